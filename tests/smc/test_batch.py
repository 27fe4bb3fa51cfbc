"""A batch of problems in one program gives each problem its own run's result.

Four problems of toy experts (a paged n-gram LM under two prompts of different lengths, with
its own EOS bias per problem, and an n-gram expert): with key 2 the problems run 4, 7, 9 steps
and one of them dies, one resamples and the others do not. The batched run must reproduce each
problem's unbatched run bit for bit (the toy arithmetic is exact, so larger calls change nothing).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smc_jax.experts.base import ExpertStack
from smc_jax.experts.token import TokenExperts
from smc_jax.experts.toy import NGramExpert, NGramTokenLM
from smc_jax.smc import SMC, ZeroWeightError
from smc_jax.smc import batch
from smc_jax.smc.batch import check_problem_mesh, problem_mesh, sample_problems, stack_problems
from smc_jax.smc.ensemble import make_ensemble
from smc_jax.utils.compilation import count_compilations

V, EOS = 6, 5
#: (LM seed, EOS bias, the two prompts, whether the n-gram expert allows only symbol 0 and no EOS)
SPECS = [(1, 2.5, [[0, 1], [2]], False), (2, 0.0, [[1, 2, 3, 4], [0]], False),
         (3, -1.0, [[3], [3, 3, 1, 0, 2]], True), (4, 0.5, [[4, 4], [2, 1]], False)]
DYING = 2
SMC8 = SMC(num_particles=8, max_length=8, ess_threshold=0.8)
FIELDS = ("symbols", "lengths", "log_weights", "finished", "expert_logprobs", "ess", "resampled", "ancestors",
          "log_weight_trace", "num_active")


def problem(seed, eos_bias, prompts, only_zero):
    lm = NGramTokenLM.random(jax.random.key(seed), vocab_size=V, order=3)
    lm = lm.replace(table=lm.table.at[:, EOS].add(eos_bias))
    prefixes, logits = zip(*[lm.prefill(p) for p in prompts])
    tokens = TokenExperts(model=lm, prefixes=jnp.stack(prefixes), prompt_logits=jnp.stack(logits), eos_ids=(EOS,),
                          max_tokens=8)
    row = np.full((1, V + 1), 1 / (V + 1))
    if only_zero:  # shares no finished string with the LM's: every particle dies at the limit
        row = np.eye(1, V + 1)
    return ExpertStack(groups=(tokens, NGramExpert.from_table(row, V, 1)))


def assert_same(got, want):
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
    assert got.log_Z == want.log_Z


def test_each_problem_gets_its_unbatched_run():
    groups = [problem(*spec) for spec in SPECS]
    ensemble = make_ensemble("product", 3)
    keys = jax.random.split(jax.random.key(2), len(groups))
    batched = sample_problems(SMC8, keys, groups, ensemble)
    alone = [SMC8(keys[b], g, ensemble, allow_zero_weight=True) for b, g in enumerate(groups)]
    # What makes the batch a test: problems of different lengths, resampling in some only, one dying.
    assert len({len(r.ess) for r in alone}) >= 3
    resampled = [bool(r.resampled.any()) for r in alone]
    assert any(resampled) and not all(resampled)
    assert alone[DYING].log_Z == -np.inf and all(np.isfinite(r.log_Z) for b, r in enumerate(alone) if b != DYING)

    assert isinstance(batched[DYING], ZeroWeightError)
    for b, result in enumerate(batched):
        if b != DYING:
            assert_same(result, alone[b])
    # The dying problem's own state is there too, when asked for.
    kept = sample_problems(SMC8, keys, groups, ensemble, allow_zero_weight=True)
    assert_same(kept[DYING], alone[DYING])


def test_results_leave_the_expert_stores_on_the_device(monkeypatch):
    # With the copy limit just above every leaf outside the experts' state, the stores' large
    # leaves are not copied, and every problem's result (or error) is the same.
    groups = [problem(*spec) for spec in SPECS]
    ensemble = make_ensemble("product", 3)
    keys = jax.random.split(jax.random.key(2), len(groups))
    experts, shared = stack_problems(groups)
    state = batch.run_problems(SMC8, keys, experts, shared, ensemble)
    per_problem = lambda leaf: leaf.nbytes // leaf.shape[0]
    others = state._replace(expert_state=None, key=jax.random.key_data(state.key))
    limit = max(per_problem(leaf) for leaf in jax.tree.leaves(others))
    host = batch.gather_problems(state, limit)
    left = [leaf for leaf in jax.tree.leaves(host.expert_state) if isinstance(leaf, jax.ShapeDtypeStruct)]
    assert len(left) >= 2, "the test needs store leaves larger than the particles' to leave behind"
    want = batch.problem_results(SMC8, state, groups, allow_zero_weight=True)
    monkeypatch.setattr(batch, "HOST_LEAF_BYTES", limit)
    got = batch.problem_results(SMC8, state, groups, allow_zero_weight=True)
    for g, w in zip(got, want):
        assert_same(g, w)
        assert g.stats == w.stats


def test_a_threshold_or_resampler_sweep_reuses_the_batched_program():
    groups = [problem(*spec) for spec in SPECS if not spec[3]]
    ensemble = make_ensemble("product", 3)
    keys = jax.random.split(jax.random.key(5), len(groups))
    sample_problems(SMC8, keys, groups, ensemble)
    SMC8(keys[1], groups[1], ensemble)  # the unbatched program the results are checked against
    with count_compilations() as compiled:
        for threshold, resampler in [(0.5, "multinomial"), (1.0, "systematic"), (0.0, "residual")]:
            smc = SMC(num_particles=8, max_length=8, ess_threshold=threshold, resampler=resampler)
            got = sample_problems(smc, keys, groups, ensemble)
            assert_same(got[1], smc(keys[1], groups[1], ensemble))
    assert compiled.count == 0


def test_problems_that_cannot_share_a_program_are_refused_before_running():
    a = problem(*SPECS[0])
    longer = a.groups[0].replace(prefixes=jnp.zeros((2, 3), jnp.int32))  # another prompt bucket
    with pytest.raises(ValueError, match="length buckets"):
        stack_problems([a, ExpertStack(groups=(longer, a.groups[1]))])
    with pytest.raises(ValueError, match="built differently"):
        stack_problems([a, a.groups[0]])
    with pytest.raises(ValueError, match="one key per problem"):
        sample_problems(SMC8, jax.random.split(jax.random.key(0), 3), [a, a], make_ensemble("product", 3))


def test_shared_leaves_are_passed_once():
    groups = [problem(*SPECS[0]), problem(*SPECS[1])]
    shared_lm = groups[0].groups[0].model
    groups[1] = ExpertStack(groups=(groups[1].groups[0].replace(model=shared_lm), groups[1].groups[1]))
    stacked, shared = stack_problems(groups)
    assert stacked.groups[0].model.table is shared_lm.table  # one copy of the weights
    assert stacked.groups[0].prefixes.shape[0] == 2 and stacked.groups[1].table.shape[0] == 2
    assert len(shared) == len(jax.tree.leaves(groups[0])) and any(shared) and not all(shared)


def test_a_mesh_that_does_not_fit_the_batch_says_what_to_do():
    from jax.sharding import AbstractMesh

    mesh = AbstractMesh((2, 4), ("problems", "particles"))
    check_problem_mesh(mesh, 6, 8)
    with pytest.raises(ValueError, match="pad the batch to a multiple of 2"):
        check_problem_mesh(mesh, 5, 8)
    with pytest.raises(ValueError, match="use a multiple of 4 particles"):
        check_problem_mesh(mesh, 6, 10)
    with pytest.raises(ValueError, match="build it with problem_mesh"):
        check_problem_mesh(AbstractMesh((2, 1), ("particles", "model")), 6, 8)
    with pytest.raises(ValueError, match="divide the number of devices"):
        problem_mesh(particles=jax.device_count() + 1)


@pytest.mark.parametrize("particles", [1, 2])
def test_two_processes_split_the_problems_and_give_one_process_results(tmp_path, particles):
    """`python -m tests.helpers.problem_processes` twice, a `jax.distributed` mesh of their CPU
    devices on 127.0.0.1: two problems per process, each problem's particles split over
    `particles` devices of its process, the results gathered, equal to one process's (bit for
    bit but the ESS, whose sum over particles is split across devices)."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "results.npz"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    if particles > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={particles}"
    root = Path(__file__).resolve().parents[2]
    workers = [subprocess.Popen([sys.executable, "-m", "tests.helpers.problem_processes", str(i), str(port), str(out),
                                 str(particles)],
                                cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for i in range(2)]
    logs = [w.communicate(timeout=600)[0] for w in workers]
    assert all(w.returncode == 0 for w in workers), "\n\n".join(log[-3000:] for log in logs)

    groups = [problem(*spec) for spec in SPECS]
    ensemble = make_ensemble("product", 3)
    keys = jax.random.split(jax.random.key(2), len(groups))
    saved = np.load(out)
    for b, group in enumerate(groups):
        want = SMC8(keys[b], group, ensemble, allow_zero_weight=True)
        for field in FIELDS:
            if field == "ess" and particles > 1:
                np.testing.assert_allclose(saved[f"{b}/{field}"], want.ess, rtol=1e-6, err_msg=f"{b} ess")
            else:
                np.testing.assert_array_equal(saved[f"{b}/{field}"], getattr(want, field), err_msg=f"{b} {field}")
        assert float(saved[f"{b}/log_Z"]) == want.log_Z

"""benchmarks.bench_path_cut: the whole-paths twin of a built expert group, and the argument
checks (no timing)."""

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from flax import struct

from benchmarks.bench_path_cut import alternate, alternation_row, parse_args, same_run, whole_paths
from benchmarks.bench_precision import parse_args as precision_args
from smc_jax.experts import ExpertStack
from smc_jax.models.paged import PagedTransformer


@struct.dataclass
class _Group:
    model: Any
    other: Any = None
    alphabet_size: int = struct.field(pytree_node=False, default=257)


def test_whole_paths_turns_off_every_models_cut_and_nothing_else():
    paged = PagedTransformer(params={"w": jnp.ones(2)}, config=None)
    stack = ExpertStack(groups=(_Group(paged), _Group("not a transformer", other=3)))
    whole = whole_paths(stack)
    assert paged.cut_paths and whole.groups[0].model.cut_paths is False
    assert whole.groups[0].model.params is paged.params
    assert whole.groups[1] == stack.groups[1]


class _Result:
    def __init__(self, calls, log_weights, sequences):
        self.stats, self.log_weights, self.sequences = {"model_calls": calls}, log_weights, sequences


def test_same_run_compares_calls_weights_and_particles():
    a = _Result(5, [0.0, -1.0], [[1, 2], [3]])
    assert same_run(a, _Result(5, [0.0, -1.0], [[1, 2], [3]]))
    assert not same_run(a, _Result(6, [0.0, -1.0], [[1, 2], [3]]))
    assert not same_run(a, _Result(5, [0.0, -1.5], [[1, 2], [3]]))
    assert not same_run(a, _Result(5, [0.0, -1.0], [[1, 2], [4]]))


@pytest.mark.parametrize("argv", [["--runs", "1"], ["--whole-paths"], ["--precision", "f16"]])
def test_bad_arguments_stop_before_any_work(argv):
    with pytest.raises(SystemExit):
        parse_args(argv)


class _Sampler:
    """Records the order of its runs; way "b" makes one more call from seed 2 on."""

    ensemble = None

    def __init__(self, log):
        self.log = log

    def smc(self, key, experts, ensemble, allow_zero_weight):
        seed = int(jax.random.key_data(key).ravel()[-1])
        self.log.append((experts, seed))
        return _Result(3 + (experts == "b" and seed >= 2), [0.0], [[1]])


def test_alternate_warms_up_then_alternates_and_counts_equal_runs():
    log = []
    out = alternate({"a": (_Sampler(log), "a"), "b": (_Sampler(log), "b")}, runs=4)
    assert [way for way, _ in log[2:]] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert [seed for _, seed in log[2:]] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert out["calls"] == {"a": [3, 3, 3, 3], "b": [3, 3, 4, 4]} and out["same_runs"] == 2
    assert all(len(s) == 4 and min(s) >= 0 for s in out["seconds"].values())


@pytest.mark.parametrize("argv", [["--runs", "1"], ["--workloads", "bytes-smollm2"]])
def test_bench_precision_bad_arguments_stop_before_any_work(argv):
    with pytest.raises(SystemExit):
        precision_args(argv)


def test_alternation_row_puts_the_baseline_first_and_divides_by_it():
    runs = {"seconds": {"new": [1.0, 1.1, 0.9], "old": [2.0, 2.2, 1.8]}, "calls": {"new": [3, 3, 3], "old": [4, 4, 4]},
            "same_runs": 1}
    row = alternation_row("smc-prompts", runs, "old", "new")
    assert list(row)[3:8] == ["old_calls", "new_calls", "old_s", "new_s", "new/old"]
    assert row["runs"] == 3 and row["same_runs"] == 1
    assert row["ratio"]["low"] <= 0.5 <= row["ratio"]["high"] and row["new/old"].startswith("0.5")

"""`smc_jax.logprob` / `logprob_batch` on SmolLM2: compiled programs reused across pairs,
batched values equal to single ones, healing on real text."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from smc_jax import logprob, logprob_batch
from smc_jax.scoring import ByteScorer
from smc_jax.sampler import EnsembleSampler, Expert
from smc_jax.models import load_model
from smc_jax.utils import compilation
from smc_jax.utils.compilation import count_compilations

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

PAIRS = [("The capital of France is", " Paris, a city"), ("def f(x):", "\n    return x + 1"), ("Hi", " wörld ünïcode")]


@pytest.fixture(scope="module")
def smol():
    return load_model("smollm2-135m-instruct")


def test_logprob_reuses_programs_and_batches_agree(smol):
    single = [logprob(smol, c, prompt=p) for p, c in PAIRS]
    with count_compilations() as compiles:  # other prompts and continuations, same buckets
        again = [logprob(smol, c + "!", prompt=p + " ok") for p, c in PAIRS]
    assert compiles.count == 0
    assert all(np.isfinite(r.prefix) and np.all(np.isfinite(r.conditionals)) for r in single + again)
    batch = logprob_batch(smol, PAIRS, batch_size=4)
    for a, b in zip(single, batch):
        np.testing.assert_allclose(a.conditionals, b.conditionals, atol=1e-4)
        np.testing.assert_allclose(a.prefix, b.prefix, atol=1e-3)
        # a batch's pairs share its calls: each counts at least those it needs alone
        assert 0 < a.model_calls <= a.rows and a.model_calls <= b.model_calls <= b.rows
    # the sampler's own teacher forcing (another program, same beam) agrees
    sampler = EnsembleSampler(experts=(Expert(smol, PAIRS[0][0]),), level="byte", num_particles=1, max_length=16)
    forced = sampler.logprob(PAIRS[0][1])
    np.testing.assert_allclose(forced.prefix, single[0].prefix, atol=1e-3)
    # unguided, both count the same forwards: the first next-byte distribution's included or
    # excluded alike; guided, the scorer makes its guiding call and fewer others
    unguided = ByteScorer(smol, guide=0)(PAIRS[0][1], PAIRS[0][0])
    assert (forced.model_calls, forced.rows) == (unguided.model_calls, unguided.rows)
    assert 0 < forced.model_calls <= forced.rows
    assert single[0].model_calls < unguided.model_calls


def test_guiding_makes_fewer_calls_and_the_same_values(smol):
    """Guided along each line's own tokenization (one call before reading), the beams find almost
    every context they need: the same values up to float rounding, a fraction of the calls."""
    guided, unguided, prompt = ByteScorer(smol), ByteScorer(smol, guide=0), "Notes:\n"
    calls = []
    for line in LINES[:5]:
        a, b = guided(line, prompt), unguided(line, prompt)
        np.testing.assert_allclose(a.conditionals, b.conditionals, atol=1e-4)
        np.testing.assert_allclose([a.prefix, a.complete], [b.prefix, b.complete], atol=1e-3)
        np.testing.assert_allclose(a.next_logprobs, b.next_logprobs, atol=1e-4)
        calls.append((a.model_calls, b.model_calls))
        prompt += line + "\n"
    # measured: 1-4 calls guided against 12-51 unguided on lines of 16-94 bytes
    assert sum(a for a, _ in calls) <= 0.25 * sum(b for _, b in calls), calls


LINES = [
    "Dear diary, it rained.",  # 22 bytes
    " Today the river was bright; the café sold naïve über-coffee at 3.14 each, and the dog ran.",
    "def f(x):\n    return {\"a\": x}  # 東京 ok, a comment of 64 byte",  # 64 and 16: chunk multiples
    "sixteen bytes ok",
    "The lazy cat slept while the morning code returned its value to the list of numbers. 42.",
    "ok",
]


def test_lines_of_any_length_share_programs_and_chunks_change_nothing(smol):
    """A continuation is read in chunks by one program, so lines of 2-94 bytes, each after the
    lines before it, compile nothing after the first line; reading 8 bytes per run instead of
    32 (every line crosses chunk boundaries, some end on one) gives the same values."""
    assert {len(line.encode()) for line in LINES} >= {2, 16, 64}
    prompt = "Notes:\n"
    first = logprob(smol, LINES[0], prompt=prompt)
    results, prompts = [first], [prompt]
    with count_compilations() as compiles:
        for line, before in zip(LINES[1:], LINES):
            prompt += before + "\n"
            prompts.append(prompt)
            results.append(logprob(smol, line, prompt=prompt))
    assert compiles.count == 0
    small = ByteScorer(smol, chunk_bytes=8)
    for line, prompt, want in zip(LINES, prompts, results):
        got = small(line, prompt)
        assert np.isfinite(got.complete)
        np.testing.assert_allclose(got.conditionals, want.conditionals, atol=1e-5)
        np.testing.assert_allclose([got.prefix, got.complete], [want.prefix, want.complete], atol=1e-4)
        np.testing.assert_allclose(got.next_logprobs, want.next_logprobs, atol=1e-5)
        assert got.model_calls == want.model_calls > 0  # the same byte steps, however they are chunked


def test_a_scorer_builds_its_stores_on_the_last_runs_buffers_with_the_same_bits(smol):
    """The start takes over the last run's pool and summary table (donated: not zeroed again)
    when the shape is the same; what they hold from that run (dead contexts, their keys and
    summaries) changes no value and no call."""
    used, fresh = ByteScorer(smol), ByteScorer(smol)
    prompt = "Notes:\n" + LINES[0] + "\n"
    used(LINES[4], prompt)  # leaves many dead contexts behind
    spare = used._spare[1]
    pointers = [leaf.unsafe_buffer_pointer() for leaf in jax.tree.leaves(spare)]
    for line in (LINES[1], LINES[2]):
        got, want = used(line, prompt), fresh(line, prompt)
        np.testing.assert_array_equal(got.conditionals, want.conditionals)
        np.testing.assert_array_equal(got.next_logprobs, want.next_logprobs)
        assert (got.prefix, got.complete, got.model_calls, got.rows) == (want.prefix, want.complete, want.model_calls,
                                                                          want.rows)
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(spare))  # donated to the start
    assert [leaf.unsafe_buffer_pointer() for leaf in jax.tree.leaves(used._spare[1])] == pointers  # updated in place


def test_a_new_scorer_reads_both_programs_from_the_store_without_tracing(smol, tmp_path, monkeypatch):
    """A scorer keeps its start and reading programs on disk (`stored_jit`); another scorer (as in
    a new process) reads them back and traces nothing, with the same bits."""
    monkeypatch.setattr(compilation, "program_store", lambda: tmp_path / "exported")
    prompt = "Notes:\n"
    first = ByteScorer(smol)(LINES[3], prompt)
    assert sorted(path.name.split("-")[0] for path in (tmp_path / "exported").glob("*.jaxexport")) == ["read", "start"]
    monkeypatch.setattr(jax.export, "export", lambda *a, **k: pytest.fail("traced again"))
    again = ByteScorer(smol)
    for program in (again._start, again._read):
        program.jitted = None  # the plain jit (which traces) is not used either
    second = again(LINES[3], prompt)
    np.testing.assert_array_equal(second.conditionals, first.conditionals)
    np.testing.assert_array_equal(second.next_logprobs, first.next_logprobs)
    assert (second.prefix, second.complete, second.model_calls, second.rows) == (
        first.prefix, first.complete, first.model_calls, first.rows)

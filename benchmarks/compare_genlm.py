"""smc_jax against GenLM (genlm-control, genlm-bytes, genlm-backend) on the same workloads and
models, in one process, one side after the other.

Workloads (`--workloads`, all by default):

* bytes-smollm2, bytes-gemma3 (a): scoring a fixed 200-byte English text after the prompt
  "A short story:\\n\\n" byte by byte (beam width 5, relative prune threshold 0.05). smc_jax:
  the public `EnsembleSampler(...).logprob(TEXT)`; GenLM: a genlm-bytes `ByteBeamState`
  prefilled with the prompt, then `logp_next()` and `prune() << byte` per byte. Agreement: the
  largest |difference| of the two sides' conditionals log P(byte_i | bytes < i) along the text,
  and of the next-byte distributions after it (256 bytes + EOS, entries with probability >=
  MASS_FLOOR on a side), as is and with '<' left out (see EOS below).
* smc-prompts (b): byte-level SMC for the product of SmolLM2 under "My favorite physicist is"
  and "My favorite author is"; smc-models (b): SmolLM2 x Gemma 3, both under the physicist
  prompt. M = 10 particles, ESS threshold 0.9, multinomial resampling, beam width 5, threshold
  0.05, at most `--max-tokens` - 1 bytes then a forced EOS. GenLM: `Product` of two `ByteLLM`
  potentials (one `AsyncTransformer` shared by the two prompts) and
  `direct_token_sampler(product).smc(...)`.
* token-prompts (b): the same two-prompt product at the token level, at equal work: every
  particle of both sides generates exactly `--max-tokens` tokens (see Length). GenLM: `Product`
  of two `PromptedLLM` potentials on one `AsyncTransformer`; smc_jax: level="token".

Conventions, so that both sides do the same work:

* Prompts: GenLM starts every beam from the BOS token and reads the prompt byte by byte; smc_jax
  runs with `prompt_as_bytes=True`, the same convention. The token level feeds the prompt's
  token ids to both.
* Target: GenLM's `Product` is p1 * p2 (its weights add the potentials' log-weights); smc_jax's
  f="product" is the geometric mean sqrt(p1 p2) (paper, tau = 0), so smc_jax runs with a
  `CustomEnsemble` for p1 * p2: both sides sample the same target, at temperature 1.
* Length: GenLM's `max_tokens` counts the end-of-sequence unit: a byte-level particle samples at
  most max_tokens - 1 bytes and GenLM then forces EOS with its weight correction; smc_jax gets
  max_length = max_tokens - 1 with at_max_length="eos", which does exactly that. At the token
  level, EOS-terminated runs are not equal work: under p1 * p2 both samplers often collapse onto
  a few-token string that ends early (" Elon Musk." + EOS), but a single particle still
  extending keeps a run going to the limit (with 9 finished particles of equal weight the ESS
  stays >= 0.9 M, so nothing resamples it away), so a run takes 5 or 40 steps at random (GenLM
  6-9 calls per run, smc_jax 33-39, when the runs end at EOS). The token workload therefore
  samples p1(x) p2(x) (prefix probabilities) over strings of exactly L = max_tokens tokens on
  both sides: GenLM multiplies a potential that gives EOS weight 0 (`genlm_side.no_eos`) into
  the product and closes particles at L with `terminate_when` (no EOS factor); smc_jax uses an
  ensemble whose complete-string target is 0 (`PREFIX_PRODUCT`: EOS is never proposed) with
  max_length = L and at_max_length="truncate" (stop at L without an EOS factor). Generated
  lengths are recorded per particle and run on both sides.
* Zero weight: under the product a run can end with every particle at weight 0; smc_jax runs with
  allow_zero_weight=True (it raises by default), GenLM returns such runs as they are; they are
  timed like the others and counted (zero_weight_runs).
* EOS and special tokens: GenLM's byte tries and `PromptedLLM` treat the byte strings of
  smc_jax's EOS ids as EOS. GenLM gives the models' other special tokens their literal text as
  bytes (b"<|im_start|>", b"<start_of_image>"), while smc_jax leaves control tokens out of the
  byte LM and renormalizes: their mass (up to 2% for Gemma 3's <start_of_image>) lands on '<'
  under GenLM only.
* Threads: GenLM's torch runs at torch's default thread count unless `--torch-threads` sets it;
  smc_jax's XLA:CPU uses its default (one intra-op thread per core it may run on). The results
  record both, and the load average before and after each side.
* Order: every workload's smc_jax side runs first, then every GenLM side (once GenLM had loaded
  its models and byte tries in the process, the same smc_jax runs -- same seeds, same calls --
  took 25-30% longer on this CPU).
* Runs: `--runs` (12 by default) timed runs per side after a warm-up run (compilation for
  smc_jax), seeds 0, 1, ...; reported as the mean with a 95% t-interval. The ratio of the mean
  times (and of the mean model calls) comes with a 95% percentile bootstrap interval: each
  side's runs are resampled with replacement, independently (BOOTSTRAP_RESAMPLES times, fixed
  seed), and the ratio of the resampled means is taken.
* Prompt work: before every GenLM run its model-output cache and its byte-beam caches are
  cleared, so no run reuses another's model calls; the prompts' own outputs are then recomputed
  untimed (`ByteLLM` keeps the beam after its prompt, `PromptedLLM` the prompt's logits; the
  one-time cost is genlm_prompt_s / genlm_prompt_calls). smc_jax likewise builds its start state
  once per sampler (`EnsembleSampler.build` prefills the prompts; the byte beams' first
  next-byte distributions after them need no model call); a run's calls exclude the prompt's
  on both sides.
* Model calls: GenLM's are the batched forward passes of its `AsyncTransformer`s (counted by
  wrapping the torch model's forward; each recomputes the whole token context, as GenLM keeps
  no KV cache for them); smc_jax's are its sequential batched decode calls (`stats`), reported
  for the SMC workloads (the public `logprob` of (a) does not report them).
* Floor (SMC workloads): smc_jax's model calls times the seconds of one batched decode call of
  the sizes it used, measured here with the same model port (`smc_jax.models.paged.paged_decode`,
  vmapped over the group's prompts, the run's pool and path shapes): t(rows) = a + b * rows is
  fitted on the call sizes up to twice the typical one, and floor = calls * a + rows * b summed
  over the model groups. "Everything else" (the profile, c) is wall - floor.
* Layers: smc_jax loads its models with `load_model`'s default weight layout (on CPU each
  layer's weights in their own buffers, which XLA:CPU reads in place; else stacked on a layer
  axis, which a `lax.scan` slices and XLA copies on every call) unless `--layers split|stacked`.
  Same arithmetic, logits within 2e-4. On CPU each call reads its rows' paths only up to the
  longest of them (`PagedTransformer.cut_paths`).
* Precision: both sides run float32 models (the same dequantized GGUF weights) unless
  `--precision bf16-matmuls`: then smc_jax multiplies in bfloat16 with float32 accumulation and
  float32 activations (`load_model(..., matmul_dtype=jnp.bfloat16)`) and GenLM's torch model is
  cast to bfloat16 (what `torch_dtype="auto"`, GenLM's loader default, gives for the bfloat16
  Hugging Face checkpoints of both models). Close to, not the same as, the float32 target on
  either side.
* Compilations: XLA compilations during the timed runs (after the warm-up) are counted with
  `smc_jax.utils.compilation.count_compilations`; 0 means no run recompiled.

Writes benchmarks/results/compare_genlm.{json,md}. Needs the `genlm`
extra (pip install -e ".[genlm]") unless --skip-genlm. Run: python -m benchmarks.compare_genlm
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import version
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from tqdm import tqdm

from benchmarks.common import markdown_table, save
from benchmarks.genlm_side import GENLM_MISSING, GenLM, byte_potentials, genlm_smc, genlm_text, token_potentials
from smc_jax import load_model
from smc_jax.sampler import EnsembleSampler, Expert
from smc_jax.smc.ensemble import CustomEnsemble
from evaluation.stats import CONFIDENCE, Interval, t_interval
from smc_jax.experts.base import ExpertStack, expert_failure
from smc_jax.experts.byte import ByteExperts
from smc_jax.models.contexts import bucket_sizes
from smc_jax.models.lm import LanguageModel
from smc_jax.models.paged import paged_decode
from smc_jax.settings import SamplerSettings
from smc_jax.smc.engine import run_jitted
from smc_jax.utils.compilation import count_compilations

TEXT = (
    b"The old lighthouse keeper climbed the spiral stairs every evening at dusk. From the top he could "
    b"watch the fishing boats return to the harbour, their lamps flickering like fireflies over the dark sea."
)
TEXT_PROMPT = "A short story:\n\n"
PROMPTS = ("My favorite physicist is", "My favorite author is")
SMOLLM2, GEMMA3 = "smollm2-135m-instruct", "gemma3-270m"
WORKLOADS = {
    "bytes-smollm2": "a: scoring a 200-byte text, SmolLM2",
    "bytes-gemma3": "a: scoring a 200-byte text, Gemma 3",
    "smc-prompts": "b: byte SMC, SmolLM2 x 2 prompts",
    "smc-models": "b: byte SMC, SmolLM2 x Gemma 3",
    "token-prompts": "b: token SMC, SmolLM2 x 2 prompts, fixed length",
}

MASS_FLOOR = 1e-4  # agreement is measured over entries with at least this probability on a side
WARMUP_SEED = 100
DECODE_REPEATS = 5
DEFAULT_RUNS = 12
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def _log_product(log_p: jax.Array) -> jax.Array:
    return jnp.sum(log_p, axis=-1)


#: GenLM's Product target p1 * p2 (smc_jax's f="product" is the weighted geometric mean sqrt(p1 p2)).
GENLM_PRODUCT = CustomEnsemble(log_abs_f=_log_product, num_experts=2)


@struct.dataclass
class PrefixProduct:
    """psi(x) = p1(x) p2(x) on prefixes and phi = 0 on complete strings: EOS is never proposed, so
    with at_max_length="truncate" every particle generates exactly max_length symbols, weighted
    for p1(x) p2(x) over the strings of that length (GenLM's product times `no_eos`, closed at L).

    Attributes
    ----------
    num_experts : int
        K (the log-probabilities' trailing axis).
    """

    num_experts: int = struct.field(pytree_node=False, default=2)

    def log_target(self, log_p: jax.Array) -> jax.Array:
        """log phi = -inf: no string may end before the length limit."""
        return jnp.full(log_p.shape[:-1], -jnp.inf, log_p.dtype)

    def log_shaping(self, log_p: jax.Array) -> jax.Array:
        """log psi = sum_k log p_k(x)."""
        return jnp.sum(log_p, axis=-1)


PREFIX_PRODUCT = PrefixProduct()


@dataclasses.dataclass(frozen=True)
class Settings:
    runs: int
    beam_width: int = 5
    prune_threshold: float = 0.05
    particles: int = 10
    ess_threshold: float = 0.9
    max_tokens: int = 40  # GenLM's max_tokens: byte SMC symbols plus the forced EOS; token SMC: exact length
    prefetch: int = 0  # smc_jax byte level: SamplerSettings.prefetch (0 = its default, off)
    prefetch_rows: int = 0
    prefetch_slots: int = SamplerSettings.prefetch_slots  # per particle (the sampler's default)
    prefetch_children: int = SamplerSettings.prefetch_children
    call_costs: bool = True  # measure the per-call decode seconds (the floor); False saves compilations


# --------------------------------------------------------------------------------- statistics


@dataclasses.dataclass(frozen=True)
class Ratio:
    """mean(numerator) / mean(denominator) with a percentile bootstrap interval [low, high]."""

    value: float
    low: float
    high: float

    def format(self, digits: int = 2) -> str:
        if math.isnan(self.value):
            return "n/a"
        if math.isnan(self.low):
            return f"{self.value:.{digits}f}"
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def mean_interval(values: Sequence[float]) -> Interval:
    """mean +- the 95% t-interval half-width over runs (`evaluation.stats.t_interval`).

    Parameters
    ----------
    values : sequence of float
        One value per run.
    """
    return t_interval([float(v) for v in values])


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float], confidence: float = CONFIDENCE,
                   resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Ratio:
    """R = mean(numerator) / mean(denominator) and its percentile bootstrap interval: both samples
    are resampled with replacement, independently of each other, R* = mean(num*) / mean(den*),
    and the interval is the (1 -+ confidence) / 2 quantiles of R*. Without two values on each
    side: no interval.

    Parameters
    ----------
    numerator, denominator : sequence of float
        Per-run values of the two sides (e.g. GenLM's and smc_jax's seconds).
    confidence : float
        The interval's coverage.
    resamples : int
        Bootstrap resamples.
    seed : int
        Seed of the resampling (the interval is reproducible).

    Returns
    -------
    Ratio
        R with its interval (NaN bounds when a side has fewer than two values).
    """
    num, den = np.asarray(numerator, np.float64), np.asarray(denominator, np.float64)
    if num.size == 0 or den.size == 0:
        return Ratio(math.nan, math.nan, math.nan)
    value = float(num.mean() / den.mean())
    if num.size < 2 or den.size < 2:
        return Ratio(value, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    num_means = num[rng.integers(0, num.size, (resamples, num.size))].mean(axis=1)
    den_means = den[rng.integers(0, den.size, (resamples, den.size))].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = num_means / den_means
    low, high = np.quantile(ratios, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Ratio(value, float(low), float(high))


def fmt(interval: Interval, digits: int = 2) -> str:
    return interval.format(digits=digits)


# ------------------------------------------------------------------------------------ smc_jax


@jax.jit
def _decode_call(model, prefixes, pool, paths, depth, tokens) -> jax.Array:
    step = lambda prefix, pool, paths, depth, tokens: paged_decode(
        model.params, model.config, prefix, pool, paths, depth, tokens)[0]
    return jax.vmap(step)(prefixes, pool, paths, depth, tokens)


def call_sizes(group: Any, num_particles: int) -> list[int]:
    """The group's model-call batch sizes (rows per prompt) up to twice the typical one."""
    most = num_particles
    if isinstance(group, ByteExperts):
        most *= group.num_slots * group.trie.max_duplicates
    return [size for size in bucket_sizes(most, typical=num_particles) if size <= 2 * num_particles]


def decode_seconds(group: Any, num_particles: int, rows: int) -> float:
    """Median seconds of one batched decode call of `rows` rows per prompt, vmapped over the
    group's K prompts, with the pool and path shapes of a run of `num_particles` particles."""
    stores = jax.eval_shape(lambda g: g.init(num_particles), group).stores
    k, slots = stores.path.shape[0], stores.path.shape[-1]
    pool = jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), stores.pool)
    paths = jnp.broadcast_to(jnp.arange(slots, dtype=jnp.int32), (k, rows, slots))
    depth = jnp.full((k, rows), slots // 2, jnp.int32)  # masked attention: the cost is that of all slots
    tokens = jnp.zeros((k, rows), jnp.int32)
    call = lambda: jax.block_until_ready(_decode_call(group.model, group.prefixes, pool, paths, depth, tokens))
    call()
    times = []
    for _ in range(DECODE_REPEATS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclasses.dataclass
class CallCost:
    """t(rows) = fixed + per_row * rows for one model group (K prompts), fitted on measured sizes."""

    model: str
    prompts: int
    seconds: dict[int, float]  # rows per prompt -> seconds of one call
    fixed: float
    per_row: float

    @classmethod
    def measure(cls, name: str, group: Any, num_particles: int) -> CallCost:
        seconds = {rows: decode_seconds(group, num_particles, rows) for rows in call_sizes(group, num_particles)}
        sizes = np.array(list(seconds), float)
        times = np.array(list(seconds.values()))
        per_row, fixed = np.polyfit(sizes, times, 1) if len(sizes) > 1 else (0.0, float(times[0]))
        return cls(model=name, prompts=group.num_experts, seconds=seconds, fixed=float(fixed), per_row=float(per_row))

    def floor(self, stats: dict[str, int]) -> float:
        """Seconds of the group's calls: calls * fixed + rows per prompt * per_row."""
        return stats["model_calls"] * self.fixed + stats["rows_computed"] / self.prompts * self.per_row


def group_stats(sampler: EnsembleSampler, seed: int) -> tuple[tuple, list[dict[str, int]]]:
    """The model groups and, per group, the counters of the run `sampler(seed)` (a run is a
    function of its seed: this reruns it through the engine to read each group's store)."""

    def run(experts: Any) -> tuple[Any, Any]:
        state = run_jitted(sampler.smc, jax.random.key(seed), experts, sampler.ensemble)
        problem = expert_failure(experts, state.expert_state)
        if problem is not None:
            raise problem  # a context-store overflow makes grow_on_overflow rebuild bigger
        return experts, state

    experts, state = sampler.grow_on_overflow(run)
    groups = experts.groups if isinstance(experts, ExpertStack) else (experts,)
    states = state.expert_state if isinstance(experts, ExpertStack) else (state.expert_state,)
    return groups, [group.stats(s) for group, s in zip(groups, states)]


def model_names(experts: Sequence[Expert]) -> list[str]:
    return list(dict.fromkeys(e.model.name for e in experts))


def smc_jax_text(model: LanguageModel, settings: Settings) -> dict[str, Any]:
    """(a) smc_jax: `EnsembleSampler.logprob(TEXT)` timed after a warm-up (compilation, start
    state): the conditionals along TEXT and the next-byte distribution after it."""
    sampler = EnsembleSampler(experts=(Expert(model, TEXT_PROMPT),), level="byte", num_particles=1,
                              max_length=len(TEXT), beam_width=settings.beam_width,
                              prune_threshold=settings.prune_threshold, prompt_as_bytes=True)
    scored = sampler.logprob(TEXT)
    times = []
    with count_compilations() as compiled:
        for _ in range(settings.runs):
            start = time.perf_counter()
            scored = sampler.logprob(TEXT)  # host arrays: the call has finished
            times.append(time.perf_counter() - start)
    return {"times": times, "conditionals": scored.conditionals, "next_logprobs": scored.next_logprobs,
            "recompiles": compiled.count}


def smc_jax_sampler(sampler: EnsembleSampler, settings: Settings) -> dict[str, Any]:
    """(b) smc_jax: per-run wall time, calls, generated lengths, floor and compilations of runs
    with seeds 0, 1, ... after a warm-up run."""
    sampler(WARMUP_SEED, allow_zero_weight=True)
    times, calls, steps, lengths, results = [], [], [], [], []
    with count_compilations() as compiled:
        for seed in range(settings.runs):
            result = sampler(seed, allow_zero_weight=True)  # a run may end at zero weight, as GenLM's may
            times.append(result.stats["seconds"])
            calls.append(result.stats["model_calls"])
            steps.append(result.stats["steps"])
            lengths.append([int(n) for n in np.asarray(result.lengths)])
            results.append(result)
    per_seed = [group_stats(sampler, seed) for seed in range(settings.runs)]
    groups = per_seed[0][0]
    costs = ([CallCost.measure(name, g, settings.particles) for name, g in zip(model_names(sampler.experts), groups)]
             if settings.call_costs else [])
    floors = ([sum(c.floor(s) for c, s in zip(costs, stats)) for _, stats in per_seed] if costs
              else [math.nan] * len(per_seed))
    median_run = results[int(np.argsort(times)[len(times) // 2])]
    return {"times": times, "calls_per_run": calls, "steps": steps, "lengths": lengths, "floors": floors,
            "costs": costs, "recompiles": compiled.count, "zero_weight_runs": sum(r.log_Z == -math.inf for r in results),
            "sample": repr(median_run.posterior()[0][0])[:50] if median_run.log_Z > -math.inf else "(zero weight)"}


# --------------------------------------------------------------------------------- comparison


def max_difference(ours: np.ndarray, theirs: np.ndarray) -> tuple[float, str]:
    """Largest |log-prob difference| over entries with mass >= MASS_FLOOR on a side, and where."""
    heavy = (np.exp(ours) >= MASS_FLOOR) | (np.exp(theirs) >= MASS_FLOOR)
    with np.errstate(invalid="ignore"):  # -inf - -inf where neither side has mass
        diff = np.where(heavy, np.abs(ours - theirs), 0.0)
    position, symbol = np.unravel_index(np.argmax(diff), diff.shape)
    return float(diff.max()), f"{'EOS' if symbol == 256 else repr(bytes([symbol]))}"


def without(logp: np.ndarray, symbol: int) -> np.ndarray:
    """The distributions with one symbol removed, renormalized."""
    kept = np.delete(logp, symbol, axis=-1)
    return kept - np.logaddexp.reduce(kept, axis=-1, keepdims=True)


def agreement(ours: dict[str, Any], theirs: np.ndarray) -> dict[str, Any]:
    """How far apart the two sides are along TEXT: the conditionals of its bytes, and the
    next-byte distribution after it as is and without '<' (GenLM gives the models' special
    tokens their literal text as bytes, e.g. b"<start_of_image>", which smc_jax leaves out of
    the byte LM, so their mass lands on '<' under GenLM only)."""
    data = np.frombuffer(TEXT, np.uint8)
    theirs_cond = theirs[np.arange(len(data)), data]
    cond_diff = np.abs(ours["conditionals"] - theirs_cond)
    ours_next = ours["next_logprobs"][None]
    theirs_next = np.concatenate([theirs[-1, :256], theirs[-1, 257:]])[None]  # drop GenLM's EOT column
    diff, where = max_difference(ours_next, theirs_next)
    diff_no_lt, where_no_lt = max_difference(without(ours_next, ord("<")), without(theirs_next, ord("<")))
    return {
        "max_conditional_diff": float(cond_diff.max()), "at_byte": int(np.argmax(cond_diff)),
        "sum_conditionals_smc_jax": float(ours["conditionals"].sum()), "sum_conditionals_genlm": float(theirs_cond.sum()),
        "max_next_logp_diff": diff, "where": where, "max_next_logp_diff_without_<": diff_no_lt,
        "where_without_<": where_no_lt,
        "next_tv": float(0.5 * np.abs(np.exp(ours_next) - np.exp(theirs_next)).sum()),
    }


def workload_experts(name: str, models: Callable[[str], LanguageModel]) -> tuple[Expert, ...]:
    """The experts of an SMC workload (b)."""
    smol = models(SMOLLM2)
    if name == "smc-models":
        return (Expert(smol, PROMPTS[0]), Expert(models(GEMMA3), PROMPTS[0]))
    return (Expert(smol, PROMPTS[0]), Expert(smol, PROMPTS[1]))


def workload_sampler(name: str, models: Callable[[str], LanguageModel], settings: Settings) -> EnsembleSampler:
    """smc_jax's sampler of an SMC workload (b) (see Length in the module docstring)."""
    common = dict(num_particles=settings.particles, ess_threshold=settings.ess_threshold, resampler="multinomial",
                  temperature=1.0)
    if name.startswith("token-"):
        return EnsembleSampler(experts=workload_experts(name, models), level="token", f=PREFIX_PRODUCT,
                               max_length=settings.max_tokens, at_max_length="truncate", **common)
    return EnsembleSampler(
        experts=workload_experts(name, models), level="byte", f=GENLM_PRODUCT, max_length=settings.max_tokens - 1,
        at_max_length="eos", beam_width=settings.beam_width, prune_threshold=settings.prune_threshold,
        prompt_as_bytes=True, prefetch=settings.prefetch, prefetch_rows=settings.prefetch_rows,
        prefetch_slots=settings.prefetch_slots, prefetch_children=settings.prefetch_children, **common)


def plain_sampler(models: Callable[[str], LanguageModel], settings: Settings) -> EnsembleSampler:
    """One plain sample at the token workload's length: one particle of SmolLM2 under the first
    prompt, exactly max_tokens tokens (no ensemble, no resampling): ancestral sampling through
    the same engine, the baseline of "token SMC within 3x of one plain sample"."""
    return EnsembleSampler(experts=(Expert(models(SMOLLM2), PROMPTS[0]),), level="token", f=PrefixProduct(num_experts=1),
                           num_particles=1, max_length=settings.max_tokens, at_max_length="truncate", temperature=1.0)


def plain_times(sampler: EnsembleSampler, settings: Settings) -> list[float]:
    """Seconds of `settings.runs` plain samples (seeds 0, 1, ...) after a warm-up."""
    sampler(WARMUP_SEED)
    return [sampler(seed).stats["seconds"] for seed in range(settings.runs)]


def smc_jax_workload(name: str, models: Callable[[str], LanguageModel], settings: Settings) -> dict[str, Any]:
    """The smc_jax side of one workload: its measurements (the row is completed by `row_of`)."""
    if name.startswith("bytes-"):
        return smc_jax_text(models(SMOLLM2 if name == "bytes-smollm2" else GEMMA3), settings)
    ours = smc_jax_sampler(workload_sampler(name, models, settings), settings)
    if name.startswith("token-"):
        ours["plain_times"] = plain_times(plain_sampler(models, settings), settings)
    return ours


def genlm_workload(name: str, models: Callable[[str], LanguageModel], genlm: GenLM, settings: Settings) -> dict[str, Any]:
    """The GenLM side of one workload."""
    if name.startswith("bytes-"):
        return genlm_text(genlm, models(SMOLLM2 if name == "bytes-smollm2" else GEMMA3), settings, TEXT, TEXT_PROMPT)
    experts = workload_experts(name, models)
    if name.startswith("token-"):
        return genlm_smc(genlm, token_potentials(genlm, experts), settings, WARMUP_SEED, fixed_length=settings.max_tokens)
    return genlm_smc(genlm, byte_potentials(genlm, experts, settings), settings, WARMUP_SEED)


def mean_length(lengths: Sequence[Sequence[int]]) -> float:
    """Mean generated symbols per particle over all runs."""
    return float(np.mean([n for run in lengths for n in run])) if lengths else math.nan


def row_of(name: str, ours: dict[str, Any], theirs: dict[str, Any] | None) -> dict[str, Any]:
    """One row of the tables from both sides' measurements (formatted cells and raw numbers)."""
    times = mean_interval(ours["times"])
    row: dict[str, Any] = {"workload": WORKLOADS[name], "runs": times.n, "smc_jax_s": fmt(times),
                           "smc_jax_s_mean": times.mean, "smc_jax_s_half_width": times.half_width,
                           "smc_jax_times": ours["times"], "recompiles": ours["recompiles"]}
    smc = "calls_per_run" in ours
    if smc:
        calls, floors = mean_interval(ours["calls_per_run"]), mean_interval(ours["floors"])
        row.update({
            "smc_jax_calls": fmt(calls, 1), "smc_jax_calls_mean": calls.mean, "smc_jax_calls_half_width": calls.half_width,
            "smc_jax_calls_per_run": ours["calls_per_run"], "smc_jax_steps": ours["steps"],
            "smc_jax_lengths": ours["lengths"], "smc_jax_mean_length": mean_length(ours["lengths"]),
            "smc_jax_run_mean_lengths": [round(float(np.mean(run)), 1) for run in ours["lengths"]],
            "smc_jax_floor_s": floors.mean, "smc_jax_other_s": times.mean - floors.mean,
            "smc_jax_wall/floor": statistics.mean(t / f for t, f in zip(ours["times"], ours["floors"])),
            "smc_jax_zero_weight_runs": ours["zero_weight_runs"], "smc_jax_sample": ours["sample"],
        })
        if "plain_times" in ours:
            plain = mean_interval(ours["plain_times"])
            per_plain = ratio_interval(ours["times"], ours["plain_times"])
            row.update({"plain_s": fmt(plain, 3), "plain_s_mean": plain.mean, "plain_times": ours["plain_times"],
                        "smc_jax/plain": per_plain.format(), "smc_jax/plain_ratio": per_plain.value})
    else:
        row["smc_jax_calls"] = "n/a"
    if theirs is None:
        return row
    genlm_times, genlm_calls = mean_interval(theirs["times"]), mean_interval(theirs["calls_per_run"])
    speedup = ratio_interval(theirs["times"], ours["times"])
    row.update({
        "genlm_s": fmt(genlm_times), "genlm_s_mean": genlm_times.mean, "genlm_s_half_width": genlm_times.half_width,
        "genlm/smc_jax": speedup.format(), "genlm/smc_jax_ratio": speedup.value, "genlm/smc_jax_low": speedup.low,
        "genlm/smc_jax_high": speedup.high, "genlm_times": theirs["times"],
        "genlm_calls": fmt(genlm_calls, 1), "genlm_calls_mean": genlm_calls.mean,
        "genlm_calls_half_width": genlm_calls.half_width, "genlm_calls_per_run": theirs["calls_per_run"],
        "genlm_forward_s": statistics.mean(theirs["forward_s_per_run"]),
        "genlm_other_s": genlm_times.mean - statistics.mean(theirs["forward_s_per_run"]),
        "genlm_rows_per_call": theirs["rows_per_call"], "genlm_tokens_per_row": theirs["tokens_per_row"],
        "genlm_s_per_call": theirs["seconds_per_call"],
    })
    if smc:
        call_ratio = ratio_interval(ours["calls_per_run"], theirs["calls_per_run"])
        row.update({
            "smc_jax/genlm_calls": call_ratio.format(), "smc_jax/genlm_calls_ratio": call_ratio.value,
            "smc_jax/genlm_calls_low": call_ratio.low, "smc_jax/genlm_calls_high": call_ratio.high,
            "genlm_lengths": theirs["lengths"], "genlm_mean_length": mean_length(theirs["lengths"]),
            "genlm_run_mean_lengths": [round(float(np.mean(run)), 1) for run in theirs["lengths"]],
            "genlm_prompt_s": theirs["prompt_s"], "genlm_prompt_calls": theirs["prompt_calls"],
            "genlm_zero_weight_runs": theirs["zero_weight_runs"],
        })
        row["lengths genlm / smc_jax"] = f"{row['genlm_mean_length']:.1f} / {row['smc_jax_mean_length']:.1f}"
    else:
        row.update(agreement(ours, theirs["logprobs"]))
    return row


def cost_table(costs: Sequence[tuple[str, CallCost]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows (workload, model group) and columns of the per-call decode seconds."""
    sizes = sorted({rows for _, c in costs for rows in c.seconds})
    rows = [{"workload": WORKLOADS[name], "model": c.model, "prompts": c.prompts,
             **{f"rows={n}": seconds for n, seconds in c.seconds.items()},
             "fixed_s": c.fixed, "per_row_s": c.per_row} for name, c in costs]
    return rows, ["workload", "model", "prompts", *(f"rows={n}" for n in sizes), "fixed_s", "per_row_s"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring).

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments (sys.argv[1:] when None).
    """
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare_genlm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="timed runs per side after a warm-up")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--skip-genlm", action="store_true", help="run only the smc_jax side")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch.set_num_threads for GenLM (default: leave torch's default)")
    parser.add_argument("--max-tokens", type=int, default=Settings.max_tokens,
                        help="byte SMC: GenLM's max_tokens (bytes + forced EOS); token SMC: the exact length")
    parser.add_argument("--particles", type=int, default=Settings.particles)
    add_layer_options(parser)
    add_precision_option(parser)
    add_prefetch_options(parser)
    parser.add_argument("--no-call-costs", action="store_true",
                        help="skip the per-call decode timings (no floor; fewer compilations)")
    args = parser.parse_args(argv)
    for option in ("runs", "max_tokens", "particles"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be >= 1")
    if args.torch_threads is not None and args.torch_threads < 1:
        parser.error("--torch-threads must be >= 1")
    check_prefetch_options(parser, args)
    return args


#: --precision: smc_jax's matmul dtype (None: the params' float32) and what both sides run.
PRECISIONS: dict[str, Any] = {"f32": None, "bf16-matmuls": jnp.bfloat16}
PRECISION_NOTES = {
    "f32": "float32 from the same GGUF files",
    "bf16-matmuls": ("the same GGUF files; bfloat16 matmuls: smc_jax's with float32 accumulation and activations, "
                     "GenLM's torch model cast to bfloat16"),
}


def add_precision_option(parser: argparse.ArgumentParser) -> None:
    """--precision, read by `model_loader` and by `GenLM`."""
    parser.add_argument("--precision", choices=PRECISIONS, default="f32",
                        help="model arithmetic (f32: float32 throughout; bf16-matmuls: smc_jax's matmuls in bfloat16 "
                             "with float32 accumulation, and GenLM's model cast to bfloat16)")


def add_prefetch_options(parser: argparse.ArgumentParser) -> None:
    """--prefetch, --prefetch-rows, --prefetch-slots, --prefetch-children (smc_jax byte level)."""
    parser.add_argument("--prefetch", type=int, default=0,
                        help="smc_jax byte level: calls also create the contexts the next N bytes may need (0: off)")
    parser.add_argument("--prefetch-rows", type=int, default=0, help="smc_jax byte level: rows a call may add to prefetch")
    parser.add_argument("--prefetch-slots", type=int, default=SamplerSettings.prefetch_slots,
                        help="smc_jax byte level, with --prefetch: prefetched contexts kept per particle")
    parser.add_argument("--prefetch-children", type=int, default=SamplerSettings.prefetch_children,
                        help="smc_jax byte level, with --prefetch: contexts per particle one token below the best candidates")


def check_prefetch_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The sampler's own checks of the byte-level prefetch settings, before any loading."""
    try:
        SamplerSettings(level="byte", prefetch=args.prefetch, prefetch_rows=args.prefetch_rows,
                        prefetch_slots=args.prefetch_slots, prefetch_children=args.prefetch_children)
    except ValueError as err:
        parser.error(f"--prefetch*: {err}")


def add_layer_options(parser: argparse.ArgumentParser) -> None:
    """--layers (the weight layout), read by `model_loader`."""
    parser.add_argument("--layers", choices=("split", "stacked"), default=None,
                        help="smc_jax: load_model(..., split_layers=...) (default: load_model's, split on CPU)")


def model_loader(args: argparse.Namespace) -> tuple[Callable[[str], LanguageModel], dict[str, LanguageModel]]:
    """Name -> model, each loaded once with --layers and --precision, and the models loaded so far."""
    split = None if args.layers is None else args.layers == "split"
    precision = PRECISIONS[args.precision]
    loaded: dict[str, LanguageModel] = {}

    def models(name: str) -> LanguageModel:
        if name not in loaded:
            loaded[name] = load_model(name, split_layers=split, matmul_dtype=precision)
        return loaded[name]

    return models, loaded


def layer_layouts(models: Iterable[LanguageModel]) -> list[str]:
    """How smc_jax's loaded models hold their layer weights (see `load_model(split_layers=...)`)
    and whether paths are cut to each call's span (`PagedTransformer.cut_paths`)."""
    return sorted({f"{'split' if model.split_layers else 'stacked'}, "
                   f"{'paths cut to the span' if model.paged().cuts_paths else 'whole paths'}" for model in models})


def threads_used(genlm: GenLM | None) -> dict[str, Any]:
    """The thread counts both sides ran with."""
    xla = {"jax_backend": jax.default_backend(), "jax_device": jax.devices()[0].device_kind,
           "xla_cpu_devices": len(jax.devices("cpu")), "cpus_available": len(os.sched_getaffinity(0)),
           "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "")}
    return {**xla, **(genlm.threads() if genlm is not None else {})}


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    genlm = None
    if not args.skip_genlm:
        try:
            import genlm.backend  # noqa: F401
            import genlm.bytes  # noqa: F401
            import genlm.control  # noqa: F401
        except ImportError:
            sys.exit(f"compare_genlm: {GENLM_MISSING}")
        genlm = GenLM(args.torch_threads, PRECISIONS[args.precision] is not None)
    else:
        print("compare_genlm: --skip-genlm: running only the smc_jax side", file=sys.stderr)
    settings = Settings(runs=args.runs, particles=args.particles, max_tokens=args.max_tokens, prefetch=args.prefetch,
                        prefetch_rows=args.prefetch_rows, prefetch_slots=args.prefetch_slots,
                        prefetch_children=args.prefetch_children, call_costs=not args.no_call_costs)
    models, loaded = model_loader(args)

    load = {"before": os.getloadavg()}
    # Every smc_jax side runs before GenLM loads anything (see "Order" in the docstring).
    ours = {name: smc_jax_workload(name, models, settings) for name in tqdm(args.workloads, desc="smc_jax side")}
    load["after_smc_jax"] = os.getloadavg()
    theirs = {name: genlm_workload(name, models, genlm, settings) if genlm is not None else None
              for name in tqdm(args.workloads, desc="GenLM side")}
    load["after_genlm"] = os.getloadavg()
    rows = [row_of(name, ours[name], theirs[name]) for name in args.workloads]
    costs = [(name, c) for name in args.workloads for c in ours[name].get("costs", [])]
    columns = ["workload", "runs", "genlm_s", "smc_jax_s", "genlm/smc_jax", "genlm_calls", "smc_jax_calls",
               "smc_jax/genlm_calls", "lengths genlm / smc_jax", "recompiles"]
    smc_rows = [r for r in rows if "smc_jax_calls_per_run" in r]
    call_costs, cost_columns = cost_table(costs)
    appendix = "\n\n".join([
        "## Equal work: generated symbols per particle (b)\n\n"
        "Mean over each run's particles (bytes, or tokens for token SMC; EOS not counted), one value per run; "
        "the token workload generates exactly max_tokens tokens on both sides.\n\n" + markdown_table(
            smc_rows, ["workload", "genlm_run_mean_lengths", "smc_jax_run_mean_lengths", "smc_jax_steps",
                       "genlm_zero_weight_runs", "smc_jax_zero_weight_runs"]),
        "## Token SMC against one plain sample (b)\n\n"
        "smc_jax's token SMC (M particles, two prompts) against one plain sample of the same length (one "
        "particle, one prompt, the same engine); seconds: mean ± 95% t-interval, ratio with a bootstrap interval.\n\n"
        + markdown_table([r for r in rows if "plain_s" in r], ["workload", "smc_jax_s", "plain_s", "smc_jax/plain"]),
        "## Sequential model calls per run (b)\n\n" + markdown_table(
            smc_rows, ["workload", "genlm_calls_per_run", "smc_jax_calls_per_run"]),
        "## Agreement along the text (a)\n\n" + markdown_table(
            [r for r in rows if "max_conditional_diff" in r],
            ["workload", "max_conditional_diff", "at_byte", "sum_conditionals_genlm", "sum_conditionals_smc_jax",
             "max_next_logp_diff", "where", "max_next_logp_diff_without_<", "where_without_<", "next_tv"]),
        "## Profile of smc_jax (c): model forward (floor) vs everything else (means over runs)\n\n" + markdown_table(
            smc_rows, ["workload", "smc_jax_s_mean", "smc_jax_floor_s", "smc_jax_other_s", "smc_jax_wall/floor",
                       "smc_jax_sample"]),
        "## GenLM: batched forward calls (whole token contexts, no KV cache; means over runs)\n\n" + markdown_table(
            rows, ["workload", "genlm_s_mean", "genlm_forward_s", "genlm_other_s", "genlm_rows_per_call",
                   "genlm_tokens_per_row", "genlm_s_per_call", "genlm_prompt_s", "genlm_prompt_calls"]),
        "## smc_jax: seconds of one batched decode call (rows per prompt; vmapped over the prompts)\n\n"
        + markdown_table(call_costs, cost_columns),
    ])
    meta = {
        "runs": args.runs, "settings": dataclasses.asdict(settings), "device": jax.devices()[0].device_kind,
        "layers": layer_layouts(loaded.values()), "precision": args.precision, "text_prompt": TEXT_PROMPT, "prompts": PROMPTS,
        "mass_floor": MASS_FLOOR, "threads": threads_used(genlm), "load_average": load,
        "intervals": (f"times and calls: mean ± {CONFIDENCE:.0%} t-interval over runs; ratios: mean / mean with a "
                      f"{CONFIDENCE:.0%} percentile bootstrap interval ({BOOTSTRAP_RESAMPLES} resamples of each "
                      "side's runs, independently)"),
        "call_costs": call_costs,
        "genlm": None if genlm is None else {
            p: version(p) for p in ("genlm-control", "genlm-bytes", "genlm-backend", "torch", "transformers")},
    }
    notes = (
        f"smc_jax vs GenLM, same models ({PRECISION_NOTES[args.precision]}), same process (smc_jax's sides first), "
        f"on {jax.default_backend()} ({jax.devices()[0].device_kind}; GenLM on {genlm.device if genlm else 'n/a'}). "
        f"{args.runs} timed runs per side after a warm-up; seconds and calls: mean ± 95% t-interval; "
        "genlm/smc_jax: ratio of mean seconds (> 1: smc_jax is faster) and smc_jax/genlm_calls: ratio of mean "
        "sequential model calls, each with a 95% percentile bootstrap interval [low, high]. GenLM's torch at "
        f"{'its default thread count' if args.torch_threads is None else f'{args.torch_threads} thread(s)'} "
        f"({meta['threads']}). smc_jax byte prefetch: {args.prefetch} tokens, {args.prefetch_rows} extra rows, "
        f"{args.prefetch_slots} slots and {args.prefetch_children} children per particle. "
        f"smc_jax's layer weights: {', '.join(meta['layers'])}. Load average (1/5/15 min) before, between and after the sides: {load}. "
        "See the script's docstring for the conventions (same target, lengths, prompts).")
    print(save("compare_genlm", rows, columns, meta, notes, appendix))
    print(appendix)


if __name__ == "__main__":
    main()

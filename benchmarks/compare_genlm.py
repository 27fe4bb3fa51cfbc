"""smc_jax against GenLM (genlm-control, genlm-bytes, genlm-backend) on the same workloads and
models, in one process, one side after the other (issue 9).

Workloads (`--workloads`, all by default):

* bytes-smollm2, bytes-gemma3 (a): the next-byte distribution at each of the 201 positions
  along a fixed 200-byte English text after the prompt "A short story:\\n\\n" (beam width 5,
  relative prune threshold 0.05). GenLM: a genlm-bytes `ByteBeamState` prefilled with the prompt,
  then `logp_next()` and `prune() << byte` per byte. Reported besides time and calls: the largest
  |difference| of the two sides' next-byte log-probabilities (256 bytes + EOS) over the entries
  with probability >= MASS_FLOOR under either side, as is and with '<' left out (see EOS below).
* smc-prompts (b): byte-level SMC for the product of SmolLM2 under "My favorite physicist is"
  and "My favorite author is"; smc-models (b): SmolLM2 x Gemma 3, both under the physicist
  prompt. M = 10 particles, ESS threshold 0.9, multinomial resampling, beam width 5, threshold
  0.05. GenLM: `Product` of two `ByteLLM` potentials (one `AsyncTransformer` shared by the two
  prompts) and `direct_token_sampler(product).smc(...)`.
* token-prompts (reference): the same two-prompt product at the token level. GenLM: `Product` of
  two `PromptedLLM` potentials on one `AsyncTransformer`; smc_jax: level="token".

Conventions, so that both sides do the same work:

* Prompts: GenLM starts every beam from the BOS token and reads the prompt byte by byte; smc_jax
  runs with `prompt_as_bytes=True`, the same convention. The token-level reference feeds the
  prompt's token ids to both.
* Target: GenLM's `Product` is p1 * p2 (its weights add the potentials' log-weights); smc_jax's
  f="product" is the geometric mean sqrt(p1 p2) (paper, tau = 0), so smc_jax runs with a
  `CustomEnsemble` for p1 * p2: both sides sample the same target.
* Zero weight: under the product a run can end with every particle at weight 0; smc_jax runs with
  allow_zero_weight=True (it raises by default), GenLM returns such runs as they are; they are
  timed like the others and counted (zero_weight_runs).
* Length: GenLM's `max_tokens` (40) counts the end-of-sequence unit: a particle samples at most
  39 symbols and GenLM then forces EOS with its weight correction. smc_jax gets
  max_length = max_tokens - 1 with at_max_length="eos", which does exactly that.
* EOS and special tokens: GenLM's byte tries treat the byte strings of smc_jax's EOS ids as EOS.
  GenLM gives the models' other special tokens their literal text as bytes (b"<|im_start|>",
  b"<start_of_image>"), while smc_jax leaves control tokens out of the byte LM and renormalizes:
  their mass (up to 2% for Gemma 3's <start_of_image>) lands on '<' under GenLM only.
* Order: every workload's smc_jax side runs first, then every GenLM side (once GenLM had loaded
  its models and byte tries in the process, the same smc_jax runs -- same seeds, same calls --
  took 25-30% longer on this CPU).
* Runs: the median of `--runs` runs after a warm-up run (compilation for smc_jax), seeds 0, 1, ...
  Before every GenLM run its model-output cache and its byte-beam caches are cleared, so no run
  reuses another's model calls; GenLM keeps the beam after the prompt across runs (`ByteLLM`
  reads its prompt once: that one-time cost is reported as genlm_prompt_s / genlm_prompt_calls),
  and so does smc_jax (`EnsembleSampler` builds its start state once: `with_start_state`; a run's
  calls then exclude the prompt's, and smc_jax_prompt_calls is what a run still spends on it).
* Model calls: GenLM's are the batched forward passes of its `AsyncTransformer`s (counted by
  wrapping the torch model's forward; each recomputes the whole token context, as GenLM keeps
  no KV cache for them); smc_jax's are its sequential batched decode calls (`stats`).
* Floor: smc_jax's model calls times the seconds of one batched decode call of the sizes it
  used, measured here with the same model port (`smc_jax.models.paged.paged_decode`, vmapped over
  the group's prompts, the run's pool and path shapes): t(rows) = a + b * rows is fitted on the
  call sizes up to twice the typical one, and floor = calls * a + rows * b summed over the model
  groups. "Everything else" (the profile, c) is wall - floor. XLA compilations during the timed
  runs (after the warm-up) are counted with `smc_jax.utils.compilation.count_compilations`.

Writes benchmarks/results/compare_genlm.{json,md}. Needs the `genlm` extra
(pip install -e ".[genlm]") unless --skip-genlm. Run: python -m benchmarks.compare_genlm
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from importlib.metadata import version
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from benchmarks.common import markdown_table, save
from benchmarks.genlm_side import GENLM_MISSING, GenLM, byte_potentials, genlm_smc, genlm_text, token_potentials
from smc_jax import load_model
from smc_jax.api import EnsembleSampler, Expert
from smc_jax.experts.byte import ByteExperts
from smc_jax.ensemble import CustomEnsemble
from smc_jax.experts.base import ExpertStack, expert_failure
from smc_jax.models.contexts import bucket_sizes, context_stats
from smc_jax.models.lm import LanguageModel
from smc_jax.models.paged import paged_decode
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
    "bytes-smollm2": "a: next-byte distributions, SmolLM2",
    "bytes-gemma3": "a: next-byte distributions, Gemma 3",
    "smc-prompts": "b: byte SMC, SmolLM2 x 2 prompts",
    "smc-models": "b: byte SMC, SmolLM2 x Gemma 3",
    "token-prompts": "ref: token SMC, SmolLM2 x 2 prompts",
}

MASS_FLOOR = 1e-4  # agreement is measured over entries with at least this probability on a side
WARMUP_SEED = 100
DECODE_REPEATS = 5


def _log_product(log_p: jax.Array) -> jax.Array:
    return jnp.sum(log_p, axis=-1)


#: GenLM's Product target p1 * p2 (smc_jax's f="product" is the weighted geometric mean sqrt(p1 p2)).
GENLM_PRODUCT = CustomEnsemble(log_abs_f=_log_product, num_experts=2)


@dataclasses.dataclass(frozen=True)
class Settings:
    runs: int
    beam_width: int
    prune_threshold: float
    particles: int
    ess_threshold: float
    max_tokens: int  # GenLM's max_tokens: symbols plus the forced EOS


# ------------------------------------------------------------------------------------ smc_jax


def _read_text(experts: ByteExperts, data: jax.Array) -> tuple[Any, jax.Array]:
    """One sequence reads `data` byte by byte: the final state and the next-byte log-probs before
    each byte and after the last ([len + 1, 257])."""
    state = experts.init(1)

    def body(state, byte):
        logp = experts.logprobs(state)[0, 0]
        return experts.advance(state, byte[None], jnp.ones((1,), bool)), logp

    state, before = jax.lax.scan(body, state, data)
    return state, jnp.concatenate([before, experts.logprobs(state)[0, 0][None]])


read_text = jax.jit(_read_text)


@functools.partial(jax.jit, static_argnums=1)
def _init_state(group: Any, num_particles: int) -> Any:
    """A group's state before the first step (for byte experts: after reading the prompt bytes)."""
    return group.init(num_particles)


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


def groups_of(experts: Any) -> tuple:
    return experts.groups if isinstance(experts, ExpertStack) else (experts,)


def group_stats(sampler: EnsembleSampler, seed: int) -> tuple[tuple, list[dict[str, int]]]:
    """The model groups and, per group, the counters of the run `sampler(seed)` (a run is a
    function of its seed: this reruns it through the engine to read each group's store)."""
    scale = 1
    while True:  # the smallest context store that holds the run, as the sampler does
        experts = sampler.build(scale)
        state = run_jitted(sampler.smc, jax.random.key(seed), experts, sampler.ensemble)
        if expert_failure(experts, state.expert_state) is None:
            break
        scale *= 2
    states = state.expert_state if isinstance(experts, ExpertStack) else (state.expert_state,)
    groups = groups_of(experts)
    return groups, [group.stats(s) for group, s in zip(groups, states)]


def model_names(experts: Sequence[Expert]) -> list[str]:
    return list(dict.fromkeys(e.model.name for e in experts))


def smc_jax_text(model: LanguageModel, settings: Settings) -> dict[str, Any]:
    """(a) smc_jax: distributions along TEXT, wall time, model calls, floor."""
    sampler = EnsembleSampler(experts=(Expert(model, TEXT_PROMPT),), level="byte", num_particles=1,
                              max_length=len(TEXT), beam_width=settings.beam_width,
                              prune_threshold=settings.prune_threshold, prompt_as_bytes=True)
    data = jnp.asarray(np.frombuffer(TEXT, np.uint8).astype(np.int32))
    scale = 1
    while True:  # the smallest context store that holds the run, as the sampler does
        experts = sampler.build(scale)
        state, logps = jax.block_until_ready(read_text(experts, data))
        if experts.failure(state) is None:
            break
        scale *= 2
    times = []
    with count_compilations() as compiled:
        for _ in range(settings.runs):
            start = time.perf_counter()
            state, logps = jax.block_until_ready(read_text(experts, data))
            times.append(time.perf_counter() - start)
    stats = context_stats(state.stores)
    cost = CallCost.measure(model.name, experts, 1)
    return {"seconds": statistics.median(times), "times": times, "calls": stats["model_calls"],
            "floor": cost.floor(stats), "costs": [cost], "recompiles": compiled.count,
            "logprobs": np.asarray(logps, np.float64)}


def smc_jax_sampler(sampler: EnsembleSampler, settings: Settings) -> dict[str, Any]:
    """(b) smc_jax: median wall time, calls, floor and compilations of runs with seeds 0, 1, ..."""
    sampler(WARMUP_SEED, allow_zero_weight=True)
    times, calls, steps, results = [], [], [], []
    with count_compilations() as compiled:
        for seed in range(settings.runs):
            result = sampler(seed, allow_zero_weight=True)  # a run may end at zero weight, as GenLM's may
            times.append(result.stats["seconds"])
            calls.append(result.stats["model_calls"])
            steps.append(result.stats["steps"])
            results.append(result)
    per_seed = [group_stats(sampler, seed) for seed in range(settings.runs)]
    groups = per_seed[0][0]
    costs = [CallCost.measure(name, g, settings.particles) for name, g in zip(model_names(sampler.experts), groups)]
    floors = [sum(c.floor(s) for c, s in zip(costs, stats)) for _, stats in per_seed]
    prompt_calls = sum(g.stats(_init_state(g, settings.particles))["model_calls"] for g in groups)
    median_run = results[int(np.argsort(times)[len(times) // 2])]
    return {"seconds": statistics.median(times), "times": times, "calls": statistics.median(calls),
            "calls_per_run": calls, "prompt_calls": prompt_calls, "steps": statistics.median(steps), "floor": statistics.median(floors),
            "wall_over_floor": statistics.median(t / f for t, f in zip(times, floors)), "costs": costs,
            "recompiles": compiled.count, "zero_weight_runs": sum(r.log_Z == -math.inf for r in results),
            "sample": repr(median_run.posterior()[0][0])[:50] if median_run.log_Z > -math.inf else "(zero weight)"}


# --------------------------------------------------------------------------------- comparison


def max_difference(ours: np.ndarray, theirs: np.ndarray) -> tuple[float, str]:
    """Largest |log-prob difference| over entries with mass >= MASS_FLOOR on a side, and where."""
    heavy = (np.exp(ours) >= MASS_FLOOR) | (np.exp(theirs) >= MASS_FLOOR)
    with np.errstate(invalid="ignore"):  # -inf - -inf where neither side has mass
        diff = np.where(heavy, np.abs(ours - theirs), 0.0)
    position, symbol = np.unravel_index(np.argmax(diff), diff.shape)
    return float(diff.max()), f"position {position}, {'EOS' if symbol == 256 else repr(bytes([symbol]))}"


def without(logp: np.ndarray, symbol: int) -> np.ndarray:
    """The distributions with one symbol removed, renormalized."""
    kept = np.delete(logp, symbol, axis=1)
    return kept - np.logaddexp.reduce(kept, axis=1, keepdims=True)


def agreement(ours: np.ndarray, theirs: np.ndarray) -> dict[str, Any]:
    """How far apart the two sides' next-byte distributions are, as is and without '<': GenLM
    gives the models' special tokens their literal text as bytes (e.g. b"<start_of_image>"), which
    smc_jax leaves out of the byte LM, so their mass lands on '<' under GenLM only."""
    theirs = np.concatenate([theirs[:, :256], theirs[:, 257:]], axis=1)  # drop GenLM's EOT column
    diff, where = max_difference(ours, theirs)
    diff_no_lt, where_no_lt = max_difference(without(ours, ord("<")), without(theirs, ord("<")))
    return {
        "max_logp_diff": diff, "where": where, "max_logp_diff_without_<": diff_no_lt, "where_without_<": where_no_lt,
        "max_tv": float(0.5 * np.abs(np.exp(ours) - np.exp(theirs)).sum(axis=1).max()),
    }


def mean_interval(values: Sequence[float]) -> str:
    """mean ± 95% t-interval (the runs of one side; each run samples its own strings)."""
    from smc_jax.evaluation.stats import t_interval

    return t_interval([float(v) for v in values]).format(digits=1)


def workload_experts(name: str, models: Callable[[str], LanguageModel]) -> tuple[Expert, ...]:
    """The experts of an SMC workload (b)."""
    smol = models(SMOLLM2)
    if name == "smc-models":
        return (Expert(smol, PROMPTS[0]), Expert(models(GEMMA3), PROMPTS[0]))
    return (Expert(smol, PROMPTS[0]), Expert(smol, PROMPTS[1]))


def smc_jax_workload(name: str, models: Callable[[str], LanguageModel], settings: Settings) -> dict[str, Any]:
    """The smc_jax side of one workload: its measurements (the row is completed by `row_of`)."""
    if name.startswith("bytes-"):
        return smc_jax_text(models(SMOLLM2 if name == "bytes-smollm2" else GEMMA3), settings)
    level = "token" if name.startswith("token-") else "byte"
    sampler = EnsembleSampler(
        experts=workload_experts(name, models), level=level, f=GENLM_PRODUCT, num_particles=settings.particles,
        max_length=settings.max_tokens - 1, at_max_length="eos", ess_threshold=settings.ess_threshold,
        resampler="multinomial", beam_width=settings.beam_width, prune_threshold=settings.prune_threshold,
        prompt_as_bytes=level == "byte")
    return smc_jax_sampler(sampler, settings)


def genlm_workload(name: str, models: Callable[[str], LanguageModel], genlm: GenLM, settings: Settings) -> dict[str, Any]:
    """The GenLM side of one workload."""
    if name.startswith("bytes-"):
        return genlm_text(genlm, models(SMOLLM2 if name == "bytes-smollm2" else GEMMA3), settings, TEXT, TEXT_PROMPT)
    experts = workload_experts(name, models)
    make = byte_potentials(genlm, experts, settings) if name.startswith("smc-") else token_potentials(genlm, experts)
    return genlm_smc(genlm, make, settings, WARMUP_SEED)


def row_of(name: str, ours: dict[str, Any], genlm_side: dict[str, Any] | None) -> dict[str, Any]:
    """One row of the table from both sides' measurements."""
    row: dict[str, Any] = {"workload": WORKLOADS[name]}
    if name.startswith("bytes-"):
        if genlm_side is not None:
            row.update(agreement(ours["logprobs"], genlm_side["logprobs"]))
        row["smc_jax_wall/floor"] = ours["seconds"] / ours["floor"]
    else:
        row.update({"smc_jax_wall/floor": ours["wall_over_floor"], "smc_jax_sample": ours["sample"],
                    "smc_jax_calls_per_run": ours["calls_per_run"], "smc_jax_calls_mean": mean_interval(ours["calls_per_run"]),
                    "smc_jax_steps": ours["steps"], "smc_jax_prompt_calls": ours["prompt_calls"],
                    "smc_jax_zero_weight_runs": ours["zero_weight_runs"]})
        if genlm_side is not None:
            row.update({"genlm_prompt_s": genlm_side["prompt_s"], "genlm_prompt_calls": genlm_side["prompt_calls"],
                        "genlm_steps": genlm_side["steps"], "genlm_zero_weight_runs": genlm_side["zero_weight_runs"],
                        "genlm_calls_per_run": genlm_side["calls_per_run"],
                        "genlm_calls_mean": mean_interval(genlm_side["calls_per_run"])})
    row.update({
        "smc_jax_s": ours["seconds"], "smc_jax_calls": ours["calls"], "smc_jax_floor_s": ours["floor"],
        "smc_jax_other_s": ours["seconds"] - ours["floor"], "recompiles": ours["recompiles"],
        "smc_jax_times": ours["times"],
    })
    if genlm_side is not None:
        row.update({
            "genlm_s": genlm_side["seconds"], "genlm_calls": genlm_side["calls"],
            "genlm_forward_s": genlm_side["forward_s"], "genlm_other_s": genlm_side["seconds"] - genlm_side["forward_s"],
            "genlm/smc_jax": genlm_side["seconds"] / ours["seconds"],
            "genlm_rows_per_call": genlm_side["rows_per_call"], "genlm_tokens_per_row": genlm_side["tokens_per_row"],
            "genlm_s_per_call": genlm_side["seconds_per_call"], "genlm_times": genlm_side["times"],
        })
    return row


def cost_table(costs: Sequence[tuple[str, CallCost]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows (workload, model group) and columns of the per-call decode seconds."""
    sizes = sorted({rows for _, c in costs for rows in c.seconds})
    rows = [{"workload": WORKLOADS[name], "model": c.model, "prompts": c.prompts,
             **{f"rows={n}": seconds for n, seconds in c.seconds.items()},
             "fixed_s": c.fixed, "per_row_s": c.per_row} for name, c in costs]
    return rows, ["workload", "model", "prompts", *(f"rows={n}" for n in sizes), "fixed_s", "per_row_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per side after a warm-up (median)")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--skip-genlm", action="store_true", help="run only the smc_jax side")
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads for GenLM (default: torch's)")
    parser.add_argument("--max-tokens", type=int, default=40, help="GenLM's max_tokens (symbols + forced EOS)")
    parser.add_argument("--particles", type=int, default=10)
    parser.add_argument("--name", default="compare_genlm", help="results name: benchmarks/results/<name>.*")
    args = parser.parse_args()
    genlm = None
    if not args.skip_genlm:
        try:
            import genlm.backend  # noqa: F401
            import genlm.bytes  # noqa: F401
            import genlm.control  # noqa: F401
        except ImportError:
            sys.exit(f"compare_genlm: {GENLM_MISSING}")
        genlm = GenLM(args.torch_threads)
    else:
        print("compare_genlm: --skip-genlm: running only the smc_jax side", file=sys.stderr)
    settings = Settings(runs=args.runs, beam_width=5, prune_threshold=0.05, particles=args.particles,
                        ess_threshold=0.9, max_tokens=args.max_tokens)
    loaded: dict[str, LanguageModel] = {}

    def models(name: str) -> LanguageModel:
        if name not in loaded:
            loaded[name] = load_model(name)
        return loaded[name]

    # Every smc_jax side runs before GenLM loads anything (see "Order" in the docstring).
    ours = {name: smc_jax_workload(name, models, settings) for name in tqdm(args.workloads, desc="smc_jax side")}
    theirs = {name: genlm_workload(name, models, genlm, settings) if genlm is not None else None
              for name in tqdm(args.workloads, desc="GenLM side")}
    rows = [row_of(name, ours[name], theirs[name]) for name in args.workloads]
    costs = [(name, c) for name in args.workloads for c in ours[name]["costs"]]
    columns = ["workload", "genlm_s", "smc_jax_s", "genlm/smc_jax", "genlm_calls", "smc_jax_calls", "genlm_forward_s",
               "smc_jax_floor_s", "smc_jax_wall/floor", "recompiles", "max_logp_diff"]
    call_costs, cost_columns = cost_table(costs)
    appendix = "\n\n".join([
        "## Agreement of the next-byte distributions (a)\n\n" + markdown_table(
            [r for r in rows if "max_logp_diff" in r],
            ["workload", "max_logp_diff", "where", "max_logp_diff_without_<", "where_without_<", "max_tv"]),
        "## Profile of smc_jax (c): model forward (floor) vs everything else\n\n" + markdown_table(
            rows, ["workload", "smc_jax_steps", "smc_jax_calls", "smc_jax_prompt_calls", "smc_jax_s", "smc_jax_floor_s",
                   "smc_jax_other_s", "recompiles", "smc_jax_zero_weight_runs", "smc_jax_sample"]),
        "## Sequential model calls per run (b)\n\n"
        "Mean ± 95% t-interval over the runs, and each run's count. Each side samples its own strings, so "
        "single runs differ in work; over runs both sample the same target with the same proposal and beam "
        "settings, so the means compare like for like.\n\n"
        + markdown_table([r for r in rows if "smc_jax_calls_mean" in r],
                         ["workload", "genlm_calls_mean", "smc_jax_calls_mean", "genlm_calls_per_run",
                          "smc_jax_calls_per_run"]),
        "## GenLM: batched forward calls (whole token contexts, no KV cache)\n\n" + markdown_table(
            rows, ["workload", "genlm_steps", "genlm_zero_weight_runs", "genlm_calls", "genlm_forward_s", "genlm_other_s", "genlm_rows_per_call",
                   "genlm_tokens_per_row", "genlm_s_per_call", "genlm_prompt_s", "genlm_prompt_calls"]),
        "## smc_jax: seconds of one batched decode call (rows per prompt; vmapped over the prompts)\n\n"
        + markdown_table(call_costs, cost_columns),
    ])
    meta = {
        "runs": args.runs, "settings": dataclasses.asdict(settings), "smc_jax_max_length": args.max_tokens - 1,
        "text_prompt": TEXT_PROMPT, "prompts": PROMPTS, "mass_floor": MASS_FLOOR, "call_costs": call_costs,
        "genlm": None if genlm is None else {
            **{p: version(p) for p in ("genlm-control", "genlm-bytes", "genlm-backend", "torch", "transformers")},
            "torch_threads": genlm.torch.get_num_threads()},
    }
    notes = ("smc_jax vs GenLM, same models (float32 from the same GGUF files), same process (smc_jax's sides first), CPU. Seconds: median "
             f"of {args.runs} runs after a warm-up. genlm/smc_jax > 1: smc_jax is faster. Calls: sequential batched "
             "model calls. floor: smc_jax's calls x the seconds of one batched decode call of the sizes it used; "
             f"max_logp_diff: over next-byte entries with probability >= {MASS_FLOOR} on a side. See the script's "
             "docstring for the conventions.")
    print(save(args.name, rows, columns, meta, notes, appendix))
    print(appendix)


if __name__ == "__main__":
    main()

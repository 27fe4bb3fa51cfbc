"""Paths cut to each call's span against whole paths, run by run in one process (issue 18).

Each SMC workload of `compare_genlm` (byte SMC over two prompts or over two models, token SMC)
is built once and run two ways: with its models' paths cut to each call's span
(`PagedTransformer.cut_paths`, the default on CPU) and read whole. The two alternate seed by
seed (cut, whole, whole, cut, ...), so a machine whose speed drifts between minutes slows both
alike.

Run i of both ways samples the same target with the same key. Whether it also made the same
particles, weights and calls is counted (`same_runs`): with cutting, a row's logits do not
depend on the span, but the attention compiled inside the width switch may round differently
from the one compiled without it (SmolLM2: the same bits; Gemma 3: logits within 1e-4, so its
runs drift apart). Reported per workload: mean seconds and calls of each way, and cut / whole
seconds with a 95% paired percentile bootstrap interval (< 1: cutting is faster; an interval
holding 1 shows no difference).

    python -m benchmarks.bench_path_cut [--runs 8] [--precision f32|bf16-matmuls] [--workloads ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from benchmarks.common import save
from benchmarks.compare_genlm import (
    CONFIDENCE,
    PRECISIONS,
    WARMUP_SEED,
    WORKLOADS,
    Settings,
    add_layer_options,
    mean_interval,
    model_loader,
    ratio_interval,
    workload_sampler,
)
from smc_jax.experts import ExpertStack
from smc_jax.models.paged import CUT_PATHS_ON, PagedTransformer

SMC_WORKLOADS = ("smc-prompts", "smc-models", "token-prompts")


def whole_paths(experts: Any) -> Any:
    """The built expert group with every model's paths read whole."""
    if isinstance(experts, ExpertStack):
        return experts.replace(groups=tuple(whole_paths(group) for group in experts.groups))
    model = getattr(experts, "model", None)
    if isinstance(model, PagedTransformer):
        return experts.replace(model=dataclasses.replace(model, cut_paths=False))
    return experts


def timed_run(sampler: Any, experts: Any, seed: int) -> tuple[float, Any]:
    start = time.perf_counter()
    result = sampler.smc(jax.random.key(seed), experts, sampler.ensemble, allow_zero_weight=True)
    return time.perf_counter() - start, result


def same_run(a: Any, b: Any) -> bool:
    """Both runs sampled the same particles with the same weights and calls."""
    return (a.stats["model_calls"] == b.stats["model_calls"]
            and np.array_equal(np.asarray(a.log_weights), np.asarray(b.log_weights))
            and [list(map(int, s)) for s in a.sequences] == [list(map(int, s)) for s in b.sequences])


def alternate(ways: dict[str, tuple[Any, Any]], runs: int) -> dict[str, Any]:
    """Runs two ways of one workload, each a (sampler, built experts) pair: a warm-up run of each,
    then seeds 0 .. runs - 1 in alternating order (A, B, B, A, ...), so drift slows both alike.
    Returns the seconds and calls of each way, and `same_runs`: how many seeds gave both ways the
    same particles, weights and calls."""
    for sampler, experts in ways.values():
        timed_run(sampler, experts, WARMUP_SEED)
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    calls: dict[str, list[int]] = {way: [] for way in ways}
    same = 0
    for seed in range(runs):
        order = list(ways) if seed % 2 == 0 else list(ways)[::-1]
        results = {}
        for way in order:
            elapsed, results[way] = timed_run(*ways[way], seed)
            seconds[way].append(elapsed)
            calls[way].append(int(results[way].stats["model_calls"]))
        same += same_run(*results.values())
    return {"seconds": seconds, "calls": calls, "same_runs": same}


def alternation_row(name: str, runs: dict[str, Any], base: str, other: str) -> dict[str, Any]:
    """The result row of one workload's `alternate` runs: each way's mean seconds and calls
    (base first), and other / base seconds with a paired bootstrap interval."""
    seconds, calls = runs["seconds"], runs["calls"]
    ratio = ratio_interval(seconds[other], seconds[base], paired=True)
    return {
        "workload": WORKLOADS[name], "runs": len(seconds[base]), "same_runs": runs["same_runs"],
        f"{base}_calls": mean_interval(calls[base]).format(), f"{other}_calls": mean_interval(calls[other]).format(),
        f"{base}_s": mean_interval(seconds[base]).format(digits=2), f"{other}_s": mean_interval(seconds[other]).format(digits=2),
        f"{other}/{base}": ratio.format(3), "ratio": dataclasses.asdict(ratio), "seconds": seconds, "calls": calls,
    }


def alternation_notes(ways: str, settings: Settings, ratio: str, faster: str) -> str:
    """The results' notes: what the two ways are, the workloads' settings and how to read `ratio`."""
    return (
        f"{ways}, the SMC workloads of compare_genlm (M = {settings.particles}, beam {settings.beam_width} / "
        f"{settings.prune_threshold}, {settings.max_tokens} symbols), alternating seed by seed in one process after "
        f"a warm-up of each; {settings.runs} runs of each way. Seconds and calls: mean ± {CONFIDENCE:.0%} "
        f"t-interval; {ratio}: ratio of mean seconds with a {CONFIDENCE:.0%} paired percentile bootstrap interval "
        f"(< 1: {faster} is faster). Run i of both ways sampled the same target with the same key; same_runs counts "
        "the runs whose particles, weights and calls were also the same.")


def measure(name: str, models: Any, settings: Settings) -> dict[str, Any]:
    """One workload: both ways, alternating, after a warm-up run of each."""
    sampler = workload_sampler(name, models, settings)
    ways = {"cut": (sampler, sampler.build()), "whole": (sampler, whole_paths(sampler.build()))}
    return alternation_row(name, alternate(ways, settings.runs), "whole", "cut")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8, help="timed runs of each way (seeds 0, 1, ...)")
    parser.add_argument("--workloads", nargs="+", choices=SMC_WORKLOADS, default=list(SMC_WORKLOADS))
    parser.add_argument("--precision", choices=PRECISIONS, default="f32")
    parser.add_argument("--name", default=None, help="results name (default bench_path_cut_<precision>)")
    add_layer_options(parser)
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error("--runs must be at least 2 (the interval needs two runs of each way)")
    if args.whole_paths:
        parser.error("--whole-paths: this script runs both ways itself")
    if jax.default_backend() not in CUT_PATHS_ON:
        parser.error(f"paths are cut only on {CUT_PATHS_ON}, not on {jax.default_backend()}: nothing to compare")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    models, _ = model_loader(args)
    settings = Settings(runs=args.runs, call_costs=False)
    rows = [measure(name, models, settings) for name in tqdm(args.workloads, desc="workloads")]
    notes = alternation_notes(f"Paths cut to each call's span against whole paths, {args.precision}", settings,
                              "cut/whole", "cutting")
    table = save(args.name or f"bench_path_cut_{args.precision}", rows,
                 ["workload", "runs", "same_runs", "whole_calls", "cut_calls", "whole_s", "cut_s", "cut/whole"],
                 {"precision": args.precision, "settings": dataclasses.asdict(settings)}, notes)
    print(table)


if __name__ == "__main__":
    main()

"""float32 against bfloat16 matmuls, run by run in one process (issue 18).

Each SMC workload of `compare_genlm` is built twice, once on float32 models and once on the same
models with bfloat16 matmuls (`load_model(..., matmul_dtype=jnp.bfloat16)`: bfloat16 weights and
products, float32 accumulation and activations). The two alternate seed by seed (f32, bf16,
bf16, f32, ...) after a warm-up of each, so a machine whose speed drifts between minutes slows
both alike (`bench_path_cut.alternate`). Run i of both ways samples the same target with the same
key; the bfloat16 model's distributions are close to the float32 model's, not equal, so the runs
may part (`same_runs` counts those that did not). Reported per workload: mean seconds and calls
of each way, and bf16 / f32 seconds with a 95% paired percentile bootstrap interval (< 1:
bfloat16 is faster; an interval holding 1 shows no difference).

    python -m benchmarks.bench_precision [--runs 8] [--workloads ...] [--name NAME]
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from benchmarks.bench_path_cut import SMC_WORKLOADS, alternate
from benchmarks.common import save
from benchmarks.compare_genlm import (
    CONFIDENCE,
    WORKLOADS,
    Settings,
    add_layer_options,
    mean_interval,
    model_loader,
    ratio_interval,
    workload_sampler,
)

#: compare_genlm's --precision values of the two ways, baseline first.
WAYS = ("f32", "bf16-matmuls")


def measure(name: str, models: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """One workload: both precisions, alternating, after a warm-up run of each."""
    ways = {}
    for precision in WAYS:
        sampler = workload_sampler(name, models[precision], settings)
        ways[precision] = (sampler, sampler.build())
    runs = alternate(ways, settings.runs)
    seconds, calls = runs["seconds"], runs["calls"]
    base, other = WAYS
    ratio = ratio_interval(seconds[other], seconds[base], paired=True)
    return {
        "workload": WORKLOADS[name], "runs": settings.runs, "same_runs": runs["same_runs"],
        "f32_calls": mean_interval(calls[base]).format(), "bf16_calls": mean_interval(calls[other]).format(),
        "f32_s": mean_interval(seconds[base]).format(digits=2), "bf16_s": mean_interval(seconds[other]).format(digits=2),
        "bf16/f32": ratio.format(3), "ratio": dataclasses.asdict(ratio), "seconds": seconds, "calls": calls,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8, help="timed runs of each way (seeds 0, 1, ...)")
    parser.add_argument("--workloads", nargs="+", choices=SMC_WORKLOADS, default=list(SMC_WORKLOADS))
    parser.add_argument("--name", default="bench_precision", help="results name")
    add_layer_options(parser)
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error("--runs must be at least 2 (the interval needs two runs of each way)")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # One loader per precision: each loads its own copy of every model (the same files).
    models = {precision: model_loader(argparse.Namespace(**{**vars(args), "precision": precision}))[0]
              for precision in WAYS}
    settings = Settings(runs=args.runs, call_costs=False)
    rows = [measure(name, models, settings) for name in tqdm(args.workloads, desc="workloads")]
    notes = (
        f"float32 against bfloat16 matmuls (float32 accumulation and activations), the SMC workloads of compare_genlm "
        f"(M = {settings.particles}, beam {settings.beam_width} / {settings.prune_threshold}, {settings.max_tokens} "
        f"symbols), alternating seed by seed in one process after a warm-up of each; {args.runs} runs of each way. "
        f"Seconds and calls: mean ± {CONFIDENCE:.0%} t-interval; bf16/f32: ratio of mean seconds with a "
        f"{CONFIDENCE:.0%} paired percentile bootstrap interval (< 1: bfloat16 is faster). Run i of both ways "
        "sampled the same target with the same key; same_runs counts the runs whose particles, weights and calls "
        "were also the same.")
    table = save(args.name, rows, ["workload", "runs", "same_runs", "f32_calls", "bf16_calls", "f32_s", "bf16_s",
                                   "bf16/f32"], {"settings": dataclasses.asdict(settings)}, notes)
    print(table)


if __name__ == "__main__":
    main()

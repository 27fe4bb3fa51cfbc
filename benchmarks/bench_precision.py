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

from benchmarks.bench_path_cut import SMC_WORKLOADS, alternate, alternation_notes, alternation_row
from benchmarks.common import save
from benchmarks.compare_genlm import Settings, add_layer_options, model_loader, workload_sampler

#: compare_genlm's --precision value of each way -> its label in the results, baseline first.
WAYS = {"f32": "f32", "bf16-matmuls": "bf16"}


def measure(name: str, models: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """One workload: both precisions, alternating, after a warm-up run of each."""
    ways = {}
    for precision, label in WAYS.items():
        sampler = workload_sampler(name, models[precision], settings)
        ways[label] = (sampler, sampler.build())
    return alternation_row(name, alternate(ways, settings.runs), *WAYS.values())


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
    notes = alternation_notes("float32 against bfloat16 matmuls (float32 accumulation and activations)", settings,
                              "bf16/f32", "bfloat16")
    table = save(args.name, rows, ["workload", "runs", "same_runs", "f32_calls", "bf16_calls", "f32_s", "bf16_s",
                                   "bf16/f32"], {"settings": dataclasses.asdict(settings)}, notes)
    print(table)


if __name__ == "__main__":
    main()

"""Two compare_genlm runs of smc_jax side by side: did a setting make it faster (issue 18)?

`python -m benchmarks.compare_genlm --skip-genlm ... --name A` and the same with one setting
changed (`--name B`) run the same seeds 0, 1, ..., so run i of A and run i of B sample the same
target with the same key. This script pairs them by seed and reports, per workload,

    time ratio = mean(B seconds) / mean(A seconds),   calls ratio = mean(B calls) / mean(A calls),

each with a 95% *paired* percentile bootstrap interval (`compare_genlm.ratio_interval(...,
paired=True)`): one resample draws seeds with
replacement and takes both runs of every drawn seed, so the seed-to-seed spread (some samples
make more calls than others) cancels out of the interval. < 1: B is faster (makes fewer calls).
An interval that contains 1 shows no difference.

    python -m benchmarks.compare_settings benchmarks/results/A.json benchmarks/results/B.json --name A_vs_B
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import markdown_table, save
from benchmarks.compare_genlm import CONFIDENCE, ratio_interval


def _changed(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The compare_genlm settings (and precision, layers) that differ between two runs."""
    pick = lambda meta: {**meta.get("settings", {}), "precision": meta.get("precision"), "layers": meta.get("layers")}
    sa, sb = pick(a), pick(b)
    return {k: (sa.get(k), sb.get(k)) for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)}


def compare(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, tuple[Any, Any]]]:
    """Rows of the paired comparison of two compare_genlm results (their JSON), one per workload
    with smc_jax runs on both sides, and the settings that differ."""
    if a["meta"].get("settings", {}).get("runs") != b["meta"].get("settings", {}).get("runs"):
        raise ValueError("the two results have different numbers of runs: rerun them with the same --runs")
    by_workload = {row["workload"]: row for row in b["rows"] if "smc_jax_times" in row}
    rows = []
    for row_a in a["rows"]:
        row_b = by_workload.get(row_a["workload"])
        if row_b is None or "smc_jax_times" not in row_a:
            continue
        out = {"workload": row_a["workload"], "runs": len(row_a["smc_jax_times"]),
               "a_s": float(np.mean(row_a["smc_jax_times"])), "b_s": float(np.mean(row_b["smc_jax_times"]))}
        time = ratio_interval(row_b["smc_jax_times"], row_a["smc_jax_times"], paired=True)
        out.update({"b/a time": time.format(3), "time_ratio": time.value, "time_low": time.low, "time_high": time.high})
        if "smc_jax_calls_per_run" in row_a and "smc_jax_calls_per_run" in row_b:
            calls = ratio_interval(row_b["smc_jax_calls_per_run"], row_a["smc_jax_calls_per_run"], paired=True)
            out.update({"a_calls": float(np.mean(row_a["smc_jax_calls_per_run"])),
                        "b_calls": float(np.mean(row_b["smc_jax_calls_per_run"])), "b/a calls": calls.format(3),
                        "calls_ratio": calls.value, "calls_low": calls.low, "calls_high": calls.high})
        rows.append(out)
    if not rows:
        raise ValueError("no workload has smc_jax runs in both results")
    return rows, _changed(a["meta"], b["meta"])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare_settings", description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="compare_genlm result JSON of the baseline (A)")
    parser.add_argument("b", type=Path, help="compare_genlm result JSON with one setting changed (B)")
    parser.add_argument("--name", default=None, help="results name (default: print only)")
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    for path in (args.a, args.b):
        if not path.is_file():
            parser.error(f"{path} is not a file: give the .json that compare_genlm saved")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    a, b = (json.loads(p.read_text()) for p in (args.a, args.b))
    rows, changed = compare(a, b)
    columns = ["workload", "runs", "a_s", "b_s", "b/a time", "a_calls", "b_calls", "b/a calls"]
    notes = (f"A = `{args.a.name}`, B = `{args.b.name}`, paired by seed (smc_jax side only). Settings that "
             f"differ (A, B): {changed or 'none'}. Ratios B / A of mean seconds and mean calls with a "
             f"{CONFIDENCE:.0%} paired percentile bootstrap interval; < 1: B is faster.")
    if args.name:
        extra = {} if args.out is None else {"directory": args.out}
        meta = {"a": str(args.a), "b": str(args.b), "changed": changed,
                "a_machine": a["meta"].get("machine"), "b_machine": b["meta"].get("machine")}
        print(save(args.name, rows, columns, meta, notes=notes, **extra))
    else:
        print(notes + "\n\n" + markdown_table(rows, columns))


if __name__ == "__main__":
    main()

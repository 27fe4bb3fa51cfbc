"""Where a whole SMC run's time goes on the device (issue 18): one `compare_genlm` workload's
smc_jax side, timed, then run under `jax.profiler.trace` and summed from the trace.

* Timing: `--runs` runs (seeds 0, 1, ...) after a warm-up run; wall seconds, steps and model
  calls per run, compilations during the timed runs.
* Trace (`--trace-runs` more runs, seeds 0, 1, ...): every complete event of the perfetto trace,
  grouped by the trace's processes (on a GPU the device's streams apart from the host's threads).
  Per process: events and summed durations per run; its 25 largest event names; on a device,
  the copies between host and device (each device-to-host copy of a loop or branch predicate is
  a wait of the host for the device).
* `--unroll-layers` runs the layer `lax.scan` unrolled (`transformer.LAYER_SCAN_UNROLL`): on a
  GPU a rolled loop is a host round trip per layer.

Writes <out>/<name>.{json,md}, and with `--keep-trace` the trace itself as <out>/<name>.trace.json.gz.
Run: python -m benchmarks.profile_run --workload smc-prompts
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import gzip
import json
import os
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from benchmarks.common import RESULTS, markdown_table, save
from benchmarks.compare_genlm import WARMUP_SEED, WORKLOADS, Settings, workload_sampler
from smc_jax import load_model
from smc_jax.models import transformer
from smc_jax.utils.compilation import count_compilations

TOP = 25


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_run", description=__doc__.split("\n\n")[0])
    smc = [w for w in WORKLOADS if w.startswith(("smc-", "token-"))]
    parser.add_argument("--workload", choices=smc, default="smc-prompts")
    parser.add_argument("--runs", type=int, default=8, help="timed runs after a warm-up")
    parser.add_argument("--trace-runs", type=int, default=2, help="runs under the profiler (0: no trace)")
    parser.add_argument("--max-tokens", type=int, default=Settings.max_tokens)
    parser.add_argument("--unroll-layers", action="store_true", help="unroll the layer scan")
    parser.add_argument("--keep-trace", action="store_true", help="also write the perfetto trace")
    parser.add_argument("--name", default=None, help="results name (default profile_<workload>)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.trace_runs < 0 or args.max_tokens < 1:
        parser.error("--runs and --max-tokens must be >= 1, --trace-runs >= 0")
    return args


def trace_summary(events: list[dict[str, Any]], runs: int) -> list[dict[str, Any]]:
    """Per trace process: its complete events ("ph" == "X") per run, their summed milliseconds
    per run, the largest names and the host/device copies."""
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    by_process: dict[Any, collections.Counter] = collections.defaultdict(collections.Counter)
    counts: dict[Any, collections.Counter] = collections.defaultdict(collections.Counter)
    for e in events:
        if e.get("ph") == "X":
            by_process[e["pid"]][e.get("name", "")] += e.get("dur", 0) / 1e3 / runs
            counts[e["pid"]][e.get("name", "")] += 1
    rows = []
    for pid, per_name in sorted(by_process.items(), key=lambda kv: -sum(kv[1].values())):
        copies = {kind: sum(n for name, n in counts[pid].items() if kind.lower() in name.lower().replace(" ", ""))
                  / runs for kind in ("MemcpyDtoH", "MemcpyHtoD", "MemcpyDtoD")}
        rows.append({
            "process": names.get(pid, str(pid)), "events_per_run": sum(counts[pid].values()) / runs,
            "ms_per_run": sum(per_name.values()), **{f"{k}_per_run": v for k, v in copies.items()},
            "largest": [(name, round(ms, 3), counts[pid][name] / runs) for name, ms in per_name.most_common(TOP)],
        })
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    name = args.name or f"profile_{args.workload}" + ("_unrolled" if args.unroll_layers else "")
    if args.unroll_layers:
        transformer.LAYER_SCAN_UNROLL = True
    settings = Settings(runs=args.runs, max_tokens=args.max_tokens, call_costs=False)
    sampler = workload_sampler(args.workload, functools.cache(load_model), settings)  # each model loaded once
    sampler(WARMUP_SEED, allow_zero_weight=True)
    with count_compilations() as compiled:
        results = [sampler(seed, allow_zero_weight=True) for seed in range(args.runs)]
    times = [r.stats["seconds"] for r in results]
    row = {"workload": WORKLOADS[args.workload], "unrolled_layers": args.unroll_layers, "runs": args.runs,
           "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
           "steps": statistics.mean(r.stats["steps"] for r in results),
           "calls": statistics.mean(r.stats["model_calls"] for r in results), "recompiles": compiled.count,
           "times": times, "calls_per_run": [r.stats["model_calls"] for r in results]}
    row["ms_per_step"] = 1e3 * row["median_s"] / row["steps"]
    processes: list[dict[str, Any]] = []
    if args.trace_runs:
        with tempfile.TemporaryDirectory() as directory:
            options = jax.profiler.ProfileOptions()
            options.python_tracer_level = 0  # XLA's and the device's events, not every Python call
            with jax.profiler.trace(directory, create_perfetto_trace=True, profiler_options=options):
                traced = [sampler(seed, allow_zero_weight=True).stats["seconds"] for seed in range(args.trace_runs)]
            files = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)
            if not files:
                raise RuntimeError("the profiler wrote no perfetto trace")
            if args.keep_trace:
                args.out.mkdir(parents=True, exist_ok=True)
                shutil.copy(files[0], args.out / f"{name}.trace.json.gz")
            with gzip.open(files[0]) as f:
                trace = json.load(f)
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        processes = trace_summary(events, args.trace_runs)
        row["traced_s_per_run"] = statistics.mean(traced)
    columns = ["workload", "unrolled_layers", "runs", "median_s", "min_s", "max_s", "steps", "calls", "ms_per_step",
               "recompiles"]
    process_columns = ["process", "events_per_run", "ms_per_run", "MemcpyDtoH_per_run", "MemcpyHtoD_per_run"]
    appendix = "## Trace: per process, per traced run\n\n" + markdown_table(processes, process_columns)
    for p in processes[:3]:
        appendix += (f"\n\n### {p['process']}: the {TOP} largest names (ms per run, events per run)\n\n"
                     + markdown_table([{"name": n[:120], "ms_per_run": ms, "events_per_run": c}
                                       for n, ms, c in p["largest"]], ["name", "ms_per_run", "events_per_run"]))
    meta = {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "trace_runs": args.trace_runs,
            "processes": processes, "settings": vars(settings)}
    notes = (f"smc_jax's side of compare_genlm's {args.workload} on {jax.default_backend()} "
             f"({jax.devices()[0].device_kind}): {args.runs} timed runs after a warm-up, then {args.trace_runs} "
             "runs under jax.profiler.trace, summed per trace process.")
    print(save(name, [row], columns, meta, notes, appendix, directory=args.out))
    print(appendix)


if __name__ == "__main__":
    main()

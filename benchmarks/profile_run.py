"""Where a whole SMC run's time goes on the device (issue 18): one `compare_genlm` workload's
smc_jax side, timed, then run under `jax.profiler.trace` and summed from the trace.

* Timing: `--runs` runs (seeds 0, 1, ...) after a warm-up run; wall seconds, steps and model
  calls per run, compilations during the timed runs.
* Trace (`--trace-runs` more runs, seeds 0, 1, ...): every complete event of the perfetto trace,
  grouped by the trace's processes (on a GPU the device's streams apart from the host's threads).
  Per process: events and summed durations per run; its 25 largest event names; on a device,
  the copies between host and device (each device-to-host copy of a loop or branch predicate is
  a wait of the host for the device).
* `--layers split|stacked`, `--layer-loop rolled|unrolled`, `--whole-paths`, `--precision` and
  `--prefetch*` as in `compare_genlm` (default: `load_model`'s layout, a rolled layer loop, paths
  cut to each call's span, float32, prefetching off).
* By source line (`--summarize TRACE --hlo FILE`): each host event's own time (its duration less
  its children's on the same thread), summed per run by the source line that made the XLA
  operation, read from the optimized HLO of the same program. Dump it while tracing with
  `XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit__run"` and
  `--keep-trace`; FILE is DIR's `*jit__run.cpu_after_optimizations.txt`.

Writes <out>/<name>.{json,md}, and with `--keep-trace` the trace itself as <out>/<name>.trace.json.gz.
Run: python -m benchmarks.profile_run --workload smc-prompts
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from benchmarks.common import RESULTS, markdown_table, save
from benchmarks.compare_genlm import (
    WARMUP_SEED,
    WORKLOADS,
    Settings,
    add_layer_options,
    add_precision_option,
    add_prefetch_options,
    check_prefetch_options,
    layer_layouts,
    model_loader,
    workload_sampler,
)
from smc_jax.utils.compilation import count_compilations

TOP = 25


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_run", description=__doc__.split("\n\n")[0])
    smc = [w for w in WORKLOADS if w.startswith(("smc-", "token-"))]
    parser.add_argument("--workload", choices=smc, default="smc-prompts")
    parser.add_argument("--runs", type=int, default=8, help="timed runs after a warm-up")
    parser.add_argument("--trace-runs", type=int, default=2, help="runs under the profiler (0: no trace)")
    parser.add_argument("--max-tokens", type=int, default=Settings.max_tokens)
    add_layer_options(parser)
    add_precision_option(parser)
    add_prefetch_options(parser)
    parser.add_argument("--keep-trace", action="store_true", help="also write the perfetto trace")
    parser.add_argument("--summarize", type=Path, default=None,
                        help="only print the summary of a kept trace (<name>.trace.json.gz of --trace-runs runs)")
    parser.add_argument("--hlo", type=Path, default=None,
                        help="with --summarize: the dumped optimized HLO text, for the time per source line")
    parser.add_argument("--name", default=None, help="results name (default profile_<workload>)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.trace_runs < 0 or args.max_tokens < 1:
        parser.error("--runs and --max-tokens must be >= 1, --trace-runs >= 0")
    if args.summarize is not None and not args.summarize.is_file():
        parser.error(f"--summarize: no such trace file: {args.summarize}")
    if args.hlo is not None and (args.summarize is None or not args.hlo.is_file()):
        parser.error(f"--hlo needs --summarize and an existing HLO text file (got {args.hlo})")
    check_prefetch_options(parser, args)
    return args


def _is_copy(name: str, kind: str) -> bool:
    """Whether an event name is a copy of `kind` ("MemcpyDtoH", ...), spelled "MemcpyDtoH",
    "Memcpy DtoH" or "MemcpyD2H" (CUPTI on CUDA)."""
    name = name.lower().replace(" ", "")
    return kind.lower() in name or kind.lower().replace("to", "2") in name


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
        copies = {kind: sum(n for name, n in counts[pid].items() if _is_copy(name, kind)) / runs
                  for kind in ("MemcpyDtoH", "MemcpyHtoD", "MemcpyDtoD")}
        rows.append({
            "process": names.get(pid, str(pid)), "events_per_run": sum(counts[pid].values()) / runs,
            "ms_per_run": sum(per_name.values()), **{f"{k}_per_run": v for k, v in copies.items()},
            "largest": [(name, round(ms, 3), counts[pid][name] / runs) for name, ms in per_name.most_common(TOP)],
        })
    return rows


def device_idle(events: list[dict[str, Any]], module: str = "jit__run") -> dict[str, Any] | None:
    """Where a device waits: within each traced run (the host's `<module>:XLA ... module` event),
    the device's kernels and copies, their union (busy) and the gaps between them (idle), and
    the idle time summed by the name of the event that ends each gap: a launch the host was late
    with. None without a device process."""
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    device = sorted((e for e in events if e.get("ph") == "X" and "/device:" in names.get(e["pid"], "")),
                    key=lambda e: e["ts"])
    windows = [e for e in events if e.get("ph") == "X" and re.fullmatch(rf"{module}:XLA \w+ module", e.get("name", ""))
               and "/device:" not in names.get(e["pid"], "")]
    if not device or not windows:
        return None
    runs, after = [], collections.Counter()
    for window in windows:
        inside = [e for e in device if window["ts"] <= e["ts"] <= window["ts"] + window["dur"]]
        idle, end = 0.0, inside[0]["ts"] if inside else window["ts"]
        for e in inside:
            if e["ts"] > end:
                idle += e["ts"] - end
                after[e["name"]] += (e["ts"] - end) / 1e3 / len(windows)
            end = max(end, e["ts"] + e["dur"])
        span = (end - inside[0]["ts"]) if inside else 0.0
        runs.append({"wall_ms": window["dur"] / 1e3, "device_events": len(inside), "busy_ms": (span - idle) / 1e3,
                     "idle_ms": idle / 1e3})
    mean = {k: statistics.mean(r[k] for r in runs) for k in runs[0]}
    return {**mean, "idle_before": [(n, round(ms, 3)) for n, ms in after.most_common(TOP)]}


def summarize(events: list[dict[str, Any]], runs: int) -> tuple[list[dict[str, Any]], dict[str, Any] | None, str]:
    """trace_summary and device_idle of a trace's events, and their markdown."""
    processes, idle = trace_summary(events, runs), device_idle(events)
    process_columns = ["process", "events_per_run", "ms_per_run", "MemcpyDtoH_per_run", "MemcpyHtoD_per_run"]
    text = "## Trace: per process, per traced run\n\n" + markdown_table(processes, process_columns)
    if idle is not None:
        text += ("\n\n## The device's busy and idle time per traced run\n\n"
                 + markdown_table([idle], ["wall_ms", "device_events", "busy_ms", "idle_ms"])
                 + f"\n\nIdle milliseconds per run by the event that ends the gap (the {TOP} largest):\n\n"
                 + markdown_table([{"name": n[:120], "idle_ms_before": ms} for n, ms in idle["idle_before"]],
                                  ["name", "idle_ms_before"]))
    for p in processes[:3]:
        text += (f"\n\n### {p['process']}: the {TOP} largest names (ms per run, events per run)\n\n"
                 + markdown_table([{"name": n[:120], "ms_per_run": ms, "events_per_run": c}
                                   for n, ms, c in p["largest"]], ["name", "ms_per_run", "events_per_run"]))
    return processes, idle, text


def self_times(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
    """Each complete event with its own microseconds: its duration less those of the events
    nested in it on the same thread (a loop's time is then its body's operations', counted once)."""
    threads: dict[Any, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            threads[e["pid"], e.get("tid")].append(e)
    own: list[tuple[dict[str, Any], float]] = []
    for thread in threads.values():
        thread.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list[Any]] = []  # [event, own time]
        for e in thread:
            while stack and stack[-1][0]["ts"] + stack[-1][0]["dur"] <= e["ts"]:
                own.append(tuple(stack.pop()))
            if stack:
                stack[-1][1] -= e["dur"]
            stack.append([e, e["dur"]])
        own.extend(tuple(x) for x in stack)
    return own


def hlo_sources(text: str) -> dict[str, str]:
    """Operation name -> "file:line function" of the innermost Python frame that made it, from
    an optimized HLO text dump (its FileNames, FunctionNames, FileLocations and StackFrames)."""
    def table(section: str) -> list[str]:
        match = re.search(rf"^{section}\n(.*?)(?:\n\n|\Z)", text, re.M | re.S)
        return match.group(1).splitlines() if match else []
    files = {int(n): v.strip('"') for n, v in (line.split(None, 1) for line in table("FileNames"))}
    functions = {int(n): v.strip('"') for n, v in (line.split(None, 1) for line in table("FunctionNames"))}
    locations = {}
    for line in table("FileLocations"):
        m = re.match(r"(\d+) \{file_name_id=(\d+) function_name_id=(\d+) line=(\d+)", line)
        if m:
            path = re.sub(r"^.*?/(smc_jax|benchmarks|jax)/", r"\1/", files[int(m[2])])
            locations[int(m[1])] = f"{path}:{m[4]} {functions[int(m[3])]}"
    frames = {int(m[1]): locations.get(int(m[2]), "?") for m in
              (re.match(r"(\d+) \{file_location_id=(\d+)", line) for line in table("StackFrames")) if m}
    return {m[1]: frames.get(int(m[2]), "?") for m in re.finditer(
        r"^\s*(?:ROOT )?%([\w.\-]+) = [^\n]*?stack_frame_id=(\d+)", text, re.M)}


def time_by_source(events: list[dict[str, Any]], sources: dict[str, str], runs: int) -> list[tuple[str, float]]:
    """Own milliseconds per run of the host's events, by the source line of their operation
    (the event name where the HLO has none); the host's waits for a whole program are left out."""
    by_line: collections.Counter = collections.Counter()
    for e, own in self_times(events):
        if "wait for completion" not in e.get("name", ""):
            by_line[sources.get(e["name"], e["name"])] += own / 1e3 / runs
    return by_line.most_common()


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    with gzip.open(path) as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    name = args.name or f"profile_{args.workload}"
    if args.summarize is not None:  # a kept trace: no model, no run
        runs, events = max(args.trace_runs, 1), read_trace(args.summarize)
        _, _, text = summarize(events, runs)
        if args.hlo is not None:
            lines = time_by_source(events, hlo_sources(args.hlo.read_text()), runs)
            text += (f"\n\n## Own time per run by source line (the {TOP} largest of "
                     f"{sum(ms for _, ms in lines):.0f} ms)\n\n"
                     + markdown_table([{"source": n[:120], "ms_per_run": round(ms, 2)} for n, ms in lines[:TOP]],
                                      ["source", "ms_per_run"]))
        print(text)
        return
    models, loaded = model_loader(args)
    settings = Settings(runs=args.runs, max_tokens=args.max_tokens, call_costs=False, prefetch=args.prefetch,
                        prefetch_rows=args.prefetch_rows, prefetch_slots=args.prefetch_slots,
                        prefetch_children=args.prefetch_children)
    sampler = workload_sampler(args.workload, models, settings)
    sampler(WARMUP_SEED, allow_zero_weight=True)
    with count_compilations() as compiled:
        results = [sampler(seed, allow_zero_weight=True) for seed in range(args.runs)]
    times = [r.stats["seconds"] for r in results]
    row = {"workload": WORKLOADS[args.workload], "layers": " / ".join(layer_layouts(loaded.values())),
           "precision": args.precision, "runs": args.runs,
           "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
           "steps": statistics.mean(r.stats["steps"] for r in results),
           "calls": statistics.mean(r.stats["model_calls"] for r in results), "recompiles": compiled.count,
           "times": times, "calls_per_run": [r.stats["model_calls"] for r in results]}
    row["ms_per_step"] = 1e3 * row["median_s"] / row["steps"]
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
            events = read_trace(files[0])
        row["traced_s_per_run"] = statistics.mean(traced)
    processes, idle, appendix = summarize(events, args.trace_runs) if args.trace_runs else ([], None, "")
    columns = ["workload", "layers", "precision", "runs", "median_s", "min_s", "max_s", "steps", "calls", "ms_per_step",
               "recompiles"]
    meta = {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "trace_runs": args.trace_runs,
            "processes": processes, "device_idle": idle, "settings": vars(settings),
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}
    notes = (f"smc_jax's side of compare_genlm's {args.workload} on {jax.default_backend()} "
             f"({jax.devices()[0].device_kind}): {args.runs} timed runs after a warm-up, then {args.trace_runs} "
             f"runs under jax.profiler.trace, summed per trace process. XLA_FLAGS: '{meta['XLA_FLAGS']}'.")
    print(save(name, [row], columns, meta, notes, appendix, directory=args.out))
    print(appendix)


if __name__ == "__main__":
    main()

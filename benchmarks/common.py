"""Shared benchmark plumbing: machine facts, timing with warm-up and medians, result files.

Every script prints a markdown table and saves `benchmarks/results/<script>.json` and `.md`
(one pair per script, overwritten by a rerun), with the run's date and commit in their meta.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parents[1]


#: The vector extensions that change what XLA:CPU and torch generate for matmuls.
_ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")


def cpu_model() -> dict[str, Any]:
    """The CPU's model name and vector extensions (Linux /proc/cpuinfo; empty elsewhere): the
    same script's timings have differed 2-5x between hosts of one cloud machine type."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    return {"cpu_model": fields.get("model name", ""), "isa": [f for f in _ISA_FLAGS if f in flags]}


def commit() -> str:
    """`git rev-parse HEAD` of this checkout, with "-dirty" when `git status --porcelain` lists
    changes outside the result folders; "unknown" without git or outside a repository."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        # Result files are left out: a script that saves more than once would mark itself.
        status = subprocess.run(["git", "status", "--porcelain", "--", ".", ":!benchmarks/results", ":!evaluation/results"],
                                cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        # A copied tree without .git (another machine's run): the commit it was copied at, if told.
        return os.environ.get("SMC_JAX_BENCH_COMMIT", "unknown")
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def run_facts() -> dict[str, str]:
    """When and from what code a result was measured: `date` (UTC, ISO 8601) and `commit`."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit()}


def device_label() -> str:
    """The device a run computes on: "cpu", or the accelerator's kind (e.g. "NVIDIA H200").
    Scripts that keep rows from earlier runs keep each device's rows apart by it."""
    import jax

    device = jax.devices()[0]
    return "cpu" if device.platform == "cpu" else device.device_kind


class DeviceBusy:
    """The fraction of wall time a GPU was running a kernel while the block ran: NVML's
    utilization (the share of its last sample period, 1/6 to 1 s, with a kernel executing),
    polled every 50 ms and averaged. `fraction` stays None without an NVIDIA GPU or pynvml."""

    def __init__(self, period: float = 0.05):
        self.period, self.fraction, self._samples = period, None, []

    def __enter__(self) -> DeviceBusy:
        import threading

        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no pynvml, no driver or no GPU: nothing to read
            self._thread = None
            return self
        self._stop = threading.Event()

        def poll() -> None:
            while not self._stop.wait(self.period):
                self._samples.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100)

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            if self._samples:
                self.fraction = round(statistics.fmean(self._samples), 3)


def machine() -> dict[str, Any]:
    import jax

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        **cpu_model(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
        "load_average": os.getloadavg(),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", ""),
    }


def timed(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> tuple[float, list[float], Any]:
    """Median seconds of `repeats` calls after `warmup` calls (each call must block until done)."""
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times, out


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return str(v).replace("|", "\\|")  # a literal | (e.g. |x|) must not split the cell

    lines = ["| " + " | ".join(fmt(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def kept_rows(name: str, remeasured: Callable[[dict[str, Any]], bool],
              device: str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows of results/<name>.json that this run does not measure again (`remeasured(row)`
    False), each with `measured` (the date and commit of the run that measured it), and that
    run's meta; ([], {}) without a saved file. A script that reruns part of its cases keeps the
    rest this way. With `device` (`device_label()`), rows are per device: another device's rows
    are always kept, and a row without one is the CPU's (it gets `device` "cpu")."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return [], {}
    saved = json.loads(path.read_text())
    if device is not None:
        saved["rows"] = [dict(row, device=row.get("device", "cpu")) for row in saved["rows"]]
    again = lambda row: remeasured(row) and (device is None or row["device"] == device)
    old = [dict(row) for row in saved["rows"] if not again(row)]
    for row in old:
        row.setdefault("measured", f"{saved['meta']['date']} at {saved['meta']['commit']}")
    return old, saved["meta"]


def save(name: str, rows: Sequence[dict[str, Any]], columns: Sequence[str], meta: dict[str, Any], notes: str = "",
         appendix: str = "", directory: Path | str = RESULTS, extra: dict[str, Any] | None = None) -> str:
    """Writes <directory>/<name>.json (meta: the run's date, commit and machine, then `meta`; the
    rows; the `extra` keys) and <directory>/<name>.md; returns the table. A benchmark script saves
    under its module name in results/ (the default directory). `appendix` (markdown, e.g. further
    tables) goes after the table, before the settings."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    info = {**run_facts(), "machine": machine(), **meta}
    data = {"meta": info, "rows": list(rows), **(extra or {})}
    (directory / f"{name}.json").write_text(json.dumps(data, indent=2, default=str))
    table = markdown_table(rows, columns)
    header = f"# {name}\n\n" + (notes.strip() + "\n\n" if notes else "")
    settings = "\n".join(f"- {k}: {v}" for k, v in info.items() if k != "machine")
    tail = "\n\n" + appendix.strip() if appendix else ""
    body = f"{header}{table}{tail}\n\nSettings:\n{settings}\n- machine: {info['machine']}\n"
    (directory / f"{name}.md").write_text(body)
    return table

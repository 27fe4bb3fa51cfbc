"""Shared benchmark plumbing: machine facts, timing with warm-up and medians, result files.

Every script prints a markdown table and saves `benchmarks/results/<name>.json` and `.md`.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


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


def save(name: str, rows: Sequence[dict[str, Any]], columns: Sequence[str], meta: dict[str, Any], notes: str = "",
         appendix: str = "", directory: Path | str = RESULTS) -> str:
    """Writes <directory>/<name>.json (rows + meta + machine) and <directory>/<name>.md (directory:
    results/ unless given); returns the table. `appendix` (markdown, e.g. further tables) goes
    after the table, before the settings."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    info = {"machine": machine(), **meta}
    (directory / f"{name}.json").write_text(json.dumps({"meta": info, "rows": list(rows)}, indent=2, default=str))
    table = markdown_table(rows, columns)
    header = f"# {name}\n\n" + (notes.strip() + "\n\n" if notes else "")
    settings = "\n".join(f"- {k}: {v}" for k, v in info.items() if k != "machine")
    extra = "\n\n" + appendix.strip() if appendix else ""
    body = f"{header}{table}{extra}\n\nSettings:\n{settings}\n- machine: {info['machine']}\n"
    (directory / f"{name}.md").write_text(body)
    return table

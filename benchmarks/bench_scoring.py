"""Scoring text line by line: compilations, time per call and memory mappings, per model.

About 5,000 bytes of varied lines (10-200 bytes each: prose, code, numbers, non-ASCII), each
scored with `smc_jax.logprob` after the lines before it as its prompt (the last ones that fit
in 1,000 bytes; the first line after BOS alone), as a user teacher-forcing a document would.
Each model runs in fresh processes with an empty XLA cache of their own: first the whole text
(cold: every program is compiled), then one line in a second process (warm cache: programs are
loaded). Reports XLA compilations (`smc_jax.utils.compilation`), seconds of the first and later
calls, the most memory mappings seen (lines of /proc/self/maps) and lines given probability 0.
Writes benchmarks/results/bench_scoring.{json,md}.

Run: python -m benchmarks.bench_scoring [--bytes 5000] [--models smollm2-135m-instruct gemma3-270m]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROSE = (
    "the a cat dog runs quickly over lazy river bright morning returns value list of numbers data model "
    "token byte string beam heal while under every small house people said that it was late again"
).split()
CODE = ["def", "f(x):", "return", "x + 1", "for i in range(10):", "{\"a\": 1}", "print(x)", "if", "else:", "None", "==", "[]"]
OTHER = ["café", "naïve", "über", "東京", "Ünïcode", "3.14", "42", "1,000", "—", "«ok»", "2026-11-29", "#7"]
#: Prompts hold the previous lines that fit in this many bytes.
PROMPT_BYTES = 1000


def lines(total: int, seed: int = 0) -> list[str]:
    """Lines of 10-200 bytes, about `total` bytes in all, mixing prose, code and other tokens."""
    rng = random.Random(seed)
    out, size = [], 0
    while size < total:
        target = rng.randint(10, 200)
        pool = rng.choice([PROSE, PROSE, CODE, PROSE + OTHER])
        line = rng.choice(pool).capitalize()
        while len(line.encode()) < target:
            word = rng.choice(pool)
            if len((line + " " + word).encode()) > 200:
                break
            line += " " + word
        out.append(line)
        size += len(line.encode())
    return out


def prompt_before(text: list[str], i: int) -> str:
    """The lines before line i that fit in PROMPT_BYTES (whole lines, newline-terminated)."""
    prompt = ""
    for line in reversed(text[:i]):
        if len((line + "\n" + prompt).encode()) > PROMPT_BYTES:
            break
        prompt = line + "\n" + prompt
    return prompt


def maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def child(model_name: str, total: int, count: int, out: str) -> None:
    """Scores the first `count` lines (all if 0) in this process; writes per-call records."""
    from smc_jax import load_model, logprob
    from smc_jax.utils.compilation import count_compilations

    start = time.perf_counter()
    model = load_model(model_name)
    loaded = time.perf_counter() - start
    text = lines(total)
    calls = []
    for i, line in enumerate(text[: count or None]):
        with count_compilations() as compiles:
            t = time.perf_counter()
            result = logprob(model, line, prompt=prompt_before(text, i))
            seconds = time.perf_counter() - t
        calls.append({"bytes": len(line.encode()), "prompt_bytes": len(prompt_before(text, i).encode()),
                      "seconds": seconds, "compilations": compiles.count, "compile_seconds": compiles.seconds,
                      "maps": maps(), "zero": not bool(result.complete > -float("inf")), "healed": result.healed})
        print(f"{model_name} line {i}: {calls[-1]}", file=sys.stderr, flush=True)
    with open(out, "w") as f:
        json.dump({"load_seconds": loaded, "calls": calls}, f)


def run_child(model_name: str, total: int, count: int, cache: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache)
        subprocess.run([sys.executable, "-m", "benchmarks.bench_scoring", "--child", model_name, "--bytes", str(total),
                        "--count", str(count), "--out", out.name], env=env, check=True)
        with open(out.name) as f:
            return json.load(f)


def summary(model_name: str, cold: dict, warm: dict) -> dict:
    calls = cold["calls"]
    later = [c["seconds"] for c in calls[1:]]
    later_bytes = sum(c["bytes"] for c in calls[1:])
    return {
        "model": model_name, "lines": len(calls), "bytes": sum(c["bytes"] for c in calls),
        "compilations": sum(c["compilations"] for c in calls),
        "compile_s": sum(c["compile_seconds"] for c in calls),
        "first_call_s_cold": calls[0]["seconds"], "first_call_s_warm_cache": warm["calls"][0]["seconds"],
        "later_calls_compiling": sum(c["compilations"] > 0 for c in calls[1:]),
        "later_call_median_s": statistics.median(later), "later_call_max_s": max(later),
        "ms_per_byte_later": 1000 * sum(later) / later_bytes,
        "max_maps": max(c["maps"] for c in calls), "zero_prob_lines": sum(c["zero"] for c in calls),
        "healed_bytes": sum(c["healed"] for c in calls), "load_s": cold["load_seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_scoring", description=__doc__)
    parser.add_argument("--bytes", type=int, default=5000, help="about this many bytes of text")
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.bytes, args.count, args.out)
    from benchmarks.common import save

    rows, calls = [], {}
    for name in args.models:
        with tempfile.TemporaryDirectory() as cache:  # this model's programs only: cold, then warm
            cold = run_child(name, args.bytes, 0, cache)
            warm = run_child(name, args.bytes, 1, cache)
        rows.append(summary(name, cold, warm))
        calls[name] = cold["calls"]
        print(rows[-1], flush=True)
    text = lines(args.bytes)
    notes = (
        f"{len(text)} lines, {sum(len(t.encode()) for t in text)} bytes (lines of "
        f"{min(len(t.encode()) for t in text)}-{max(len(t.encode()) for t in text)} bytes), each scored by "
        f"`smc_jax.logprob` after the previous lines that fit in {PROMPT_BYTES} bytes, default beam (width 5, "
        "threshold 0.05), healing on. Cold: a fresh process with an empty XLA cache scores every line "
        "(compilations, compile seconds and maps are that process's); warm cache: a second process scores the "
        "first line. later_call: lines after the first. max_maps: most /proc/self/maps lines after any call."
    )
    columns = list(rows[0])
    print(save("bench_scoring", rows, columns, {"bytes": args.bytes, "prompt_bytes": PROMPT_BYTES}, notes,
               extra={"calls": calls}))


if __name__ == "__main__":
    main()

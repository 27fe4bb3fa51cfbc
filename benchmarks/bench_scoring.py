"""Scoring text line by line: compilations, time per call and memory mappings, per model.

About 5,000 bytes of varied lines (10-200 bytes each: prose, code, numbers, non-ASCII), each
scored with `smc_jax.logprob` after the lines before it as its prompt (the last ones that fit
in 1,000 bytes; the first line after BOS alone), as a user teacher-forcing a document would.
Each model runs in fresh processes with an empty XLA cache of their own: first the whole text
(cold: every program is compiled), then one line in a second process (warm cache: programs are
loaded). Reports XLA compilations (`smc_jax.utils.compilation`), seconds of the first and later
calls, the most memory mappings seen (lines of /proc/self/maps) and lines given probability 0.
The models in --bf16-matmuls run a second time with bfloat16 weight matmuls
(`load_model(..., matmul_dtype=jnp.bfloat16)`, the CLI's --bf16-matmuls).
Writes benchmarks/results/bench_scoring.{json,md}.

Run: python -m benchmarks.bench_scoring [--bytes 5000] [--models smollm2-135m-instruct gemma3-270m]
[--bf16-matmuls smollm2-135m-instruct]
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
from functools import partial

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


def load(model_name: str, matmuls: str):
    """The model, its weight matmuls in `matmuls` ("float32": as loaded)."""
    from smc_jax import load_model

    return load_model(model_name, **({} if matmuls == "float32" else {"matmul_dtype": matmuls}))


def child(model_name: str, total: int, count: int, out: str, matmuls: str) -> None:
    """Scores the first `count` lines (all if 0) in this process; writes per-call records."""
    from smc_jax import logprob
    from smc_jax.utils.compilation import count_compilations

    start = time.perf_counter()
    model = load(model_name, matmuls)
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
                      "maps": maps(), "zero": not bool(result.complete > -float("inf")), "healed": result.healed,
                      "model_calls": result.model_calls, "rows": result.rows})
        print(f"{model_name} line {i}: {calls[-1]}", file=sys.stderr, flush=True)
    with open(out, "w") as f:
        json.dump({"load_seconds": loaded, "calls": calls}, f)


#: The line `profile_child` profiles: a later call of about median length (104 bytes) after a
#: full window of previous lines (914 bytes).
PROFILED_LINE = 19


def profile_child(model_name: str, total: int, out: str, matmuls: str) -> None:
    """Scores lines up to PROFILED_LINE, then that line again twice (nothing compiles then): its
    three stages timed apart (the prompt's prefill, the start with its guiding call, the reading
    program's runs), then under `jax.profiler`; writes its seconds by stage and the reading's by part.
    Run with XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true."""
    import glob

    import jax

    from benchmarks.compile_profile import runtime_parts
    from smc_jax import scoring
    from smc_jax.scoring import ByteScorer
    from smc_jax.utils import compilation

    compilation.program_store = lambda: None  # the plain jit's programs: their HLO names the trace's kernels
    model, text = load(model_name, matmuls), lines(total)
    scorer = ByteScorer(model)  # logprob's scorer: the default settings
    read, seen = scorer._read, []

    class Recorded:  # the reading program, its last arguments kept (copies: the state is donated)
        trace, precompile = read.trace, read.precompile

        def __call__(self, *args):
            seen[:] = [args[:1] + tuple(jax.tree.map(jax.numpy.copy, args[1:]))]
            return read(*args)

    scorer._read = Recorded()
    for i in range(PROFILED_LINE + 1):
        scorer(text[i], prompt_before(text, i))
    hlo = read.lower(*seen[-1]).compile().as_text()
    stages: dict[str, float] = {}

    def timed(stage, fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            result = jax.block_until_ready(fn(*args, **kwargs))
            stages[stage] = stages.get(stage, 0.0) + time.perf_counter() - start
            return result
        return run

    prefill, begin = scoring.prefill_prompts, scorer._start
    scoring.prefill_prompts, scorer._start, scorer._read = timed("prefill_s", prefill), timed("start_s", begin), timed(
        "read_s", read)
    scorer(text[PROFILED_LINE], prompt_before(text, PROFILED_LINE))
    scoring.prefill_prompts, scorer._start, scorer._read = prefill, begin, read
    with tempfile.TemporaryDirectory() as trace:
        jax.profiler.start_trace(trace, create_perfetto_trace=True)
        start = time.perf_counter()
        scorer(text[PROFILED_LINE], prompt_before(text, PROFILED_LINE))
        seconds = time.perf_counter() - start
        jax.profiler.stop_trace()
        parts = runtime_parts(glob.glob(f"{trace}/**/perfetto_trace.json.gz", recursive=True)[0], hlo)
    with open(out, "w") as f:
        json.dump({"line": PROFILED_LINE, "bytes": len(text[PROFILED_LINE].encode()), "seconds": seconds,
                   "stages": stages, "parts": parts}, f)


def run_child(model_name: str, total: int, count: int, cache: str, matmuls: str, profile: bool = False) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache)
        if profile:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true").strip()
        subprocess.run([sys.executable, "-m", "benchmarks.bench_scoring", "--child", model_name, "--bytes", str(total),
                        "--count", str(count), "--out", out.name, "--matmuls", matmuls] + (["--profile"] if profile else []),
                       env=env, check=True)
        with open(out.name) as f:
            return json.load(f)


def summary(model_name: str, matmuls: str, cold: dict, warm: dict, profiled: dict) -> dict:
    calls = cold["calls"]
    later = [c["seconds"] for c in calls[1:]]
    steady = [c for c in calls[1:] if not c["compilations"]]  # later calls that compiled nothing
    steady_s, steady_bytes = sum(c["seconds"] for c in steady), sum(c["bytes"] for c in steady)
    forwards = sum(c["model_calls"] for c in steady)
    parts = profiled["parts"]
    return {
        "model": model_name, "matmuls": matmuls, "lines": len(calls), "bytes": sum(c["bytes"] for c in calls),
        "compilations": sum(c["compilations"] for c in calls),
        "compile_s": sum(c["compile_seconds"] for c in calls),
        "first_call_s_cold": calls[0]["seconds"], "first_call_s_warm_cache": warm["calls"][0]["seconds"],
        "later_calls_compiling": sum(c["compilations"] > 0 for c in calls[1:]),
        "later_call_median_s": statistics.median(later), "later_call_max_s": max(later),
        "ms_per_byte_later": 1000 * steady_s / steady_bytes,
        "forwards_per_byte": forwards / steady_bytes, "rows_per_forward": sum(c["rows"] for c in steady) / forwards,
        "ms_per_forward": 1000 * steady_s / forwards,
        **{f"line{PROFILED_LINE}_{stage}": seconds for stage, seconds in profiled["stages"].items()},
        "read_forward_share": parts.get("model forward", 0.0) / sum(parts.values()),
        "max_maps": max(c["maps"] for c in calls), "zero_prob_lines": sum(c["zero"] for c in calls),
        "healed_bytes": sum(c["healed"] for c in calls), "load_s": cold["load_seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_scoring", description=__doc__)
    parser.add_argument("--bytes", type=int, default=5000, help="about this many bytes of text")
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    parser.add_argument("--bf16-matmuls", nargs="*", default=["smollm2-135m-instruct"],
                        help="models also run with bfloat16 weight matmuls")
    parser.add_argument("--matmuls", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run = profile_child if args.profile else partial(child, count=args.count)
        return run(args.child, args.bytes, out=args.out, matmuls=args.matmuls)
    from benchmarks.common import markdown_table, save

    rows, calls, profiles = [], {}, {}
    runs = [(name, "float32") for name in args.models] + [(name, "bfloat16") for name in args.bf16_matmuls]
    for name, matmuls in runs:
        label = name if matmuls == "float32" else f"{name}, {matmuls} matmuls"
        with tempfile.TemporaryDirectory() as cache:  # this model's programs only: cold, then warm
            cold = run_child(name, args.bytes, 0, cache, matmuls)
            warm = run_child(name, args.bytes, 1, cache, matmuls)
            profiles[label] = run_child(name, args.bytes, 0, cache, matmuls, profile=True)
        rows.append(summary(name, matmuls, cold, warm, profiles[label]))
        calls[label] = cold["calls"]
        print(rows[-1], flush=True)
    text = lines(args.bytes)
    notes = (
        f"{len(text)} lines, {sum(len(t.encode()) for t in text)} bytes (lines of "
        f"{min(len(t.encode()) for t in text)}-{max(len(t.encode()) for t in text)} bytes), each scored by "
        f"`smc_jax.logprob` after the previous lines that fit in {PROMPT_BYTES} bytes, default beam (width 5, "
        "threshold 0.05), healing on. matmuls: the weight matmuls' dtype (bfloat16: `load_model(..., "
        "matmul_dtype=jnp.bfloat16)`, log-probabilities within bfloat16's rounding). Cold: a fresh process with "
        "an empty XLA cache scores every line (compilations, compile seconds and maps are that process's); warm cache: a second process scores the "
        "first line. later_call: lines after the first. ms_per_byte_later, forwards_per_byte (model forwards, "
        "`ByteLogprob.model_calls`), rows_per_forward and ms_per_forward: over the later calls that compiled "
        "nothing. max_maps: most /proc/self/maps lines after any call. "
        f"line{PROFILED_LINE}_*: line {PROFILED_LINE} scored again in a third process, its stages timed apart: the "
        "prompt's prefill, the start (the guiding call: the contexts of the line's own tokenization and those one "
        "token off it) and the reading program's runs. read_forward_share: the model forward's share of the "
        "reading's kernel time under `jax.profiler` (appendix: seconds by part, summed over threads)."
    )
    names = list(profiles)
    part_rows = [{"part": part, **{n: profiles[n]["parts"].get(part, 0.0) for n in names}}
                 for part in sorted({p for n in names for p in profiles[n]["parts"]},
                                    key=lambda p: -max(profiles[n]["parts"].get(p, 0.0) for n in names))]
    appendix = (f"## seconds by part of line {PROFILED_LINE}'s reading ({profiles[names[0]]['bytes']} bytes), profiled\n\n"
                + markdown_table(part_rows, ["part", *names]))
    columns = list(rows[0])
    print(save("bench_scoring", rows, columns, {"bytes": args.bytes, "prompt_bytes": PROMPT_BYTES}, notes,
               appendix=appendix, extra={"calls": calls, "profiles": profiles}))


if __name__ == "__main__":
    main()

"""JAX port vs transformers PyTorch eager on CPU, for the two embedded GGUF models.

Measured per model and side: load time, peak resident memory, prefill throughput (one prompt)
and greedy decode throughput with a KV cache at batch 1 and batch DECODE_BATCH (rows continuing
one prompt). Each measurement runs in a fresh subprocess per side ("worker"), the sides take turns
(ROUNDS rounds), each timing is repeated REPS times after a warm-up (compilation, first-call
allocation) that is not timed, and medians are reported.

Threads: PyTorch runs with OMP_NUM_THREADS=1 / torch.set_num_threads(1) (with two threads it
slows down erratically when another process is busy). XLA runs with its defaults: its CPU client
spreads large matmuls over an Eigen thread pool with one thread per core (2 here).

    python -m benchmarks.bench_models            # writes benchmarks/results/bench_models.{json,md}
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, ROOT, run_facts

MODELS = ("smollm2-135m-instruct", "gemma3-270m")
SIDES = ("jax", "jax_split", "torch")
ROUNDS = 2
REPS = 5
PROMPT_TOKENS = 128
DECODE_PROMPT_TOKENS = 64
DECODE_STEPS = 16
DECODE_BATCH = 16
THREADS = "1"


def _median_seconds(fn, reps: int = REPS, warmup: list | None = None) -> float:
    start = time.perf_counter()
    fn()  # warm-up: compilation / first-call allocations, not in the median
    if warmup is not None:
        warmup.append(time.perf_counter() - start)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _prompt_ids(vocab: int, n: int) -> list[int]:
    """A fixed pseudo-random prompt (the same for both sides)."""
    return np.random.default_rng(0).integers(1000, min(vocab, 30000), size=n).tolist()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_jax(model_name: str, split_layers: bool = False) -> dict:
    import jax
    import jax.numpy as jnp
    from smc_jax.models import load_model
    from smc_jax.models.lm import decode_step

    start = time.perf_counter()
    model = load_model(model_name, split_layers=split_layers)
    load = time.perf_counter() - start
    config, params = model.config, model.params
    prompt = _prompt_ids(config.vocab_size, PROMPT_TOKENS)
    warmup: list[float] = []
    prefill = _median_seconds(lambda: jax.block_until_ready(model.prefill(prompt)), warmup=warmup)
    prefix, first = model.prefill(_prompt_ids(config.vocab_size, DECODE_PROMPT_TOKENS))

    def decode(rows: int) -> float:
        def run() -> None:
            cache = model.new_cache(rows, DECODE_STEPS)
            tokens = jnp.broadcast_to(jnp.argmax(first).astype(jnp.int32), (rows,))
            for _ in range(DECODE_STEPS):
                logits, cache = decode_step(params, config, prefix, cache, tokens)
                tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            tokens.block_until_ready()

        return rows * DECODE_STEPS / _median_seconds(run, warmup=warmup)

    decode_1, decode_batch = decode(1), decode(DECODE_BATCH)
    return {
        "load_s": load,
        "warmup_s": sum(warmup),
        "prefill_tok_s": PROMPT_TOKENS / prefill,
        "decode_1_tok_s": decode_1,
        f"decode_{DECODE_BATCH}_tok_s": decode_batch,
        "peak_rss_mb": _peak_rss_mb(),
    }


def worker_jax_split(model_name: str) -> dict:
    return worker_jax(model_name, split_layers=True)


def worker_torch(model_name: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    from smc_jax.models.registry import resolve

    torch.set_num_threads(int(THREADS))
    path = resolve(model_name)[1]
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    load = time.perf_counter() - start
    vocab = model.config.vocab_size
    prompt = torch.tensor([_prompt_ids(vocab, PROMPT_TOKENS)])
    warmup: list[float] = []

    @torch.inference_mode()
    def prefill() -> None:
        model(prompt, use_cache=True, logits_to_keep=1)

    @torch.inference_mode()
    def decode(rows: int) -> float:
        ids = torch.tensor([_prompt_ids(vocab, DECODE_PROMPT_TOKENS)] * rows)
        out = model(ids, use_cache=True, logits_to_keep=1)  # the prompt cache, not timed

        def run() -> None:
            cache = copy.deepcopy(out.past_key_values)  # DynamicCache grows in place
            tokens = out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(DECODE_STEPS):
                step = model(tokens, past_key_values=cache, use_cache=True, logits_to_keep=1)
                cache, tokens = step.past_key_values, step.logits[:, -1].argmax(-1, keepdim=True)

        return rows * DECODE_STEPS / _median_seconds(run, warmup=warmup)

    prefill_tok_s = PROMPT_TOKENS / _median_seconds(prefill, warmup=warmup)
    decode_1, decode_batch = decode(1), decode(DECODE_BATCH)
    return {
        "load_s": load,
        "warmup_s": sum(warmup),
        "prefill_tok_s": prefill_tok_s,
        "decode_1_tok_s": decode_1,
        f"decode_{DECODE_BATCH}_tok_s": decode_batch,
        "peak_rss_mb": _peak_rss_mb(),
    }


def worker_convert(model_name: str) -> dict:
    """Our first load of the GGUF file (parse, dequantize, tokenizer) with an empty weights cache."""
    from smc_jax.models import load_model
    from smc_jax.models.weights_cache import CACHE_DIR_ENV

    default_cache = os.environ.pop(CACHE_DIR_ENV, None)
    with tempfile.TemporaryDirectory() as cache:
        os.environ[CACHE_DIR_ENV] = cache
        start = time.perf_counter()
        load_model(model_name)
        first_load = time.perf_counter() - start
    os.environ.pop(CACHE_DIR_ENV)
    if default_cache is not None:
        os.environ[CACHE_DIR_ENV] = default_cache
    load_model(model_name)  # fills the usual weights cache, so the timed loads read from it
    return {"first_load_s": first_load}


WORKERS = {"jax": worker_jax, "jax_split": worker_jax_split, "torch": worker_torch, "convert": worker_convert}


def _run_worker(kind: str, model: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": THREADS, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_models", "--worker", kind, "--model", model],
        env=env, capture_output=True, text=True, check=False, cwd=ROOT,
    )
    if done.returncode:
        raise RuntimeError(f"{kind} worker for {model} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _machine() -> dict:
    import jax
    import torch
    import transformers

    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": f"torch: OMP_NUM_THREADS={THREADS}, torch.set_num_threads({THREADS}); "
        f"XLA: default CPU client (Eigen thread pool, {os.cpu_count()} threads for large matmuls)",
        "load_average_start": os.getloadavg(),
    }


METRICS = (
    ("load_s", "load (s); ours from the weights cache", "lower"),
    ("warmup_s", "first calls: compile / warm-up (s)", "lower"),
    ("peak_rss_mb", "peak RSS (MiB)", "lower"),
    ("prefill_tok_s", f"prefill, 1 x {PROMPT_TOKENS} tokens (tok/s)", "higher"),
    ("decode_1_tok_s", "greedy decode, batch 1 (tok/s)", "higher"),
    (f"decode_{DECODE_BATCH}_tok_s", f"greedy decode, batch {DECODE_BATCH} (tok/s total)", "higher"),
)


def _summarise(runs: dict) -> dict:
    """Medians per side; 'advantage' = how many times better the JAX side is than PyTorch."""
    summary = {}
    for model in MODELS:
        rows = {}
        for key, label, better in METRICS:
            row = {"label": label}
            for side in SIDES:
                row[side] = float(np.median([r[key] for r in runs[model][side]]))
            for side in ("jax", "jax_split"):
                ratio = row[side] / row["torch"]
                row[f"{side}_advantage"] = 1 / ratio if better == "lower" else ratio
            rows[key] = row
        rows["first_load_s"] = runs[model]["convert"][0]["first_load_s"]
        summary[model] = rows
    return summary


def _markdown(summary: dict, meta: dict) -> str:
    machine = meta["machine"]
    lines = [
        "# JAX port vs transformers PyTorch eager (CPU, float32)",
        "",
        f"{machine['cpu']}, {machine['cores']} cores; jax {machine['jax']}, torch {machine['torch']}, "
        f"transformers {machine['transformers']}. Threads: {machine['threads']}. Load average at "
        f"start {machine['load_average_start'][0]:.1f}, at end {machine['load_average_end'][0]:.1f} "
        "(other processes shared the machine).",
        f"Medians of {REPS} timed repetitions after a warm-up, in {ROUNDS} rounds alternating the "
        f"sides, each in a fresh process. Decode: {DECODE_STEPS} greedy steps after a "
        f"{DECODE_PROMPT_TOKENS}-token prompt, KV cache on both sides. 'JAX advantage' is the "
        "speed-up (or time/memory saving) factor of the port over PyTorch (>1: the port is better). "
        "'stacked': weights stacked on a layer axis, sliced by jax.lax.scan (load_model(..., "
        "split_layers=False)); 'split': each layer's weights in their own buffers, the scan switching "
        "between them (split_layers=True, load_model's default on CPU).",
        "",
        "| model | metric | JAX stacked | JAX split | PyTorch eager | stacked / torch | split / torch |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for model, rows in summary.items():
        for key, _, _ in METRICS:
            row = rows[key]
            lines.append(
                f"| {model} | {row['label']} | {row['jax']:.1f} | {row['jax_split']:.1f} | {row['torch']:.1f} "
                f"| {row['jax_advantage']:.2f}x | {row['jax_split_advantage']:.2f}x |"
            )
        lines.append(f"| {model} | first load: GGUF conversion (s) | {rows['first_load_s']:.1f} | | | | |")
    lines += ["", "Settings:", f"- date: {meta['date']}", f"- commit: {meta['commit']}",
              *(f"- {key}: {value}" for key, value in meta["settings"].items())]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)  # one measurement, JSON to stdout
    parser.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args.model)))
        return

    from tqdm import tqdm

    facts, machine = run_facts(), _machine()
    tasks = [(model, "convert") for model in MODELS]
    tasks += [(model, side) for _ in range(ROUNDS) for model in MODELS for side in SIDES]
    runs: dict = {model: {kind: [] for kind in (*SIDES, "convert")} for model in MODELS}
    for model, kind in tqdm(tasks, desc="bench_models", unit="run"):
        runs[model][kind].append(_run_worker(kind, model))
    machine["load_average_end"] = os.getloadavg()
    summary = _summarise(runs)
    meta = {**facts, "machine": machine, "settings": {
        "rounds": ROUNDS, "reps": REPS, "prompt_tokens": PROMPT_TOKENS, "decode_prompt_tokens": DECODE_PROMPT_TOKENS,
        "decode_steps": DECODE_STEPS, "decode_batch": DECODE_BATCH}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_models.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=1))
    table = _markdown(summary, meta)
    (RESULTS / "bench_models.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()

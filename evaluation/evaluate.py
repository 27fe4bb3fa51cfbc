"""The paper's main evaluation (Table 5): expected accuracy of methods x f over task instances,
mean and 95% CI over seeds (t-interval; see evaluation/stats.py).

Methods (--methods): prompt1, prompt2 (each base prompt alone: K = 1 token-level SMC with M
particles, whose weights are uniform), local (token-local f-ensemble), token (token SMC),
token_is (token SMC without resampling), byte (byte SMC, one model, the two prompts),
cross_byte (byte SMC of --model x --cross-model under one prompt), cross_a / cross_b (each of
the two models alone under that prompt). Every finished (task, instance, method, f, M, seed)
run is appended to the JSONL file --out and skipped when the script runs again: interrupt and
rerun freely. Writes evaluation/results/<name>.{json,md}.

CPU, embedded models (the committed results; about 10 minutes on 2 cores):

    python -m evaluation.evaluate --tasks json word_sorting sql --methods prompt1 prompt2 local token \\
        --limit 3 --particles 8 --seeds 0 1 2 --max-length 32 --temperature 0.5 --name evaluate_cpu

Quick check (one instance, one seed): add --limit 1 --seeds 0 --particles 2 --max-length 8.
Byte level and cross-model (SmolLM2 x Gemma 3, prompt 1 as plain text since Gemma 3 270M has no
chat template): --methods byte cross_byte cross_a cross_b --max-bytes 64.

GPU, the paper's models from local checkpoints (Hugging Face directories), the paper's settings
(100 instances, M = 10, 5 seeds, temperature 1, resampling threshold 0.9):

    python -m evaluation.evaluate --model /ckpt/Llama-3.1-8B-Instruct --cross-model /ckpt/Qwen2.5-7B-Instruct \\
        --dtype bfloat16 --tasks json word_sorting sql \\
        --methods prompt1 prompt2 local token byte cross_byte cross_a cross_b \\
        --limit 100 --particles 10 --seeds 0 1 2 3 4 --max-length 512 --max-bytes 2048 \\
        --at-max-length eos --out runs/llama_qwen.jsonl --name evaluate_llama
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import save
from evaluation.cli import RESULTS
from evaluation.cli import add_common_arguments, command_line, LazyModelRunner, json_safe, settings_from
from evaluation import STUDY_METHODS, RecordStore, load_instances, plan, run_jobs, select
from evaluation.report import table5_rows

TASKS = ("json", "word_sorting", "sql")
TABLE5_METHODS = ("prompt1", "prompt2", "local", "token", "byte", "cross_byte", "cross_a", "cross_b")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--methods", nargs="+", choices=list(STUDY_METHODS), default=list(TABLE5_METHODS))
    parser.add_argument("--out", default=None, help="JSONL record file (default evaluation/results/<name>.jsonl)")
    parser.add_argument("--name", default="evaluate", help="results name: evaluation/results/<name>.{json,md}")
    add_common_arguments(parser, particles=[10], seeds=[0, 1, 2, 3, 4])
    args = parser.parse_args()

    start = time.perf_counter()
    settings = settings_from(args)
    out = Path(args.out) if args.out else RESULTS / f"{args.name}.jsonl"
    store = RecordStore(out, settings.to_dict())
    instances = {task: load_instances(task, args.limit, args.instance_seed, args.data_dir, args.max_words)
                 for task in args.tasks}
    jobs = plan(instances, args.methods, args.fs, args.particles)
    new = run_jobs(jobs, args.seeds, store, LazyModelRunner(settings, args.methods), progress=not args.no_progress,
                   batch_size=args.batch_size)
    wall = time.perf_counter() - start

    ids = {task: {str(i.id) for i in xs} for task, xs in instances.items()}
    records = [r for r in select(store.records, method=args.methods, num_particles=args.particles, seed=args.seeds)
               if r.instance in ids.get(r.task, ()) and (r.f in args.fs or r.f == "none")]
    rows = json_safe(table5_rows(records, args.tasks, args.methods, args.fs, args.particles))
    run_seconds = sum(r.seconds for r in records)
    n = {task: len(xs) for task, xs in instances.items()}
    notes = (
        f"Expected accuracy (%) of {settings.model}: mean ± 95% t-interval over {len(args.seeds)} seeds of the "
        f"per-seed mean over N instances per task ({', '.join(f'{t}: N={k}' for t, k in n.items())}); "
        f"M = {', '.join(map(str, args.particles))} particles; f in {', '.join(args.fs)}; max_length "
        f"{settings.max_length} tokens ({settings.max_bytes} bytes at the byte level), at_max_length="
        f"{settings.at_max_length} (strings cut at the limit count as wrong), temperature {settings.temperature}. "
        f"Prompt 1 / Prompt 2 = the base prompt alone (K = 1 token SMC, uniform weights). "
        f"Wall time of this invocation {wall:.0f} s (model loading and compilation included; {new} new runs); "
        f"sum of the recorded sampler-call times {run_seconds:.0f} s."
    )
    meta = {"settings": settings.to_dict(), "tasks": args.tasks, "instances": {t: sorted(v) for t, v in ids.items()},
            "N": n, "particles": args.particles, "seeds": args.seeds, "methods": args.methods, "fs": args.fs,
            "wall_seconds": wall, "new_runs": new, "recorded_run_seconds": run_seconds, "records": str(out),
            "command": command_line()}
    print(save(args.name, rows, ["method", *args.tasks], meta, notes, directory=RESULTS))


if __name__ == "__main__":
    main()

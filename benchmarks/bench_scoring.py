"""Scoring many (prompt, continuation) pairs in one process.

500 different pairs (prompts and continuations of varied lengths, built from sentences) scored
with SmolLM2 as a byte-level LM: `smc_jax.logprob` one pair at a time, then
`smc_jax.logprob_batch` (8 pairs per program run). Reports XLA compilations
(`smc_jax.utils.compilation`), memory mappings of the process (lines of /proc/self/maps) after
50 and 500 pairs, and seconds per pair after warm-up (the pairs after the first 50).
Writes benchmarks/results/bench_scoring.{json,md}.

Run: python -m benchmarks.bench_scoring [--pairs 500] [--model smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import os
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from benchmarks.common import save
from smc_jax import load_model, logprob, logprob_batch
from smc_jax.scoring import scorer_for
from smc_jax.utils.compilation import count_compilations

WORDS = (
    "the a cat dog runs quickly over lazy river bright morning code function returns value "
    "json key list of numbers café naïve über 東京 data model token byte string beam heal "
    "print(x) {\"a\": 1} while for if else True False None 42 3.14 hello world"
).split()


def pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = set()
    while len(out) < n:
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
        cont = " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
        out.add((prompt.capitalize(), cont))
    return sorted(out)


def maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_scoring", description=__doc__)
    parser.add_argument("--pairs", type=int, default=500)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    model = load_model(args.model)
    items = pairs(args.pairs)
    lengths = sorted({len(c.encode()) for _, c in items})
    rows = []
    for mode in ("one at a time", "batched"):
        marks = {}
        with count_compilations() as compiles:
            start = time.perf_counter()
            if mode == "one at a time":
                results = []
                for i, (p, c) in enumerate(items):
                    results.append(logprob(model, c, prompt=p))
                    if i + 1 == 50:
                        marks = {"maps_at_50": maps(), "compiles_at_50": compiles.count, "t50": time.perf_counter()}
            else:
                first = logprob_batch(model, items[:56], batch_size=args.batch)
                marks = {"maps_at_50": maps(), "compiles_at_50": compiles.count, "t50": time.perf_counter()}
                results = first + logprob_batch(model, items[56:], batch_size=args.batch)
            end = time.perf_counter()
        done = len(items) - (50 if mode == "one at a time" else 56)
        scorer = scorer_for(model, beam_width=5, prune_threshold=0.05, temperature=1.0, prompt_as_bytes=False, heal=True)
        rows.append({
            "mode": mode, "pairs": len(items), "compilations": compiles.count,
            "compilations_at_50": marks["compiles_at_50"], "program_shapes": scorer.compiled,
            "maps_at_50": marks["maps_at_50"], "maps_at_end": maps(),
            "seconds_total": end - start, "seconds_per_pair_after_warmup": (end - marks["t50"]) / done,
            "zero_prob_pairs": int(sum(not np.isfinite(r.prefix) for r in results)),
            "healed_bytes": int(sum(r.healed for r in results)),
        })
        print(rows[-1], flush=True)
    columns = list(rows[0])
    notes = (
        f"{len(items)} distinct (prompt, continuation) pairs, continuations of {lengths[0]}-{lengths[-1]} bytes, "
        f"{args.model}, default beam (width 5, threshold 0.05), healing on. Programs are compiled per "
        "(batch, prompt bucket, length bucket); memory mappings are /proc/self/maps lines."
    )
    print(save("bench_scoring", rows, columns, {"model": args.model, "batch": args.batch}, notes))


if __name__ == "__main__":
    main()

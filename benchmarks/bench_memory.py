"""Memory of a byte-SMC run as the output length grows.

The workload of compare_genlm (b): a product ensemble of SmolLM2-135M-Instruct under two prompts,
M = 10 particles, beam width 5, relative prune threshold 0.05, ESS threshold 0.9, for max_length
L = 40, 80, 160, 320 bytes. Each L runs in its own process (so its peak resident memory is its
own): a warm-up run (compilation) then `--runs` runs with seeds 1, 2, ... Reported per L:

* the context store's capacities (pool entries, contexts) and the most of each in use at once
  (`peak_live_*`, measured inside the run), against the tokens the model computed
  (`tokens_computed`: each writes one pool entry and creates one context, so it is what a store
  that never frees would need of both);
* the bytes of the run's state (KV pool, paths, per-context byte sum trees, beams), the capacity
  scale the run needed (1: the starting capacities held it) and the process's peak RSS.

Capacities are fixed before the run: the KV pool holds 2 M (L + 1) + contexts entries (each
particle's path of at most L tokens, twice for beam forks), the contexts (one sum tree of the
vocabulary each) do not depend on L. Freed entries and contexts are reused, so memory is linear
in L through the KV pool only, like one KV cache per particle, and does not grow with the number
of contexts ever computed. Writes benchmarks/results/bench_memory.{json,md,png}.

Run: python -m benchmarks.bench_memory [--lengths 40 80 160 320] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import RESULTS, ROOT, save

MODEL = "smollm2-135m-instruct"
PROMPTS = ("My favorite physicist is", "My favorite author is")
MIB = 2**20


def measure(length: int, runs: int) -> dict:
    """One length, in this process: capacities, peaks, state bytes, peak RSS (no timing: this is
    a memory benchmark, see bench_sampler.py and compare_genlm.py for wall times)."""
    import jax

    from smc_jax import load_model
    from smc_jax.sampler import EnsembleSampler, Expert

    model = load_model(MODEL)
    sampler = EnsembleSampler(experts=tuple(Expert(model, p) for p in PROMPTS), f="product", level="byte",
                              num_particles=10, max_length=length, beam_width=5, prune_threshold=0.05,
                              ess_threshold=0.9, resampler="multinomial")
    sampler(0, allow_zero_weight=True)  # warm-up: compilation and the prompt's start state
    results = [sampler(seed, allow_zero_weight=True) for seed in range(1, runs + 1)]
    built = sampler.build(sampler.capacity_scale)
    starts = [group.start for group in getattr(built, "groups", (built,))]
    state_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(starts))
    kv_bytes = sum(leaf.nbytes for start in starts for leaf in jax.tree.leaves(start.stores.pool))
    summary_bytes = sum(leaf.nbytes for start in starts for leaf in jax.tree.leaves(start.stores.summary))
    stats = [r.stats for r in results]
    most = lambda key: max(s[key] for s in stats)  # noqa: E731
    return {
        "max_bytes": length,
        "bytes_sampled": max(int(r.lengths.max()) for r in results),
        "model_calls": statistics.median(s["model_calls"] for s in stats),
        "tokens_computed": most("rows_needed") // len(PROMPTS),  # summed over the prompts' stores
        "peak_live_entries": most("peak_live_entries"),
        "entry_capacity": stats[0]["entry_capacity"],
        "peak_live_contexts": most("peak_live_contexts"),
        "context_capacity": stats[0]["context_capacity"],
        "capacity_scale": sampler.capacity_scale,
        "state_MiB": state_bytes / MIB,
        "kv_pool_MiB": kv_bytes / MIB,
        "sum_trees_MiB": summary_bytes / MIB,
        "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [r["max_bytes"] for r in rows]
    panels = [
        ("KV pool entries (per prompt)", [("tokens_computed", "--s", "tokens computed"),
                                          ("entry_capacity", "-o", "pool capacity"),
                                          ("peak_live_entries", "-^", "peak entries in use")]),
        ("contexts (per prompt)", [("tokens_computed", "--s", "contexts created"),
                                   ("context_capacity", "-o", "capacity"),
                                   ("peak_live_contexts", "-^", "peak in use")]),
        ("MiB", [("peak_rss_MiB", "-o", "process peak RSS"), ("state_MiB", "-s", "run state"),
                 ("kv_pool_MiB", "-^", "of it: KV pool")]),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 3.4))
    for ax, (ylabel, series) in zip(axes, panels):
        for key, style, label in series:
            ax.plot(lengths, [r[key] for r in rows], style, label=label)
        ax.set_xlabel("max_length (bytes)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"byte SMC, {MODEL} x 2 prompts, M = 10, beam 5", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[40, 80, 160, 320], help="max_length values (bytes)")
    parser.add_argument("--runs", type=int, default=2, help="runs per length after the warm-up")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)  # one length, JSON to stdout
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.runs)))
        return

    from tqdm import tqdm

    rows = []
    for length in tqdm(args.lengths, desc="lengths"):
        out = subprocess.run([sys.executable, "-m", "benchmarks.bench_memory", "--child", str(length), "--runs",
                              str(args.runs)], capture_output=True, text=True, cwd=ROOT)
        if out.returncode:
            sys.exit(f"the max_length={length} process failed:\n{out.stderr[-4000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(report(rows, args.runs, args.lengths))


def report(rows: list[dict], runs: int, lengths: list[int]) -> str:
    """Saves the plot, results/bench_memory.{json,md}; returns the table."""
    png = plot(rows, RESULTS / "bench_memory.png")
    columns = ["max_bytes", "bytes_sampled", "model_calls", "tokens_computed", "entry_capacity",
               "peak_live_entries", "context_capacity", "peak_live_contexts", "capacity_scale", "kv_pool_MiB",
               "sum_trees_MiB", "state_MiB", "peak_rss_MiB"]
    notes = (
        f"Byte SMC, product of {MODEL} under {PROMPTS}, M = 10, beam width 5, prune threshold 0.05, float32 on "
        f"CPU; one process per max_length (peak RSS is that process's: model, compiled programs and run). "
        f"Entries and contexts are per prompt's store (tokens_computed: the mean of the two); tokens_computed and peaks are the largest over "
        f"{runs} runs, model calls their median. bytes_sampled: the longest string of those runs "
        f"(shorter than max_bytes when every particle ended). Plot: {png.name}."
    )
    return save("bench_memory", rows, columns, {"model": MODEL, "prompts": PROMPTS, "runs": runs, "lengths": lengths},
                notes)


if __name__ == "__main__":
    main()

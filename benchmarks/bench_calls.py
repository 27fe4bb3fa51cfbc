"""Sequential model calls per byte-SMC run with prefetching off and on (issue 18, item 2).

The two byte-SMC workloads of `compare_genlm.py` (smc_jax side, same settings: M = 10 particles,
beam width 5, prune threshold 0.05, prompts read as bytes from BOS, 39 bytes plus a forced EOS,
ESS threshold 0.9, multinomial resampling, GenLM's product target p1 * p2): SmolLM2 x 2 prompts
and SmolLM2 x Gemma 3. For each prefetch setting (`SamplerSettings.prefetch` = bytes looked
ahead, `prefetch_rows` = rows beyond a call's padding, and `prefetch_children` per particle:
contexts one token below the best candidates,
created in the same call by tree attention) it runs seeds 0..runs-1 after a
warm-up seed and reports, per run, the sequential model calls (summed over the model groups,
as they run one after the other), the rows computed (padding included), the contexts
prefetched and the cache hits, and wall time (median). XLA compilations during the timed runs
are counted (`count_compilations`: 0 means no recompilation after the warm-up). Every run's
samples and weights are compared with the prefetch-off run of the same seed (exact equality):
prefetching only creates contexts earlier, so the distributions are the same, but a prefetched
context's logits come from a call of another batch size, and XLA's CPU matrix products round
differently per batch size, so weights may differ in the last float digits (measured: equal for
two prompts with padding rows only; SmolLM2 x Gemma 3, same texts, log-weights within 2.3e-5).

`--precision bf16-matmuls` multiplies in bfloat16 as in `compare_genlm.py`. Each setting runs in a fresh
subprocess (`--child`), which loads the models and compiles its one byte program: on a 2-core VM with 24 GB a
third SmolLM2 x Gemma 3 program in one process failed to compile (`LLVM compilation error: Cannot allocate
memory`; one compile took the process from ~6,700 to >16,000 memory mappings, against Linux's default limit of
65,530).

Run: python -m benchmarks.bench_calls [--runs 3] [--workloads smc-prompts smc-models] [--precision bf16-matmuls]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax.numpy as jnp
import numpy as np

from benchmarks.common import save
from benchmarks.compare_genlm import PRECISIONS, add_precision_option
from smc_jax import load_model
from smc_jax.api import EnsembleSampler, Expert
from smc_jax.ensemble import CustomEnsemble
from smc_jax.settings import SamplerSettings
from smc_jax.utils.compilation import count_compilations

PROMPTS = ("My favorite physicist is", "My favorite author is")
SMOLLM2, GEMMA3 = "smollm2-135m-instruct", "gemma3-270m"
WORKLOADS = {"smc-prompts": "SmolLM2 x 2 prompts", "smc-models": "SmolLM2 x Gemma 3"}
#: (prefetch, prefetch_rows, children per particle) settings compared; (0, 0, 0) is prefetching off.
CONFIGS = ((0, 0, 0), (8, 0, 0), (8, 0, 1), (8, 64, 0), (8, 64, 1))
WARMUP_SEED = 100


def _log_product(log_p):
    return jnp.sum(log_p, axis=-1)


#: GenLM's Product target p1 * p2, as in compare_genlm.py.
PRODUCT = CustomEnsemble(log_abs_f=_log_product, num_experts=2)


def sampler_for(workload: str, models: dict, prefetch: int, prefetch_rows: int, children: int) -> EnsembleSampler:
    smol = models[SMOLLM2]
    experts = ((Expert(smol, PROMPTS[0]), Expert(models[GEMMA3], PROMPTS[0])) if workload == "smc-models"
               else (Expert(smol, PROMPTS[0]), Expert(smol, PROMPTS[1])))
    return EnsembleSampler(
        experts=experts, level="byte", f=PRODUCT, num_particles=10, max_length=39, at_max_length="eos",
        ess_threshold=0.9, resampler="multinomial", beam_width=5, prune_threshold=0.05, prompt_as_bytes=True,
        prefetch=prefetch, prefetch_rows=prefetch_rows, prefetch_children=children)


#: The per-run counters a child reports (`SMCResult.stats`).
STATS = ("model_calls", "rows_computed", "prefetched", "prefetch_hits", "seconds")


def measure(workload: str, config: tuple[int, int, int], runs: int, precision: str) -> dict:
    """One setting in this process: a warm-up seed, then seeds 0..runs-1; their texts, log-weights
    (float64, -inf kept), counters, and the XLA compilations during the timed runs."""
    matmul_dtype = PRECISIONS[precision]
    models = {SMOLLM2: load_model(SMOLLM2, matmul_dtype=matmul_dtype)}
    if workload == "smc-models":
        models[GEMMA3] = load_model(GEMMA3, matmul_dtype=matmul_dtype)
    sampler = sampler_for(workload, models, *config)
    sampler(WARMUP_SEED, allow_zero_weight=True)  # compilation
    with count_compilations() as compiled:
        results = [sampler(seed, allow_zero_weight=True) for seed in range(runs)]
    return {
        "texts": [list(r.texts) for r in results],
        "log_weights": [np.asarray(r.log_weights, np.float64).tolist() for r in results],
        "stats": {name: [float(r.stats.get(name, 0)) for r in results] for name in STATS},
        "recompiles": compiled.count,
    }


def measure_in_child(workload: str, config: tuple[int, int, int], runs: int, precision: str) -> dict:
    """`measure` in a fresh Python process (its JSON on the last line of its stdout)."""
    command = [sys.executable, "-m", "benchmarks.bench_calls", "--child", workload, "/".join(map(str, config)),
               "--runs", str(runs), "--precision", precision]
    out = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def parse_config(text: str) -> tuple[int, int, int]:
    """"P/R[/C]" -> (prefetch, prefetch_rows, children), checked by the sampler's own settings."""
    try:
        config = tuple(int(v) for v in (text.split("/") + ["0"])[:3])
        SamplerSettings(level="byte", prefetch=config[0], prefetch_rows=config[1], prefetch_children=config[2])
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--configs {text!r}: {err}") from None
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--configs", nargs="+", default=["/".join(map(str, c)) for c in CONFIGS],
                        help="prefetch/prefetch_rows[/children per particle, 0 if omitted (the sampler's default is 1)]; "
                             "0/0/0 (off) is always run first")
    parser.add_argument("--name", default="bench_calls")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "CONFIG"), help=argparse.SUPPRESS)
    add_precision_option(parser)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], parse_config(args.child[1]), args.runs, args.precision)), flush=True)
        return
    try:  # before any child loads a model
        configs = [parse_config(c) for c in args.configs]
    except argparse.ArgumentTypeError as err:
        parser.error(str(err))
    configs = [(0, 0, 0)] + [c for c in configs if c != (0, 0, 0)]
    rows = []
    for workload in args.workloads:
        reference = None
        for config in configs:
            out = measure_in_child(workload, config, args.runs, args.precision)
            runs = list(zip(out["texts"], (np.asarray(w, np.float64) for w in out["log_weights"])))
            reference = reference or runs  # prefetching off comes first
            same, same_texts, diffs = [], [], []
            for (ref_texts, ref_logw), (texts, logw) in zip(reference, runs):
                same.append(ref_texts == texts and np.array_equal(ref_logw, logw))
                same_texts.append(ref_texts == texts)
                if same_texts[-1]:
                    finite = np.isfinite(ref_logw)
                    diffs.append(float(np.max(np.abs(ref_logw - logw)[finite], initial=0.0)))
            stat = out["stats"]
            prefetch, extra, children = config
            row = {
                "workload": WORKLOADS[workload], "prefetch": prefetch, "prefetch_rows": extra, "children": children,
                "calls_per_run": statistics.mean(stat["model_calls"]), "calls": [int(c) for c in stat["model_calls"]],
                "rows_per_run": statistics.mean(stat["rows_computed"]),
                "prefetched_per_run": statistics.mean(stat["prefetched"]),
                "hits_per_run": statistics.mean(stat["prefetch_hits"]),
                "wall_s": statistics.median(stat["seconds"]), "walls": [round(t, 3) for t in stat["seconds"]],
                "recompiles": out["recompiles"], "same_samples_as_off": all(same), "same_texts_as_off": all(same_texts),
                "max_logw_diff": max(diffs, default=float("nan")),
            }
            print(row, flush=True)
            rows.append(row)
    columns = ["workload", "prefetch", "prefetch_rows", "children", "calls_per_run", "rows_per_run", "prefetched_per_run",
               "hits_per_run", "wall_s", "recompiles", "same_samples_as_off", "same_texts_as_off", "max_logw_diff"]
    notes = (f"Byte SMC as in compare_genlm.py (M=10, beam 5 / 0.05, 39 bytes + EOS, {args.precision}), {args.runs} runs (seeds "
             "0..) per setting after a warm-up run; calls, rows, prefetched contexts and cache hits are means per "
             "run, wall_s the median. Timings measured under load (shared 2-core machine): compare the calls, "
             "and the walls only roughly. same_samples_as_off: every run's texts and weights equal the "
             "prefetch-off run of the same seed; same_texts_as_off: the texts do, and max_logw_diff is the "
             "largest |log-weight difference| over those runs (float rounding: another batch size, tree attention).")
    print(save(args.name, rows, columns, {"runs": args.runs, "configs": configs, "precision": args.precision}, notes))


if __name__ == "__main__":
    main()

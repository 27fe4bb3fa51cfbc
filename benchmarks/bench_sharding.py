"""Particles sharded over 1, 2, 4 and 8 simulated CPU devices: same results, and the cost.

XLA can split one CPU into N "devices" (XLA_FLAGS=--xla_force_host_platform_device_count=N),
but the flag must be set before jax is imported, so each device count runs in its own process
(this script with --worker N). Every worker runs the same samplers on a mesh of N particle
devices (`smc_jax.smc.sharding.run_sharded`) with the same keys:

* toy n-grams: two n-gram experts (orders 2 and 3, 8 symbols), M = 256, L = 32, ESS 0.9;
* token experts: one random 2-layer transformer (hidden 64, 4 heads, vocabulary 64) under two
  prompts, the context store replicated, M = 64, L = 16, ESS 0.9.

The parent checks that every device count gives the 1-device particles (identical symbols and
ancestors, allclose weights) and reports compile time, the median wall time of a run, the
speed-up t_1 / t_N and the scaling efficiency t_1 / (N t_N). Simulated devices share the same
CPU cores (2 here), so the timings measure the overhead of sharding, not a speed-up: this
benchmark checks correctness. Writes benchmarks/results/bench_sharding.{json,md}.
Run: python -m benchmarks.bench_sharding [--repeats 3] [--devices 1 2 4 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKLOADS = ("toy n-grams", "token experts")
NOTES = """
**Simulated devices measure correctness, not speed.** XLA splits this machine's CPU (2 cores,
shared with other jobs) into N host "devices" that all run on those 2 cores, so beyond 2 devices
nothing can get faster and every extra device adds collectives, dispatch and synchronization:
the wall times show what sharding costs on one CPU, and the efficiency t_1 / (N t_N) is expected
to fall. What carries over to real accelerators is `same_as_1_device`: every device count gives
the symbols, ancestors and step counts of the 1-device run for every key, and its weights up to
the summation order of cross-device sums (`max_abs_dlogw`). On N accelerators each device
computes its M / N particles (and, for the token experts, about 1 / N of the deduplicated model
rows; see docs/devices.md). compile_s: first call minus the median run; wall_s:
median of `repeats` runs with different keys.
"""


# ------------------------------------------------------------------ worker (one device count)

def workloads():
    import jax

    from smc_jax.smc.ensemble import make_ensemble
    from smc_jax.experts import NGramExpert
    from smc_jax.experts.base import stack_experts
    from smc_jax.experts.token import TokenExperts
    from smc_jax.models import transformer
    from smc_jax.models.config import ModelConfig
    from smc_jax.models.paged import PagedTransformer
    from smc_jax.models.params import random_params
    from smc_jax.smc import SMC

    k1, k2 = jax.random.split(jax.random.key(0))
    toy = stack_experts([NGramExpert.random(k1, alphabet_size=8, order=2, eos_logit=-2.0),
                         NGramExpert.random(k2, alphabet_size=8, order=3, eos_logit=-2.0)])
    config = ModelConfig(architecture="llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=16, max_positions=64)
    model = PagedTransformer(params=random_params(config, jax.random.key(1)), config=config)
    prompts = jax.numpy.asarray([[1, 2, 3, 4], [5, 6, 7, 0]], jax.numpy.int32)
    prefill = jax.jit(jax.vmap(transformer.prefill, in_axes=(None, None, 0, 0)), static_argnums=1)
    prefixes, logits = prefill(model.params, config, prompts, jax.numpy.asarray([4, 3], jax.numpy.int32))
    token = TokenExperts(model=model, prefixes=prefixes, prompt_logits=logits, eos_ids=(63,), max_tokens=16)
    product = make_ensemble("product", 2)
    return {
        "toy n-grams": (SMC(num_particles=256, max_length=32, ess_threshold=0.9), toy, product),
        "token experts": (SMC(num_particles=64, max_length=16, ess_threshold=0.9), token, product),
    }


def worker(devices: int, repeats: int, out: Path) -> None:
    import jax
    import numpy as np

    from benchmarks.common import timed
    from smc_jax.smc.sharding import make_mesh, run_sharded

    assert jax.device_count() == devices, jax.devices()
    mesh = make_mesh()
    rows, arrays = [], {}
    for name, (smc, experts, ensemble) in workloads().items():
        keys = [jax.random.key(seed) for seed in range(repeats)]
        start = time.perf_counter()
        jax.block_until_ready(run_sharded(smc, keys[0], experts, ensemble, mesh))
        compile_s = time.perf_counter() - start
        calls = iter(keys * 2)
        median, times, _ = timed(lambda: jax.block_until_ready(run_sharded(smc, next(calls), experts, ensemble, mesh)),
                                 repeats=repeats, warmup=0)
        for i, key in enumerate(keys):
            state = jax.device_get(run_sharded(smc, key, experts, ensemble, mesh))
            for field, value in [("symbols", state.symbols), ("log_weights", state.log_weights),
                                 ("ancestors", state.trace.ancestors), ("steps", state.step),
                                 ("resampled", state.trace.resampled)]:
                arrays[f"{name}/{i}/{field}"] = np.asarray(value)
        rows.append(dict(workload=name, M=smc.num_particles, L=smc.max_length, compile_s=compile_s - median,
                         wall_s=median, times_s=times))
    np.savez(out, **arrays)
    print(json.dumps(rows))


# ------------------------------------------------------------------ parent

def compare(reference: dict, other: dict, workload: str) -> tuple[bool, float]:
    """(same symbols, ancestors and step counts for every key, max |log w - log w_1|)."""
    import numpy as np

    same, worst = True, 0.0
    for field in reference:
        if not field.startswith(workload + "/"):
            continue
        a, b = reference[field], other[field]
        if field.endswith("log_weights"):
            finite = np.isfinite(a)
            same &= bool(np.array_equal(finite, np.isfinite(b)) and np.allclose(a[finite], b[finite], rtol=1e-5, atol=1e-5))
            worst = max(worst, float(np.abs(a[finite] - b[finite]).max(initial=0.0)))
        else:
            same &= bool(np.array_equal(a, b))
    return same, worst


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_sharding", description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (one key each) per device count")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.repeats, args.out)

    import numpy as np
    from tqdm import tqdm

    from benchmarks.common import save

    results: dict[int, tuple[list, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in tqdm(args.devices, desc="device counts", unit="run"):
            env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n}", JAX_PLATFORMS="cpu")
            out = Path(tmp) / f"{n}.npz"
            proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_sharding", "--worker", str(n), "--repeats", str(args.repeats),
                                   "--out", str(out)], env=env, capture_output=True, text=True, cwd=ROOT)
            if proc.returncode:
                sys.exit(f"the {n}-device worker failed:\n{proc.stderr[-4000:]}")
            results[n] = (json.loads(proc.stdout.strip().splitlines()[-1]), dict(np.load(out)))
    base = min(results)
    rows = []
    for workload in WORKLOADS:
        t_base = next(r for r in results[base][0] if r["workload"] == workload)["wall_s"]
        for n, (worker_rows, arrays) in results.items():
            row = next(r for r in worker_rows if r["workload"] == workload)
            same, worst = compare(results[base][1], arrays, workload)
            speedup = t_base / row["wall_s"]
            reference = results[base][1]
            steps = np.mean([reference[f"{workload}/{i}/steps"] for i in range(args.repeats)])
            resampled = np.mean([reference[f"{workload}/{i}/resampled"].sum() for i in range(args.repeats)])
            rows.append(dict(workload=workload, devices=n, M=row["M"], L=row["L"], steps=float(steps),
                             resampling_steps=float(resampled),
                             same_as_1_device="yes" if same else "NO", max_abs_dlogw=worst,
                             compile_s=row["compile_s"], wall_s=row["wall_s"], speedup=speedup,
                             efficiency=speedup * base / n, times_s=row["times_s"]))
    columns = ["workload", "devices", "M", "L", "steps", "resampling_steps", "same_as_1_device", "max_abs_dlogw", "compile_s", "wall_s",
               "speedup", "efficiency"]
    meta = {"repeats": args.repeats, "device_counts": args.devices, "reference": f"{base} device(s)",
            "simulated": "XLA_FLAGS=--xla_force_host_platform_device_count=N, one process per N"}
    print(NOTES.strip() + "\n")
    print(save("bench_sharding", rows, columns, meta, NOTES))
    if any(row["same_as_1_device"] != "yes" for row in rows):
        sys.exit("some device counts did not reproduce the 1-device run")


if __name__ == "__main__":
    main()

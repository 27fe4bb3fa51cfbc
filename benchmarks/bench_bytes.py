"""Next-byte distributions per second on the embedded models.

For SmolLM2-135M-Instruct and Gemma 3 270M, each of M sequences (M = 1 and 10) reads its own
slice of a fixed English text byte by byte through a beam over tokenizations (beam widths 1, 5,
10; relative prune threshold 0.05), computing the next-byte distribution after every byte. One
jitted scan per setting; the median of repeated runs after a warm-up (compilation excluded and
reported separately). Reports bytes/s (M * T / seconds), model calls per byte (sequential
batched calls / T) and rows per call. Every setting runs with token healing on and off
(`--heal on off`, side by side: the cost of healing), reporting the bytes healed and the
bytes whose conditional is 0 (-inf). Writes benchmarks/results/bench_bytes.{json,md}.

Run: python -m benchmarks.bench_bytes [--bytes 64] [--repeats 3] [--heal on off]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from benchmarks.common import save, timed
from smc_jax import load_model
from smc_jax.sampler import EnsembleSampler, Expert
from smc_jax.models.contexts import context_stats

TEXT = (
    "The history of science is full of people who were both careful observers and gifted writers. "
    "Galileo described the moons of Jupiter in a short book written for a wide audience, and Newton "
    "argued with his critics in long letters. In the twentieth century, Richard Feynman gave lectures "
    "that are still read today, while Carl Sagan wrote about the cosmos for millions of readers. "
    "Good explanations need patience, examples and a clear voice; the best of them feel like a "
    "conversation with a friend who happens to know a great deal about the universe."
).encode()
PROMPT = "Here is a paragraph about scientists:"
MODELS = ("smollm2-135m-instruct", "gemma3-270m")


def reader(num_sequences: int):
    @jax.jit
    def read(experts, data):
        state = experts.init(num_sequences)

        def body(state, column):
            logp = experts.logprobs(state)[:, 0]
            return experts.advance(state, column, jnp.ones((num_sequences,), bool)), logp

        state, logps = jax.lax.scan(body, state, data.T)
        return state, logps

    return read


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_bytes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, default=64, help="bytes read by each sequence")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 5, 10])
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--heal", nargs="+", choices=["on", "off"], default=["on", "off"], help="token healing")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    args = parser.parse_args()
    rows = []
    settings = [(m, w, s, h == "on") for m in args.models for s in args.sequences for w in args.widths for h in args.heal]
    models = {}
    for name, width, seqs, heal in tqdm(settings, desc="settings"):
        model = models.setdefault(name, load_model(name))
        sampler = EnsembleSampler(experts=(Expert(model, PROMPT),), level="byte", num_particles=seqs,
                                  max_length=args.bytes, beam_width=width, prune_threshold=0.05, heal=heal)
        data = np.stack([np.frombuffer(TEXT[i * 7 : i * 7 + args.bytes], np.uint8) for i in range(seqs)]).astype(np.int32)
        data = jnp.asarray(data)
        read = reader(seqs)

        def first_read(experts):
            state, _ = jax.block_until_ready(read(experts, data))
            problem = experts.failure(state)
            if problem is not None:
                raise problem
            return experts

        start = time.perf_counter()
        experts = sampler.grow_on_overflow(first_read)  # the smallest store that holds the run, as runs do
        compile_s = time.perf_counter() - start  # of the last (successful) capacity, plus smaller ones tried
        seconds, times, (state, logps) = timed(lambda: jax.block_until_ready(read(experts, data)), args.repeats, warmup=0)
        stats = context_stats(state.stores)
        logps = np.asarray(logps)
        read_logps = logps[np.arange(args.bytes)[:, None], np.arange(seqs)[None], np.asarray(data).T]
        # A narrow beam can lose every tokenization that continues the fixed text (the sampler
        # never hits this: it samples bytes the beam can produce); count such bytes.
        zero_bytes = int((~np.isfinite(read_logps)).sum())
        # Bytes healed (a back-off into a token; `smc_jax.bytes.healing`), over the sequences.
        heals = int(np.asarray(state.beams.heals).sum())
        rows.append({
            "model": name, "sequences": seqs, "beam_width": width, "heal": heal, "heals": heals, "bytes": args.bytes,
            "bytes_per_s": seqs * args.bytes / seconds, "seconds": seconds, "compile_s": compile_s,
            "seconds_range": f"[{min(times):.3g}, {max(times):.3g}]",
            "calls_per_byte": stats["model_calls"] / args.bytes,
            "rows_per_call": stats["rows_needed"] / max(stats["model_calls"], 1),
            "store_scale": sampler.capacity_scale, "zero_prob_bytes": zero_bytes,
        })
    columns = ["model", "sequences", "beam_width", "heal", "bytes_per_s", "calls_per_byte", "rows_per_call", "seconds", "seconds_range",
               "compile_s", "zero_prob_bytes", "heals"]
    table = save("bench_bytes", rows, columns, {"bytes": args.bytes, "repeats": args.repeats, "prune_threshold": 0.05,
                                                "prompt": PROMPT},
                 notes="Next-byte distributions along a fixed text (teacher forcing), float32 on CPU, token "
                       "healing on and off for every setting (heals: bytes healed, summed over the sequences; "
                       "zero_prob_bytes: bytes the next-byte distribution before them gave 0, healed ones included). seconds: "
                       f"the median of {args.repeats} runs after compilation, seconds_range their lowest and highest; "
                       "the machine's load average at the end is under Settings.")
    print(table)


if __name__ == "__main__":
    main()

"""Wall time per sample of the samplers on the embedded models: the paper's Table 6, measured here.

One word-sorting instance (the paper's task with its two prompt templates; chat messages rendered
by SmolLM2's template) and, per method, the median over seeds of the wall time of one call
(one sample for the single model and the local ensemble; M weighted particles for SMC), after a
warm-up call whose time (compilation) is reported separately:

* base model: SmolLM2 under prompt 1, one sample (token level, M = 1);
* local ensemble: token-local product of the two prompts, one sample;
* token SMC, M = 10 / 25 / 75: global product of the two prompts;
* byte SMC, M = 10: the same ensemble at the byte level (beam 5, threshold 0.05);
* cross-model byte SMC, M = 10: SmolLM2 x Gemma 3 under prompt 1.

Generation stops at EOS or at the length limit (tokens, or bytes at the byte level).
Writes benchmarks/results/bench_sampler.{json,md}. Run: python -m benchmarks.bench_sampler
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tqdm import tqdm

from benchmarks.common import save, timed
from smc_jax import load_model
from smc_jax.sampler import EnsembleSampler, Expert
from evaluation.tasks import get_task


def as_text(chat) -> str:
    """A chat prompt as plain text (for base models without a chat template)."""
    return "\n\n".join(message["content"] for message in chat)


def methods(smol, gemma, prompts, tokens: int, byte_len: int) -> dict[str, EnsembleSampler]:
    both = (Expert(smol, prompts[0]), Expert(smol, prompts[1]))
    common = dict(at_max_length="truncate")
    return {
        "base model (1 sample)": EnsembleSampler(experts=both[:1], level="token", num_particles=1, max_length=tokens, **common),
        "local ensemble (1 sample)": EnsembleSampler(experts=both, level="local", num_particles=1, max_length=tokens, **common),
        "token SMC M=10": EnsembleSampler(experts=both, level="token", num_particles=10, max_length=tokens, **common),
        "token SMC M=25": EnsembleSampler(experts=both, level="token", num_particles=25, max_length=tokens, **common),
        "token SMC M=75": EnsembleSampler(experts=both, level="token", num_particles=75, max_length=tokens, **common),
        "byte SMC M=10": EnsembleSampler(experts=both, level="byte", num_particles=10, max_length=byte_len, **common),
        # Gemma 3 270M is a base model without a chat template: both models read prompt 1 as text.
        "cross-model byte SMC M=10": EnsembleSampler(
            experts=(Expert(smol, as_text(prompts[0])), Expert(gemma, as_text(prompts[0]))),
            level="byte", num_particles=10, max_length=byte_len, **common),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_sampler", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=24, help="length limit in tokens")
    parser.add_argument("--bytes", type=int, default=64, help="length limit in bytes (byte level)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", nargs="*", help="substrings of the method names to run")
    args = parser.parse_args()
    smol, gemma = load_model("smollm2-135m-instruct"), load_model("gemma3-270m")
    task = get_task("word_sorting")
    instance = task.instances(limit=1, seed=0)[0]
    prompts = task.prompts(instance)
    rows = []
    todo = {k: v for k, v in methods(smol, gemma, prompts, args.tokens, args.bytes).items()
            if not args.only or any(s in k for s in args.only)}
    for name, sampler in tqdm(todo.items(), desc="methods"):
        first, _, _ = timed(lambda: sampler(100), repeats=1, warmup=0)
        seeds = iter(range(args.seeds))
        seconds, times, result = timed(lambda: sampler(next(seeds)), repeats=args.seeds, warmup=0)
        rows.append({
            "method": name, "seconds": seconds, "first_call_s": first, "steps": result.num_steps,
            "model_calls": result.stats.get("model_calls"), "particles": result.num_particles,
            "top_sample": repr(result.posterior()[0][0])[:60],
        })
    columns = ["method", "seconds", "first_call_s", "steps", "model_calls", "particles", "top_sample"]
    notes = (f"One BIG-bench word-sorting instance ({instance.input!r}), prompts 1 and 2 of the paper (chat template), "
             f"length limit {args.tokens} tokens / {args.bytes} bytes, float32 on CPU; seconds = median over "
             f"{args.seeds} seeds after a warm-up call (first_call_s includes compilation).")
    print(save("bench_sampler", rows, columns, {"tokens": args.tokens, "bytes": args.bytes, "seeds": args.seeds}, notes))


if __name__ == "__main__":
    main()

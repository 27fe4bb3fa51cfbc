"""Command line: `smc-jax sample` draws weighted samples from an f-ensemble of language models::

    smc-jax sample                                   # cross-tokenizer product of the embedded models
    smc-jax sample -e smollm2-135m-instruct "My favorite physicist is" \\
                   -e smollm2-135m-instruct "My favorite author is" --level token --f product
    smc-jax models                                   # list the built-in model names

Everything runs offline on the embedded models (SmolLM2-135M-Instruct, Gemma 3 270M).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smc_jax.smc.ensemble import NAMED_TAUS, make_ensemble
from smc_jax.models.tokenizer import check_prompt
from smc_jax.settings import DEFAULTS, LEVELS, SamplerSettings


DEFAULT_EXPERTS = (
    ("smollm2-135m-instruct", "My favorite physicist is"),
    ("gemma3-270m", "My favorite physicist is"),
)
TABLE_ROWS = 10
TEXT_WIDTH = 70


def _f_value(text: str) -> str | float:
    if text.lower() in NAMED_TAUS:
        return text.lower()
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"unknown f {text!r}: use one of {sorted(NAMED_TAUS)} or a number tau (e.g. -1, 0, 2.5, inf)"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `smc-jax` (subcommands `sample`, `precompile` and `models`)."""
    parser = argparse.ArgumentParser(
        prog="smc-jax",
        description="Sample strings from the global f-ensemble of language models with SMC (JAX).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_sample_options(sub.add_parser(
        "sample",
        help="draw weighted samples from an f-ensemble",
        description="Draw M weighted particles from Phi(x) ∝ f(p_1(x), ..., p_K(x)) and print them with log Z-hat.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    ))
    _add_sample_options(sub.add_parser(
        "precompile",
        help="compile the programs of `sample` (same options) once and keep them on disk",
        description="Run the job of `smc-jax sample` with these options once, so that its compiled programs are "
        "kept in the persistent cache ($SMC_JAX_CACHE_DIR/xla): a later `sample` with the same options loads "
        "them instead of compiling. Run it once per machine or image build.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    ))
    sub.add_parser("models", help="list the built-in model names")
    return parser


def _add_sample_options(s: argparse.ArgumentParser) -> None:
    """The options of a sampling job (shared by `sample` and `precompile`)."""
    s.add_argument(
        "-e", "--expert", nargs=2, action="append", metavar=("MODEL", "PROMPT"),
        help="an expert: a model (built-in name, local HF directory, .gguf file or hub id) and its prompt; "
        "repeat for K experts. Default: SmolLM2-135M-Instruct and Gemma 3 270M, both 'My favorite physicist is'",
    )
    s.add_argument("--chat", action="store_true", help="render each prompt as a user message with the model's chat template")
    s.add_argument("--f", type=_f_value, default="product",
                   help=f"ensemble function: one of {sorted(NAMED_TAUS)} or an exponent tau")
    s.add_argument("--weights", type=float, nargs="+", help="expert weights on the simplex (default uniform)")
    s.add_argument("--level", choices=LEVELS, default=DEFAULTS.level,
                   help="byte: exact across tokenizers; token: experts share a tokenizer; local: token-local baseline")
    s.add_argument("-M", "--particles", type=int, default=DEFAULTS.num_particles, help="number of particles M")
    s.add_argument("--ess-threshold", type=float, default=DEFAULTS.ess_threshold, help="resample when ESS < threshold * M (0 = importance sampling)")
    s.add_argument("--resampler", choices=["multinomial", "systematic", "stratified", "residual"], default=DEFAULTS.resampler)
    s.add_argument("--resample-active-only", action="store_true",
                   help="resample only particles still extending; finished ones keep their weights "
                        "(the paper's Alg. 1 resamples all)")
    s.add_argument("--max-length", type=int, default=DEFAULTS.max_length, help="longest continuation, in bytes (byte level) or tokens")
    s.add_argument("--at-max-length", choices=["eos", "truncate"], default=DEFAULTS.at_max_length,
                   help="eos: force EOS at the limit with its weight factor (target: strings <= max length); "
                   "truncate: stop there without it (unfinished strings, a prefix target)")
    s.add_argument("--temperature", type=float, default=DEFAULTS.temperature, help="temperature of every expert")
    s.add_argument("--beam-width", type=int, default=DEFAULTS.beam_width, help="byte level: beam width B")
    s.add_argument("--prune-threshold", type=float, default=DEFAULTS.prune_threshold, help="byte level: relative prune threshold")
    s.add_argument("--no-heal", action="store_true",
                   help="byte level: no token healing (a byte that no kept tokenization can read gets probability 0)")
    s.add_argument("--regex", metavar="PATTERN",
                   help="constrain every sampled string to match this regular expression in full "
                   "(a separate factor: Phi ∝ f(p_1..p_K) * 1{x matches}); checked before models load")
    s.add_argument("--json-schema", type=Path, metavar="FILE",
                   help="constrain every sampled string to a JSON text valid under this JSON Schema file")
    s.add_argument("--seed", type=int, default=0, help="PRNG seed (same seed, same result)")
    precision = s.add_mutually_exclusive_group()
    precision.add_argument("--bf16", action="store_true",
                           help="bfloat16 parameters, activations and cache (float32 log-probabilities); for accelerators")
    precision.add_argument("--bf16-matmuls", action="store_true",
                           help="bfloat16 weight matmuls, float32 accumulation, activations and cache: about half the "
                                "forward time on CPU, log-probabilities within bfloat16's rounding (docs/models.md)")
    s.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    s.add_argument("--plot", type=Path, help="save a plot of weights, ESS and particle ancestry to this PNG file")
    s.add_argument("--top", type=int, default=TABLE_ROWS, help="rows of the table (distinct strings)")


def _short(text: str, width: int = TEXT_WIDTH) -> str:
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)  # newlines etc. escaped, quotes kept
    return text if len(text) <= width else text[: width - 1] + "…"


def precision_of(args: argparse.Namespace) -> dict[str, Any]:
    """`load_model`'s precision arguments for --bf16 or --bf16-matmuls (float32 for neither).

    Parameters
    ----------
    args : argparse.Namespace
        The parsed `smc-jax sample` arguments.
    """
    import jax.numpy as jnp

    if args.bf16:
        return {"dtype": jnp.bfloat16}
    return {"matmul_dtype": jnp.bfloat16} if args.bf16_matmuls else {}


def _load_models(names: Sequence[str], bar, **precision: Any) -> dict:
    from smc_jax.models import load_model

    models = {}
    for name in dict.fromkeys(names):
        bar.set_description(f"loading {name}")
        models[name] = load_model(name, **precision)
        bar.update(1)
    return models


def settings_of(args: argparse.Namespace) -> SamplerSettings:
    """The sampler settings the arguments ask for (raises ValueError for a bad one).

    Parameters
    ----------
    args : argparse.Namespace
        The parsed `smc-jax sample` arguments.
    """
    return DEFAULTS.replace(
        level=args.level, num_particles=args.particles, max_length=args.max_length,
        ess_threshold=args.ess_threshold, resampler=args.resampler,
        resample_finished=not args.resample_active_only, at_max_length=args.at_max_length,
        temperature=args.temperature, beam_width=args.beam_width, prune_threshold=args.prune_threshold,
        heal=not args.no_heal, progress=not args.json,
    )


def validate(args: argparse.Namespace) -> tuple[list[tuple[str, str]], SamplerSettings]:
    """Every check that needs no model, run before any model loads (loading takes a minute):
    the sampler settings, f and the weights against the number of experts, the prompts' text
    and the table size. Returns the (model, prompt) pairs and the settings.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed `smc-jax sample` arguments.
    """
    pairs = [tuple(e) for e in args.expert] if args.expert else list(DEFAULT_EXPERTS)
    settings = settings_of(args)
    make_ensemble(args.f, len(pairs), args.weights)
    for i, (_, prompt) in enumerate(pairs):
        check_prompt(prompt, f"the prompt of expert {i}")
    if args.top < 1:
        raise ValueError(f"--top must be >= 1, got {args.top}")
    return pairs, settings


def _compile_constraints(args: argparse.Namespace) -> list:
    from smc_jax import constraints

    out = []
    if args.regex is not None:
        out.append(constraints.regex(args.regex))
    if args.json_schema is not None:
        out.append(constraints.json_schema(args.json_schema))
    return out


def run_sample(args: argparse.Namespace) -> int:
    """Runs `smc-jax sample` and prints its table (or JSON); returns the exit status.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments of `sample`.
    """
    result, pairs, elapsed = _sample(args)
    if args.plot:
        from smc_jax.plots import plot_run

        plot_run(result, args.plot, title=f"{args.level} {args.f}-ensemble of {len(pairs)} experts")
    if args.json:
        print(json.dumps(_as_json(result, pairs, args, elapsed), indent=2))
    else:
        _print_table(result, pairs, args, elapsed)
    return 0


def run_precompile(args: argparse.Namespace) -> int:
    """Runs `smc-jax precompile`: the job of `sample` with the same options, once, so that its
    compiled programs are kept in the persistent cache; prints what was compiled and where.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments of `precompile` (those of `sample`).
    """
    import jax

    from smc_jax.models.weights_cache import cache_enabled
    from smc_jax.utils.compilation import count_compilations

    if not cache_enabled():  # else `import smc_jax` has turned the cache on
        raise ValueError("precompile keeps programs in the persistent cache, which SMC_JAX_NO_CACHE=1 turns off; unset it")
    with count_compilations() as compiled:
        _, _, elapsed = _sample(args)
    print(f"compiled {compiled.count} programs ({compiled.seconds:.1f} s of compilation, {elapsed:.1f} s in all), "
          f"kept in {jax.config.jax_compilation_cache_dir}: `smc-jax sample` with the same options loads them")
    return 0


def _sample(args: argparse.Namespace) -> tuple[Any, list[tuple[str, str]], float]:
    """The sampling job of `sample` / `precompile`: (result, (model, prompt) pairs, seconds)."""
    from tqdm.auto import tqdm

    from smc_jax.sampler import EnsembleSampler, Expert
    from smc_jax.smc.progress import report_progress

    pairs, settings = validate(args)
    constraints = _compile_constraints(args)  # bad patterns fail here, before any model loads
    with tqdm(total=len({m for m, _ in pairs}), unit="model", file=sys.stderr, disable=args.json) as bar:
        models = _load_models([m for m, _ in pairs], bar, **precision_of(args))
    experts = tuple(
        Expert(models[m], [{"role": "user", "content": p}] if args.chat else p) for m, p in pairs
    )
    sampler = EnsembleSampler(experts, f=args.f, weights=args.weights, settings=settings, constraint=constraints)
    steps = sampler.smc.num_steps
    start = time.perf_counter()
    with tqdm(total=steps, unit="step", file=sys.stderr, disable=args.json, desc="compiling + sampling") as bar:

        def on_step(step: int, active: int) -> None:
            bar.set_description(f"sampling ({active} of {args.particles} particles active)")
            bar.update(max(0, step + 1 - bar.n))

        with report_progress(on_step):
            result = sampler(args.seed)
        bar.update(bar.total - bar.n)
    return result, pairs, time.perf_counter() - start


def _as_json(result, pairs, args, elapsed: float) -> dict:
    return {
        "experts": [{"model": m, "prompt": p} for m, p in pairs],
        "f": args.f,
        "level": args.level,
        "log_Z": result.log_Z,
        "particles": [
            {"text": t, "weight": float(w), "finished": bool(fin), "expert_logprobs": [float(v) for v in lp]}
            for t, w, fin, lp in zip(result.texts, result.weights, result.finished, result.expert_logprobs)
        ],
        "posterior": [{"text": k if isinstance(k, str) else k[0], "finished": isinstance(k, str), "weight": w}
                      for k, w in result.posterior()],
        "ess": [float(v) for v in result.ess],
        "resampled": [bool(v) for v in result.resampled],
        "stats": {k: v for k, v in result.stats.items()},
        "seconds": elapsed,
    }


def _print_table(result, pairs, args, elapsed: float) -> None:
    print(f"{args.level}-level {args.f} ensemble of {len(pairs)} experts, M={args.particles}:")
    for i, (m, p) in enumerate(pairs):
        print(f"  expert {i}: {m} <- {p!r}")
    print(f"\n  {'weight':>7}  {'done':4}  text")
    for key, weight in result.posterior()[: args.top]:
        text, done = (key, "yes") if isinstance(key, str) else (key[0], "…")
        print(f"  {weight:7.3f}  {done:4}  {_short(text)}")
    log_z = "n/a (local baseline: weights ignored)" if result.log_Z is None else f"{result.log_Z:.4f}"
    print(f"\nlog Z-hat: {log_z}")
    resamples = int(result.resampled.sum())
    stats = result.stats
    print(
        f"steps: {result.num_steps}, resampled {resamples} times, model calls: {stats.get('model_calls', 'n/a')}, "
        f"{elapsed:.1f} s (includes compilation on a first run)"
    )
    if args.plot:
        print(f"plot: {args.plot}")
    if not math.isfinite(result.log_Z or 0.0):
        print("warning: every particle has zero weight", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """The `smc-jax` entry point.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments (default: the command line's).

    Returns
    -------
    int
        The exit status.
    """
    args = build_parser().parse_args(argv)
    if args.command == "models":
        from smc_jax.models.registry import EMBEDDED

        for model in EMBEDDED.values():
            print(f"{model.name:24s} aliases: {', '.join(model.aliases) or '-'}")
        print("also: a local Hugging Face directory, a .gguf file, or a hub id (when the hub is reachable)")
        return 0
    try:
        return (run_precompile if args.command == "precompile" else run_sample)(args)
    except (ValueError, ImportError, FileNotFoundError, RuntimeError) as err:
        # Bad input (unknown model, prompt too long, bad f or weights, every particle at zero
        # weight, ...): the library's message says what to do; no stack trace.
        print(f"smc-jax: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

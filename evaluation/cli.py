"""Command-line plumbing shared by evaluate.py and particle_study.py: the common options, the
run settings they imply, model loading, and JSON-safe rows."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evaluation import PAPER_FS, StudySettings, get_method

#: Where the study scripts write their tables, figures and record files.
RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_CROSS_MODEL = "gemma3-270m"
#: Byte-level length limit per token of --max-length when --max-bytes is not given.
BYTES_PER_TOKEN = 4


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a clear usage error instead of a sampler traceback)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def add_common_arguments(parser: argparse.ArgumentParser, *, particles: Sequence[int], seeds: Sequence[int]) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="main model: an embedded name, a local checkpoint directory or a .gguf file")
    parser.add_argument("--cross-model", default=DEFAULT_CROSS_MODEL,
                        help="second model of the cross-model methods (loaded only when one is run)")
    parser.add_argument("--cross-prompt", type=int, choices=(1, 2), default=1,
                        help="the prompt both models read in cross-model methods")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--fs", nargs="+", default=list(PAPER_FS), help="f-ensembles (names or exponents tau)")
    parser.add_argument("--particles", "-M", nargs="+", type=positive_int, default=list(particles), help="particle counts M")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(seeds))
    parser.add_argument("--limit", type=positive_int, default=None, help="instances per task (seeded draw; all when omitted)")
    parser.add_argument("--instance-seed", type=int, default=0, help="seed of the instance draw")
    parser.add_argument("--max-words", type=int, default=None,
                        help="word sorting only: keep lists of at most this many words before the draw")
    parser.add_argument("--max-length", type=positive_int, default=32, help="length limit in tokens (token and local levels)")
    parser.add_argument("--max-bytes", type=positive_int, default=None,
                        help=f"length limit in bytes (byte level); default {BYTES_PER_TOKEN} x --max-length")
    parser.add_argument("--at-max-length", choices=("truncate", "eos"), default="truncate",
                        help="truncate: strings cut at the limit are unfinished (wrong); eos: forced EOS there, "
                             "weighted by its probability")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--ess-threshold", type=float, default=0.9, help="resample when ESS < threshold x M")
    parser.add_argument("--data-dir", default=None, help="task data folder (default $SMC_JAX_DATA, else the data in evaluation/tasks/data)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help="run the instances and seeds of each method, f and M this many at a time, as one batch "
                             "of problems (default: one run at a time)")


def settings_from(args: argparse.Namespace) -> StudySettings:
    return StudySettings(
        model=args.model,
        cross_model=args.cross_model,
        max_length=args.max_length,
        max_bytes=args.max_bytes if args.max_bytes is not None else BYTES_PER_TOKEN * args.max_length,
        at_max_length=args.at_max_length,
        temperature=args.temperature,
        ess_threshold=args.ess_threshold,
        cross_prompt=args.cross_prompt,
        dtype=args.dtype,
    )


def load_models(settings: StudySettings, methods: Sequence[str]):
    """(main model, cross model or None when no method needs it) in the settings' dtype."""
    import jax.numpy as jnp

    from smc_jax import load_model

    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[settings.dtype]
    model = load_model(settings.model, dtype)
    needs_cross = any(get_method(m).cross_model for m in methods)
    cross = load_model(settings.cross_model, dtype) if needs_cross else None
    return model, cross


class LazyModelRunner:
    """make_runner that loads the models at the first job only: a rerun with nothing pending
    (e.g. to redo the report) loads nothing."""

    def __init__(self, settings: StudySettings, methods: Sequence[str]):
        self.settings, self.methods, self._runner = settings, list(methods), None

    def _loaded(self):
        if self._runner is None:
            from evaluation import ModelRunner

            model, cross = load_models(self.settings, self.methods)
            self._runner = ModelRunner(model, self.settings, cross)
        return self._runner

    def __call__(self, job):
        return self._loaded()(job)

    def run_batch(self, runs, batch_size: int):
        """`ModelRunner.run_batch`, loading the models first."""
        return self._loaded().run_batch(runs, batch_size)


def json_safe(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with NaN/inf floats as None (strict JSON)."""
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()} for row in rows]


def command_line() -> str:
    """The command that reproduces this run (`python -m evaluation.<name> ...`)."""
    return " ".join([f"python -m evaluation.{Path(sys.argv[0]).stem}", *sys.argv[1:]])

"""Time to the first sample, as a user meets it: fresh processes, side by side with GenLM.

The job is the default demo's: SmolLM2 x Gemma 3 under "My favorite physicist is", byte-level
product, M = 10, at 40 and at 64 bytes (models converted already). Each case is the wall time
from process start to the first printed sample, with the XLA compilations the process made:

* cold: `smc-jax sample --max-length L` with an empty compilation cache (and program store);
* warm: the same command in a second process (the cache filled by the first);
* sweep: one Python process through eight runs in turn: the demo, then ess_threshold 0.5,
  temperature 0.8, tau 2.5, weights (0.3, 0.7), max_length L - 2, at_max_length "truncate" and
  seed 1, each a new `EnsembleSampler` (seconds and compilations per setting);
* GenLM: a fresh process that loads the same GGUF files (transformers, float32, GenLM's
  AsyncTransformer), builds `ByteLLM` potentials (beam 5, threshold 0.05, the prompt read as
  bytes) and runs `direct_token_sampler(Product(p1, p2)).smc(10 particles, ESS 0.9,
  max_tokens L + 1)` at its defaults.

Writes benchmarks/results/first_sample.{json,md}; rows of lengths (or of GenLM, or of another
device: `device` is "cpu" or the GPU's kind) not measured in a run are kept from the saved file,
with the date and commit they were measured at.
Run: python -m benchmarks.first_sample [--lengths 40 64] [--sweep-length 40] [--skip-genlm]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import ROOT, device_label, kept_rows, save

MODELS = ("smollm2-135m-instruct", "gemma3-270m")
PROMPT = "My favorite physicist is"

#: A child process: counts compilations and persistent-cache events, runs the command line,
#: reports them as JSON on its last stderr line.
_CLI = """
import collections, json, sys
import jax
events, compiles = collections.Counter(), []
jax.monitoring.register_event_listener(lambda event, **_: events.update([event.rsplit("/", 1)[-1]]))
jax.monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **_: compiles.append(seconds) if event == "/jax/core/compile/backend_compile_duration" else None)
from smc_jax.cli import main
status = main(sys.argv[1:])
sys.stdout.flush()
print(json.dumps({"compilations": len(compiles), "compile_s": sum(compiles), "cache_hits": events["cache_hits"],
                  "cache_misses": events["cache_misses"]}), file=sys.stderr)
sys.exit(status)
"""

_SWEEP = """
import json, sys, time
start = time.perf_counter()
import jax
from smc_jax import EnsembleSampler, load_model
from smc_jax.utils.compilation import count_compilations
length = int(sys.argv[1])
smol, gemma = load_model("smollm2-135m-instruct"), load_model("gemma3-270m")
experts = [(smol, {prompt!r}), (gemma, {prompt!r})]
settings = [("demo", {{}}, 0), ("ess_threshold 0.5", dict(ess_threshold=0.5), 0), ("temperature 0.8", dict(temperature=0.8), 0),
            ("tau 2.5", dict(f=2.5), 0), ("weights (0.3, 0.7)", dict(weights=[0.3, 0.7]), 0),
            ("max_length L - 2", dict(max_length=length - 2), 0), ("at_max_length truncate", dict(at_max_length="truncate"), 0),
            ("seed 1", {{}}, 1)]
rows = []
for name, change, seed in settings:
    options = dict(dict(f="product", max_length=length), **change)
    t = time.perf_counter()
    with count_compilations() as compiles:
        result = EnsembleSampler(experts, **options)(seed)
    key = result.posterior()[0][0]
    text = key if isinstance(key, str) else key[0]  # an unfinished string's key is (text, "unfinished")
    rows.append(dict(setting=name, seconds=time.perf_counter() - t, compilations=compiles.count,
                     since_start=time.perf_counter() - start, sample=text[:40]))
    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
print(json.dumps(rows))
"""

_GENLM = """
import time
start = time.perf_counter()
import asyncio, json, sys
from types import SimpleNamespace
from transformers import AutoTokenizer
from genlm.control import ByteLLM, direct_token_sampler
from genlm.control.potential import Product
from benchmarks.genlm_side import GenLM
from smc_jax.models.registry import resolve
length, eos = int(sys.argv[1]), json.loads(sys.argv[2])
settings = SimpleNamespace(beam_width=5, prune_threshold=0.05)
models = []
for name in {models!r}:
    path = resolve(name)[1]
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    models.append(SimpleNamespace(name=name, tokenizer=SimpleNamespace(hf=tokenizer, eos_token_ids=eos[name])))
genlm = GenLM(torch_threads=None)
potentials = []
for model in models:
    p = ByteLLM(genlm.llm(model), genlm.beam_params(model, settings))
    p.set_prompt_from_str({prompt!r})
    potentials.append(p)
print(json.dumps({{"models_loaded_s": time.perf_counter() - start}}), file=sys.stderr, flush=True)
sampler = direct_token_sampler(Product(*potentials))
sequences = asyncio.run(sampler.smc(n_particles=10, ess_threshold=0.9, max_tokens=length + 1, resampling_method="multinomial"))
posterior = sequences.decoded_posterior
print(repr(max(posterior, key=posterior.get) if posterior else None)[:60], flush=True)
"""


def timed_process(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Runs a child; the seconds from its start to its first stdout line and to its exit, its
    last stderr line parsed as JSON when it is JSON."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # stderr drained beside (a progress bar would fill its pipe); stdout read through one buffered
    # reader (`communicate` after `readline` would skip the lines already buffered).
    errors: list[str] = []
    drain = threading.Thread(target=lambda: errors.append(child.stderr.read()))
    drain.start()
    first = child.stdout.readline()
    first_s = time.perf_counter() - start
    rest = child.stdout.read()
    child.wait()
    drain.join()
    err = errors[0] if errors else ""
    total = time.perf_counter() - start
    if child.returncode:
        raise RuntimeError(f"{argv[:4]} failed ({child.returncode}):\n{err[-3000:]}")
    lines = [line for line in err.strip().splitlines() if line.startswith("{")]
    facts = json.loads(lines[-1]) if lines else {}
    return {"first_output_s": first_s, "exit_s": total, "stdout": first + rest, **facts}


def clean(text: str) -> str:
    """A sample on one table line: newlines shown as \\n, at most 50 characters."""
    return text.replace("\n", "\\n")[:50]


def first_sample_line(stdout: str) -> str:
    """The first particle row of `smc-jax sample`'s output (weight, finished, text: the heaviest):
    the line after the table's header."""
    lines = stdout.splitlines()
    header = [i for i, line in enumerate(lines) if re.match(r"\s+weight\s+done\s+text", line)]
    row = lines[header[0] + 1] if header and header[0] + 1 < len(lines) else stdout.strip()
    return clean(" ".join(row.split()))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.first_sample", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[40, 64])
    parser.add_argument("--sweep-length", type=int, default=40)
    parser.add_argument("--skip-genlm", action="store_true")
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "SMC_JAX_NO_CACHE")}
    rows, device = [], device_label()
    load = os.getloadavg()
    if not args.skip_genlm:  # GenLM ends at smc_jax's EOS tokens (the same strings end)
        from smc_jax import load_model

        eos = {name: list(load_model(name).tokenizer.eos_token_ids) for name in MODELS}
    with tempfile.TemporaryDirectory() as scratch:
        for length in args.lengths:
            cache = Path(scratch) / f"xla-{length}"
            env = {**base, "JAX_COMPILATION_CACHE_DIR": str(cache)}
            command = [sys.executable, "-c", _CLI, "sample", "--max-length", str(length)]
            for case in ("cold", "warm"):
                got = timed_process(command, env)
                rows.append({"tool": "smc_jax (smc-jax sample)", "case": case, "bytes": length,
                             "seconds": got["first_output_s"], "compilations": got.get("compilations"),
                             "cache_hits": got.get("cache_hits"), "cache_misses": got.get("cache_misses"),
                             "sample": first_sample_line(got["stdout"])})
                print(rows[-1], flush=True)
            if length == args.sweep_length:
                sweep = timed_process([sys.executable, "-c", _SWEEP.format(prompt=PROMPT), str(length)], env)
                for i, step in enumerate(json.loads(sweep["stdout"])):
                    rows.append({"tool": "smc_jax (Python)", "case": f"sweep {i + 1}: {step['setting']}", "bytes": length,
                                 "seconds": step["seconds"], "compilations": step["compilations"], "sample": clean(step["sample"])})
                    print(rows[-1], flush=True)
            if not args.skip_genlm:
                got = timed_process([sys.executable, "-c", _GENLM.format(models=MODELS, prompt=PROMPT), str(length),
                                     json.dumps(eos)], base)
                rows.append({"tool": "GenLM", "case": "fresh process", "bytes": length, "seconds": got["first_output_s"],
                             "models_loaded_s": got.get("models_loaded_s"), "sample": clean(got["stdout"].strip().strip("'\""))})
                print(rows[-1], flush=True)
    rows = [dict(row, device=device) for row in rows]
    old, _ = kept_rows("first_sample", lambda row: row["bytes"] in args.lengths
                       and (row["tool"] != "GenLM" or not args.skip_genlm), device)
    rows += old
    columns = ["device", "tool", "case", "bytes", "seconds", "compilations", "cache_hits", "cache_misses", "models_loaded_s", "sample",
               "measured"]
    notes = ("Wall seconds from process start to the first printed sample (smc_jax: the first table row of "
             "`smc-jax sample`, its progress bar on; sweep: seconds of each setting's call in one process, "
             "a new sampler each). compilations: XLA compilations in the process (the sweep: in that call); "
             "cache hits / misses: the persistent compilation cache. Models converted beforehand. Load average "
             f"at the start: {load[0]:.2f}.")
    print(save("first_sample", rows, columns, {"prompt": PROMPT, "models": MODELS, "particles": 10}, notes))


if __name__ == "__main__":
    main()

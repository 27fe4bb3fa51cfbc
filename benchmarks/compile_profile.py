"""Where a sampler's compile time goes: program size by part, and trace / lower / compile seconds.

For the default demo's byte program (SmolLM2 x Gemma 3, byte product, M = 10, 64 bytes) and a
token program (SmolLM2 under two prompts, M = 8, 40 tokens), with the persistent cache off:

* the seconds to build the experts (prompt prefill and the byte beams' start state: programs
  of their own, compiled on first use);
* for the step loop (`SMC`'s `advance` program): seconds to trace, lower and compile it, its
  size (jaxpr equations, counted into sub-programs; characters of StableHLO), and how many
  times a model's forward appears in it;
* the equations by part: each model-forward call site, the context store, beam and trie code,
  byte healing, EOS healing, prefetch, resampling, recording and the rest of the SMC step.
  Each equation goes to the innermost of the library's named scopes (`jax.named_scope`)
  around it; a forward's equations go to the call site that asked for it;
* the byte program once more with healing off (`heal=False`), whose compile seconds show what
  healing costs.

Writes benchmarks/results/compile_profile.{json,md}.
Run: python -m benchmarks.compile_profile [--only byte token no-heal]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax
import numpy as np

from benchmarks.common import markdown_table, save
from smc_jax import load_model
from smc_jax.sampler import EnsembleSampler
from smc_jax.smc import engine

PROMPT = "My favorite physicist is"
#: The library's named scopes (`jax.named_scope`) and the part each stands for.
SCOPES = {
    "byte step": "byte step (its one call site)",
    "byte shift": "beam and trie: shift",
    "byte refresh": "beam and trie: next-byte distributions",
    "healing": "byte healing",
    "eos healing": "EOS healing",
    "prefetch": "prefetch",
    "token step": "token expert step",
    "context store": "context store",
    "proposal": "proposal",
    "reweighting": "reweighting",
    "resampling": "resampling",
    "recording": "recording",
}
#: The scopes that ask for model forwards: a forward is counted at the innermost one around it.
CALL_SITES = ("byte step", "byte shift", "byte refresh", "healing", "eos healing", "token step")


def innermost(stack: str, names) -> str | None:
    """The name among `names` whose scope is innermost in the name stack `stack` ("a/b/c")."""
    scopes = stack.split("/")
    found = [(i, name) for name in names for i, scope in enumerate(scopes) if scope == name or scope.endswith(f"({name})")]
    return max(found)[1] if found else None


def _is_forward(eqn) -> bool:
    return eqn.primitive.name in ("pjit", "jit") and "paged_decode" in str(eqn.params.get("name", ""))


def _sub_jaxprs(eqn):
    for value in eqn.params.values():
        for sub in value if isinstance(value, (list, tuple)) else (value,):
            if hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
                yield sub.jaxpr
            elif hasattr(sub, "eqns"):
                yield sub


def count_parts(jaxpr, counts: collections.Counter, forwards: collections.Counter, outer: str = "",
                forward_site: str | None = None) -> None:
    """Adds each equation of `jaxpr` (and of its sub-programs, each as often as it is called) to
    its part in `counts` (the innermost library scope around it, `SCOPES`), and each forward to
    its call site in `forwards`. `outer` is the name stack of the enclosing equations (a
    sub-program's own stacks start empty)."""
    for eqn in jaxpr.eqns:
        stack = f"{outer}/{eqn.source_info.name_stack}"
        if _is_forward(eqn):
            site = innermost(stack, CALL_SITES) or "elsewhere"
            forwards[site] += 1
            for sub in _sub_jaxprs(eqn):
                count_parts(sub, counts, forwards, stack, site)
            continue
        if forward_site is not None:
            counts[f"model forward @ {forward_site}"] += 1
        else:
            scope = innermost(stack, SCOPES)
            counts[SCOPES[scope] if scope else "SMC step (rest)"] += 1
        for sub in _sub_jaxprs(eqn):
            count_parts(sub, counts, forwards, stack, forward_site)


def profile(name: str, sampler: EnsembleSampler) -> tuple[dict[str, Any], collections.Counter, collections.Counter]:
    """Builds the experts, then traces, lowers and compiles the `advance` program of `sampler`."""
    start = time.perf_counter()
    experts = jax.block_until_ready(sampler.build())
    build = time.perf_counter() - start
    smc = sampler.smc
    quiet = dataclasses.replace(smc, progress=False, ess_threshold=1.0)
    knobs = engine._Knobs(np.float32(smc.ess_threshold), np.float32(smc.ess_threshold * smc.num_particles))
    state = engine._init_jitted(quiet, jax.random.key(0), experts, sampler.ensemble)
    args = (quiet, knobs, state, experts, sampler.ensemble, np.int32(quiet.num_steps))
    start = time.perf_counter()
    traced = engine._advance_jitted.trace(*args)
    trace = time.perf_counter() - start
    start = time.perf_counter()
    lowered = traced.lower()
    lower = time.perf_counter() - start
    hlo_chars = len(lowered.as_text())
    start = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args[1:]))
    run = time.perf_counter() - start
    counts, forwards = collections.Counter(), collections.Counter()
    count_parts(traced.jaxpr.jaxpr, counts, forwards)
    row = {
        "program": name, "build_s": build, "trace_s": trace, "lower_s": lower, "compile_s": compile_s, "run_s": run,
        "jaxpr_eqns": sum(counts.values()), "stablehlo_chars": hlo_chars, "forwards": sum(forwards.values()),
    }
    print(row, flush=True)
    return row, counts, forwards


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=["byte", "no-heal", "token"], help="programs to profile")
    args = parser.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)  # every program compiles here
    smol, gemma = load_model("smollm2-135m-instruct"), load_model("gemma3-270m")
    programs = {
        "byte (default demo)": lambda: EnsembleSampler([(smol, PROMPT), (gemma, PROMPT)], "product"),
        "byte, heal=False": lambda: EnsembleSampler([(smol, PROMPT), (gemma, PROMPT)], "product", heal=False),
        "token (SmolLM2 x 2 prompts)": lambda: EnsembleSampler(
            [(smol, PROMPT), (smol, "The greatest scientist of all time is")], "product",
            level="token", num_particles=8, max_length=40),
    }
    keys = {"byte": "byte (default demo)", "no-heal": "byte, heal=False", "token": "token (SmolLM2 x 2 prompts)"}
    wanted = [keys[k] for k in args.only] if args.only else list(programs)
    rows, parts, sites = [], {}, {}
    for name in wanted:
        row, counts, forwards = profile(name, programs[name]())
        rows.append(row)
        parts[name], sites[name] = dict(counts.most_common()), dict(forwards.most_common())
    columns = ["program", "build_s", "trace_s", "lower_s", "compile_s", "run_s", "jaxpr_eqns", "stablehlo_chars", "forwards"]
    part_rows = [{"part": part, **{name: parts[name].get(part, 0) for name in wanted}}
                 for part in sorted({p for c in parts.values() for p in c}, key=lambda p: -max(c.get(p, 0) for c in parts.values()))]
    site_rows = [{"call site": site, **{name: sites[name].get(site, 0) for name in wanted}}
                 for site in sorted({s for c in sites.values() for s in c})]
    appendix = ("## jaxpr equations by part\n\n" + markdown_table(part_rows, ["part", *wanted])
                + "\n\n## model forwards by call site (each model counted)\n\n"
                + markdown_table(site_rows, ["call site", *wanted]))
    notes = ("Persistent compilation cache off. build_s: prompt prefill and start state (their own programs); "
             "trace/lower/compile/run: the step loop (`advance`), run = one whole run of it. forwards: model "
             "forwards in the step loop (a call site with several batch-size buckets holds one per bucket). "
             "XLA options tried on the byte step loop (one run each): backend optimization level 0 compiled in "
             "16 s against 24 s but ran 1.6x slower, with other floats; level 1, xla_llvm_disable_expensive_passes "
             "and xla_cpu_parallel_codegen_split_count=4 did not shorten compiling.")
    print(save("compile_profile", rows, columns, {"prompt": PROMPT}, notes, appendix=appendix,
               extra={"parts": parts, "forwards_by_call_site": sites}))
    print(appendix)


if __name__ == "__main__":
    main()

"""Where a sampler's compile time goes: program size by part, and trace / lower / compile seconds.

For the default demo's byte program (SmolLM2 x Gemma 3, byte product, M = 10, 64 bytes) and a
token program (SmolLM2 under two prompts, M = 8, 40 tokens), with the persistent cache off:

* the seconds to build the experts (the prompt prefill, a program of its own compiled on first
  use; the byte beams' first next-byte distributions are the step loop's first call);
* for the step loop (`SMC`'s `advance` program): seconds to trace, lower and compile it, its
  size (jaxpr equations, counted into sub-programs; characters of StableHLO), and how many
  times a model's forward appears in it;
* the equations by part: each model-forward call site, the context store, beam and trie code,
  byte healing, EOS healing, prefetch, resampling, recording and the rest of the SMC step.
  Each equation goes to the innermost of the library's named scopes (`jax.named_scope`)
  around it; a forward's equations go to the call site that asked for it;
* the byte program once more with healing off (`heal=False`), whose compile seconds show what
  healing costs;
* with `--against REV`, the default demo's first call in a fresh process with an empty cache,
  on this checkout's code and on the code of commit REV (extracted with `git archive`; models
  converted in a scratch cache for it): JAX's own duration events, so both sides are measured
  alike -- seconds of tracing, lowering and XLA compiling, in all and for the largest program,
  and the first and second calls' wall time;
* compile seconds by part (`--backend`): each program compiled again in a child process with
  XLA:CPU's timing logs on, which give the HLO passes' seconds, the backend's (kernel emission
  and LLVM), and each kernel's LLVM seconds; a kernel goes to the part of the operation it was
  fused from (its `op_name` in the compiled HLO, the same named scopes).

Writes benchmarks/results/compile_profile.{json,md}.
Run: python -m benchmarks.compile_profile [--only byte token no-heal] [--backend] [--against REV]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax
import numpy as np

from benchmarks.common import ROOT, markdown_table, save
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


#: XLA:CPU's timing logs (absl VLOG): HLO passes, the backend, and each kernel's LLVM module.
XLA_LOGS = {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "cpu_compiler=1,ir_compiler=1"}
_SECONDS = r"time: ([\d.]+) (us|ms|s) "
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


#: The part of an instruction XLA made with no `op_name` that no neighbour names either.
UNNAMED = "copies and layout (no op_name)"
#: XLA:CPU's element-wise emitters put most kernels in one LLVM module, compiled as up to 32
#: parts (`__compute_module_part_NN`) of several kernels each: their seconds have no one part.
MODULE_PARTS = "LLVM module parts (several kernels each)"


def kernel_parts(hlo_text: str) -> dict[str, str]:
    """Each instruction of a compiled HLO module (its kernels are named after them) -> its part.
    XLA's passes drop the `op_name` of some instructions they make (the forward's matrix
    products among them): such an instruction takes the part of its first named operand, else
    of its first named user."""
    parts, operands = {}, {}
    for line in hlo_text.splitlines():
        found = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line)
        if found:
            stack = (re.search(r'op_name="([^"]*)"', line) or [None, ""])[1]
            scope = innermost(stack, SCOPES)
            operands[found[1]] = re.findall(r"%([\w.\-]+)", line[found.end():])
            if stack:
                parts[found[1]] = "model forward" if "paged_decode" in stack else SCOPES[scope] if scope else "SMC step (rest)"
    users: dict[str, list[str]] = collections.defaultdict(list)
    for name, args in operands.items():
        for arg in args:
            users[arg].append(name)
    for neighbours in (operands, users):  # producers first: a product belongs to what it computes
        changed = True
        while changed:
            changed = False
            for name in operands:
                if name not in parts:
                    named = [parts[n] for n in neighbours.get(name, ()) if n in parts]
                    if named:
                        parts[name], changed = named[0], True
    return {name: parts.get(name, UNNAMED) for name in operands}


def runtime_parts(trace: str, hlo_text: str) -> dict[str, float]:
    """Seconds by part of a profiled run: each kernel's own time (its nested events subtracted),
    from a perfetto trace of `jax.profiler` taken with XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true
    (one event per kernel run), summed over threads; events of other programs are left out."""
    with gzip.open(trace) if trace.endswith(".gz") else open(trace) as f:
        events = json.load(f)
    events = [e for e in (events["traceEvents"] if isinstance(events, dict) else events) if e.get("ph") == "X"]
    by_thread = collections.defaultdict(list)
    for event in events:
        by_thread[event.get("pid"), event.get("tid")].append(event)
    own = collections.Counter()
    for thread in by_thread.values():
        thread.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        stack: list[dict] = []
        for event in thread:
            while stack and stack[-1]["ts"] + stack[-1].get("dur", 0) <= event["ts"]:
                stack.pop()
            if stack:
                own[stack[-1]["name"]] -= event.get("dur", 0)
            own[event["name"]] += event.get("dur", 0)
            stack.append(event)
    parts, seconds = kernel_parts(hlo_text), collections.Counter()
    for name, micros in own.items():
        if name in parts:
            seconds[parts[name]] += micros * 1e-6
    return dict(seconds.most_common())


def backend_seconds(log: str, hlo_text: str) -> dict[str, Any]:
    """The `advance` program's compile seconds from XLA's logs: HLO passes, backend, kernels,
    and LLVM seconds by part (summed over the compile threads)."""
    total = lambda what: sum(float(m[1]) * _UNIT[m[2]] for m in re.finditer(what + _SECONDS, log))  # noqa: E731
    parts, by_part = kernel_parts(hlo_text), collections.Counter()
    # Its kernels are logged between the end of its HLO passes and the end of its backend.
    start = log.find("Running HLO passes on [jit__advance]")
    own = log[start: log.find("Compiling [jit__advance] for CPU using JIT", start)]
    kernels = re.findall(r"Compiled LLVM module: __compute_module_(\S+?)(?:_kernel_module)? " + _SECONDS, own)
    for name, value, unit in kernels:
        name = name.removesuffix("_elemental")  # an element-wise emitter's kernel of one instruction
        by_part[MODULE_PARTS if re.fullmatch(r"part_\d+", name) else parts.get(name, UNNAMED)] += float(value) * _UNIT[unit]
    return {"hlo_passes_s": total(r"Running HLO passes on \[jit__advance\] for CPU "),
            "backend_s": total(r"Compiling \[jit__advance\] for CPU using JIT "),
            "kernels": len(kernels), "llvm_thread_s": sum(by_part.values()), "llvm_s_by_part": dict(by_part)}


def profile(
    name: str, sampler: EnsembleSampler, hlo: bool = False
) -> tuple[dict[str, Any], collections.Counter, collections.Counter]:
    """Builds the experts, then traces, lowers and compiles the `advance` program of `sampler`
    (with `hlo`, the row's "_hlo" holds the compiled module's text)."""
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
        "program": name, "build_s": build, "trace_s": trace, "lower_s": lower, "compile_s": compile_s,
        "cold_s": build + trace + lower + compile_s, "run_s": run,
        "jaxpr_eqns": sum(counts.values()), "stablehlo_chars": hlo_chars, "forwards": sum(forwards.values()),
    }
    print(row, flush=True)
    if hlo:
        row["_hlo"] = compiled.as_text()
    return row, counts, forwards


def run_backend_child(key: str) -> dict[str, Any]:
    """`--backend-child key` in a fresh process with XLA's timing logs on; its parsed figures."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.compile_profile", "--backend-child", key],
                          env=dict(os.environ, **XLA_LOGS), capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"compile_profile --backend-child {key} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


#: A child: the default demo's sampler (byte product of SmolLM2 and Gemma 3, M = 10, 64 bytes)
#: built and called twice (the first call's seconds count the building), with JAX's duration
#: events summed from there; its last line is JSON. It uses only the public API, which every
#: version since the byte demo has had.
_FIRST_CALL = """
import json, sys, time
import jax
events = {}
jax.monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **_: events.setdefault(event.rsplit("/", 1)[-1], []).append(seconds))
from smc_jax import EnsembleSampler, Expert, load_model
smol, gemma = load_model("smollm2-135m-instruct"), load_model("gemma3-270m")
prompt = "My favorite physicist is"
events.clear()  # what the sampler and its first call cost, not model loading
calls, start = [], time.perf_counter()
sampler = EnsembleSampler([Expert(smol, prompt), Expert(gemma, prompt)], f="product", level="byte", num_particles=10,
                          max_length=64)
for seed in (0, 1):
    sampler(seed)
    calls.append(time.perf_counter() - start)
    start = time.perf_counter()
pick = lambda name: events.get(name, [0.0])
print(json.dumps(dict(first_call_s=calls[0], second_call_s=calls[1], compilations=len(events.get("backend_compile_duration", [])),
                      trace_s=sum(pick("jaxpr_trace_duration")), lower_s=sum(pick("jaxpr_to_mlir_module_duration")),
                      compile_s=sum(pick("backend_compile_duration")), largest_compile_s=max(pick("backend_compile_duration")))))
"""


def first_call(code: str | None = None) -> dict[str, Any]:
    """`_FIRST_CALL` in a fresh process with an empty compilation cache, on this checkout's code
    or on the code in directory `code` (with a scratch model cache: an older version may keep
    converted checkpoints in another layout under the same names)."""
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.path.join(scratch, "xla"))
        if code is not None:
            env.update(PYTHONPATH=code, SMC_JAX_CACHE_DIR=os.path.join(scratch, "models"))
        done = subprocess.run([sys.executable, "-c", _FIRST_CALL], cwd=code or ROOT, env=env, capture_output=True,
                              text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"the first-call child failed on {code or 'this checkout'}:\n{done.stderr[-3000:]}")
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def commit_of(rev: str) -> str | None:
    """The full hash of `rev` in this checkout's repository, or None where it names no commit."""
    done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def first_call_against(sha: str) -> list[dict[str, Any]]:
    """`first_call` on the code of commit `sha` and on this checkout's: two rows."""
    rows = []
    with tempfile.TemporaryDirectory() as code:
        archive = subprocess.run(["git", "archive", sha], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", code], input=archive, check=True)
        rows.append({"code": f"commit {sha[:7]}", **first_call(code)})
        print(rows[-1], flush=True)
    rows.append({"code": "this checkout", **first_call()})
    print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=["byte", "no-heal", "token"], help="programs to profile")
    parser.add_argument("--backend", action="store_true", help="also compile seconds by part (a child per program)")
    parser.add_argument("--backend-child", help=argparse.SUPPRESS)
    parser.add_argument("--against", metavar="REV", help="also the demo's first call on the code of commit REV, beside this one's")
    args = parser.parse_args()
    against = commit_of(args.against) if args.against else None
    if args.against and against is None:  # said before any model loads or program compiles
        parser.error(f"--against {args.against!r} names no commit of this repository; give a commit hash, tag or branch")
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
    if args.backend_child:  # stderr holds XLA's logs: read them back and print the figures
        log = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"compile_profile_{os.getpid()}.log")
        saved = os.dup(2)
        with open(log, "w") as sink:
            os.dup2(sink.fileno(), 2)
            row, _, _ = profile(keys[args.backend_child], programs[keys[args.backend_child]](), hlo=True)
            os.dup2(saved, 2)
        with open(log) as f:
            text = f.read()
        os.remove(log)
        print(json.dumps(backend_seconds(text, row["_hlo"])))
        return
    wanted = [keys[k] for k in args.only] if args.only else list(programs)
    rows, parts, sites = [], {}, {}
    for name in wanted:
        row, counts, forwards = profile(name, programs[name]())
        rows.append(row)
        parts[name], sites[name] = dict(counts.most_common()), dict(forwards.most_common())
    backend = {}
    if args.backend:
        for key, name in keys.items():
            if name in wanted:
                backend[name] = run_backend_child(key)
                print(name, backend[name], flush=True)
    columns = ["program", "build_s", "trace_s", "lower_s", "compile_s", "cold_s", "run_s", "jaxpr_eqns", "stablehlo_chars",
               "forwards"]
    part_rows = [{"part": part, **{name: parts[name].get(part, 0) for name in wanted}}
                 for part in sorted({p for c in parts.values() for p in c}, key=lambda p: -max(c.get(p, 0) for c in parts.values()))]
    site_rows = [{"call site": site, **{name: sites[name].get(site, 0) for name in wanted}}
                 for site in sorted({s for c in sites.values() for s in c})]
    if backend:
        names = [n for n in wanted if n in backend]
        totals = [{"figure": label, **{n: backend[n][field] for n in names}} for field, label in (
            ("hlo_passes_s", "HLO passes (s)"), ("backend_s", "backend: kernel emission and LLVM (s)"),
            ("kernels", "LLVM modules compiled"), ("llvm_thread_s", "LLVM, summed over threads (s)"))]
        by_part = sorted({p for n in names for p in backend[n]["llvm_s_by_part"]},
                         key=lambda p: -max(backend[n]["llvm_s_by_part"].get(p, 0) for n in names))
        totals += [{"figure": f"LLVM (s): {p}", **{n: backend[n]["llvm_s_by_part"].get(p, 0.0) for n in names}}
                   for p in by_part]
        appendix_backend = ("\n\n## compile seconds by part (XLA's logs, a child process per program)\n\n"
                            + markdown_table(totals, ["figure", *names]))
    else:
        appendix_backend = ""
    versus = first_call_against(against) if against else []
    appendix_versus = ""
    if versus:
        old, new = versus
        appendix_versus = (
            "\n\n## the default demo's first call, this code against an earlier commit (fresh processes, empty caches)\n\n"
            + markdown_table(versus, ["code", "first_call_s", "second_call_s", "compilations", "trace_s", "lower_s",
                                      "compile_s", "largest_compile_s"])
            + f"\n\nXLA compiling {old['compile_s'] / new['compile_s']:.2f}x less in all, "
            f"{old['largest_compile_s'] / new['largest_compile_s']:.2f}x for the largest program; the first call "
            f"{old['first_call_s'] / new['first_call_s']:.2f}x sooner.")
    appendix = ("## jaxpr equations by part\n\n" + markdown_table(part_rows, ["part", *wanted])
                + "\n\n## model forwards by call site (each model counted)\n\n"
                + markdown_table(site_rows, ["call site", *wanted]) + appendix_backend + appendix_versus)
    notes = ("Persistent compilation cache off. build_s: prompt prefill (its own program) and the experts' "
             "start (byte beams: no model call, their first distributions are the step loop's first call); "
             "trace/lower/compile/run: the step loop (`advance`), run = one whole run of it; cold_s: build plus "
             "the step loop's trace, lower and compile, what a first run spends before it steps. forwards: model "
             "forwards in the step loop (a call site with several batch-size buckets holds one per bucket). "
             "Programs compile with the library's XLA options (`utils.compilation.COMPILER_OPTIONS`): XLA:CPU's "
             "element-wise fusion emitters compiled the byte step loop in 15.8 s against 21.3 s with its MLIR "
             "ones and the token loop in 4.85 s against 6.07 s, runs 12.1 s against 12.0 s and 3.82 s against "
             "3.78 s (one run each); they put most kernels in LLVM module parts, whose seconds have no one "
             "part. XLA options tried and not used on the byte step loop (one run each): backend optimization "
             "level 0 compiled in 16 s against 24 s but ran 1.6x slower, with other floats; level 1, "
             "xla_llvm_disable_expensive_passes, xla_cpu_parallel_codegen_split_count=4 (or 2) and "
             "xla_cpu_emitter_verification_level=0 did not shorten compiling.")
    print(save("compile_profile", rows, columns, {"prompt": PROMPT}, notes, appendix=appendix,
               extra={"parts": parts, "forwards_by_call_site": sites, "backend": backend, "first_call_against": versus}))
    print(appendix)


if __name__ == "__main__":
    main()

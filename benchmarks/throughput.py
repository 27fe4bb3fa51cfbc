"""Problems per second: many SMC problems one after another against the same problems run in
batches (`EnsembleSampler.sample_problems`: one program over a problem axis, so every model
call carries the rows of all the batch's particles).

Workload: the constraint study's JSON setting. N JSON-Schema instances x S seeds (the first N
instances whose schema compiles, drawn as `evaluation.load_instances("json", ...)` does), token
SMC, SmolLM2-135M-Instruct under the task's prompt 1, the instance's schema as constraint, M = 8,
max_length 48 with the forced EOS, ESS threshold 0.9.

* sequential: one `EnsembleSampler` per instance (as the evaluation runner builds them), its seeds
  one call each;
* batched: one sampler, `sample_problems(prompts, seeds, constraints=schemas, batch_size=B)`.

Each is run twice: the first pass includes compilation (what a study run meets: the sequential
path compiles once per prompt and automaton bucket, the batched path once per batch shape), the
second is warm. The warm rate's 95% interval comes from the spread of the per-problem (sequential)
or per-batch (batched) seconds; the speed-up's interval combines both relative errors.
`same_strings` counts problems whose particles' strings are equal on both paths (their weights
agree to float32 rounding: the batched calls are larger, tests/test_sampler_real.py).

Byte workload (`--workloads bytes`): ten cross-model problems, SmolLM2 x Gemma 3 at the byte
level under ten different prompts (the same prompt for both models), the product, M = 10, 40
bytes with the forced EOS, beam 5 / 0.05, seed 0: sequential (one sampler per prompt, as a user
would build them) against batches of `--byte-batch-size` (10: each problem keeps its own context
store, whose byte-level contexts hold sum trees of the vocabulary, 2 MB each for Gemma 3, so a
batch of ten is about 7 GB resident), and GenLM running the same ten problems
concurrently, `asyncio.gather` over `direct_token_sampler(Product(p1, p2)).smc(...)` at its
defaults (compare_genlm's GenLM side: its ByteLLM reads the prompt as bytes, smc_jax prefills
the prompt's tokens; lengths, M and the sampled target's factors are the same), in a process of
its own: all ten at once, and in groups of the byte batch size (each group's prompts read
before its clock starts, GenLM's model-output caches emptied after it, as compare_genlm does
between runs).

Forward workload (`--workloads forward`): the model's decode forward alone, warm, one call of a
problem's M rows (each model once) against one call of a batch's B x M rows (JSON: B = the batch
size, SmolLM2; bytes: B = 10, SmolLM2 and Gemma 3), after the workload's median prompt, vmapped
over the B problems with a prompt cache each, as a batch runs it. Its
problems per second are what a path would reach if a step were nothing but its forwards, so
forward_*_speedup is the most batching can give on this device where the forward is all (the
rest of a step, beams, tries, constraint masks and resampling, grows with the rows).

Tried and not kept: one model call reading the written rows of all problems of a byte batch (and
all prompts) together, M at a time: fewer rows (770 against 1,000 for two SmolLM2 problems) but
more forwards (77 of 10 rows against 50 of 20), 8.0 s against 7.0 s warm.
A quarter-size forward for batched calls whose rows fit in M / 4: 484 rows a byte problem
instead of 580, 32.5-32.9 s against 32.8-33.3 s a batch of ten warm.
Packing a batch's rows that write into one forward (a `custom_vmap` folding the problems and
experts into one call of an eighth, a quarter, a half or all of their rows): 32.0 s against
32.3 s a batch of ten warm (the same strings), for a larger program.
XLA:CPU's YNNPACK dots (XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=individual_dot) ran the
JSON forward's 8 / 160 rows in 46.6 / 282 ms against 42.6 / 264 ms with XLA's own (one fresh
process each); the XNNPACK and oneDNN switches left the arithmetic unchanged.

Writes benchmarks/results/throughput.{json,md}, keeping the saved rows of other workloads and of
other devices (`device`: "cpu" or the GPU's kind; a GPU's facts carry its name). `device_busy`:
on an NVIDIA GPU, the share of a pass it spent running kernels (NVML, `common.DeviceBusy`).
Run: python -m benchmarks.throughput [--workloads json bytes forward] [--instances 20] [--seeds 3]
[--batch-size 20] [--skip-genlm]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from scipy import stats  # noqa: E402

from benchmarks.common import DeviceBusy, device_label, kept_rows, save, timed  # noqa: E402

SETTINGS = dict(level="token", num_particles=8, max_length=48, ess_threshold=0.9, at_max_length="eos", temperature=1.0)


def json_problems(count: int) -> list[tuple[object, object, object]]:
    """(instance, prompt 1, constraint) of the first `count` JSON instances whose schema compiles."""
    from evaluation import load_instances
    from evaluation.methods import instance_constraint
    from evaluation.tasks.registry import get_task

    task = get_task("json")
    chosen = []
    for instance in load_instances("json", None):
        try:
            constraint = instance_constraint("json", instance)
        except ValueError:  # a keyword the compiler refuses: skipped, as in the study
            continue
        chosen.append((instance, task.prompts(instance)[0], constraint))
        if len(chosen) == count:
            break
    return chosen


BYTE_PROMPTS = ("My favorite physicist is", "My favorite author is", "The capital of France is",
                "A good name for a cat is", "The best way to learn is", "My favorite color is",
                "The ocean is", "In the morning I", "The tallest mountain is", "A healthy breakfast is")
BYTE_SETTINGS = dict(level="byte", num_particles=10, max_length=40, ess_threshold=0.9, at_max_length="eos",
                     beam_width=5, prune_threshold=0.05)


def byte_rows(skip_genlm: bool, size: int) -> tuple[list[dict], dict]:
    """The byte workload's rows (sequential, batched, GenLM concurrent) and its facts."""
    from benchmarks.compare_genlm import GENLM_PRODUCT
    from smc_jax.models import load_model
    from smc_jax.sampler import EnsembleSampler, Expert
    from smc_jax.utils.compilation import count_compilations

    # GenLM first, in its own processes: their memory is returned before the JAX runs start. All
    # ten at once is the comparison asked for; in groups of the byte batch size, the same
    # concurrency as the batched path (and a figure when ten at once do not fit in memory).
    rows = []
    for group in [] if skip_genlm else sorted({len(BYTE_PROMPTS), size}, reverse=True):
        rows.append(genlm_concurrent(group))
        print(rows[-1], flush=True)
    smol, gemma = load_model("smollm2-135m-instruct"), load_model("gemma3-270m")
    texts, n = {}, len(BYTE_PROMPTS)
    for label in ("first pass", "warm"):
        per_problem, start = [], time.perf_counter()
        with count_compilations() as compiled, DeviceBusy() as busy:
            for prompt in BYTE_PROMPTS:
                sampler = EnsembleSampler([Expert(smol, prompt), Expert(gemma, prompt)], f=GENLM_PRODUCT, **BYTE_SETTINGS)
                t = time.perf_counter()
                texts[("sequential", prompt)] = sampler(0).texts
                per_problem.append(time.perf_counter() - t)
        wall = time.perf_counter() - start
        rate, half, _ = interval(per_problem, 1)
        rows.append(dict(workload="bytes", path="sequential", pass_=label, problems=n, seconds=round(wall, 1),
                         problems_per_s=n / wall, warm_rate=rate, warm_rate_ci95=half, compilations=compiled.count,
                         device_busy=busy.fraction))
        print(rows[-1], flush=True)
    sampler = EnsembleSampler([Expert(smol, BYTE_PROMPTS[0]), Expert(gemma, BYTE_PROMPTS[0])], f=GENLM_PRODUCT,
                              **BYTE_SETTINGS)
    for label in ("first pass", "warm"):
        start = time.perf_counter()
        with count_compilations() as compiled, DeviceBusy() as busy:
            results = sampler.sample_problems([[p, p] for p in BYTE_PROMPTS], 0, batch_size=size)
        wall = time.perf_counter() - start
        for prompt, result in zip(BYTE_PROMPTS, results):
            texts[("batched", prompt)] = getattr(result, "texts", repr(result))
        rows.append(dict(workload="bytes", path=f"batched (B = {size})", pass_=label, problems=n, seconds=round(wall, 1),
                         problems_per_s=n / wall, compilations=compiled.count, device_busy=busy.fraction))
        print(rows[-1], flush=True)
    facts = dict(byte_same_strings=sum(texts[("sequential", p)] == texts[("batched", p)] for p in BYTE_PROMPTS))
    warm = {row["path"].split(" ")[0]: row["problems_per_s"] for row in rows if row["pass_"] == "warm"}
    facts["byte_speedup_warm"] = warm["batched"] / warm["sequential"]
    return rows, facts


def decode_seconds(model, prompt_tokens: int, problems: int, rows: int, slots: int = 48, repeats: int = 10) -> float:
    """Median seconds of one warm decode forward of `model` (`transformer.decode`) for `problems`
    problems of `rows` rows each, as the batched step runs it: vmapped over the problems, each
    with its own copy of a `prompt_tokens`-token prompt's cache (one problem: no vmap), each row
    one token after half of `slots` earlier tokens."""
    import jax
    import jax.numpy as jnp

    from smc_jax.models import lm, transformer

    padded = lm.prompt_bucket(prompt_tokens, model.prompt_capacity)
    prefix, _ = lm.prefill(model.params, model.config, jnp.ones(padded, jnp.int32), jnp.int32(prompt_tokens))
    suffix = jnp.zeros(prefix.k.shape[:1] + (rows, slots) + prefix.k.shape[2:], prefix.k.dtype)
    lengths, tokens = jnp.full((rows,), slots // 2, jnp.int32), jnp.arange(rows, dtype=jnp.int32) + 100
    one = lambda params, p, s: transformer.decode(params, model.config, p, s, s, lengths, tokens)[0]  # noqa: E731
    if problems > 1:
        one = jax.vmap(one, in_axes=(None, 0, 0))
        # copies, not broadcasts: each problem's cache is its own buffer, as in a batch
        prefix, suffix = jax.tree.map(lambda x: jnp.repeat(x[None], problems, axis=0), (prefix, suffix))
    call = jax.jit(one)
    return timed(lambda: call(model.params, prefix, suffix).block_until_ready(), repeats)[0]


def forward_rows(instances: int, json_batch: int) -> tuple[list[dict], dict]:
    """The model forward alone, per workload: one decode call of a problem's M rows (each model
    once) against one of a batch's B problems of M rows each (each with its own prompt cache, as
    in a batch), after the workload's median prompt. Its rate is
    the problems per second if a step were nothing but its forwards, so the ratio is the most
    batching can give where the forward is all; the rest of a step grows with the rows."""
    from smc_jax.models import load_model

    smol, gemma = load_model("smollm2-135m-instruct"), load_model("gemma3-270m")
    json_prompts = [prompt for _, prompt, _ in json_problems(instances)]
    rows, facts = [], {}
    for workload, models, prompts, m, b in (("json", [smol], json_prompts, SETTINGS["num_particles"], json_batch),
                                            ("bytes", [smol, gemma], BYTE_PROMPTS, BYTE_SETTINGS["num_particles"],
                                             len(BYTE_PROMPTS))):
        tokens = {model.name: int(statistics.median(len(model.encode_prompt(p)) for p in prompts)) for model in models}
        seconds = {}
        for label, count in (("one problem", 1), (f"batch of {b}", b)):
            seconds[count] = sum(decode_seconds(model, tokens[model.name], count, m) for model in models)
            rows.append(dict(workload="forward", path=f"{workload}: {label}, {m * count} rows a model", pass_="warm",
                             problems=count, seconds=seconds[count], problems_per_s=count / seconds[count]))
            print(rows[-1], flush=True)
        facts[f"forward_{workload}_speedup"] = b * seconds[1] / seconds[b]
        facts[f"forward_{workload}_prompt_tokens"] = tokens
    return rows, facts


def genlm_ratios(rows: list[dict], device: str) -> dict:
    """On `device`, the better smc_jax byte path's warm rate over each GenLM row's that finished
    (GenLM's rows may be kept from an earlier run: `--skip-genlm`)."""
    mine = [row for row in rows if row.get("device", "cpu") == device and row["workload"] == "bytes"]
    warm = [row["problems_per_s"] for row in mine if row["pass_"] == "warm"]
    return {f"{fact_prefix(device)}byte_vs_genlm_gather_of_{row['path'].rsplit(' ', 1)[1]}_speedup_warm":
            max(warm) / row["problems_per_s"] for row in mine
            if warm and row["path"].startswith("GenLM") and isinstance(row.get("problems_per_s"), float)}


def genlm_concurrent(group: int) -> dict:
    """GenLM's row for `group` problems at a time, measured in a process of its own
    (`--genlm-side`): alone, with no JAX program or buffer beside it. A crash, for example for
    memory, is the row's result."""
    import json
    import subprocess
    import sys

    n, path = len(BYTE_PROMPTS), f"GenLM, asyncio.gather of {group}"
    command = [sys.executable, "-m", "benchmarks.throughput", "--genlm-side", str(group)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode == 0:
        return json.loads(done.stdout.strip().splitlines()[-1])
    print(done.stderr[-2000:], flush=True)
    # SIGKILL is what the kernel's out-of-memory killer sends; its log (dmesg) names the process.
    killed = " (SIGKILL: out of memory?)" if done.returncode == -9 else ""
    return dict(workload="bytes", path=path, pass_="first", problems=n,
                seconds=f"failed (exit status {done.returncode}{killed})")


def genlm_side(group: int) -> dict:
    """GenLM: the ten byte problems `group` at a time, `asyncio.gather` over their `smc` calls,
    at its defaults (models loaded first, untimed); its peak resident memory too.

    As compare_genlm's GenLM side does between runs, each group's prompts are read before its
    clock starts, and the model-output caches and the potentials' beams are emptied after it:
    GenLM's caches keep every prefix's outputs (a Gemma 3 row is a 262,144-logit vector), so ten
    problems' outputs in one process exceed this machine's 24 GB."""
    import asyncio
    import gc
    import resource

    from genlm.control import direct_token_sampler
    from genlm.control.potential import Product

    from benchmarks.compare_genlm import Settings
    from benchmarks.genlm_side import GenLM, byte_potentials
    from smc_jax.models import load_model
    from smc_jax.sampler import Expert

    smol, gemma = load_model("smollm2-135m-instruct"), load_model("gemma3-270m")
    genlm = GenLM(torch_threads=None)
    settings = Settings(runs=1, max_tokens=BYTE_SETTINGS["max_length"] + 1)
    fractions = []

    async def all_problems(seed: int) -> float:
        genlm.reset(seed)
        wall = 0.0
        for at in range(0, len(BYTE_PROMPTS), group):
            potentials = [byte_potentials(genlm, [Expert(smol, prompt), Expert(gemma, prompt)], settings)()
                          for prompt in BYTE_PROMPTS[at: at + group]]
            each = [p for pair in potentials for p in pair]
            for p in each:
                await p.logw_next([])  # the prompt's beam, read untimed
            start = time.perf_counter()
            with DeviceBusy() as busy:
                await asyncio.gather(*[direct_token_sampler(Product(*pair)).smc(
                    n_particles=BYTE_SETTINGS["num_particles"], ess_threshold=0.9, max_tokens=settings.max_tokens,
                    resampling_method="multinomial") for pair in potentials])
            wall += time.perf_counter() - start
            fractions.append(busy.fraction)
            for p in each:
                await p.cleanup()
            del potentials, each
            genlm.reset()
            gc.collect()
        return wall

    wall = asyncio.run(all_problems(0))  # GenLM compiles nothing: its first run is its run
    n = len(BYTE_PROMPTS)
    return dict(workload="bytes", path=f"GenLM, asyncio.gather of {group}", pass_="first", problems=n, seconds=round(wall, 1),
                problems_per_s=n / wall, peak_rss_gb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 1),
                device_busy=None if None in fractions else round(statistics.fmean(fractions), 3), **genlm.threads())


def interval(seconds: list[float], problems_each: int) -> tuple[float, float, float]:
    """(problems per second, its 95% interval's half-width, relative error) from timings of
    calls that each solved `problems_each` problems."""
    mean = statistics.fmean(seconds)
    half = stats.t.ppf(0.975, len(seconds) - 1) * statistics.stdev(seconds) / math.sqrt(len(seconds)) if len(seconds) > 1 else math.nan
    rate = problems_each / mean
    return rate, rate * half / mean, half / mean


def json_rows(instances: int, seeds: list[int], size: int) -> tuple[list[dict], dict]:
    """The JSON workload's rows (sequential and batched, two passes each) and its facts."""
    from smc_jax.models import load_model
    from smc_jax.sampler import EnsembleSampler, Expert
    from smc_jax.utils.compilation import count_compilations

    smol = load_model("smollm2-135m-instruct")
    problems = json_problems(instances)
    jobs = [(i, seed) for i in range(len(problems)) for seed in seeds]
    rows, texts, rel = [], {}, {}

    for label in ("first pass", "warm"):
        per_problem, start = [], time.perf_counter()
        with count_compilations() as compiled, DeviceBusy() as busy:
            for i, (_, prompt, constraint) in enumerate(problems):
                sampler = EnsembleSampler([Expert(smol, prompt)], constraint=constraint, **SETTINGS)
                for seed in seeds:
                    t = time.perf_counter()
                    texts[("sequential", i, seed)] = sampler(seed).texts
                    per_problem.append(time.perf_counter() - t)
        wall = time.perf_counter() - start
        rate, half, rel[("sequential", label)] = interval(per_problem, 1)
        rows.append(dict(workload="json", path="sequential", pass_=label, problems=len(jobs), seconds=round(wall, 1),
                         problems_per_s=len(jobs) / wall, warm_rate=rate, warm_rate_ci95=half,
                         compilations=compiled.count, device_busy=busy.fraction))
        print(rows[-1], flush=True)

    sampler = EnsembleSampler([Expert(smol, problems[0][1])], constraint=problems[0][2], **SETTINGS)
    prompts = [[problems[i][1]] for i, _ in jobs]
    constraints = [problems[i][2] for i, _ in jobs]
    job_seeds = [seed for _, seed in jobs]
    for label in ("first pass", "warm"):
        per_batch, start = [], time.perf_counter()
        with count_compilations() as compiled, DeviceBusy() as busy:
            for at in range(0, len(jobs), size):
                t = time.perf_counter()
                results = sampler.sample_problems(prompts[at: at + size], job_seeds[at: at + size],
                                                  constraints=constraints[at: at + size], batch_size=size)
                per_batch.append(time.perf_counter() - t)
                for (i, seed), result in zip(jobs[at: at + size], results):
                    texts[("batched", i, seed)] = getattr(result, "texts", repr(result))
        wall = time.perf_counter() - start
        rate, half, rel[("batched", label)] = interval(per_batch, size)
        rows.append(dict(workload="json", path=f"batched (B = {size})", pass_=label, problems=len(jobs),
                         seconds=round(wall, 1), problems_per_s=len(jobs) / wall, warm_rate=rate, warm_rate_ci95=half,
                         compilations=compiled.count, device_busy=busy.fraction))
        print(rows[-1], flush=True)

    seq, bat = rows[1], rows[3]
    speedup = bat["warm_rate"] / seq["warm_rate"]
    facts = dict(
        json_speedup_warm=speedup,
        # Relative half-widths of two independent rates add in quadrature (delta method).
        json_speedup_warm_ci95=speedup * math.hypot(rel[("sequential", "warm")], rel[("batched", "warm")]),
        json_speedup_first_pass=rows[2]["problems_per_s"] / rows[0]["problems_per_s"],
        json_same_strings=f"{sum(texts[('sequential', i, s)] == texts[('batched', i, s)] for i, s in jobs)} of {len(jobs)}",
        json_instances=len(problems), json_seeds=seeds, json_batch_size=size, json_settings=SETTINGS)
    return rows, facts


def keep_other_workloads(rows: list[dict], facts: dict, measured: list[str], device: str,
                         genlm_measured: bool = True) -> str | None:
    """Adds the saved rows and facts of the workloads not measured now on this device (and
    GenLM's rows when it was not run: `genlm_measured` False), each row with the date and commit
    it was measured at; returns what was kept, for the notes."""
    old, meta = kept_rows("throughput", lambda row: row.get("workload") in measured
                          and (genlm_measured or not row["path"].startswith("GenLM")), device)
    rows += old
    remeasured = tuple(fact_prefix(device) + prefix for workload, prefix in (
        ("json", "json_"), ("bytes", "byte_"), ("forward", "forward_")) if workload in measured)
    facts |= {k: v for k, v in meta.items() if k not in facts and ("json_" in k or "byte_" in k or "forward_" in k)
              and not k.startswith(remeasured)}
    facts |= genlm_ratios(rows, device)
    return f"{len(old)} rows kept from earlier runs" if old else None


def fact_prefix(device: str) -> str:
    """The prefix of a device's facts in the saved meta: none on the CPU, "nvidia_h200_" on an
    NVIDIA H200 (so a GPU run keeps the CPU's facts and the other way round)."""
    return "" if device == "cpu" else device.lower().replace(" ", "_") + "_"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", choices=("json", "bytes", "forward"),
                        default=["json", "bytes", "forward"])
    parser.add_argument("--instances", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--byte-batch-size", type=int, default=10,
                        help="byte problems per batch: each problem's context store holds sum trees of the "
                             "vocabularies (2 MB a context for Gemma 3): about 0.7 GB resident a problem")
    parser.add_argument("--skip-genlm", action="store_true")
    parser.add_argument("--genlm-side", type=int, metavar="GROUP", help="(internal) print GenLM's byte row as JSON")
    args = parser.parse_args()
    if args.genlm_side:
        import json

        print(json.dumps(genlm_side(args.genlm_side)))
        return

    rows, facts, done, device = [], {}, [], device_label()
    for workload in args.workloads:  # saved after each workload: a later failure keeps it
        if workload == "json":
            more, known = json_rows(args.instances, list(range(args.seeds)), args.batch_size)
        elif workload == "forward":
            more, known = forward_rows(args.instances, args.batch_size)
        else:
            more, known = byte_rows(args.skip_genlm, args.byte_batch_size)
            known |= dict(byte_settings=BYTE_SETTINGS)
        # a None (no GPU to read, say) is left out rather than shown
        rows += [dict({k: v for k, v in row.items() if v is not None}, device=device) for row in more]
        facts |= {fact_prefix(device) + k: v for k, v in known.items()}
        done.append(workload)
        write(list(rows), dict(facts), done, device, not args.skip_genlm)


def write(rows: list[dict], facts: dict, measured: list[str], device: str, genlm_measured: bool = True) -> None:
    """Saves the rows of the measured workloads with the kept rows of the others."""
    kept = keep_other_workloads(rows, facts, measured, device, genlm_measured)
    notes = __doc__.split("\n\n", 1)[1].rsplit("\n\nWrites", 1)[0]
    shown = ("speedup_warm", "speedup_warm_ci95", "speedup_first_pass", "same_strings", "forward_json_speedup",
             "forward_bytes_speedup")
    notes += "\n\n" + "\n".join(f"- {k}: {round(v, 3) if isinstance(v, float) else v}" for k, v in facts.items()
                                 if k.endswith(shown))
    if kept:
        notes += f"\n- {kept} (column `measured`)"
    print(save("throughput", rows, ["device", "workload", "path", "pass_", "problems", "seconds", "problems_per_s",
                                    "warm_rate", "warm_rate_ci95", "compilations", "device_busy", "peak_rss_gb", "measured"],
               facts, notes=notes))


if __name__ == "__main__":
    main()

"""The particle study (paper App. F, Figs. 5-8, Table 7) and the sanity checks of Sec. 6.2.

On one task, for each f and M, SMC (and importance sampling: the same sampler with
ess_threshold = 0) over N instances and several seeds, plus each expert alone at the same M.
--level token (default): one model under the task's two prompts, token level; --level
cross_byte: --model x --cross-model under one prompt, byte level. --resampling: SMC as in the
paper's Alg. 1 (all particles resampled), resampling only the particles still extending
(`resample_finished=False`), or both. Reports, from those runs:

* E[log Z-hat] against M per f, each SMC variant and IS (mean over instances per seed, then
  mean and 95% t-interval over seeds), plotted as <name>_logz.png (Figs. 6-8);
* sanity check (a): the mixture's expected accuracy against the mean of its experts' (each
  alone) per M, with |mixture - mean(experts)| and the CI of the difference;
* sanity check (b): E[log Z-hat] of SMC minus that of IS at equal M, per SMC variant and f
  (per seed, and paired run by run);
* Table 7: per f, the mean over instances of the per-instance Spearman correlation between
  log Z-hat and expected accuracy across the (M, seed) runs, +- standard error, with a
  one-sample t-test against 0 (instances whose values are constant are left out, counted);
* Fig. 5: z-scored log Z-hat against z-scored expected accuracy (per instance, over M; seed
  means), <name>_zscores.png.

Runs are appended to the JSONL file --out and skipped when already there (resumable).

CPU, embedded model (the committed results, about 25 minutes on 2 cores; see the README's
Evaluation section for the exact command and shared record file):

    python -m evaluation.particle_study --task word_sorting --max-words 3 --limit 4 \\
        --particles 2 4 8 16 --seeds 0 1 2 --max-length 20 --temperature 0.5 --is-fs min product

GPU, a paper model from a local checkpoint (M up to 75 as in the paper's study):

    python -m evaluation.particle_study --model /ckpt/Llama-3.1-8B-Instruct --dtype bfloat16 \\
        --task word_sorting --limit 100 --particles 5 10 25 50 75 --seeds 0 1 2 3 4 \\
        --max-length 512 --at-max-length eos --out runs/particles_llama.jsonl --name particle_study_llama
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import markdown_table, save
from evaluation.cli import RESULTS
from evaluation.cli import add_common_arguments, command_line, LazyModelRunner, json_safe, settings_from
from evaluation import STUDY_LEVELS, RecordStore, get_method, load_instances, plan, run_jobs, select
from evaluation.report import (
    PERCENT, correlations, logz_by_particles, mixture_check, plot_logz_vs_particles, plot_zscores, seed_interval,
    smc_vs_is,
)

TASKS = ("json", "word_sorting", "sql")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--task", choices=TASKS, default="word_sorting")
    parser.add_argument("--level", choices=sorted(STUDY_LEVELS), default="token",
                        help="token: one model under the task's two prompts, token-level SMC/IS; cross_byte: "
                             "--model and --cross-model under prompt --cross-prompt, byte-level SMC/IS")
    parser.add_argument("--resampling", choices=["all", "active", "both"], default="all",
                        help="SMC resamples all particles (the paper's Alg. 1), only those still extending, or "
                             "run both variants")
    parser.add_argument("--is-fs", nargs="*", default=None,
                        help="f-ensembles that also run importance sampling (default: all of --fs; none: pass no value)")
    parser.add_argument("--out", default=None, help="JSONL record file (default evaluation/results/<name>.jsonl)")
    parser.add_argument("--no-base-prompts", action="store_true",
                        help="skip the base prompts alone (no accuracy baselines, no sanity check (a))")
    parser.add_argument("--name", default="particle_study", help="results name: evaluation/results/<name>.*")
    add_common_arguments(parser, particles=[2, 4, 8, 16], seeds=[0, 1, 2])
    parser.set_defaults(max_length=24, limit=4)
    args = parser.parse_args()
    is_fs = args.fs if args.is_fs is None else args.is_fs
    if "mixture" not in args.fs or args.no_base_prompts:
        print("note: sanity check (a) needs the mixture in --fs and the base prompts", file=sys.stderr)

    if args.level == "cross_byte" and not args.cross_model:
        parser.error("--level cross_byte needs --cross-model (e.g. --cross-model gemma3-270m)")
    level = STUDY_LEVELS[args.level]
    smc_methods = {"all": [level.smc], "active": [level.smc_active], "both": [level.smc, level.smc_active]}[args.resampling]
    main_smc = smc_methods[0]  # accuracy rows, sanity check (a), Table 7 and Fig. 5
    start = time.perf_counter()
    settings = settings_from(args)
    out = Path(args.out) if args.out else RESULTS / f"{args.name}.jsonl"
    store = RecordStore(out, settings.to_dict())
    instances = {args.task: load_instances(args.task, args.limit, args.instance_seed, args.data_dir, args.max_words)}
    # Instance by instance (an interrupted study leaves whole instances, SMC and IS paired).
    jobs = []
    for instance in instances[args.task]:
        one = {args.task: [instance]}
        jobs += ([] if args.no_base_prompts else plan(one, list(level.experts), [], args.particles))
        jobs += plan(one, smc_methods, args.fs, args.particles) + plan(one, [level.importance], is_fs, args.particles)
    runner = LazyModelRunner(settings, smc_methods)
    new = run_jobs(jobs, args.seeds, store, runner, progress=not args.no_progress, batch_size=args.batch_size)
    wall = time.perf_counter() - start

    ids = {str(i.id) for i in instances[args.task]}
    records = [r for r in select(store.records, task=args.task, num_particles=args.particles, seed=args.seeds)
               if r.instance in ids]
    ms = args.particles

    # E[log Z-hat] per f and M, SMC and IS; expected accuracy per f and M.
    rows = []
    for f in args.fs:
        for method, label in ((level.smc, "SMC (Alg. 1)"), (level.smc_active, "SMC, active only"), (level.importance, "IS")):
            intervals = logz_by_particles(records, method, f, ms)
            if any(i.n for i in intervals):
                rows.append({"f": f, "sampler": label, **{f"M={m}": i.format(digits=2) for m, i in zip(ms, intervals)},
                             **{f"mean_M{m}": i.mean for m, i in zip(ms, intervals)},
                             **{f"ci95_M{m}": i.half_width for m, i in zip(ms, intervals)}})
    accuracy = []
    for method, f, label in ([(name, "none", get_method(name).label) for name in level.experts]
                             + [(smc, f, f"{f}, {get_method(smc).label}") for smc in smc_methods for f in args.fs]):
        cells = {f"M={m}": seed_interval(select(records, method=method, f=f, num_particles=m)).format(PERCENT)
                 for m in ms}
        accuracy.append({"method": label, **cells})
    sanity_a = mixture_check(records, ms, dataclasses.replace(level, smc=main_smc))
    sanity_b = smc_vs_is(records, is_fs, ms, level)
    corr = correlations(records, args.fs, main_smc)
    corr_rows = [{"f": f, "mean Spearman ± SE": c.format(), "p (t-test vs 0)": c.p_value,
                  "instances": c.n_instances, "undefined (constant)": c.n_undefined} for f, c in corr.items()]

    m_cols = [f"M={m}" for m in ms]
    models = settings.model + (f" x {settings.cross_model} (prompt {settings.cross_prompt})" if args.level == "cross_byte" else "")
    title = f"{models}, {args.task}, N={len(ids)}, seeds={len(args.seeds)}"
    logz_png = plot_logz_vs_particles(records, args.fs, ms, RESULTS / f"{args.name}_logz.png", title, level)
    z_png = plot_zscores(records, args.fs, RESULTS / f"{args.name}_zscores.png", title, main_smc)
    run_seconds = sum(r.seconds for r in records)
    notes = (
        f"Particle study on {args.task} with {models} ({' and '.join(get_method(s).label for s in smc_methods)} against "
        f"{get_method(level.importance).label}): N = {len(ids)} instances"
        + (f" (lists of at most {args.max_words} words)" if args.max_words and args.task == "word_sorting" else "")
        + f", M in {{{', '.join(map(str, ms))}}}, seeds {args.seeds}, "
        + (f"max_bytes {settings.max_bytes}, beam width {settings.beam_width}, prune threshold {settings.prune_threshold}, "
           if args.level == "cross_byte" else f"max_length {settings.max_length} tokens, ")
        + f"at_max_length={settings.at_max_length}, temperature {settings.temperature}, resampling threshold "
        f"{settings.ess_threshold} (IS: 0). Values: mean ± 95% t-interval over seeds of the per-seed mean over "
        f"instances. Wall time of this invocation {wall:.0f} s ({new} new runs; model loading and compilation "
        f"included); sum of the recorded sampler-call times {run_seconds:.0f} s. Plots: {logz_png.name}, {z_png.name}.\n\n"
        "## E[log Z-hat] against M"
    )
    appendix = "\n\n".join([
        "## Expected accuracy (%) against M\n\n" + markdown_table(accuracy, ["method", *m_cols]),
        "## Sanity check (a): mixture vs mean of its experts (expected accuracy, %)\n\n"
        "With at_max_length=truncate the mixture's target is exactly the average of the experts' (length-limited) "
        "sampling distributions, so its expected accuracy converges to the mean of theirs as M grows.\n\n"
        + markdown_table(sanity_a, ["M", "mixture", "prompt 1", "prompt 2", "mean(experts)", "mixture - mean(experts)",
                                    "|mixture - mean(experts)|"]),
        "## Sanity check (b): SMC vs importance sampling, E[log Z-hat] at equal M\n\n"
        "SMC - IS: difference of the per-seed means (t-interval over seeds); paired runs: the same "
        "instance and seed under both samplers (t-interval over the pairs), and the share of pairs where "
        "SMC's log Z-hat is higher.\n\n"
        + markdown_table(sanity_b, ["resampling", "f", "M", "E[log Z] SMC", "E[log Z] IS", "SMC - IS", "SMC higher",
                                    "SMC - IS (paired runs)", "pairs", "SMC higher in"]),
        f"## Table 7: per-instance Spearman(log Z-hat, expected accuracy), {get_method(main_smc).label}\n\n"
        "Per instance over its (M, seed) runs; mean ± standard error over instances; * p<0.05, ** p<0.01, "
        "*** p<0.001 (one-sample t-test against 0).\n\n"
        + markdown_table(corr_rows, ["f", "mean Spearman ± SE", "p (t-test vs 0)", "instances", "undefined (constant)"]),
    ])
    meta = {"settings": settings.to_dict(), "task": args.task, "instances": sorted(ids), "N": len(ids),
            "max_words": args.max_words, "particles": ms, "seeds": args.seeds, "fs": args.fs, "is_fs": is_fs,
            "wall_seconds": wall, "new_runs": new, "recorded_run_seconds": run_seconds, "records": str(out),
            "expected_accuracy": accuracy, "sanity_mixture": json_safe(sanity_a), "sanity_smc_vs_is": json_safe(sanity_b),
            "correlations": json_safe([{**row, "per_instance": corr[row["f"]].per_instance} for row in corr_rows]),
            "plots": [logz_png.name, z_png.name], "command": command_line()}
    print(save(args.name, json_safe(rows), ["f", "sampler", *m_cols], meta, notes, appendix, directory=RESULTS))
    print(appendix)


if __name__ == "__main__":
    main()

"""The constraint study: expected accuracy of unconstrained, locally constrained and
SMC-constrained decoding on the JSON, word-sorting and text-to-SQL tasks, and E[log Z-hat] of SMC against
importance sampling with the constraint.

Methods (all token level). --prompts 1 (default): SmolLM2 under the task's prompt 1 (K = 1):
prompt1 (plain sampling, no constraint), prompt1_local_constrained (the model's next-token
distribution masked by the constraint and renormalized: locally constrained decoding),
prompt1_constrained (token SMC targeting p(x) C(x): global), prompt1_constrained_is (the same
without resampling, for E[log Z-hat]). --prompts 2: the same four over both prompts and f in
--fs (token, local_constrained, token_constrained, token_constrained_is). The constraint is
the instance's own (`evaluation.instance_constraint`): JSON, its schema; word sorting,
a comma-separated list of the input's words (any order, repeats allowed); text-to-SQL (--tasks
sql), the SELECT language over the database's tables and columns (`evaluation.tasks.sql_grammar`,
one automaton for all questions). JSON instances whose
schema the compiler refuses are skipped and listed (the draw continues until --limit compile).
Accuracy is the task's own checker (jsonschema validation; exact word list; execution
accuracy). With
--at-max-length eos every particle ends with EOS by its task's max length (the constraint's
viability is then length-aware).

Intervals: mean +- 95% t-interval over seeds of the per-seed mean over instances (as Table 5),
and for SMC-constrained minus each baseline the paired difference over (instance, seed) runs.
Jobs alternate between the tasks, instance by instance, so an interrupted study has both.
Records go to one JSONL file per task, <out-prefix>_<task>.jsonl (each task has its own length
limit, hence its own settings); rerun the same command to continue, or with more seeds.

CPU, embedded models (the committed study):

    python -m evaluation.evaluate_constraints --limit 20 --particles 8 --seeds 0 1 \\
        --task-max-length json=48 word_sorting=24 --at-max-length eos --temperature 1.0 --max-words 5
    python -m evaluation.evaluate_constraints --tasks sql --limit 20 --particles 8 --seeds 0 1 \
        --task-max-length sql=64 --at-max-length eos --temperature 1.0 --name evaluate_constraints_cpu_sql
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import markdown_table, save
from evaluation.cli import RESULTS
from evaluation.cli import add_common_arguments, command_line, json_safe, settings_from
from evaluation import STUDY_LEVELS, RecordStore, StudySettings, get_method, load_instances, plan, run_jobs, select
from evaluation.methods import instance_constraint, method_label
from evaluation.records import NO_F
from evaluation.report import (
    F_NAMES, PERCENT, RESAMPLE_ALL, expected_accuracy, paired_difference, run_paired_difference, smc_vs_is, table5_rows,
)

TASKS = ("json", "word_sorting", "sql")
#: Per number of prompts: (unconstrained, locally constrained, SMC-constrained, IS-constrained).
METHOD_SETS = {
    1: ("prompt1", "prompt1_local_constrained", "prompt1_constrained", "prompt1_constrained_is"),
    2: ("token", "local_constrained", "token_constrained", "token_constrained_is"),
}
LEVELS = {1: STUDY_LEVELS["prompt1_constrained"], 2: STUDY_LEVELS["token_constrained"]}


def method_fs(name: str, fs: Sequence[str]) -> tuple[str, ...]:
    return tuple(fs) if get_method(name).uses_f else (NO_F,)


class TaskStores:
    """One RecordStore per task (each under its own settings), addressed by a record's task."""

    def __init__(self, stores: dict[str, RecordStore]):
        self.stores = stores

    def __contains__(self, key) -> bool:
        return key in self.stores[key[0]]

    def append(self, record) -> None:
        self.stores[record.task].append(record)

    @property
    def records(self) -> list:
        return [r for store in self.stores.values() for r in store.records]


class TaskRunners:
    """make_runner over tasks with different settings: the model is loaded once, at the first job."""

    def __init__(self, settings: dict[str, StudySettings], methods: Sequence[str]):
        self.settings, self.methods, self.runners = settings, list(methods), {}

    def _runner(self, task: str):
        if not self.runners:
            from evaluation.cli import load_models
            from evaluation import ModelRunner

            any_settings = next(iter(self.settings.values()))
            model, cross = load_models(any_settings, self.methods)
            self.runners = {name: ModelRunner(model, s, cross) for name, s in self.settings.items()}
        return self.runners[task]

    def __call__(self, job):
        return self._runner(job.task)(job)

    def run_batch(self, runs, batch_size: int):
        """`ModelRunner.run_batch` of the runs' task (a batch holds one task)."""
        return self._runner(runs[0][0].task).run_batch(runs, batch_size)


def interleave(jobs_by_task: dict[str, list]) -> list:
    """Jobs alternating between tasks, each task's jobs in their own (instance-major) order."""
    out, queues = [], [list(q) for q in jobs_by_task.values()]
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def constrained_instances(task: str, limit: int, seed: int, data_dir, max_words) -> tuple[list, list[tuple[str, str]]]:
    """The first `limit` instances of the task's seeded draw whose constraint compiles, and
    (id, reason) for those skipped on the way."""
    pool = load_instances(task, None, seed, data_dir, max_words)
    draw = load_instances(task, len(pool), seed, data_dir, max_words)  # the whole pool, shuffled by seed
    kept, skipped = [], []
    for instance in draw:
        if len(kept) == limit:
            break
        try:
            instance_constraint(task, instance)
        except ValueError as error:
            skipped.append((str(instance.id), str(error).splitlines()[0][:120]))
            continue
        kept.append(instance)
    return kept, skipped


#: Accuracy differences below this are ties (normalized float32 weights sum to 1 within ~1e-7).
TIE = 1e-6


def win_shares(a, b) -> tuple[float, float]:
    """Shares of (instance, seed) pairs where a's expected accuracy is above / below b's by more
    than TIE."""
    va = {(r.instance, r.seed): r.expected_accuracy for r in a}
    diffs = [va[(r.instance, r.seed)] - r.expected_accuracy for r in b if (r.instance, r.seed) in va]
    if not diffs:
        return math.nan, math.nan
    return sum(d > TIE for d in diffs) / len(diffs), sum(d < -TIE for d in diffs) / len(diffs)


def difference_rows(records, tasks: Sequence[str], methods: Sequence[str], fs: Sequence[str], m: int) -> list[dict]:
    """SMC-constrained minus the locally constrained and the unconstrained methods, per task and f:
    seed-level and run-level intervals."""
    unconstrained, local, smc_name, _ = methods
    rows = []
    for task in tasks:
        for f in method_fs(smc_name, fs):
            smc = select(records, task=task, method=smc_name, f=f, num_particles=m)
            for base in (local, unconstrained):
                other = select(records, task=task, method=base, f=f if get_method(base).uses_f else NO_F,
                               num_particles=m)
                if not smc or not other:
                    continue
                seeds = paired_difference(smc, other, expected_accuracy)
                runs, _ = run_paired_difference(smc, other, expected_accuracy)
                wins, losses = win_shares(smc, other)
                rows.append({
                    "task": task, "f": f, "comparison": f"{get_method(smc_name).label} - {get_method(base).label}",
                    "diff (seeds)": seeds.format(PERCENT), "diff (paired runs)": runs.format(PERCENT),
                    "pairs": runs.n, "SMC higher": f"{wins:.0%}", "SMC lower": f"{losses:.0%}",
                    "seed_diff_mean": seeds.mean, "seed_diff_ci95": seeds.half_width,
                    "run_diff_mean": runs.mean, "run_diff_ci95": runs.half_width,
                    "smc_higher_share": wins, "smc_lower_share": losses,
                })
    return rows


def run_facts(records, tasks: Sequence[str], methods: Sequence[str], fs: Sequence[str], m: int) -> list[dict]:
    """Per task and method: runs, mean share of finished particles, runs with every weight zero,
    mean seconds per sampler call."""
    rows = []
    for task in tasks:
        for name in methods:
            for f in method_fs(name, fs):
                chosen = select(records, task=task, method=name, f=f, num_particles=m)
                if not chosen:
                    continue
                rows.append({
                    "task": task, "method": method_label(get_method(name), f, F_NAMES), "runs": len(chosen),
                    "finished": sum(r.finished for r in chosen) / len(chosen),
                    "all-zero-weight runs": sum(r.zero_weight for r in chosen),
                    "seconds/run": sum(r.seconds for r in chosen) / len(chosen),
                })
    return rows


def plot(rows: Sequence[dict], logz: Sequence[dict], tasks: Sequence[str], path: Path, title: str) -> Path:
    """Left: expected accuracy (%) per task and method; right: E[log Z-hat] of SMC and IS with the
    constraint per task. Bars: means; error bars: 95% t-intervals over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    def half(v):
        return 0.0 if v is None else v

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4.0), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / max(len(rows), 1)
    x = np.arange(len(tasks))
    for i, row in enumerate(rows):
        means = [PERCENT * (row[f"{t}_mean"] or 0.0) for t in tasks]
        halves = [PERCENT * half(row[f"{t}_ci95"]) for t in tasks]
        ax.bar(x + (i - (len(rows) - 1) / 2) * width, means, width, yerr=halves, capsize=3, label=row["method"])
    ax.set_xticks(x, list(tasks))
    ax.set_ylabel("expected accuracy (%)")
    ax.set_ylim(0, 105)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)
    rows_all = [r for r in logz if r.get("resampling") == RESAMPLE_ALL]
    for j, (key, label) in enumerate((("smc_mean", "SMC + constraint"), ("is_mean", "IS + constraint"))):
        found = {r["task"]: r for r in rows_all}
        means = [found[t][key] if t in found and found[t][key] is not None else 0.0 for t in tasks]
        ci_key = "smc_ci95" if key == "smc_mean" else "is_ci95"
        halves = [half(found[t].get(ci_key)) if t in found else 0.0 for t in tasks]
        bx.bar(x + (j - 0.5) * 0.35, means, 0.35, yerr=halves, capsize=3, label=label)
    bx.set_xticks(x, list(tasks))
    bx.set_ylabel(r"E[log $\hat Z$]")
    bx.grid(axis="y", alpha=0.3)
    bx.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse_task_lengths(values: Sequence[str], default: int) -> dict[str, int]:
    lengths = dict.fromkeys(TASKS, default)
    for value in values:
        task, _, n = value.partition("=")
        if task not in TASKS or not n.isdigit():
            raise SystemExit(f"--task-max-length wants TASK=N with TASK in {TASKS}, got {value!r}")
        lengths[task] = int(n)
    return lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=["json", "word_sorting"],
                        help="sql: text-to-SQL with the schema's SELECT language (tasks/sql_grammar.py)")
    parser.add_argument("--prompts", type=int, choices=(1, 2), default=1,
                        help="1: prompt 1 alone (K = 1); 2: both prompts, f in --fs")
    parser.add_argument("--task-max-length", nargs="*", default=[],
                        help="per-task length limits in tokens, TASK=N (default --max-length)")
    parser.add_argument("--out-prefix", default=None,
                        help="record files <prefix>_<task>.jsonl (default evaluation/results/<name>)")
    parser.add_argument("--name", default="evaluate_constraints_cpu", help="results name: evaluation/results/<name>.*")
    parser.add_argument("--report-only", action="store_true", help="run nothing: the report of the records there")
    add_common_arguments(parser, particles=[8], seeds=[0, 1, 2])
    parser.set_defaults(fs=["product"], limit=20, max_length=48, at_max_length="eos", max_words=5)
    args = parser.parse_args()
    if len(args.particles) != 1:
        parser.error("one particle count (--particles M)")
    m = args.particles[0]
    methods = METHOD_SETS[args.prompts]
    level = LEVELS[args.prompts]
    lengths = parse_task_lengths(args.task_max_length, args.max_length)

    start = time.perf_counter()
    settings, stores = {}, {}
    prefix = args.out_prefix or str(RESULTS / args.name)
    for task in args.tasks:
        args.max_length = lengths[task]
        settings[task] = settings_from(args)
        stores[task] = RecordStore(Path(f"{prefix}_{task}.jsonl"), settings[task].to_dict())
    store = TaskStores(stores)
    instances, skipped = {}, {}
    for task in args.tasks:
        instances[task], skipped[task] = constrained_instances(task, args.limit, args.instance_seed, args.data_dir,
                                                               args.max_words)
    new = 0
    if not args.report_only:
        jobs = interleave({task: plan({task: xs}, methods, args.fs, args.particles) for task, xs in instances.items()})
        new = run_jobs(jobs, args.seeds, store, TaskRunners(settings, methods), progress=not args.no_progress,
                       batch_size=args.batch_size)
    wall = time.perf_counter() - start

    ids = {task: {str(i.id) for i in xs} for task, xs in instances.items()}
    records = [r for r in select(store.records, method=list(methods), num_particles=m, seed=args.seeds)
               if r.instance in ids.get(r.task, ()) and (r.f in args.fs or r.f == NO_F)]
    # Only instances with every (method, f, seed) run: the methods are compared on the same ones.
    expected = len(args.seeds) * sum(len(method_fs(name, args.fs)) for name in methods)
    counts = Counter((r.task, r.instance) for r in records)
    complete = {task: {i for i in ids[task] if counts[(task, i)] == expected} for task in args.tasks}
    partial = {task: sorted(i for i in ids[task] if 0 < counts[(task, i)] < expected) for task in args.tasks}
    records = [r for r in records if r.instance in complete[r.task]]
    rows = json_safe(table5_rows(records, args.tasks, methods, args.fs, args.particles))
    diffs = json_safe(difference_rows(records, args.tasks, methods, args.fs, m))
    logz = []
    for task in args.tasks:
        logz += [{"task": task, **row} for row in
                 smc_vs_is(select(records, task=task), method_fs(level.smc, args.fs), args.particles, level)]
    logz = json_safe(logz)
    facts = json_safe(run_facts(records, args.tasks, methods, args.fs, m))
    n = {task: len(complete[task]) for task in args.tasks}
    done = {task: {name: len(select(records, task=task, method=name)) for name in methods} for task in args.tasks}
    model = next(iter(settings.values())).model
    temperature = next(iter(settings.values())).temperature
    limits = ", ".join(f"{t} {settings[t].max_length}" for t in args.tasks)
    png = plot(rows, logz, args.tasks, RESULTS / f"{args.name}.png",
               f"{model}, M = {m}, {len(args.seeds)} seeds, temperature {temperature}, max_length {limits} "
               f"(forced EOS)")
    experts = ("prompt 1 alone (K = 1)" if args.prompts == 1 else
               f"the task's two prompts, f = {', '.join(args.fs)}")

    notes = (
        f"Expected accuracy (%) of {model} (token level, {experts}) with and without the instance's constraint: "
        f"mean ± 95% t-interval over {len(args.seeds)} seeds of the per-seed mean over N instances "
        f"({', '.join(f'{t}: N={k}' for t, k in n.items())}); M = {m}; max_length in tokens: {limits}; "
        f"at_max_length={args.at_max_length}; temperature {temperature}. "
        f"{get_method(methods[0]).label} = no constraint; {get_method(methods[1]).label} = locally constrained "
        f"decoding (mask, renormalize, weights ignored); {get_method(methods[2]).label} = global (the constraint a "
        f"factor of the SMC target, resampling at ESS < {args.ess_threshold} M); {get_method(methods[3]).label} = the same without resampling. Byte level left out (about 400 s a "
        f"run on CPU). Load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores. Wall time of this invocation {wall:.0f} s "
        f"({new} new runs{f', {args.batch_size} problems per program' if args.batch_size else ', one at a time'}); "
        f"sum of recorded sampler-call times {sum(r.seconds for r in records):.0f} s. "
        f"Plot: {png.name}."
    )
    appendix = "\n\n".join([
        "## SMC + constraint minus the baselines (expected accuracy, percentage points)\n\n"
        "diff (seeds): t-interval over seeds of the difference of per-seed instance means; diff (paired runs): "
        "t-interval over (instance, seed) pairs (instance difficulty cancels; pairs of one instance are not "
        "independent, so this interval is optimistic). SMC higher / lower: share of pairs.\n\n"
        + markdown_table(diffs, ["task", "f", "comparison", "diff (seeds)", "diff (paired runs)", "pairs",
                                 "SMC higher", "SMC lower"]),
        "## E[log Z-hat] with the constraint: SMC against importance sampling (same M)\n\n"
        + markdown_table(logz, ["task", "resampling", "f", "M", "E[log Z] SMC", "E[log Z] IS", "SMC - IS",
                                "SMC - IS (paired runs)", "pairs", "SMC higher in"]),
        "## Runs\n\n" + markdown_table(facts, ["task", "method", "runs", "finished", "all-zero-weight runs",
                                                "seconds/run"]),
    ])
    meta = {"settings": {t: s_.to_dict() for t, s_ in settings.items()}, "tasks": args.tasks,
            "instances": {t: sorted(v) for t, v in complete.items()}, "planned_instances": {t: sorted(v) for t, v in ids.items()},
            "partial_instances (left out)": partial, "skipped_instances": skipped, "N": n,
            "runs_done": done, "particles": args.particles, "seeds": args.seeds, "methods": list(methods),
            "fs": args.fs, "differences": diffs, "logz": logz, "runs": facts, "wall_seconds": wall, "new_runs": new,
            "records": [str(st.path) for st in stores.values()], "plot": str(png), "command": command_line()}
    print(save(args.name, rows, ["method", *args.tasks], meta, notes, appendix, directory=RESULTS))
    print(appendix)


if __name__ == "__main__":
    main()

"""Runs methods x f x M x seeds over task instances, one record per finished run, resumably.

Jobs are (task, instance, method, f, M); each job's sampler is built once and called per seed.
Runs already in the record file are skipped (a job whose seeds are all done is never built), so
an interrupted study continues where it stopped.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from evaluation.methods import StudySettings, build_sampler, experts_for, get_method, instance_constraint
from evaluation.records import NO_F, Record, RecordKey, RecordStore
from smc_jax.models.lm import LanguageModel
from smc_jax.smc.result import SMCResult, ZeroWeightError
from evaluation.tasks import get_task
from evaluation.tasks.base import sample

#: The f-ensembles of the paper (Sec. 6.1): min, product, mixture, max of the experts.
PAPER_FS = ("min", "product", "mixture", "max")


@dataclasses.dataclass(frozen=True)
class Job:
    """One sampler configuration: a task instance, a method, an f and a particle count.

    Attributes
    ----------
    task : str
        "json", "word_sorting" or "sql".
    instance : task instance
        One instance of the task.
    method : str
        A name of `STUDY_METHODS`.
    f : str
        The ensemble function (`NO_F` for one-expert methods).
    num_particles : int
        M.
    """

    task: str
    instance: Any
    method: str
    f: str
    num_particles: int

    def key(self, seed: int) -> RecordKey:
        return (self.task, str(self.instance.id), self.method, self.f, self.num_particles, seed)


def load_instances(task: str, limit: int | None, seed: int = 0, data_dir: str | Path | None = None,
                   max_words: int | None = None) -> list[Any]:
    """`limit` instances of `task` drawn with `seed` (all when None). For word sorting,
    `max_words` first keeps only the lists of at most that many words.

    Parameters
    ----------
    task : str
        The task's name.
    limit : int or None
        How many instances.
    seed : int
        The draw's seed.
    data_dir : str or pathlib.Path, optional
        The data folder (see `evaluation.tasks.resolve_data_dir`).
    max_words : int, optional
        Word sorting only: the longest list kept.
    """
    pool = get_task(task).instances(data_dir=data_dir)
    if max_words is not None and task == "word_sorting":
        pool = [instance for instance in pool if len(instance.input.split()) <= max_words]
        if not pool:
            raise ValueError(f"no word sorting instance has at most {max_words} words")
    return sample(pool, None if limit is None else min(limit, len(pool)), seed)


def plan(instances: Mapping[str, Sequence[Any]], methods: Sequence[str], fs: Sequence[str],
         particles: Sequence[int]) -> list[Job]:
    """Every (task, instance, method, f, M); methods with one expert get f = NO_F (once).

    Parameters
    ----------
    instances : mapping of str to sequence
        Task name -> its instances.
    methods : sequence of str
        Method names.
    fs : sequence of str
        Ensemble functions.
    particles : sequence of int
        Particle counts M.
    """
    jobs = []
    for task, task_instances in instances.items():
        for instance in task_instances:
            for name in methods:
                method = get_method(name)
                for f in (fs if method.uses_f else (NO_F,)):
                    for m in particles:
                        jobs.append(Job(task, instance, name, f, m))
    return jobs


SeedRunner = Callable[[int], Record]


def batch_key(job: Job) -> tuple:
    """Runs with equal keys share models, method, f, M and settings: one batch may hold them."""
    return job.task, job.method, job.f, job.num_particles


def run_jobs(jobs: Sequence[Job], seeds: Sequence[int], store: RecordStore,
             make_runner: Callable[[Job], SeedRunner], progress: bool = True, batch_size: int | None = None) -> int:
    """Runs every (job, seed) not yet in `store`, appending each record as it finishes.
    `make_runner(job)` builds the job's sampler once; returns the number of new runs.

    With `batch_size`, the pending runs are grouped by `batch_key` (instances and seeds of one
    task, method, f and M) and each group runs `batch_size` at a time through
    `make_runner.run_batch(runs, batch_size)` (one program over a problem axis,
    `EnsembleSampler.sample_problems`); the records, and what a rerun skips, are the same.

    Parameters
    ----------
    jobs : sequence of Job
        From `plan`.
    seeds : sequence of int
        The seeds of every job.
    store : RecordStore
        Where the records go (runs already there are skipped).
    make_runner : callable
        Job -> a function of the seed returning a `Record`.
    progress : bool
        Show a progress bar.
    batch_size : int, optional
        Runs per batch (None: one run at a time).
    """
    pending = [(job, [s for s in seeds if job.key(s) not in store]) for job in jobs]
    pending = [(job, todo) for job, todo in pending if todo]
    run_batch = getattr(make_runner, "run_batch", None)
    if batch_size is not None and run_batch is None:
        raise ValueError(f"batch_size needs a make_runner with run_batch (ModelRunner has it); got {make_runner!r}")
    total = sum(len(todo) for _, todo in pending)
    with tqdm(total=total, desc="runs", disable=not progress, dynamic_ncols=True) as bar:

        def keep(job: Job, seed: int, record: Record) -> None:
            if record.key != job.key(seed):
                raise RuntimeError(f"the runner returned record {record.key} for {job.key(seed)}")
            store.append(record)
            bar.update()

        if batch_size is None:
            for job, todo in pending:
                runner = make_runner(job)
                for seed in todo:
                    bar.set_postfix_str(f"{job.task} {job.instance.id} {job.method} {job.f} M={job.num_particles} seed={seed}")
                    keep(job, seed, runner(seed))
            return total
        groups: dict[tuple, list[tuple[Job, int]]] = {}
        for job, todo in pending:
            groups.setdefault(batch_key(job), []).extend((job, seed) for seed in todo)
        for (task, method, f, m), runs in groups.items():
            for at in range(0, len(runs), batch_size):
                chunk = runs[at: at + batch_size]
                bar.set_postfix_str(f"{task} {method} {f} M={m}: {len(chunk)} runs")
                for (job, seed), record in zip(chunk, run_batch(chunk, batch_size), strict=True):
                    keep(job, seed, record)
    return total


def record_from_result(job: Job, seed: int, result: SMCResult | None, correct: Callable[[str], bool],
                       settings: StudySettings, seconds: float = math.nan) -> Record:
    """The record of one run; `result` None means every particle ended at zero weight (counted
    as expected accuracy 0, no log Z-hat)."""
    base = dict(task=job.task, instance=str(job.instance.id), method=job.method, f=job.f,
                num_particles=job.num_particles, seed=seed, settings=settings.to_dict())
    if result is None:
        return Record(**base, expected_accuracy=0.0, log_Z=None, seconds=seconds, model_calls=None,
                      steps=0, finished=0.0, zero_weight=True)
    log_z = result.log_Z
    zero = log_z is not None and not math.isfinite(log_z)
    return Record(
        **base,
        expected_accuracy=result.expected_accuracy(correct),
        log_Z=None if zero else log_z,
        seconds=float(result.stats.get("seconds", seconds)),
        model_calls=result.stats.get("model_calls"),
        steps=result.num_steps,
        finished=float(result.finished.mean()),
        zero_weight=zero,
    )


@dataclasses.dataclass
class ModelRunner:
    """make_runner for real models: experts from the task's prompts, one sampler per job.

    Attributes
    ----------
    model : LanguageModel
        The model (`--model`).
    settings : StudySettings
        The run settings.
    cross_model : LanguageModel, optional
        The second model of cross-model methods.
    """

    model: LanguageModel
    settings: StudySettings
    cross_model: LanguageModel | None = None

    def __call__(self, job: Job) -> SeedRunner:
        task = get_task(job.task)
        method = get_method(job.method)
        experts = experts_for(method, task.prompts(job.instance), self.model, self.cross_model,
                              self.settings.cross_prompt)
        constraint = instance_constraint(job.task, job.instance) if method.constrained else None
        sampler = build_sampler(method, job.f, job.num_particles, experts, self.settings, constraint)

        def correct(text: str) -> bool:
            return task.is_correct(job.instance, text)

        def run(seed: int) -> Record:
            start = time.perf_counter()
            try:
                result = sampler(seed, allow_zero_weight=True)
            except ZeroWeightError:  # the local baseline: every particle hit an inadmissible symbol
                result = None
            return record_from_result(job, seed, result, correct, self.settings, time.perf_counter() - start)

        return run

    def run_batch(self, runs: Sequence[tuple[Job, int]], batch_size: int) -> list[Record]:
        """The records of (job, seed) runs that share a `batch_key`, sampled as one batch of
        problems (each its instance's prompts, constraint and seed); a run's seconds are its
        share of the batch's.

        Parameters
        ----------
        runs : sequence of (Job, int)
            At most `batch_size` runs.
        batch_size : int
            The batch's size (a shorter batch is padded to it: one program for all).
        """
        first = runs[0][0]
        task, method = get_task(first.task), get_method(first.method)
        experts = [experts_for(method, task.prompts(job.instance), self.model, self.cross_model,
                               self.settings.cross_prompt) for job, _ in runs]
        constraints = [instance_constraint(job.task, job.instance) for job, _ in runs] if method.constrained else None
        sampler = build_sampler(method, first.f, first.num_particles, experts[0], self.settings,
                                None if constraints is None else constraints[0])
        start = time.perf_counter()
        results = sampler.sample_problems([[e.prompt for e in group] for group in experts], [seed for _, seed in runs],
                                          constraints=constraints, batch_size=batch_size, allow_zero_weight=True)
        seconds = (time.perf_counter() - start) / len(runs)
        records = []
        for (job, seed), result in zip(runs, results):
            if isinstance(result, ZeroWeightError):  # the local baseline: every particle hit an inadmissible symbol
                result = None
            elif isinstance(result, Exception):
                raise result
            else:
                result = dataclasses.replace(result, stats=dict(result.stats, seconds=seconds))
            records.append(record_from_result(job, seed, result, lambda text, job=job: task.is_correct(job.instance, text),
                                              self.settings, seconds))
        return records


def select(records: Iterable[Record], **criteria: Any) -> list[Record]:
    """Records whose fields equal every given value (a tuple/list/set value: any of them).

    Parameters
    ----------
    records : iterable of Record
        The records.
    **criteria
        Field name -> value (or a tuple, list or set of values).
    """
    out = []
    for record in records:
        ok = True
        for name, value in criteria.items():
            field = getattr(record, name)
            if isinstance(value, (tuple, list, set, frozenset)):
                ok = field in value
            else:
                ok = field == value
            if not ok:
                break
        if ok:
            out.append(record)
    return out

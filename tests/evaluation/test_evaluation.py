"""Aggregation logic of the evaluation (no model): t-intervals over seeds, per-instance Spearman
averaging, z-scores, the sanity-check tables, the Table 5 layout, and resumability (also after a
study was killed while writing a record)."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest
from scipy import stats as scipy_stats

from evaluation import (
    NO_F, STUDY_LEVELS, Job, Record, RecordStore, SettingsMismatchError, TornLineWarning, get_method,
    per_instance_spearman, plan, run_jobs, spearman, t_interval, zscore,
)
from evaluation.report import (
    RESAMPLE_ACTIVE, RESAMPLE_ALL, correlations, mixture_check, seed_interval, seed_means, smc_vs_is, table5_rows,
    zscored_points,
)

T_975_DF2 = 4.302652729749464  # Student's t quantile 0.975 with 2 degrees of freedom


def record(instance="a", method="token", f="product", m=4, seed=0, acc=0.0, log_z=-1.0, task="word_sorting",
           **kw) -> Record:
    return Record(task=task, instance=instance, method=method, f=f, num_particles=m, seed=seed,
                  expected_accuracy=acc, log_Z=log_z, seconds=0.1, model_calls=3, steps=3, finished=1.0, **kw)


@dataclasses.dataclass(frozen=True)
class FakeInstance:
    id: str


# ---------------------------------------------------------------- statistics


def test_t_interval_formula():
    interval = t_interval([1.0, 2.0, 3.0])
    assert interval.mean == pytest.approx(2.0)
    # mean +- t_{0.975, n-1} * s / sqrt(n), s with ddof=1 (s = 1 here)
    assert interval.half_width == pytest.approx(T_975_DF2 / math.sqrt(3))
    assert interval.n == 3
    assert interval.format() == "2.0 ± 2.5"


def test_t_interval_small_samples():
    assert math.isnan(t_interval([0.4]).half_width) and t_interval([0.4]).mean == 0.4
    assert t_interval([0.4]).format(100) == "40.0"
    assert t_interval([]).n == 0 and t_interval([]).format() == "n/a"
    assert t_interval([0.2, 0.2, 0.2]).half_width == pytest.approx(0.0, abs=1e-12)


def test_zscore():
    np.testing.assert_allclose(zscore([1.0, 2.0, 3.0]), [-math.sqrt(1.5), 0.0, math.sqrt(1.5)])
    np.testing.assert_array_equal(zscore([5.0, 5.0]), [0.0, 0.0])  # constant: all zero, no NaN


def test_spearman_matches_scipy_with_ties():
    x, y = [1.0, 2.0, 2.0, 4.0, 5.0], [0.1, 0.0, 0.3, 0.3, 0.9]
    assert spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 2, 3], [0.0, 0.0, 0.0]))  # constant side: undefined
    with pytest.raises(ValueError):
        spearman([1, 2], [1])


def test_per_instance_spearman_averages_defined_instances():
    points = (
        [("a", x, y) for x, y in [(1, 1), (2, 2), (3, 3)]]          # rho = 1
        + [("b", x, y) for x, y in [(1, 2), (2, 3), (3, 1)]]        # rho = -0.5
        + [("c", x, 0.0) for x in (1, 2, 3)]                         # constant accuracy: undefined
    )
    summary = per_instance_spearman(points)
    assert summary.per_instance["a"] == pytest.approx(1.0)
    assert summary.per_instance["b"] == pytest.approx(-0.5)
    assert math.isnan(summary.per_instance["c"])
    assert summary.mean == pytest.approx(0.25)
    assert summary.standard_error == pytest.approx(np.std([1.0, -0.5], ddof=1) / math.sqrt(2))
    assert summary.n_instances == 2 and summary.n_undefined == 1
    assert summary.p_value == pytest.approx(scipy_stats.ttest_1samp([1.0, -0.5], 0.0).pvalue)


def test_per_instance_spearman_all_undefined():
    summary = per_instance_spearman([("a", 1.0, 0.0), ("a", 2.0, 0.0)])
    assert summary.n_instances == 0 and summary.format() == "n/a"


# ---------------------------------------------------------------- aggregation of records


def test_seed_interval_averages_instances_first():
    records = [record("a", seed=0, acc=0.2), record("b", seed=0, acc=0.4),
               record("a", seed=1, acc=0.6), record("b", seed=1, acc=0.8),
               record("a", seed=2, acc=0.4), record("b", seed=2, acc=0.6)]
    assert seed_means(records) == pytest.approx({0: 0.3, 1: 0.7, 2: 0.5})
    interval = seed_interval(records)
    assert interval.mean == pytest.approx(0.5)
    assert interval.half_width == pytest.approx(T_975_DF2 * 0.2 / math.sqrt(3))


def test_log_z_none_is_left_out():
    records = [record("a", seed=0, log_z=-2.0), record("b", seed=0, log_z=None, zero_weight=True)]
    assert seed_means(records, lambda r: r.log_Z) == {0: -2.0}


def test_table5_layout():
    records = []
    for seed, (p1, tok) in enumerate([(0.1, 0.3), (0.2, 0.4), (0.3, 0.5)]):
        records += [record(method="prompt1", f=NO_F, seed=seed, acc=p1, m=8),
                    record(method="token", f="min", seed=seed, acc=tok, m=8),
                    record(method="token", f="min", seed=seed, acc=1.0, m=8, task="sql")]
    rows = table5_rows(records, ["word_sorting", "sql"], ["prompt1", "token"], ["min"], [8])
    assert [r["method"] for r in rows] == ["Prompt 1", "min, Token SMC"]
    half = T_975_DF2 * 0.1 / math.sqrt(3) * 100
    assert rows[0]["word_sorting"] == f"20.0 ± {half:.1f}"
    assert rows[1]["word_sorting"] == f"40.0 ± {half:.1f}"
    assert rows[1]["sql"] == "100.0 ± 0.0" and rows[0]["sql"] == "n/a"
    assert rows[1]["word_sorting_seeds"] == 3 and rows[1]["word_sorting_instances"] == 1


def test_mixture_check_reports_difference_to_mean_of_experts():
    records = []
    for seed in range(3):
        records += [record(method="prompt1", f=NO_F, seed=seed, acc=0.2),
                    record(method="prompt2", f=NO_F, seed=seed, acc=0.6),
                    record(method="token", f="mixture", seed=seed, acc=0.4 + 0.01 * seed)]
    (row,) = mixture_check(records, [4])
    assert row["experts_mean"] == pytest.approx(0.4)
    assert row["mixture_mean"] == pytest.approx(0.41)
    assert row["|mixture - mean(experts)|"] == pytest.approx(1.0)  # percent
    assert row["diff_ci95"] == pytest.approx(T_975_DF2 * 0.01 / math.sqrt(3))


def test_smc_vs_is_difference_per_seed():
    records = []
    for seed in range(3):
        records += [record(method="token", seed=seed, log_z=-1.0 - 0.1 * seed),
                    record(method="token_is", seed=seed, log_z=-2.0)]
    (row,) = smc_vs_is(records, ["product"], [4])
    assert row["smc_mean"] == pytest.approx(-1.1) and row["is_mean"] == pytest.approx(-2.0)
    assert row["diff_mean"] == pytest.approx(0.9) and row["SMC higher"]


def test_smc_vs_is_reports_each_resampling_variant_at_its_level():
    records = []
    for seed in range(3):
        records += [record(method="cross_byte", seed=seed, log_z=-3.0), record(method="cross_byte_active", seed=seed, log_z=-1.5),
                    record(method="cross_byte_is", seed=seed, log_z=-2.0), record(method="token", seed=seed, log_z=9.0)]
    rows = smc_vs_is(records, ["product"], [4], STUDY_LEVELS["cross_byte"])
    assert [(r["resampling"], r["diff_mean"]) for r in rows] == [
        (RESAMPLE_ALL, pytest.approx(-1.0)), (RESAMPLE_ACTIVE, pytest.approx(0.5))]
    assert smc_vs_is(records, ["product"], [4]) == []  # token level: no token_is records


def test_study_levels_name_their_methods():
    for level_name, level in STUDY_LEVELS.items():
        smc, active, importance = (get_method(n) for n in (level.smc, level.smc_active, level.importance))
        assert smc.resample_finished and not active.resample_finished and importance.importance_sampling
        assert {smc.level, active.level, importance.level} == {"byte" if level_name.endswith("byte") else "token"}
        assert smc.constrained == active.constrained == importance.constrained
        assert len({smc.experts, active.experts, importance.experts}) == 1


def test_smc_vs_is_pairs_runs_by_instance_and_seed():
    # Instance difficulty varies a lot; SMC is 0.5 above IS on every (instance, seed) but one.
    records = []
    for i, base in enumerate([-10.0, -1.0, -5.0]):
        for seed in range(2):
            smc = base + 0.5 if (i, seed) != (2, 1) else base - 0.1
            records += [record(f"i{i}", method="token", seed=seed, log_z=smc),
                        record(f"i{i}", method="token_is", seed=seed, log_z=base)]
    records.append(record("unpaired", method="token", seed=0, log_z=100.0))  # no IS partner: left out
    (row,) = smc_vs_is(records, ["product"], [4])
    diffs = [0.5] * 5 + [-0.1]
    expected = t_interval(diffs)
    assert row["pairs"] == 6
    assert row["run_diff_mean"] == pytest.approx(expected.mean)
    assert row["run_diff_ci95"] == pytest.approx(expected.half_width)
    assert row["smc_higher_share"] == pytest.approx(5 / 6) and row["SMC higher in"] == "83%"


def test_correlations_and_zscores_use_runs_of_each_instance():
    records = []
    for m, (lz, acc) in zip([2, 4, 8], [(-3.0, 0.1), (-2.0, 0.2), (-1.0, 0.6)]):
        for seed in range(2):
            records.append(record("a", m=m, seed=seed, log_z=lz + 0.01 * seed, acc=acc))
            records.append(record("b", m=m, seed=seed, log_z=-lz, acc=acc))
    summary = correlations(records, ["product"])["product"]
    assert summary.per_instance["a"] > 0.9 and summary.per_instance["b"] < -0.9
    points = zscored_points(records, "product")
    assert len(points) == 6  # (instance, M) cells, seeds averaged
    za = [p for p in points if p[0] == "a"]
    np.testing.assert_allclose(sum(p[2] for p in za), 0.0, atol=1e-12)
    np.testing.assert_allclose(np.std([p[2] for p in za]), 1.0)


# ---------------------------------------------------------------- records and resumability


def test_record_json_round_trip_and_infinite_log_z():
    r = record(log_z=-math.inf, zero_weight=True, settings={"max_length": 8})
    data = json.loads(r.to_json())
    assert data["log_Z"] is None and data["zero_weight"]
    assert Record.from_json(record(log_z=-1.5).to_json()) == record(log_z=-1.5)


def test_plan_gives_single_expert_methods_no_f():
    jobs = plan({"word_sorting": [FakeInstance("x")]}, ["prompt1", "token"], ["min", "max"], [2, 4])
    assert [(j.method, j.f, j.num_particles) for j in jobs] == [
        ("prompt1", NO_F, 2), ("prompt1", NO_F, 4),
        ("token", "min", 2), ("token", "min", 4), ("token", "max", 2), ("token", "max", 4)]


SETTINGS = {"max_length": 8}


class CountingRunner:
    """A fake make_runner: counts builds and calls, returns a record per (job, seed)."""

    def __init__(self):
        self.built, self.calls = [], []

    def __call__(self, job: Job):
        self.built.append(job)

        def run(seed: int) -> Record:
            self.calls.append((job.key(seed)))
            return record(job.instance.id, job.method, job.f, job.num_particles, seed, task=job.task,
                          settings=SETTINGS)

        return run


def test_resumable_runs_skip_existing_records(tmp_path):
    path = tmp_path / "runs.jsonl"
    jobs = plan({"word_sorting": [FakeInstance("x"), FakeInstance("y")]}, ["token"], ["product"], [2])
    store = RecordStore(path, SETTINGS)
    store.append(record("x", "token", "product", 2, seed=0, settings=SETTINGS))  # done before the run
    runner = CountingRunner()
    assert run_jobs(jobs, [0, 1], store, runner, progress=False) == 3
    assert ("word_sorting", "x", "token", "product", 2, 0) not in runner.calls
    assert len(path.read_text().splitlines()) == 4

    again = CountingRunner()
    reopened = RecordStore(path, SETTINGS)
    assert len(reopened) == 4
    assert run_jobs(jobs, [0, 1], reopened, again, progress=False) == 0
    assert again.built == [] and again.calls == []  # no sampler is even built
    assert run_jobs(jobs, [0, 1, 2], reopened, again, progress=False) == 2  # only the new seed


class BatchRunner(CountingRunner):
    """CountingRunner that also runs batches, recording each batch's runs."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def run_batch(self, runs, batch_size):
        assert len(runs) <= batch_size and len({(j.task, j.method, j.f, j.num_particles) for j, _ in runs}) == 1
        self.batches.append([job.key(seed) for job, seed in runs])
        return [self(job)(seed) for job, seed in runs]


def test_batched_runs_group_by_method_and_resume_like_single_runs(tmp_path):
    """Batches hold the instances and seeds of one (task, method, f, M); the records and what a
    rerun skips are those of one-at-a-time runs."""
    jobs = plan({"word_sorting": [FakeInstance("x"), FakeInstance("y"), FakeInstance("z")]}, ["token", "local"],
                ["product", "min"], [2])
    single, batched = tmp_path / "single.jsonl", tmp_path / "batched.jsonl"
    assert run_jobs(jobs, [0, 1], RecordStore(single, SETTINGS), CountingRunner(), progress=False) == 24
    store = RecordStore(batched, SETTINGS)
    store.append(record("x", "token", "product", 2, seed=0, task="word_sorting", settings=SETTINGS))
    runner = BatchRunner()
    assert run_jobs(jobs, [0, 1], store, runner, progress=False, batch_size=4) == 23
    assert [len(b) for b in runner.batches] == [4, 1, 4, 2, 4, 2, 4, 2]  # 5 + 6 + 6 + 6 runs, by 4
    assert ("word_sorting", "x", "token", "product", 2, 0) not in sum(runner.batches, [])
    key = lambda r: r.key
    assert sorted(RecordStore(batched, SETTINGS).records, key=key) == sorted(RecordStore(single, SETTINGS).records, key=key)
    again = BatchRunner()
    assert run_jobs(jobs, [0, 1, 2], RecordStore(batched, SETTINGS), again, progress=False, batch_size=4) == 12
    assert all(key[-1] == 2 for batch in again.batches for key in batch)  # only the new seed
    with pytest.raises(ValueError, match="run_batch"):
        run_jobs(jobs, [3], RecordStore(batched, SETTINGS), CountingRunner(), progress=False, batch_size=4)


def test_store_refuses_other_settings_and_duplicates(tmp_path):
    path = tmp_path / "runs.jsonl"
    store = RecordStore(path, {"max_length": 8})
    store.append(record(settings={"max_length": 8}))
    with pytest.raises(ValueError, match="already"):
        store.append(record(settings={"max_length": 8}))
    with pytest.raises(SettingsMismatchError, match="max_length"):
        store.append(record(seed=1, settings={"max_length": 9}))
    with pytest.raises(SettingsMismatchError, match="max_length"):
        RecordStore(path, {"max_length": 16})
    path.write_text(path.read_text() + "not json\n")
    with pytest.raises(ValueError, match=":2: not a record"):
        RecordStore(path)


# ---------------------------------------------------------------- interrupted studies


def finished_study(path, seeds=(0, 1)) -> list:
    """A toy study of 2 instances x `seeds` written to `path`; its jobs."""
    jobs = plan({"word_sorting": [FakeInstance("x"), FakeInstance("y")]}, ["token"], ["product"], [2])
    assert run_jobs(jobs, list(seeds), RecordStore(path, SETTINGS), CountingRunner(), progress=False) == 4
    return jobs


def test_study_killed_while_writing_a_record_resumes_and_redoes_only_that_run(tmp_path):
    path = tmp_path / "runs.jsonl"
    jobs = finished_study(path)
    lines = path.read_bytes().splitlines(keepends=True)
    last = Record.from_json(lines[-1].decode())
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # killed mid-write

    with pytest.warns(TornLineWarning, match=r"runs\.jsonl:4: the last line is cut off"):
        reopened = RecordStore(path, SETTINGS)
    assert len(reopened) == 3 and last.key not in reopened
    runner = CountingRunner()
    with pytest.warns(TornLineWarning, match="removed a cut-off last line"):
        assert run_jobs(jobs, [0, 1], reopened, runner, progress=False) == 1
    assert runner.calls == [last.key]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file is whole again: no torn line, no fragment
        complete = RecordStore(path, SETTINGS)
    assert len(complete) == 4 and len(path.read_text().splitlines()) == 4
    assert run_jobs(jobs, [0, 1], complete, CountingRunner(), progress=False) == 0


def test_opening_a_torn_file_does_not_change_it(tmp_path):
    path = tmp_path / "runs.jsonl"
    finished_study(path)
    torn = path.read_bytes()[:-7]
    path.write_bytes(torn)
    with pytest.warns(TornLineWarning):
        RecordStore(path, SETTINGS)
    assert path.read_bytes() == torn  # only an append cuts the fragment (read-only files stay readable)


@pytest.mark.parametrize("damage", [
    lambda line: b"not json",                 # garbage
    lambda line: line[: len(line) // 2],      # a torn line that is not the last one
    lambda line: b"\xff" + line,              # not UTF-8
])
def test_a_bad_line_before_the_last_is_an_error_with_its_line_number(tmp_path, damage):
    path = tmp_path / "runs.jsonl"
    finished_study(path)
    lines = path.read_bytes().split(b"\n")
    lines[1] = damage(lines[1])
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(ValueError, match=r"runs\.jsonl:2: not"):
        RecordStore(path, SETTINGS)


def test_a_complete_last_line_that_is_not_a_record_is_an_error(tmp_path):
    path = tmp_path / "runs.jsonl"
    finished_study(path)
    path.write_bytes(path.read_bytes() + b'{"task": "word_sorting"}\n')  # whole line, so not a torn write
    with pytest.raises(ValueError, match=r"runs\.jsonl:5: not a record"):
        RecordStore(path, SETTINGS)


def test_study_scripts_reject_non_positive_counts_before_any_work():
    import argparse

    from evaluation.cli import add_common_arguments

    parser = argparse.ArgumentParser()
    add_common_arguments(parser, particles=[8], seeds=[0])
    assert parser.parse_args(["--particles", "4", "8"]).particles == [4, 8]
    for flag in ("--particles", "--limit", "--max-length", "--max-bytes"):
        with pytest.raises(SystemExit):
            parser.parse_args([flag, "0"])

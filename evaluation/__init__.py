"""The paper's evaluations (Sec. 6, App. F): methods x f x M x seeds over task instances,
recorded run by run in a resumable JSONL file and aggregated into Table 5 (expected accuracy,
mean and 95% CI over seeds), the particle study (E[log Z-hat] against M), Table 7 (per-instance
Spearman correlations of log Z-hat with expected accuracy) and their plots::

    from evaluation import ModelRunner, RecordStore, StudySettings, load_instances, plan, run_jobs
    settings = StudySettings(model="smollm2-135m-instruct", max_length=24, at_max_length="truncate")
    store = RecordStore("runs.jsonl", settings.to_dict())
    jobs = plan({"word_sorting": load_instances("word_sorting", limit=4)}, ["prompt1", "token"],
                ["product"], particles=[8])
    run_jobs(jobs, seeds=[0, 1, 2], store=store, make_runner=ModelRunner(model, settings))

The scripts evaluation/evaluate.py (Table 5) and evaluation/particle_study.py drive this.
"""

from evaluation.jsonl import TornLineWarning
from evaluation.methods import (
    STUDY_METHODS, STUDY_LEVELS, Method, StudySettings, StudyLevel, build_sampler, chat_as_text, experts_for, get_method,
)
from evaluation.records import NO_F, Record, RecordStore, SettingsMismatchError
from evaluation.runner import PAPER_FS, Job, ModelRunner, load_instances, plan, run_jobs, select
from evaluation.stats import CorrelationSummary, Interval, per_instance_spearman, spearman, t_interval, zscore

__all__ = [
    "STUDY_METHODS", "STUDY_LEVELS", "Method", "StudySettings", "StudyLevel", "build_sampler", "chat_as_text", "experts_for", "get_method",
    "NO_F", "Record", "RecordStore", "SettingsMismatchError", "TornLineWarning",
    "PAPER_FS", "Job", "ModelRunner", "load_instances", "plan", "run_jobs", "select",
    "CorrelationSummary", "Interval", "per_instance_spearman", "spearman", "t_interval", "zscore",
]

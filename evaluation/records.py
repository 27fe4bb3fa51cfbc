"""One evaluation run as a record, and the append-only JSONL file that makes a study resumable.

A record is one finished (task, instance, method, f, M, seed) run with what the paper reports
for it: expected accuracy, log Z-hat, wall time, model calls and SMC steps. Every record also
carries the run-level `settings` (models, length limit, temperature, ...) so that records made
under other settings are never silently mixed into one table.

The file is written line by line through `evaluation.jsonl`: a study killed while it
writes a record loses only that run (the cut-off last line is dropped with a warning and the run
is redone on resume); a bad line anywhere else is an error naming its line number.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from evaluation.jsonl import append_line, read_lines

#: The f of a single-expert run (K = 1: every f-ensemble of one expert is that expert).
NO_F = "none"

RecordKey = tuple[str, str, str, str, int, int]
"""(task, instance, method, f, num_particles, seed): what identifies a run."""


class SettingsMismatchError(ValueError):
    """The record file holds runs made under other settings than the ones asked for."""


@dataclasses.dataclass(frozen=True)
class Record:
    """One finished run. `log_Z` is None for the token-local baseline (no importance weights)
    and when every particle ended at zero weight (`zero_weight`); `finished` is the fraction of
    particles that ended with EOS; `seconds` is the wall time of the sampler call (the first
    call of a compiled shape includes compilation).

    Attributes
    ----------
    task, instance, method, f : str
        What ran.
    num_particles, seed : int
        M and the seed.
    expected_accuracy : float
        sum_m w_bar_m 1{x_m correct}.
    log_Z : float or None
        log Z-hat.
    seconds : float
        Wall time of the sampler call.
    model_calls : int or None
        Sequential model calls.
    steps : int
        SMC steps.
    finished : float
        Fraction of particles that ended with EOS.
    zero_weight : bool
        Every particle ended at zero weight.
    settings : mapping
        The run settings (`StudySettings.to_dict`).
    """

    task: str
    instance: str
    method: str
    f: str
    num_particles: int
    seed: int
    expected_accuracy: float
    log_Z: float | None
    seconds: float
    model_calls: int | None
    steps: int
    finished: float
    zero_weight: bool = False
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> RecordKey:
        return (self.task, self.instance, self.method, self.f, self.num_particles, self.seed)

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["settings"] = dict(self.settings)
        if data["log_Z"] is not None and not math.isfinite(data["log_Z"]):
            data["log_Z"] = None  # strict JSON has no infinities; zero_weight says why
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> "Record":
        data = json.loads(line)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown record fields {sorted(unknown)} in {line[:80]!r}")
        return cls(**data)


def first_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """The first setting (sorted by name) whose value differs between a and b, else None."""
    for name in sorted(set(a) | set(b)):
        if a.get(name) != b.get(name):
            return name
    return None


class RecordStore:
    """Records of one study in a JSONL file: loaded on open, appended one by one as whole lines.

    With `settings`, every record already in the file must have been made under the same
    settings; otherwise `SettingsMismatchError` (use another file for other settings). A last
    line cut off by an interrupted write is dropped with a `TornLineWarning` (that run is then
    missing and is run again); any other line that is not a record raises `ValueError` with the
    file and line number. Opening never modifies the file.

    Parameters
    ----------
    path : str or pathlib.Path
        The JSONL file (created when missing).
    settings : mapping, optional
        The settings every record must share.
    """

    def __init__(self, path: str | Path, settings: Mapping[str, Any] | None = None):
        self.path = Path(path)
        self.settings = dict(settings or {})
        self._records: dict[RecordKey, Record] = {}
        if self.path.exists():
            for number, line in read_lines(self.path):
                if not line.strip():
                    continue
                try:
                    record = Record.from_json(line)
                except (ValueError, TypeError) as error:
                    raise ValueError(f"{self.path}:{number}: not a record ({error})") from error
                if settings is not None:
                    self._check(record)
                self._records[record.key] = record
        self._checked = settings is not None

    def _check(self, record: Record) -> None:
        name = first_difference(record.settings, self.settings)
        if name is not None:
            raise SettingsMismatchError(
                f"{self.path}: run {record.key} was made with {name}={record.settings.get(name)!r}, but "
                f"this study uses {name}={self.settings.get(name)!r}; pass another --out file "
                "(or delete this one) to run under the new settings"
            )

    def __contains__(self, key: RecordKey) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    @property
    def records(self) -> list[Record]:
        return list(self._records.values())

    def append(self, record: Record) -> None:
        """Adds a record and appends it to the file at once, as one whole line (a crash loses at
        most the run in flight)."""
        if record.key in self._records:
            raise ValueError(f"record {record.key} is already in {self.path}")
        if self._checked:
            self._check(record)
        append_line(self.path, record.to_json())
        self._records[record.key] = record

    def extend(self, records: Iterable[Record]) -> None:
        for record in records:
            self.append(record)

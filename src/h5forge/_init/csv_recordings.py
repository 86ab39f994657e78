"""The CSV recording layout: ``*.csv`` files with a time column, one ``signal`` field per numeric
column, the rate measured from the time column (samples over its span, as a build measures it,
over the first rows only, so a long recording is not read whole)."""

from __future__ import annotations

import csv
import itertools
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from h5forge.kinds import Layout
from h5forge._init.signals import Survey, folders_with

CSV_ROWS = 20_000


@dataclass
class _CsvRecording:
    time: str | None = None
    columns: list[str] = field(default_factory=list)  # numeric columns other than time
    other: list[str] = field(default_factory=list)  # columns holding text
    rate: float | None = None
    problem: str | None = None


def _csv_recording(path: Path, time_columns: tuple[str, ...]) -> _CsvRecording:
    """The time column, the numeric columns and the rate (from the first rows) of a CSV recording."""
    rec = _CsvRecording()
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            reader = csv.reader(fh)
            header = [h.strip() for h in next(reader, [])]
            rows = [r for r in itertools.islice(reader, CSV_ROWS) if r]
    except (OSError, csv.Error) as err:
        rec.problem = str(err)
        return rec
    time_col = next((i for i, h in enumerate(header) if h.lower() in time_columns), None)
    if time_col is None:
        return rec
    rec.time = header[time_col]
    try:
        times = np.array([float(r[time_col]) for r in rows], np.float64)
    except (ValueError, IndexError):
        rec.problem = f"its {rec.time} column holds a value that is not a number"
        return rec
    steps = np.diff(times)
    if not steps.size or (steps <= 0).any():
        rec.problem = "fewer than two samples" if not steps.size else f"its {rec.time} column does not increase"
        return rec
    rec.rate = len(steps) / float(times[-1] - times[0])  # over the span, as the build measures it
    for i, h in enumerate(header):
        if i == time_col or not h:
            continue
        try:
            [float(r[i]) for r in rows[:50]]
            rec.columns.append(h)
        except (ValueError, IndexError):
            rec.other.append(h)
    return rec


def detect(kind, raw: Path, notes: list[str], todo: list[str]) -> Layout | None:
    """The ``signals`` layout of the CSV recordings of ``raw`` or its first sub-folder whose first
    CSV has a time column, or None if there is none (a CSV without one is an annotation file);
    ``kind`` gives the rate tolerance and the time column names."""
    for base, files in folders_with(raw, (".csv",)):
        if _csv_recording(files[0], kind.time_columns).time is not None:
            return _csv_recordings_body(Survey(raw, base, files, kind.rate_tolerance), notes, kind.time_columns)
    return None


def _csv_recordings_body(survey: Survey, notes: list[str], time_columns: tuple[str, ...]) -> Layout:
    text_columns: Counter[str] = Counter()
    for p in survey.sampled:
        rec = _csv_recording(p, time_columns)
        if rec.time is None or rec.rate is None:
            survey.reject(p.name, rec.problem or "no time column (" + ", ".join(time_columns) + ")")
            continue
        for column in rec.columns:
            survey.add(column, rec.rate, p.name)
        text_columns.update(rec.other)
    survey.require(
        notes,
        f"no CSV recording in {survey.base} has a numeric column beside its time column",
        "no columns",
        "CSV recordings cannot be used",
    )
    if text_columns:
        notes.append(f"columns holding text are not declared: {', '.join(sorted(text_columns))}")
    return survey.layout(
        "column",
        notes,
        f"one field per column of the {len(survey.files)} CSV recordings in "
        f"{survey.prefix or './'} (the time column gives the rate)",
        "measured from the time column",
    )

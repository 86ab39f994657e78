"""The annotation file beside the pictures (``*.json``, ``*.jsonl``, ``*.csv``): the one that names
most samples is joined by the column naming them; every other candidate gets a note saying why it
is not read, so nothing is dropped silently. Also the spec lines that join it."""

from __future__ import annotations

import csv
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from h5forge._ingest.discover import _IMAGE_SUFFIXES, TEXT_FORMAT, bare_name_index, read_annotation_file
from h5forge._init.columns import column_types
from h5forge._init.folders import visible
from h5forge._init.text import SpecText, flow, mapping, scalar

ANNOTATION_SUFFIXES = (".json", ".jsonl", ".csv")
_ID_KEYS = ("id", "sample_id", "name", "file", "filename", "file_name", "image", "image_id", "path")
_LABEL_KEYS = ("label", "labels", "class", "class_name", "classname", "category", "target")


@dataclass
class Annotations:
    file: str
    id_key: str
    columns: dict[str, str]
    index_by: list[str]
    matched: int
    label: tuple[str, tuple[str, ...] | None] | None = None  # a label-like column and its classes


def _record_id(value: Any, ids: str) -> str:
    """A record's sample id as discovery makes it (``load_records``)."""
    raw_id = str(value)
    suffix = Path(raw_id).suffix
    if suffix.lower() in _IMAGE_SUFFIXES:
        raw_id = Path(raw_id).stem if ids == "stem" else raw_id[: -len(suffix)]
    return raw_id


def _looks_annotation(p: Path) -> bool:
    return p.is_file() and visible(p) and p.suffix.lower() in ANNOTATION_SUFFIXES


def find_annotations(raw: Path, ids: set[str], id_mode: str, skip: set[str], notes: list[str]) -> Annotations | None:
    """The annotation file beside the pictures that names most samples; notes for the others."""
    usable: list[tuple[tuple, Annotations, list[str]]] = []
    example = ", ".join(sorted(ids)[:3])
    bare = bare_name_index(ids) if id_mode == "path" else {}  # discovery joins a unique bare file name
    for path in sorted(p for p in raw.iterdir() if _looks_annotation(p)):
        name = path.name
        try:
            records = read_annotation_file(path)
        except (ValueError, UnicodeDecodeError, RecursionError, csv.Error, OSError) as err:
            reason = str(err)
            if path.suffix.lower() == ".json":
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                    if isinstance(data, dict):
                        shown = ", ".join(list(map(str, data))[:6])
                        reason = f"it holds a JSON object (keys: {shown}), not a list of records"
                except (ValueError, UnicodeDecodeError, RecursionError):
                    pass
            notes.append(f"{name} is not used: {reason}")
            continue
        dicts = [r for r in records if isinstance(r, dict)]
        if not dicts:
            notes.append(
                f"{name} is not used: it holds no records (a list of objects, JSON Lines or a CSV "
                "with a header row is needed)"
            )
            continue
        text = path.suffix.lower() == ".csv"
        if text:
            header = [k for k in dicts[0] if k != TEXT_FORMAT]
            if any(_record_id(h, id_mode) in ids for h in header if h is not None):
                notes.append(
                    f"{name} is not used: its first line names a sample ({', '.join(map(str, header))}); "
                    "a CSV needs a header row (e.g. id,label)"
                )
                continue
        keys = {k for r in dicts[:2000] for k, v in r.items() if k != TEXT_FORMAT and isinstance(v, (str, int))}
        scores = {}
        for key in keys:
            found = {_record_id(r[key], id_mode) for r in dicts if key in r and isinstance(r[key], (str, int))}
            scores[key] = len(found & ids) + sum(len(bare[k]) == 1 for k in found - ids if k in bare)
        if not scores or max(scores.values()) == 0:
            notes.append(
                f"{name} is not used: no column names the samples (tried {', '.join(sorted(keys)) or 'none'}; "
                f"sample ids look like {example})"
            )
            continue

        def preference(k: str, scores: dict = scores) -> tuple:
            return scores[k], -(_ID_KEYS.index(k.lower()) if k.lower() in _ID_KEYS else len(_ID_KEYS)), k

        id_key = max(scores, key=preference)
        file_notes: list[str] = []
        columns, distinct = column_types(dicts, id_key, text, name, skip, file_notes)
        index_by = [c for c, kind in columns.items() if kind in ("str", "bool", "int") and 1 < len(distinct[c]) <= 50]
        label = None
        for c, kind in columns.items():
            if c.lower() in _LABEL_KEYS and kind in ("str", "int") and 1 < len(distinct[c]) <= 1000:
                label = (c, tuple(sorted(map(str, distinct[c]))) if kind == "str" else None)
                break
        ann = Annotations(name, id_key, columns, index_by, scores[id_key], label)
        record_ids = Counter(_record_id(r[id_key], id_mode) for r in dicts if id_key in r)
        twice = sum(1 for n in record_ids.values() if n > 1)
        if len(dicts) < len(records):
            file_notes.append(f"{name}: {len(records) - len(dicts)} entries are not records and will be rejected")
        if twice:
            file_notes.append(f"{name}: {twice} sample ids have several records; those samples will be rejected")
        rank = (scores[id_key], "annot" in name.lower(), -ANNOTATION_SUFFIXES.index(path.suffix.lower()))
        usable.append((rank, ann, file_notes))
    if not usable:
        return None
    usable.sort(key=lambda u: u[0], reverse=True)
    _, chosen, file_notes = usable[0]
    notes.extend(file_notes)
    for _, other, _ in usable[1:]:
        notes.append(
            f"{other.file} also names {other.matched} samples but only one annotation file is read "
            f"({chosen.file}); merge its columns into it to use them"
        )
    if chosen.matched < len(ids):
        notes.append(
            f"{chosen.file} has records for {chosen.matched} of {len(ids)} samples; the others are "
            "quarantined (no annotation record)"
        )
    return chosen


def annotation_lines(
    t: SpecText,
    ann: Annotations | None,
    folders: dict[str, int] | None = None,
    folder_columns: dict[str, str] | None = None,
    index_by: list[str] | None = None,
) -> None:
    columns = {**(folder_columns or {}), **(ann.columns if ann else {})}
    index = [*(index_by or []), *(c for c in (ann.index_by if ann else []) if c not in (index_by or []))]
    if ann is None and not folders:
        return
    t(0, "annotations:")
    if ann is not None:
        t(1, f"file: {scalar(ann.file)}")
        t(1, f"id_key: {scalar(ann.id_key)}", "record key naming the sample (an id or a file name)")
    t(1, f"columns: {mapping(columns)}", "types inferred from the values" if ann else None)
    if folders:
        t(1, f"folders: {mapping(folders)}", "-1: the picture's folder, -2: the one above")
    t(1, f"index_by: {flow(index)}", "columns to precompute row-index arrays for")
    if ann is not None:
        t(1, "required: true", "a sample without a record is quarantined")
    else:
        t(1, "required: false", "no annotation file: the folders say everything")


def label_field(t: SpecText, column: str, classes: tuple[str, ...] | None, comment: str, active: bool = True) -> None:
    """A ``label`` field from a label-like annotation column; commented out (``active`` false) where
    the masks are the target, so it is offered without being stored."""
    if not active:
        listed = f", classes: {flow(classes)}" if classes else ""
        t.comment(
            1,
            f"label: {{kind: label, column: {scalar(column)}{listed}}}   # uncomment to store "
            f"{column!r} as a class index",
        )
        return
    t(1, "label:")
    t(2, "kind: label")
    t(2, f"column: {scalar(column)}", comment)
    if classes:
        t(2, f"classes: {flow(classes)}", "sorted; a class's index is its position")

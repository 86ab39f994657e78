"""Discover: walk the source folder, pair field files by stem, join annotation records, assign splits.

Raw-file hashes are computed by the cleaning workers from the very bytes they decode (in parallel,
and with no window in which a file could change between hashing and decoding).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h5forge.spec import DatasetSpec
from h5forge.splits import assign_split


@dataclass(frozen=True)
class SampleRef:
    """One sample to clean: its id, split, raw files (relative to the source root), columns."""

    id: str
    split: str
    files: dict[str, str]
    columns: dict[str, Any]


@dataclass(frozen=True)
class Rejection:
    """A raw input that did not become a sample, and why."""

    sample_id: str
    path: str
    reason: str
    stage: str = "discover"

    def as_dict(self) -> dict[str, str]:
        return {"sample_id": self.sample_id, "path": self.path, "reason": self.reason, "stage": self.stage}


@dataclass
class Inventory:
    root: Path
    samples: list[SampleRef] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)

    def split_counts(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for s in self.samples:
            counts[s.split] += 1
        return dict(counts)


_COERCE = {"str": str, "int": int, "float": float, "bool": bool}


def _coerce(value: Any, kind: str) -> Any:
    if value is None:
        raise ValueError("missing")
    if kind == "int" and (isinstance(value, bool) or (isinstance(value, float) and not value.is_integer())):
        raise ValueError(f"{value!r} is not an integer")
    if kind == "bool" and not isinstance(value, bool):
        raise ValueError(f"{value!r} is not true/false")
    if kind in ("int", "float") and isinstance(value, str):
        raise ValueError(f"{value!r} is a string, expected {kind}")
    return _COERCE[kind](value)


def _glob_field(root: Path, pattern: str) -> tuple[dict[str, str], list[Rejection]]:
    by_stem: dict[str, list[str]] = defaultdict(list)
    for p in sorted(root.glob(pattern)):
        if p.is_file() and not p.name.startswith("."):
            by_stem[p.stem].append(p.relative_to(root).as_posix())
    found, problems = {}, []
    for stem, paths in by_stem.items():
        if len(paths) > 1:
            problems.append(Rejection(stem, ", ".join(paths), f"ambiguous: {len(paths)} files share the stem"))
        else:
            found[stem] = paths[0]
    return found, problems


def load_records(path: Path, id_key: str) -> tuple[dict[str, dict], list[Rejection]]:
    """Annotation records keyed by sample id (a file-name value is reduced to its stem)."""
    rel = path.name
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, [Rejection("", rel, "annotation file not found")]
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return {}, [Rejection("", rel, f"annotation file is not valid JSON: {err}")]
    if isinstance(data, dict) and isinstance(data.get("samples"), list):
        data = data["samples"]
    if not isinstance(data, list):
        return {}, [Rejection("", rel, "annotation file must hold a JSON list of records")]
    records: dict[str, dict] = {}
    problems: list[Rejection] = []
    seen_twice: set[str] = set()
    for i, rec in enumerate(data):
        if not isinstance(rec, dict) or id_key not in rec:
            problems.append(Rejection("", f"{rel}[{i}]", f"record has no {id_key!r} key"))
            continue
        raw_id = str(rec[id_key])
        sid = Path(raw_id).stem if Path(raw_id).suffix.lower() in _IMAGE_SUFFIXES else raw_id
        if sid in records:
            seen_twice.add(sid)
        records[sid] = rec
    for sid in sorted(seen_twice):
        problems.append(Rejection(sid, rel, "several annotation records for this sample"))
        del records[sid]
    return records, problems


_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".gif", ".webp", ".dcm", ".npy", ".csv"}


def discover(spec: DatasetSpec, root: Path | None = None) -> Inventory:
    """Pair the files of every field by stem and join annotations; order is sorted by id."""
    root = Path(root or spec.source.root)
    inv = Inventory(root=root)
    if not root.is_dir():
        inv.rejections.append(Rejection("", str(root), "source folder does not exist"))
        return inv
    per_field: dict[str, dict[str, str]] = {}
    for name, f in spec.fields.items():
        per_field[name], problems = _glob_field(root, f.files)
        inv.rejections.extend(problems)
    ann = spec.annotations
    records: dict[str, dict] = {}
    if ann.file:
        records, problems = load_records(root / ann.file, ann.id_key)
        inv.rejections.extend(problems)
    already = {r.sample_id for r in inv.rejections if r.sample_id}  # reported once is enough
    all_ids = sorted(set().union(*per_field.values()) - already)
    for sid in all_ids:
        files = {name: found[sid] for name, found in per_field.items() if sid in found}
        missing = [name for name in spec.fields if name not in files]
        if missing:
            where = ", ".join(f"{m} ({spec.fields[m].files})" for m in missing)
            inv.rejections.append(Rejection(sid, ", ".join(files.values()), f"incomplete sample: no file for {where}"))
            continue
        rejection, columns = _columns_for(spec, sid, records.get(sid), files)
        if rejection:
            inv.rejections.append(rejection)
            continue
        try:
            split = assign_split(sid, spec.splits, columns)
        except ValueError as err:
            inv.rejections.append(Rejection(sid, files[next(iter(files))], str(err)))
            continue
        inv.samples.append(SampleRef(sid, split, files, columns))
    paired = set().union(*per_field.values())
    for sid in sorted(set(records) - paired):
        inv.rejections.append(Rejection(sid, f"{ann.file}#{sid}", "annotation record without files"))
    return inv


def _columns_for(spec: DatasetSpec, sid: str, rec: dict | None, files: dict[str, str]) -> tuple[Rejection | None, dict]:
    ann = spec.annotations
    first = next(iter(files.values()))
    if rec is None:
        if ann.file and ann.required:
            return Rejection(sid, first, f"no annotation record in {ann.file}"), {}
        return None, {}
    columns = {}
    for col, kind in ann.columns.items():
        try:
            columns[col] = _coerce(rec.get(col), kind)
        except (ValueError, TypeError) as err:
            return Rejection(sid, f"{ann.file}#{sid}", f"annotation column {col!r}: {err}"), {}
    return None, columns

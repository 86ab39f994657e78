"""Sample-level changes between two versions: ids added and removed, samples whose content
(checksum) or labels / columns changed or that moved split, and count changes per split and label.

Only the per-sample columns are read, never the sample arrays: a sample's ``checksum`` covers every
value a reader can return for it (so a changed label is also changed content).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from h5forge.errors import ReadError, VersionError
from h5forge._format import markdown
from h5forge._format.layout import decode_str
from h5forge._format.mapped import read_all
from h5forge._format.row_files import virtual_sources
from h5forge._format.names import CHECKSUM, IDS, LATEST, SPLITS, Attr, parse_version
from h5forge.kinds import stored_kinds
from h5forge.spec import DatasetSpec
from h5forge._views.info import open_version, plain
from h5forge._store.versions import latest, published

LISTED = 20  # ids shown per list in the text and Markdown renderings (the JSON has them all)


@dataclass(frozen=True)
class Row:
    split: str
    checksum: str
    columns: dict[str, Any]


@dataclass
class VersionDiff:
    old: dict[str, Any]  # path, version, counts
    new: dict[str, Any]
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    content_changed: list[str] = field(default_factory=list)
    columns_changed: dict[str, dict[str, list]] = field(default_factory=dict)  # id -> column -> [old, new]
    moved_split: dict[str, list[str]] = field(default_factory=dict)  # id -> [old split, new split]
    split_rule: str = "stable"  # "stable" (hash of the id) or "column <name>" (splits from an annotation)
    columns_only_in: dict[str, list[str]] = field(default_factory=dict)  # "old"/"new" -> columns
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # split -> old/new/change
    labels: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)  # column -> value -> old/new/change

    @property
    def unchanged(self) -> bool:
        return not (self.added or self.removed or self.content_changed or self.columns_changed or self.moved_split)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "unchanged": self.unchanged}

    def _moved_line(self) -> str:
        if not self.moved_split:
            rule = (
                "the stable-split rule holds"
                if self.split_rule == "stable"
                else f"splits come from the annotation {self.split_rule}"
            )
            return f"moved split: none ({rule})"
        why = (
            "VIOLATES the stable-split rule"
            if self.split_rule == "stable"
            else f"their annotation {self.split_rule} changed"
        )
        return f"moved split: {len(self.moved_split)} ({why})"

    def lines(self) -> list[str]:
        """The diff as plain text lines (the terminal)."""
        out = [f"{_name(self.old)} -> {_name(self.new)}"]
        if self.unchanged:
            out.append("no sample changed")
        out.append(f"samples: {_changes(self.counts)}")
        out.append(f"added: {len(self.added)}{_listed(self.added)}")
        out.append(f"removed: {len(self.removed)}{_listed(self.removed)}")
        out.append(f"content changed (checksum): {len(self.content_changed)}{_listed(self.content_changed)}")
        out.append(f"labels/columns changed: {len(self.columns_changed)}")
        for sid, cols in list(self.columns_changed.items())[:LISTED]:
            out.append(f"  {sid}: " + ", ".join(f"{c} {o!r} -> {n!r}" for c, (o, n) in cols.items()))
        if len(self.columns_changed) > LISTED:
            out.append(f"  ... and {len(self.columns_changed) - LISTED} more")
        out.append(self._moved_line())
        for sid, (a, b) in list(self.moved_split.items())[:LISTED]:
            out.append(f"  {sid}: {a} -> {b}")
        for side, only in self.columns_only_in.items():
            if only:
                out.append(f"columns only in the {side} version: {', '.join(only)}")
        for col, values in self.labels.items():
            changed = {v: c for v, c in values.items() if c["change"]}
            out.append(f"{col}: {_changes(changed) if changed else 'unchanged'}")
        return out

    def to_markdown(self) -> str:
        """The diff for a Prefect Markdown artifact."""
        md = [f"# Changes: {markdown.text(_name(self.old))} → {markdown.text(_name(self.new))}", ""]
        if self.unchanged:
            md += ["No sample changed.", ""]
        md += ["| split | before | after | change |", "|---|---:|---:|---:|"]
        md += [f"| {markdown.text(s)} | {c['old']} | {c['new']} | {c['change']:+d} |" for s, c in self.counts.items()]
        md += [
            "",
            "| change | samples |",
            "|---|---:|",
            f"| added | {len(self.added)} |",
            f"| removed | {len(self.removed)} |",
            f"| content changed (checksum) | {len(self.content_changed)} |",
            f"| labels/columns changed | {len(self.columns_changed)} |",
            f"| moved split | {len(self.moved_split)} |",
            "",
            f"**{markdown.text(self._moved_line())}**",
            "",
        ]
        for title, ids in (("Added", self.added), ("Removed", self.removed), ("Content changed", self.content_changed)):
            if ids:
                md += [
                    f"## {title}",
                    ", ".join(markdown.text(i) for i in ids[:LISTED])
                    + (f" … and {len(ids) - LISTED} more" if len(ids) > LISTED else ""),
                    "",
                ]
        if self.columns_changed:
            md += ["## Labels and columns changed", "| sample | column | before | after |", "|---|---|---|---|"]
            md += [
                f"| {markdown.text(sid)} | {markdown.text(c)} | {markdown.text(o)} | {markdown.text(n)} |"
                for sid, cols in list(self.columns_changed.items())[:LISTED]
                for c, (o, n) in cols.items()
            ]
            md.append("")
        for col, values in self.labels.items():
            md += [f"## {markdown.text(col)}", "| value | before | after | change |", "|---|---:|---:|---:|"]
            md += [f"| {markdown.text(v)} | {c['old']} | {c['new']} | {c['change']:+d} |" for v, c in values.items()]
            md.append("")
        return "\n".join(md)


def _name(side: dict[str, Any]) -> str:
    return f"v{side['version']:04d}" if side.get("version") else Path(side["path"]).name


def _changes(counts: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{k} {c['old']} -> {c['new']} ({c['change']:+d})" for k, c in counts.items())


def _listed(ids: list[str]) -> str:
    if not ids:
        return ""
    more = f" ... and {len(ids) - LISTED} more" if len(ids) > LISTED else ""
    return ": " + ", ".join(ids[:LISTED]) + more


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _compared(spec: DatasetSpec, f: h5py.File) -> dict[str, list[str] | None]:
    """The per-sample values compared besides the checksum: every small stored column (labels,
    annotation columns, a volume's spacing), with its class names when the field has them."""
    out: dict[str, list[str] | None] = {}
    train = f[SPLITS[0]]
    for path, kind in stored_kinds(spec).items():
        if kind.stored().bulk or path not in train:
            continue
        classes = train[path].attrs.get("classes")
        out[path] = [str(c) for c in plain(np.asarray(classes))] if classes is not None and np.ndim(classes) else None
    return out


def read_rows(f: h5py.File, columns: dict[str, list[str] | None]) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for split in SPLITS:
        g = f[split]
        ids = decode_str(read_all(g[IDS]))
        checksums = decode_str(read_all(g[CHECKSUM]))
        values = {}
        for path, names in columns.items():
            col = [plain(v) for v in g[path][()]]
            values[path] = [names[v] if names and isinstance(v, int) and 0 <= v < len(names) else v for v in col]
        for i, sid in enumerate(ids):
            rows[sid] = Row(split, checksums[i], {p: values[p][i] for p in columns})
    return rows


def _count_change(old: dict, new: dict, keep_order: bool = False) -> dict[str, dict[str, int]]:
    keys = list(dict.fromkeys([*old, *new])) if keep_order else sorted(set(old) | set(new), key=str)
    return {str(k): {"old": old.get(k, 0), "new": new.get(k, 0), "change": new.get(k, 0) - old.get(k, 0)} for k in keys}


def _side(path: Path, f: h5py.File, rows: dict[str, Row]) -> dict[str, Any]:
    counts = {s: 0 for s in SPLITS}
    for r in rows.values():
        counts[r.split] += 1
    return {
        "path": str(path),
        "file": Path(os.path.realpath(path)).name,
        "version": int(f.attrs.get(Attr.VERSION, 0)),
        "counts": counts,
    }


def _check_sources(path: Path, f: h5py.File) -> None:
    """A thin version's rows come from other files; a missing one would read as blank ids."""
    missing = sorted(Path(s).name for s in virtual_sources(f) if not Path(s).is_file())
    if missing:
        raise ReadError(
            f"{path} reads its rows from {', '.join(missing)}, which is missing; "
            "restore it, or compare versions that are complete"
        )


def diff_versions(old: str | Path, new: str | Path) -> VersionDiff:
    """What changed, sample by sample, from version file ``old`` to version file ``new``."""
    old, new = Path(old), Path(new)
    with open_version(old) as (fa, spec_a), open_version(new) as (fb, spec_b):
        _check_sources(old, fa)
        _check_sources(new, fb)
        cols_a, cols_b = _compared(spec_a, fa), _compared(spec_b, fb)
        common = {p: cols_b[p] or cols_a[p] for p in cols_b if p in cols_a}
        a, b = read_rows(fa, {p: cols_a[p] for p in common}), read_rows(fb, common)
        d = VersionDiff(old=_side(old, fa, a), new=_side(new, fb, b))
    d.split_rule = f"column {spec_b.splits.column!r}" if spec_b.splits.column else "stable"
    d.columns_only_in = {"old": sorted(set(cols_a) - set(cols_b)), "new": sorted(set(cols_b) - set(cols_a))}
    d.added = sorted(set(b) - set(a))
    d.removed = sorted(set(a) - set(b))
    for sid in sorted(set(a) & set(b)):
        ra, rb = a[sid], b[sid]
        if ra.checksum != rb.checksum:
            d.content_changed.append(sid)
        changed = {p: [ra.columns[p], rb.columns[p]] for p in common if not _same(ra.columns[p], rb.columns[p])}
        if changed:
            d.columns_changed[sid] = changed
        if ra.split != rb.split:
            d.moved_split[sid] = [ra.split, rb.split]
    d.counts = _count_change(d.old["counts"], d.new["counts"], keep_order=True)
    labelled = [p for p in common if common[p] is not None]
    labelled += [
        f"meta/{c}" for c in spec_b.annotations.index_by if f"meta/{c}" in common and f"meta/{c}" not in labelled
    ]
    for p in labelled:
        before, after = (Counter(r.columns[p] for r in rows.values()) for rows in (a, b))
        d.labels[p] = _count_change(before, after)
    return d


def resolve_version(folder: str | Path, text: str) -> Path:
    """A version of an output folder by number or name: 3, v3, v0003, dataset_v0003.h5; ``latest``
    (what dataset_latest.h5 points at) or ``previous`` (the published version before it)."""
    folder = Path(folder)
    found = published(folder)
    if not found:
        raise VersionError(f"{folder}: no published version")
    current = latest(folder) or max(found)
    if text == "latest":
        return found.get(current, folder / LATEST)
    if text == "previous":
        earlier = [n for n in found if n < current]
        if not earlier:
            raise VersionError(f"{folder}: no published version before v{current:04d}")
        return found[earlier[-1]]
    number = parse_version(text)
    if number is None:
        raise VersionError(f"not a version: {text!r} (expected e.g. v0003, 3, latest or previous)")
    if number not in found:
        raise VersionError(
            f"{folder}: v{number:04d} is not a published version (published: {', '.join(f'v{n:04d}' for n in found)})"
        )
    return found[number]

"""Leaks: one raw input shared by samples of two splits, or by samples labelled differently.

A picture in train and in test lets a model be scored on what it learnt; a picture under two
labels teaches two answers. Both are found from the raw digests a run knows already (a build's
``Inputs.hexes``, an append's stored ``source_sha256``): no raw file is read for them.

Only a sample's subject is compared: the fields read from whole files that follow no other field
(an image, not its mask: many samples may share an all-background mask). The rest of the sample is
its label: the files that follow its subject (a mask, boxes), and in a build its annotation values
and its part of a shared file (a COCO entry). Samples identical in subject and label in one split
are duplicates (``duplicates`` in the spec), not reported here. These are warnings, never
rejections: a picture annotated twice may be meant, and a build knows the digests only once it has
cleaned every sample.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

import h5py
import numpy as np

from h5forge._format.layout import decode_str
from h5forge._format.mapped import rows_of
from h5forge._format.names import IDS, SOURCE_SHA256, SPLITS, Attr
from h5forge.kinds import FieldKind, field_kinds, file_fields, stored_kinds
from h5forge.kinds.parts import SampleParts
from h5forge.kinds.shared import sharing
from h5forge._samples import SampleRef, encodable
from h5forge.spec import DatasetSpec

MAX_NAMED = 5  # shared inputs named in a warning; the rest are counted
MAX_HOLDERS = 4  # samples named per shared input; the rest are counted
BLOCK_ROWS = 1 << 16  # rows of a version's digests read at a time


@dataclass(frozen=True)
class Holder:
    """One sample that holds a shared input."""

    id: str
    split: str
    label: str  # a digest of what the sample is besides its subject


@dataclass(frozen=True)
class Shared:
    """One raw input of field ``field`` held by several samples of the dataset."""

    field: str
    holders: tuple[Holder, ...]

    @property
    def across_splits(self) -> bool:
        return len({h.split for h in self.holders}) > 1

    @property
    def relabelled(self) -> bool:
        return len({h.label for h in self.holders}) > 1

    def text(self) -> str:
        """``'a' (train), 'b' (val)``, and how many more, and whether their labels differ."""
        named = ", ".join(f"{encodable(h.id)!r} ({h.split})" for h in self.holders[:MAX_HOLDERS])
        more = len(self.holders) - MAX_HOLDERS
        rest = f" and {more} more" if more > 0 else ""
        return named + rest + (", labelled differently" if self.relabelled and self.across_splits else "")


def subject_fields(spec: DatasetSpec) -> dict[str, FieldKind]:
    """The fields compared: read from whole files (not a part of a file several samples share),
    following no other field."""
    return {n: k for n, k in field_kinds(spec).items() if k.files and not k.after and not isinstance(k, SampleParts)}


def label_fields(spec: DatasetSpec) -> list[str]:
    """The fields read from files that are a sample's label: those that follow another."""
    return [n for n, k in field_kinds(spec).items() if k.files and k.after]


def shared_inputs(
    spec: DatasetSpec, digests: Callable[[str], Iterable[tuple[str, str, str]]], label: Callable[[str], str]
) -> list[Shared]:
    """The subject inputs held by samples of several splits or several labels. ``digests(field)``
    yields ``(sample id, split, digest)`` of each sample's file of that field ("" when unknown);
    ``label(sample id)`` is asked only of samples that share an input. One input listed under
    several fields (channels of one file) is reported once."""
    found: list[Shared] = []
    seen: set[frozenset[str]] = set()
    for name in subject_fields(spec):
        for members in _alike(digests(name)):
            ids = frozenset(sid for sid, _ in members)
            if len(ids) < 2 or ids in seen:
                continue
            shared = Shared(name, tuple(Holder(sid, split, label(sid)) for sid, split in sorted(members)))
            if shared.across_splits or shared.relabelled:
                seen.add(ids)
                found.append(shared)
    return sorted(found, key=lambda s: s.holders[0].id)  # in id order, whichever file listed them first


def _alike(digests: Iterable[tuple[str, str, str]]) -> Iterable[list[tuple[str, str]]]:
    """The ``(sample id, split)`` of each digest more than one sample has (a known one: not "")."""
    first: dict[str, tuple[str, str]] = {}
    shared: dict[str, list[tuple[str, str]]] = {}
    for sid, split, digest in digests:
        if digest in first:
            shared.setdefault(digest, [first[digest]]).append((sid, split))
        elif digest:
            first[digest] = (sid, split)
    return shared.values()


def build_leaks(spec: DatasetSpec, root: Path, refs: list[SampleRef], hexes: Mapping[str, str]) -> list[Shared]:
    """The leaks among a build's samples ``refs``, by the raw digests ``hexes`` (file -> sha256)."""
    by_id = {ref.id: ref for ref in refs}
    labels = label_fields(spec)
    shared = sharing(field_kinds(spec)).values()  # their digests come from discovery's entries
    dropped = {spec.splits.column} if spec.splits.column else set()  # the split is no label

    def digests(name: str) -> Iterable[tuple[str, str, str]]:
        return ((ref.id, ref.split, hexes.get(ref.files[name], "")) for ref in refs)

    def label(sid: str) -> str:
        ref = by_id[sid]
        columns = {k: v for k, v in ref.columns.items() if k not in dropped}
        entries = [k.input_digest(root, ref) for k in shared]
        # a label file the sample may lack (a background picture's) is no file: ""
        files = [hexes.get(rel, rel) if (rel := ref.file_of(n)) else "" for n in labels]
        return _digest([files, columns, entries])

    return shared_inputs(spec, digests, label)


def append_leaks(spec: DatasetSpec, parent: Path, delta: Path) -> list[Shared]:
    """The leaks an append brings: a subject input of the new samples (``delta``) held by another
    new sample, or by a sample of the version appended to (``parent``), of another split or with
    other label files. Compared by the digests both files store; the parent's are read a block at
    a time, and only the rows holding an input of the delta are kept."""
    names = file_fields(stored_kinds(spec))
    subjects = [names.index(n) for n in subject_fields(spec)]
    labels = [names.index(n) for n in label_fields(spec)]
    if not subjects:
        return []
    new = _rows(delta, subjects, labels)
    wanted = np.unique(np.concatenate([new.subjects[:, j] for j in range(len(subjects))]))
    old = _rows(os.path.realpath(parent), subjects, labels, wanted)
    ids, splits = new.ids + old.ids, new.splits + old.splits
    lab = dict(zip(ids, new.labels + old.labels))

    def digests(name: str) -> Iterable[tuple[str, str, str]]:
        j = list(subject_fields(spec)).index(name)
        column = [*new.subjects[:, j].tolist(), *old.subjects[:, j].tolist()]
        return ((sid, split, d.decode()) for sid, split, d in zip(ids, splits, column))

    # a parent sample shares an input only with new ones: two old samples sharing one were reported
    # when they came in
    found = shared_inputs(spec, digests, lab.__getitem__)
    fresh = set(new.ids)
    return [s for s in found if any(h.id in fresh for h in s.holders)]


@dataclass
class _Stored:
    ids: list[str]
    splits: list[str]
    subjects: np.ndarray  # (n, subject fields) S64
    labels: list[str]


def _rows(path: str | Path, subjects: list[int], labels: list[int], only: np.ndarray | None = None) -> _Stored:
    """The ids, splits, subject digests and label-file digests of a version file's rows, or of the
    rows whose subject digest is one of ``only``."""
    out = _Stored([], [], np.zeros((0, len(subjects)), "S64"), [])
    blocks = [out.subjects]
    with h5py.File(path, "r") as f:
        for split in SPLITS:
            g = f[split]
            n = int(g.attrs[Attr.COUNT])
            hashes, names = rows_of(g[SOURCE_SHA256]), rows_of(g[IDS])
            for start in range(0, n, BLOCK_ROWS):
                block = np.asarray(hashes[start : start + BLOCK_ROWS]).astype("S64")
                rows = np.arange(len(block))
                if only is not None:
                    rows = np.flatnonzero(np.isin(block[:, subjects], only).any(axis=1))
                if not len(rows):
                    continue
                held = decode_str(names[start : start + len(block)])
                out.ids += [held[i] for i in rows]
                out.splits += [split] * len(rows)
                blocks.append(block[rows][:, subjects])
                out.labels += [_digest([block[i, labels].tolist()]) for i in rows]
    out.subjects = np.concatenate(blocks)
    return out


def _digest(parts: list) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def leak_warnings(found: list[Shared]) -> list[str]:
    """A warning line for the inputs shared across splits and one for those labelled differently
    in one split: the first few named, then a count."""
    across = [s for s in found if s.across_splits]
    relabelled = [s for s in found if not s.across_splits]
    lines = []
    if across:
        lines.append(_line("leak between splits", across, "in more than one split"))
    if relabelled:
        lines.append(_line("label conflict", relabelled, "in samples labelled differently"))
    return lines


def _line(what: str, found: list[Shared], where: str) -> str:
    fields = ", ".join(dict.fromkeys(s.field for s in found))
    named = "; ".join(f"{s.text()}" for s in found[:MAX_NAMED])
    more = f"; and {len(found) - MAX_NAMED} more" if len(found) > MAX_NAMED else ""
    return f"{what}: {len(found)} raw input(s) of {fields} are {where} ({named}{more})"

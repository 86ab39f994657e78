"""Append: take the complete samples of an inbox into a new thin version, exactly once.

Steps (the append flow composes them, under the output folder's lock):
  recover  finish or undo what a killed append left (journal)
  scan     complete, settled samples of the inbox; the rest waits for the next round
  write    clean them, drop duplicates of what latest holds, write the delta file
  thin     the new version: virtual datasets over the parent's files + the delta
  verify   structure, every file it depends on, checksums of the new rows and a sample of the old
  publish  journal the inbox moves, publish, move inbox files to processed/<version>/ or quarantine/

A crash at any point converges on rerun: before publish nothing is visible and the inbox is
untouched; after publish the journal says which moves are left.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import h5py

from h5forge.errors import InboxMoveFailed, NoBaseVersion, UsageError, VerificationFailed
from h5forge._format.catalog import (
    catalog_from_rows,
    catalog_intact,
    content_digest,
    id_digest,
    read_catalog,
    split_row,
    write_catalog,
)
from h5forge._format.layout import decode_str
from h5forge._format.mapped import rows_of
from h5forge._format.names import (
    IDS,
    INBOX_MANAGED,
    INBOX_PROCESSED,
    INBOX_QUARANTINE,
    INBOX_TEMPORARY,
    JOURNAL,
    SPLITS,
    Attr,
    delta_name,
    partial_name,
    version_name,
)
from h5forge._format.summary import WriteSummary
from h5forge._ingest.clean import CleanedBatch
from h5forge._ingest.duplicates import duplicate_reason
from h5forge._ingest.discover import INCOMPLETE, TEXT_FORMAT, discover, match_key, read_annotation_file, record_key
from h5forge._ingest.incremental.inputs import Inputs, rules_hash
from h5forge._ingest.parallel import clean_all
from h5forge._ingest.writer import DatasetWriter
from h5forge.kinds import FieldKind, field_kinds, stored_kinds
from h5forge.kinds.base import read_bounded
from h5forge.kinds.shared import sharing
from h5forge._samples import Rejection, SampleRef, encodable
from h5forge.spec import DatasetSpec
from h5forge._crash_points import checkpoint
from h5forge._store.reports import write_health
from h5forge._store.thin import require_current_format, write_thin
from h5forge._store.verify import HealthReport, verify_file
from h5forge._store.versions import Candidate, fsync_dir, latest, publish, published, seal, set_latest
from h5forge._store.whole_files import replace_file, temporary_name

log = logging.getLogger("h5forge._ingest.append")


@dataclass
class InboxScan:
    inbox: Path
    ready: list[SampleRef] = field(default_factory=list)
    waiting: list[Rejection] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    spec: DatasetSpec | None = None  # the spec as it reads this inbox (``inbox_spec``)


def inbox_spec(spec: DatasetSpec, inbox: Path) -> DatasetSpec:
    """The spec as it reads an inbox: each field reads the shared files the inbox holds (a COCO
    file of any name), not those of the source root."""
    fields = {}
    for name, kind in sharing(field_kinds(spec)).items():
        update = kind.reading(kind.shared_files_in(inbox))
        if update:
            fields[name] = spec.fields[name].model_copy(update=update)
    return spec.model_copy(update={"fields": {**spec.fields, **fields}}) if fields else spec


def rewritten_by_append(spec: DatasetSpec, inbox: Path) -> list[str]:
    """The inbox files an append rewrites as it takes samples (the annotation file, shared files
    such as a COCO file): a watcher does not take their changes for news."""
    own = [Path(spec.annotations.file).as_posix()] if spec.annotations.file else []
    return own + [f for files in shared_files(inbox_spec(spec, inbox)).values() for f in files]


def shared_files(spec: DatasetSpec) -> dict[str, tuple[str, ...]]:
    """{field: the shared files it reads} of the fields that read any."""
    return {name: files for name, kind in sharing(field_kinds(spec)).items() if (files := kind.shared_files())}


def scan_inbox(spec: DatasetSpec, inbox: Path, now: float | None = None) -> InboxScan:
    """Complete samples whose files have settled; incomplete or fresh ones wait.

    A sample settles as a whole: every file it is made of (each file of a case folder, the
    shared file that holds its record) has been unchanged for ``settle_seconds``."""
    inbox = Path(inbox)
    scan = InboxScan(inbox)
    if not inbox.is_dir():
        return scan
    scan.spec = reading = inbox_spec(spec, inbox)
    kinds = field_kinds(reading)
    inv = discover(reading, root=inbox, extra_roots=[], sidecars=True, skip=INBOX_MANAGED)
    now = time.time() if now is None else now
    settle = spec.append.settle_seconds
    for ref in inv.samples:
        members, missing = _members(kinds, inbox, ref)
        busy = missing or _unsettled(inbox, members, now, settle) or _file_may_come(kinds, ref, inbox, now, settle)
        if busy:
            scan.waiting.append(Rejection(ref.id, (busy[0],), busy[1], waitable=True))
        else:
            scan.ready.append(ref)
    for r in inv.rejections:
        # a file still being written may not show what it is yet (a header cut short): it waits
        fresh = [p for p in r.paths if "#" not in p and _changed_since(inbox / p, now - settle)]
        if fresh and not r.waitable:
            why = f"still being written (changed less than {settle:g} s ago)"
            r = Rejection(r.sample_id, (fresh[0],), why, waitable=True)
        (scan.waiting if r.waitable else scan.rejections).append(r)
    return scan


def refuse_waits_for_held_ids(scan: InboxScan, parent: Path | None, now: float | None = None) -> None:
    """Move to ``scan.rejections`` each settled part of an incomplete sample whose id ``parent``
    (latest) holds: whatever part it waits for, the sample it would make is refused for its id, so
    the file would wait in the inbox for ever, read by no build (a YOLO label file that arrives after
    its picture was taken as a background picture)."""
    if parent is None or scan.spec is None:
        return
    settle = scan.spec.append.settle_seconds
    now = time.time() if now is None else now

    def settled(r: Rejection) -> bool:
        return all("#" not in p and not _changed_since(scan.inbox / p, now - settle) for p in r.paths)

    candidates = [r for r in scan.waiting if r.sample_id and r.reason.startswith(INCOMPLETE) and settled(r)]
    if not candidates:
        return
    known = KnownSamples(parent)
    held = {id(r) for r in candidates if known.holds(r.sample_id)}
    for r in scan.waiting:
        if id(r) in held:
            scan.rejections.append(
                replace(
                    r,
                    reason=f"{r.reason}; the sample is already in the dataset ({parent.name}) and an append never "
                    "replaces one: put the file beside the sample's others (in processed/ when an append took "
                    "them) and rebuild",
                    waitable=False,
                )
            )
    scan.waiting = [r for r in scan.waiting if id(r) not in held]


def sample_files(kinds: dict[str, FieldKind], inbox: Path, ref: SampleRef) -> list[str]:
    """The files of ``ref``: its own, those its fields read beside them (``files_beside``), its sidecar."""
    own = [*ref.files.values()]
    for name, rel in ref.files.items():
        if (kind := kinds.get(name)) is not None:
            own.extend(c for c in kind.files_beside(inbox, rel) if c not in own)
    return [*own, *ref.extra_files]


def _members(kinds: dict[str, FieldKind], inbox: Path, ref: SampleRef) -> tuple[list[str], tuple[str, str] | None]:
    """Every file ``ref`` is made of (its own, its sidecar, the shared files holding its record),
    and why it waits when a shared file holding its record is not there yet."""
    members = sample_files(kinds, inbox, ref)
    for name, kind in sharing(kinds).items():
        holders = kind.shared_files_of(inbox, ref)
        if holders is None:
            continue
        if not holders:
            first = next(iter(ref.files.values()))
            return members, (first, f"waiting for its {name} record: no file of the inbox holds it yet")
        members.extend(holders)
    return members, None


def _unsettled(inbox: Path, members: list[str], now: float, settle: float) -> tuple[str, str] | None:
    """The first member (or file inside a member folder) changed less than ``settle`` seconds
    before ``now``, or still being copied under a temporary name, and the reason the sample waits;
    None when all have settled."""
    since = now - settle
    for rel in members:
        path = inbox / rel
        if _changed_since(path, since):
            return rel, f"still being written (changed less than {settle:g} s ago)"
        if not path.is_dir():
            continue
        for folder, dirs, files in os.walk(path):
            for name in [*dirs, *files]:
                inner = os.path.join(folder, name)
                where = os.path.relpath(inner, inbox)
                if name.endswith(INBOX_TEMPORARY):
                    return where, "still being copied (a file in it has a temporary name)"
                if _changed_since(Path(inner), since):
                    return where, f"still being written: {name} changed less than {settle:g} s ago"
    return None


def _file_may_come(
    kinds: dict[str, FieldKind], ref: SampleRef, inbox: Path, now: float, settle: float
) -> tuple[str, str] | None:
    """Why a sample without a file its field may lack (``h5forge.kinds.optional``: a YOLO picture
    without its label file) waits: the file may still be on its way while the sample's own files
    arrived less than ``settle`` seconds before ``now``. Arrived is the later of a file's mtime and
    ctime: a picture moved in (``mv``) or copied with its times (``cp -p``) keeps an old mtime, and
    a label file dropped in just after it must not find the picture taken without it."""
    lacking = [name for name, kind in kinds.items() if kind.files and name not in ref.files]
    if not lacking:
        return None
    since = now - settle
    fresh = next((rel for rel in ref.files.values() if _arrived_since(inbox / rel, since)), None)
    if fresh is None:
        return None
    where = ", ".join(f"{name} ({', '.join(kinds[name].files)})" for name in lacking)
    return fresh, f"no file for {where} yet: taken without it once it has been in the inbox {settle:g} s"


def _arrived_since(path: Path, when: float) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return max(st.st_mtime, st.st_ctime) > when


def _changed_since(path: Path, when: float) -> bool:
    try:
        return path.stat().st_mtime > when
    except OSError:
        return False


class KnownSamples:
    """What the parent version holds, for exactly-once: its inputs catalog (sorted hashes of every
    sample's raw content and id, searched by bisection), plus what this append has taken so far.

    Reading the catalog is the only per-sample cost, a few dozen bytes a sample; a parent without a
    catalog is read row by row once (ids and raw-file hashes)."""

    def __init__(self, path: Path):
        self.path = Path(os.path.realpath(path))
        with h5py.File(self.path, "r") as f:
            catalog = read_catalog(f)
            if catalog is not None and catalog_intact(f, catalog) is False:
                log.warning(
                    "%s: its /inputs catalog does not match its digest (damaged); the exactly-once check "
                    "reads the ids and raw-file hashes of its rows instead (`h5forge verify` reports it)",
                    self.path.name,
                )
                catalog = None
            self.catalog = catalog if catalog is not None else catalog_from_rows(f)
        self.new_contents: dict[bytes, str] = {}
        self.new_ids: set[bytes] = set()

    def holder_of(self, hexes: list[str]) -> str | None:
        """The id of a sample with this raw content, in the parent or taken already; None if new."""
        digest = content_digest(hexes)
        if digest in self.new_contents:
            return self.new_contents[digest]
        at = self.catalog.find_content(digest)
        if at is None:
            return None
        split, row = split_row(at)
        with h5py.File(self.path, "r") as f:  # one row of one column, only for a duplicate
            return decode_str(rows_of(f[split][IDS])[row : row + 1])[0]

    def has_id(self, sid: str) -> bool:
        digest = id_digest(sid)
        return digest in self.new_ids or self.catalog.has_id(digest)

    def holds(self, sid: str) -> bool:
        """Whether the parent version holds ``sid`` (not only this append)."""
        return self.catalog.has_id(id_digest(sid))

    def take(self, sid: str, hexes: list[str]) -> None:
        self.new_contents[content_digest(hexes)] = sid
        self.new_ids.add(id_digest(sid))


def _dedupe(
    batch: CleanedBatch, kinds: dict[str, FieldKind], known: KnownSamples, parent: str, keep_all: bool = False
) -> CleanedBatch:
    """``batch`` without the samples whose id latest holds already, nor (``duplicates:
    keep_first``) those whose raw content it holds or this append took already."""
    keep, dropped = [], []
    for i, sid in enumerate(batch.ids):
        path = tuple(batch.files[i])
        same = None if keep_all else known.holder_of(batch.source_sha256[i])
        if same is not None:
            reason = (
                duplicate_reason(same, "already in the dataset", f" ({parent})")
                if known.holds(same)
                else duplicate_reason(same, "earlier in this append")
            )
            dropped.append(Rejection(sid, path, reason, stage="append"))
        elif known.has_id(sid):
            why = f"id {sid!r} is already in the dataset with other content; rename the new sample, or replace"
            dropped.append(Rejection(sid, path, f"{why} the old one in the raw folder and rebuild", stage="append"))
        else:
            keep.append(i)
            known.take(sid, batch.source_sha256[i])
    return batch.take(kinds, keep, dropped) if dropped else batch


@dataclass
class AppendCandidate:
    """The files one append writes, by their temporary and final names."""

    out: Path
    number: int
    parent: int

    @property
    def version(self) -> Candidate:
        return Candidate(self.out, self.number, self.parent)

    @property
    def delta(self) -> Path:
        return self.out / delta_name(self.number)

    @property
    def delta_partial(self) -> Path:
        return self.out / partial_name(delta_name(self.number))


def stage_append(out: Path) -> AppendCandidate:
    parent = latest(out)
    if parent is None:
        raise NoBaseVersion(f"no published version in {out} to append to; run `h5forge build` first")
    return AppendCandidate(out, max(published(out)) + 1, parent)


def processed_dir(inbox: Path, number: int) -> Path:
    return inbox / INBOX_PROCESSED / f"v{number:04d}"


def write_delta(
    spec: DatasetSpec,
    scan: InboxScan,
    cand: AppendCandidate,
    progress: Callable[[int], None] = lambda n: None,
    status: Callable[[str], None] = lambda text: None,
) -> WriteSummary:
    """Clean the ready samples and write the new ones to the delta file. Returns the summary.

    ``progress`` hears how many samples each batch settled, ``status`` what happens before the first."""
    parent_path = cand.out / version_name(cand.parent)
    fmt = require_current_format(parent_path, cand.parent, spec)  # before any cleaning
    known = KnownSamples(parent_path)
    kinds = stored_kinds(spec)
    final_dir = processed_dir(scan.inbox, cand.number)
    checkpoint("append:before-write")
    t0 = time.perf_counter()
    timings: dict = {}
    # the field rules recorded, so a nightly rebuild can take these rows from the delta file
    rules = Inputs(rules_hash(spec, fmt), key="")
    with DatasetWriter(cand.delta_partial, spec, cand.number, cand.parent, rules, fmt) as writer:
        writer.add_rejections(scan.rejections)
        for i, batch in enumerate(clean_all(scan.spec or spec, scan.inbox, scan.ready, timings, status, fmt)):
            settled = len(batch) + len(batch.rejections)
            batch = _dedupe(batch, kinds, known, version_name(cand.parent), spec.duplicates == "keep_all")
            # record where the raw files will live once moved out of the inbox (no file: none)
            batch.files = [
                [rel and os.path.relpath(final_dir / rel, spec.source.root) for rel in row] for row in batch.files
            ]
            writer.add(batch)
            progress(settled)
            if i == 0:
                checkpoint("append:mid-write")
        return writer.finish({**timings, "append_seconds": round(time.perf_counter() - t0, 3)})


def write_thin_version(spec: DatasetSpec, cand: AppendCandidate, summary: WriteSummary) -> WriteSummary:
    os.replace(cand.delta_partial, cand.delta)  # not referenced by any published version yet
    parent = cand.out / version_name(cand.parent)
    args = (cand.version.partial, parent, cand.delta, spec, cand.number, cand.parent, summary)
    return write_thin(*args, extra=lambda f: write_thin_catalog(f, parent, cand.delta))


def write_thin_catalog(f: h5py.File, parent: Path, delta: Path) -> None:
    """The thin version's inputs catalog: the parent's plus the delta's, rows shifted past the
    parent's (sorted arrays merged by insertion: no per-sample work beyond copying them)."""
    with h5py.File(os.path.realpath(parent), "r") as p, h5py.File(delta, "r") as d:
        old = read_catalog(p) or catalog_from_rows(p)
        new = read_catalog(d) or catalog_from_rows(d)
        shift = {s: int(p[s].attrs[Attr.COUNT]) for s in SPLITS}
    write_catalog(f, old.merged(new, shift))


def verify_append(cand: AppendCandidate, found: Sequence[str] = (), seed: int = 0) -> HealthReport:
    """The delta in full; the thin version's structure, dependencies and sampled rows of every
    row file. The health report, with the append's own warnings (``found``), is written beside
    the versions. The thin version's heap, and its parent's, are not walked: a walk of a parent of
    small chunks reads its every byte, and the append costs what it adds."""
    thin = verify_file(
        cand.version.partial, checksum_sample=64, resample=0, latency_reads=50, seed=seed, walk_heap=False
    )
    thin.merge(verify_file(cand.delta, resample=0, latency_reads=0), "delta")
    thin.warnings.extend(found)
    write_health(cand.out, cand.number, thin)
    return thin


# ---- journal and inbox moves ------------------------------------------------------------------


@dataclass
class MovePlan:
    """What happens to the inbox once a version is published; journalled so a rerun finishes it."""

    version: int | None  # None: no version (every ready sample was rejected)
    inbox: str
    moves: list[tuple[str, str]] = field(default_factory=list)  # (from, to)
    reasons: list[tuple[str, str]] = field(default_factory=list)  # (reason file, text)
    processed_records: tuple[str | None, list[dict]] = (None, [])  # annotations of the taken samples
    inbox_records: tuple[str, list[dict]] | None = None  # what stays in the inbox's annotation list
    inbox_taken: list[dict] = field(default_factory=list)  # what leaves it (none in older journals)
    # records written beside their samples: the refused samples' in quarantine/, the taken
    # samples' part of a shared file (COCO) in processed/
    records: list[tuple[str, list[dict]]] = field(default_factory=list)  # (file, records in its format)
    writes: list[tuple[str, str]] = field(default_factory=list)  # (file, text)
    inbox_rewrites: list[tuple[str, str | None]] = field(default_factory=list)  # shared files: what stays
    # the sha256 of each shared file as it was when its rewrite was planned (none in older journals):
    # a file a user replaced since is left as it is, their new entries with it
    inbox_digests: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "MovePlan":
        data = json.loads(text)
        for pairs in ("moves", "reasons", "records", "writes", "inbox_rewrites"):
            data[pairs] = [tuple(m) for m in data.get(pairs, [])]
        data["processed_records"] = tuple(data["processed_records"])
        data["inbox_records"] = tuple(data["inbox_records"]) if data["inbox_records"] else None
        return cls(**data)


class _Plan:
    """Builds a MovePlan: where each inbox file, record and shared-file entry goes."""

    def __init__(self, spec: DatasetSpec, scan: InboxScan, number: int | None):
        self.spec, self.scan, self.inbox = spec, scan, scan.inbox
        self.plan = MovePlan(number, str(scan.inbox))
        ann = spec.annotations
        self.inbox_records = (_read_list(self.inbox / ann.file) or []) if ann.file else []
        self.by_key: dict[str | None, list[dict]] = {}
        for rec in self.inbox_records:
            self.by_key.setdefault(self.key(rec), []).append(rec)
        self.quarantined: set[str] = set()

    def key(self, rec: dict) -> str | None:  # as discovery keys it: a file name, NFC
        id_key = self.spec.annotations.id_key
        return record_key(rec, id_key, self.spec.source.ids) if id_key in rec else None

    def quarantine(self, rel: str, reason: str) -> None:
        self.plan.moves.append((str(self.inbox / rel), str(self.inbox / INBOX_QUARANTINE / rel)))
        self.reason(rel, reason)

    def reason(self, rel: str, reason: str) -> None:
        name = Path(rel).name
        short = shortened(name, ".reason")
        text = reason if short == f"{name}.reason" else f"{reason}\nfile: {name}"  # a shortened name says whose
        # the file keeps its name; its .reason says it in text UTF-8 can store
        self.plan.reasons.append((str(self.inbox / INBOX_QUARANTINE / Path(rel).parent / short), encodable(text)))

    def quarantine_records(self, sid: str, files: list[str], reason: str) -> None:
        """The annotation records of a refused sample, beside its files in quarantine/ (once)."""
        key = match_key(sid)
        ann = self.spec.annotations.file
        records = self.by_key.get(key, [])
        if not ann or not records or key in self.quarantined:
            return
        self.quarantined.add(key)
        rel = self.beside(files, sid, Path(ann).name)
        self.plan.records.append((str(self.inbox / INBOX_QUARANTINE / rel), records))
        self.reason(rel, f"the annotation record(s) of sample {sid!r}, refused: {reason}")

    def beside(self, files: list[str], sid: str, name: str) -> str:
        """``<the sample's first file>.<name>``, or ``<sid>.<name>`` beside the annotation file."""
        anchor = files[0] if files else (Path(self.spec.annotations.file or name).parent / sid).as_posix()
        folder, base = os.path.split(anchor)
        return os.path.join(folder, shortened(f"{base}.{name}"))


def plan_moves(spec: DatasetSpec, scan: InboxScan, rejections: tuple[Rejection, ...], number: int | None) -> MovePlan:
    """What to do with the inbox files once version ``number`` is published (``None``: no version,
    every ready sample was rejected): taken samples to processed/, rejected inputs to quarantine/,
    each with its annotation records."""
    inbox = scan.inbox
    p = _Plan(spec, scan, number)
    plan = p.plan
    id_key = spec.annotations.id_key
    rejected = {r.sample_id: r.reason for r in rejections if r.sample_id}
    records = []
    # a file holding several samples (the time points of a 4-D volume) moves once, to processed/
    # when any of them was taken (the others' rejections are in the report), else to quarantine/
    moved: dict[str, None] = {}
    refused: dict[str, str] = {}
    refused_inputs: dict[str, tuple[list[str], str]] = {}  # input id -> (its files, why)
    recorded: set[str] = set()
    kinds = field_kinds(spec)
    for ref in scan.ready:
        rel_files = sample_files(kinds, inbox, ref)
        if ref.id in rejected:
            refused.update((rel, rejected[ref.id]) for rel in rel_files if rel not in refused)
            refused_inputs.setdefault(ref.input_id, (rel_files, rejected[ref.id]))
            continue
        assert number is not None, "a taken sample needs the version it went into"
        moved.update(dict.fromkeys(rel_files))
        if ref.input_id in recorded:
            continue
        recorded.add(ref.input_id)
        found = p.by_key.get(match_key(ref.input_id))
        rec = found[-1] if found else None
        if rec is None and ref.extra_files:
            rec = json.loads((inbox / ref.extra_files[0]).read_text())
            if id_key not in rec:  # a sidecar is named by its file; processed/ records are named by id_key
                rec = {id_key: ref.input_id, **rec}
        if rec is not None:
            records.append(rec)
    if number is not None:
        plan.moves += [(str(inbox / rel), str(processed_dir(inbox, number) / rel)) for rel in moved]
    for rel, reason in refused.items():
        if rel not in moved:
            p.quarantine(rel, reason)
    for input_id, (files, reason) in refused_inputs.items():
        if input_id not in recorded:  # every part of the input was refused
            p.quarantine_records(input_id, files, reason)
    taken = {match_key(ref.input_id) for ref in scan.ready}  # each one's records: to processed/ or quarantine/
    ann_file = Path(spec.annotations.file).as_posix() if spec.annotations.file else None
    for r in scan.rejections:  # discovery-time rejections: their files go to quarantine too
        for rel in r.paths:
            if rel == ann_file and r.sample_id:
                continue  # the file is everyone's: only the sample's records go, below
            # a FIFO, a folder or a symlink named as a sample's file goes too, with its reason
            if rel and "#" not in rel and os.path.lexists(inbox / rel):
                p.quarantine(rel, r.reason)
        for rel in r.others:  # the sample's files the reason is not about go with it, saying why
            if os.path.lexists(inbox / rel):
                p.quarantine(rel, f"sample {r.sample_id!r} refused ({r.path}: {r.reason})")
        if r.sample_id:
            files = [f for f in (*r.paths, *r.others) if "#" not in f and f != ann_file]
            p.quarantine_records(r.sample_id, files, f"{r.path}: {r.reason}")
            refused_inputs.setdefault(r.sample_id, (files, r.reason))
        taken.add(match_key(r.sample_id))
    _plan_shared(spec, scan, p, moved, refused_inputs)
    remaining = [r for r in p.inbox_records if p.key(r) not in taken]
    if number is not None:
        name = spec.annotations.file or "annotations.json"
        plan.processed_records = (str(processed_dir(inbox, number) / name), records)
    if spec.annotations.file and p.inbox_records:
        plan.inbox_records = (str(inbox / spec.annotations.file), remaining)
        plan.inbox_taken = [r for r in p.inbox_records if p.key(r) in taken]
    return plan


def _plan_shared(
    spec: DatasetSpec, scan: InboxScan, p: _Plan, moved: dict[str, None], refused: dict[str, tuple[list[str], str]]
) -> None:
    """The entries of shared files (a COCO file's pictures) follow their samples: the taken ones'
    into processed/ under the spec's name, each refused one's beside it in quarantine/; what the
    inbox's files say of samples still waiting stays there."""
    if scan.spec is None:
        return
    inbox, number = scan.inbox, p.plan.version
    named = shared_files(spec)
    for name, kind in sharing(field_kinds(scan.spec)).items():
        here = kind.shared_files()
        if name not in named or not here:
            continue
        if number is not None and moved:
            text = kind.shared_subset(inbox, here, set(moved))
            if text is not None:
                p.plan.writes.append((str(processed_dir(inbox, number) / named[name][0]), text))
        gone = set(moved)
        for sid, (files, reason) in refused.items():
            gone.update(files)
            text = kind.shared_subset(inbox, here, set(files))
            if text is not None and files:
                rel = p.beside(files, sid, Path(named[name][0]).name)
                p.plan.writes.append((str(inbox / INBOX_QUARANTINE / rel), text))
                p.reason(rel, f"the entry of sample {sid!r} in {', '.join(here)}, refused: {reason}")
        for rel in here:
            digest = _digest(inbox / rel)  # before it is read for the plan: a later change shows
            if digest is None:
                continue
            if kind.shared_subset(inbox, (rel,), gone) is not None:  # a file none of them left stays as it is
                rest = kind.shared_subset(inbox, (rel,), gone, complement=True)
                p.plan.inbox_rewrites.append((str(inbox / rel), rest))
                p.plan.inbox_digests[str(inbox / rel)] = digest


def _digest(path: Path) -> str | None:
    """The sha256 of a file's content; None when it cannot be read (or is gone)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


NAME_MAX = 255  # bytes in one file name, on every filesystem h5forge writes to


def shortened(name: str, suffix: str = "") -> str:
    """``name + suffix``, or when that is too long for a file name, the name cut on a character
    boundary plus a hash of the whole name and the suffix: always fits, and never collides with
    another file's."""
    full = f"{name}{suffix}"
    if len(os.fsencode(full)) <= NAME_MAX:
        return full
    keep = Path(name).suffix if not suffix and len(Path(name).suffix) < 16 else ""  # a record file keeps its format
    tail = f"~{hashlib.sha256(os.fsencode(name)).hexdigest()[:12]}{keep}{suffix}"
    room = NAME_MAX - len(tail.encode())
    cut = os.fsencode(name)[:room].decode("utf-8", errors="ignore")
    return cut + tail


def _read_list(path: Path) -> list[dict] | None:
    """The inbox's annotation records, in any format discovery reads: none when the file is
    missing, None when it cannot be read (its problems are in the scan's rejections)."""
    try:
        return [r for r in read_annotation_file(path) if isinstance(r, dict)]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, UnicodeDecodeError, RecursionError, csv.Error):
        return None


def _prune_inbox_records(path: Path, remaining: list[dict], taken: list[dict]) -> None:
    """The inbox's annotation list without the records the append took. The file is read again
    first, so records a user added while the append ran (a new copy renamed over it) stay; one
    that cannot be read now is left as it is (the next append reports it). It is written through
    a temporary name of its own (``_own_temporary``)."""
    if taken:
        current = _read_list(path)
        if current is None:
            return
        gone = {_record_text(r) for r in taken}
        remaining = [r for r in current if _record_text(r) not in gone]
    if remaining:
        _write_records(path, remaining, _own_temporary(path))
    else:
        path.unlink(missing_ok=True)


def _own_temporary(path: Path) -> Path:
    """A temporary name for rewriting an inbox file that no user's copy takes (``.<name>.tmp`` may be one)."""
    return temporary_name(path, f"h5forge-{os.getpid()}")


def _record_text(record: dict) -> str:
    return json.dumps(record, sort_keys=True, default=str)


def _write_records(path: Path, records: list[dict], tmp: Path | None = None) -> None:
    """Records written atomically in the format the file's suffix names (JSON list, JSON Lines, CSV)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{k: v for k, v in r.items() if k != TEXT_FORMAT} for r in records]
    suffix = path.suffix.lower()
    if suffix == ".csv":
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)
        replace_file(path, text.getvalue(), tmp)
    elif suffix == ".jsonl":
        replace_file(path, "".join(json.dumps(r) + "\n" for r in rows), tmp)
    else:
        replace_file(path, json.dumps(rows, indent=1), tmp)


def write_journal(out: Path, plan: MovePlan) -> None:
    replace_file(out / JOURNAL, plan.to_json(), durable=True)
    fsync_dir(out)


def apply_moves(plan: MovePlan) -> None:
    """Idempotent: a move already done is skipped, so a rerun after a crash finishes the job.

    A move that fails does not stop the others; the failures are raised together at the end
    (``InboxMoveFailed``), the journal stays, and the next run retries what is left."""
    failed: list[str] = []

    def attempt(what: str, step) -> None:
        try:
            step()
        except OSError as err:
            failed.append(f"{what}: {err.strerror or err}")

    checkpoint("append:records")
    for where, recs in [plan.processed_records, *plan.records]:
        if where and recs:
            attempt(where, lambda w=where, r=recs: _write_records(Path(w), r))
    for where, text in plan.writes:
        attempt(where, lambda w=where, t=text: _write_text(Path(w), t))
    for i, (src, dst) in enumerate(plan.moves):
        checkpoint(f"append:move-{i}")
        if os.path.lexists(src):
            attempt(f"{src} -> {dst}", lambda src=src, dst=dst: _move(src, dst))
        if i == 0:
            checkpoint("append:mid-move")
    checkpoint("append:reasons")
    for reason_path, reason in plan.reasons:
        attempt(reason_path, lambda p=reason_path, r=reason: _write_text(Path(p), r + "\n"))
    if failed:
        done = f"{version_name(plan.version)} is published, but " if plan.version is not None else ""
        raise InboxMoveFailed(
            f"{done}{len(failed)} inbox file(s) could not be moved or written (first: {failed[0]}); "
            "fix that and rerun append to finish"
        )
    if plan.inbox_records:
        _prune_inbox_records(Path(plan.inbox_records[0]), plan.inbox_records[1], plan.inbox_taken)
    for where, rest in plan.inbox_rewrites:
        planned, now = plan.inbox_digests.get(where), _digest(Path(where))
        if now == (None if rest is None else hashlib.sha256(rest.encode("utf-8")).hexdigest()):
            continue  # done already (a rerun after a kill)
        if planned is not None and now != planned:
            log.warning(
                "%s changed while the append ran: left as it is (the entries taken are in processed/ too)", where
            )
            continue
        if rest is not None:
            replace_file(Path(where), rest, _own_temporary(Path(where)))
        else:
            Path(where).unlink(missing_ok=True)


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, text)


def _move(src: str, dst: str) -> None:
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, dst)


JOURNAL_MAX_BYTES = 1 << 30  # a journal lists every inbox file its append moves


def recover(out: Path) -> str | None:
    """Finish (version published) or forget (not published) a killed append. Call under the lock."""
    journal = out / JOURNAL
    try:
        plan = MovePlan.from_json(read_bounded(journal, JOURNAL_MAX_BYTES).decode())
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as err:  # a FIFO planted there is never waited on
        raise UsageError(f"{journal} cannot be read as an append's journal ({err}); remove it and retry") from None
    number = plan.version
    assert number is not None  # a journal is written only when a staged version is published
    if number in published(out):
        if (latest(out) or 0) < number:
            set_latest(out, number)
        apply_moves(plan)
        outcome = f"finished the append of {version_name(number)} (inbox moves completed)"
    else:
        outcome = f"discarded an unpublished append of {version_name(number)}; its inbox files stay put"
    journal.unlink()
    return outcome


def publish_append(cand: AppendCandidate, report: HealthReport, plan: MovePlan) -> str:
    """Journal, publish, move the inbox files, drop the journal."""
    if not report.ok:
        cand.version.discard()
        cand.delta.unlink(missing_ok=True)
        raise VerificationFailed(report.errors)
    write_journal(cand.out, plan)
    try:
        seal(cand.delta)  # what the version reads is as immutable as the version itself
        checkpoint("append:before-publish")
        path = publish(cand.version)
    except OSError:  # a full disk before the version's rename: nothing published, no moves to finish
        if not cand.version.final.exists():
            (cand.out / JOURNAL).unlink(missing_ok=True)
        raise
    checkpoint("append:before-move")
    apply_moves(plan)
    (cand.out / JOURNAL).unlink()
    return str(path)

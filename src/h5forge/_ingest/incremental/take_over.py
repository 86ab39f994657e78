"""A killed build's file taken over in place by the next build: kept where it is, cut back to the
rows its last checkpoint made durable, and continued.

That is possible when the durable rows are, in each split, the first rows the new build writes
(the usual case: the same inputs); the samples the killed build rejected among them are rejected
again without cleaning (the same inputs give the same outcome). Otherwise the durable rows are
copied (``h5forge._ingest.incremental.reuse``).

What a kept row needs checking: its bytes were flushed to the operating system before the
checkpoint counted it, but the file lay unguarded after the kill (a restart of the machine can
lose pages the kernel had not written; anything can write into it). So the file's chunk index
must list every kept row inside the file, and every kept row's checksum is recomputed from its
stored bytes, all of them, before the file is changed: the rows from the first one that does not
match (or cannot be read) on are cut off with the rest and cleaned again. A build whose cluster
started ahead (``_ingest.parallel.ClusterAhead``) shares that check among its workers.
"""

from __future__ import annotations

import logging
import os
from typing import cast
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from h5forge._format import arrays, heap
from h5forge._format.catalog import KEY, sample_keys, sample_keys_path
from h5forge._format.checksums import stored_checksums
from h5forge._format.codecs import ensure_filters
from h5forge._format.names import CHECKSUM, IDS, PER_SAMPLE, SPEC, SPLITS, block_rows
from h5forge._ingest.incremental.inputs import Inputs
from h5forge._ingest.incremental.resume import checkpoint_of, discard_resumable
from h5forge._ingest.incremental.reuse import count_rows
from h5forge._ingest.writer import Durable
from h5forge.kinds import FieldKind, stored_kinds
from h5forge.kinds.statistics import Statistics
from h5forge.spec import spec_from_json
from h5forge._samples import Rejection, SampleRef

log = logging.getLogger(__name__)

MAX_CHECK_ROWS = 256  # rows checksummed per read, whatever the chunks of the killed build's file
WORKER_ROWS = 1024  # kept rows from which the check is shared among a cluster's workers


@dataclass
class TakenOver:
    """A killed build's file taken over in place: the rows kept (``durable``), every one checked
    against its checksum (by ``processes``); the samples they and the carried rejections stand for
    (``ids``); and how many durable rows were cut off from the first one that failed that check
    (``damaged``)."""

    durable: Durable
    ids: set[str]
    rejections: list[Rejection]
    damaged: int = 0
    processes: int = 1  # that checked the rows: a cluster's workers, or this one

    @property
    def rows(self) -> int:
        return sum(self.durable.counts.values())


def take_over(
    out: Path,
    inputs: Inputs,
    samples: list[SampleRef],
    kinds: dict[str, FieldKind],
    partial: Path,
    workers: tuple[Executor, int] | None = None,
) -> TakenOver | None:
    """Make what a killed build left in ``out`` the file at ``partial``, cut back to the durable
    rows this build would write first in each split and that match their checksums; None (the file
    left as it is) when its rows are not such a prefix, or its chunk index does not list every one
    of them. ``workers``: a running cluster's executor and its number of workers, which check the
    rows from ``WORKER_ROWS`` on."""
    try:
        found = checkpoint_of(out)
        if found is None or found[2].get("rules") != inputs.rules:
            return None
        data, state, saved = found
        if heap.damage(data):
            return None
        with h5py.File(data, "r") as f:
            keep, ids, rejections = _prefix(f, saved, inputs, samples)
            if not any(keep.values()) or not all(_listed(f, split, m, kinds) for split, m in keep.items()):
                return None
            shared = _intact_on(workers, f, keep, kinds) if workers and sum(keep.values()) >= WORKER_ROWS else None
            intact = shared or {split: _intact(f[split], m, kinds) for split, m in keep.items()}
            damaged = sum(keep.values()) - sum(intact.values())
            if damaged:
                keep, ids, rejections = _prefix(f, saved, inputs, samples, limit=intact)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError):
        return None  # the copying path reads what it can of it, or discards it
    if not any(keep.values()):  # every split's first row was damaged, and no row after one is trusted
        discard_resumable(out)
        return None
    try:  # from here the file changes: if this fails, it is discarded and the build starts afresh
        with h5py.File(data, "r+") as f:
            stats = _kept_stats(f, saved, keep, kinds)
            for split, m in keep.items():
                _cut(f, split, m, kinds)
        os.replace(data, partial)
        state.unlink()
    except (OSError, ValueError, KeyError, TypeError, RuntimeError):
        discard_resumable(out)
        partial.unlink(missing_ok=True)
        return None
    listed = {s: {p: list(v[: keep[s]]) for p, v in per.items()} for s, per in saved["listed"].items()}
    return TakenOver(Durable(keep, stats, listed), ids, rejections, damaged, workers[1] if shared and workers else 1)


def _intact(g: h5py.Group, n: int, kinds: dict[str, FieldKind]) -> int:
    """How many of the first ``n`` rows of the split group ``g``, counted from its first, hash to
    the checksums stored beside them: the first row that does not, or cannot be read, ends them."""
    step = _check_step(g, kinds)
    for a in range(0, n, step):
        bad = _first_bad(g, kinds, a, min(n, a + step))
        if bad < min(n, a + step):
            return _warned(g.name, bad, n)
    return n


def _check_step(g: h5py.Group, kinds: dict[str, FieldKind]) -> int:
    """Rows checked per read: whole chunks of the file, at most ``MAX_CHECK_ROWS``."""
    fixed = [g[path].chunks[0] for path, kind in kinds.items() if not kind.stored().ragged and g[path].chunks]
    return min(block_rows(max(fixed, default=1)), MAX_CHECK_ROWS)


def _first_bad(g: h5py.Group, kinds: dict[str, FieldKind], a: int, b: int) -> int:
    """The first of rows ``a:b`` that does not hash to its checksum or cannot be read; ``b`` when none."""
    bad = _first_mismatch(g, kinds, a, b)
    if bad is None:  # a block that cannot be read: its rows one by one
        bad = next((r for r in range(a, b) if _first_mismatch(g, kinds, r, r + 1) != r + 1), b)
    return bad


def _warned(split: str, bad: int, n: int) -> int:
    log.warning(
        "%s[%d] of a killed build's file does not match its checksum: it and the %d durable row(s) "
        "after it are cleaned again",
        split.strip("/"),
        bad,
        n - bad - 1,
    )
    return bad


def _intact_on(
    workers: tuple[Executor, int], f: h5py.File, keep: dict[str, int], kinds: dict[str, FieldKind]
) -> dict[str, int] | None:
    """``_intact`` of each split, its blocks of rows shared among the workers (every worker's
    n-th block); None when the workers fail to check them (the caller checks them itself)."""
    executor, n = workers
    steps = {s: _check_step(f[s], kinds) for s in keep}
    blocks = [(s, a, min(m, a + steps[s])) for s, m in keep.items() for a in range(0, m, steps[s])]
    try:
        futures = [executor.submit(_first_bad_of, f.filename, blocks[i::n]) for i in range(n)]
        firsts = [future.result() for future in futures]
    except Exception:  # noqa: BLE001 - e.g. a worker lost: checked in this process instead
        return None
    first_bad = {block: bad for i in range(n) for block, bad in zip(blocks[i::n], firsts[i])}
    intact = dict(keep)
    for s, a, b in blocks:  # in order: the first bad row of a split ends it
        if intact[s] == keep[s] and first_bad[s, a, b] < b:
            intact[s] = _warned(s, first_bad[s, a, b], keep[s])
    return intact


def _first_bad_of(path: str, blocks: list[tuple[str, int, int]]) -> list[int]:
    """``_first_bad`` of each block of the file at ``path``, as its stored spec's kinds hash them: a
    cluster worker's share of the check."""
    ensure_filters()
    with h5py.File(path, "r") as f:
        kinds = stored_kinds(spec_from_json(f[SPEC][()].decode()))
        return [_first_bad(f[s], kinds, a, b) for s, a, b in blocks]


def _first_mismatch(g: h5py.Group, kinds: dict[str, FieldKind], a: int, b: int) -> int | None:
    """The first of rows ``a:b`` whose stored values do not hash to its checksum (``b`` when every
    one does); None when they cannot be read."""
    try:
        sums = stored_checksums(g, kinds, a, b)
        stored = g[CHECKSUM][a:b]
    except Exception:  # noqa: BLE001 - a corrupt chunk, heap or string: the caller narrows it down
        return None
    return next((a + i for i, digest in enumerate(sums) if digest.encode() != stored[i]), b)


def _prefix(f: h5py.File, saved: dict, inputs: Inputs, samples: list[SampleRef], limit: dict[str, int] | None = None):
    """Per split, how many of the durable rows (of the first ``limit[split]`` when given) are the
    first rows this build writes; the samples they stand for and those the killed build rejected
    before them (taken as rejected again). Raises ValueError when a durable row this build wants
    lies beyond them (it would be lost)."""
    rejected = {(sid, bytes.fromhex(key)): (paths, reason) for sid, key, paths, reason in saved.get("rejected", [])}
    keep: dict[str, int] = {}
    ids: set[str] = set()
    rejections: list[Rejection] = []
    for split in SPLITS:
        n = int(saved["counts"].get(split, 0))
        if limit is not None:
            n = min(n, limit[split])
        stored = sample_keys(f, split, n)
        if len(stored) != n or f[split][IDS].shape[0] < n:
            raise ValueError(f"{split}: fewer rows than its checkpoint says")
        refs = [ref for ref in samples if ref.split == split]
        wanted = np.array([inputs.samples.get(ref.id) or b"" for ref in refs], KEY)
        j = 0
        for ref, key in zip(refs, wanted):
            # (numpy drops trailing NUL bytes of fixed-length byte strings: padded back for the lookup)
            carried = rejected.get((ref.id, bytes(key).ljust(KEY.itemsize, b"\0")))
            if j < n and key == stored[j]:
                j += 1
            elif carried is not None:
                rejections.append(Rejection(ref.id, tuple(carried[0]), carried[1], stage="clean"))
            else:
                break
            ids.add(ref.id)
        if np.isin(stored[j:], wanted).any():
            raise ValueError(f"{split}: a durable row is wanted after one that is not")
        keep[split] = j
    return keep, ids, rejections


def _listed(f: h5py.File, split: str, n: int, kinds: dict[str, FieldKind]) -> bool:
    """Whether every chunk holding the first ``n`` rows of the split's datasets is listed in its
    chunk index, inside the file."""
    g, size = f[split], os.path.getsize(f.filename)
    datasets = [(g[name], n) for name in PER_SAMPLE] + [(f[sample_keys_path(split)], n)]
    for path, kind in kinds.items():
        st = kind.stored()
        elements = int(g[path + arrays.LENGTHS][:n].sum()) if st.ragged else n
        datasets += [(g[path], elements)] + ([(g[path + arrays.LENGTHS], n)] if st.ragged else [])
    for ds, rows in datasets:
        if ds.shape[0] < rows:
            return False
        if rows == 0:
            continue
        step = ds.chunks[0]
        seen = np.zeros(-(-rows // step), bool)
        inside = [True]

        def visit(info, seen=seen, inside=inside, step=step) -> None:
            k = info.chunk_offset[0] // step
            if k < len(seen):
                seen[k] = True
                inside[0] = inside[0] and info.size > 0 and info.byte_offset + info.size <= size

        ds.id.chunk_iter(visit)
        if not (inside[0] and seen.all()):
            return False
    return True


def _kept_stats(f: h5py.File, saved: dict, keep: dict[str, int], kinds: dict[str, FieldKind]) -> dict:
    """The statistics of the kept rows: the checkpoint's when it recorded exact ones for exactly
    these rows, else counted from the rows (read back before the file is cut)."""
    exact = saved.get("stats")
    if exact is not None and all(keep[s] == int(saved["counts"].get(s, 0)) for s in SPLITS):
        # only kinds with statistics have saved ones
        return {p: {s: cast(Statistics, kinds[p]).saved_counts(c) for s, c in per.items()} for p, per in exact.items()}
    stats: dict[str, dict[str, np.ndarray]] = {}
    for split, m in keep.items():
        for path, kind in kinds.items():
            total = count_rows(f[split], path, kind, np.arange(m)) if m else None
            if total is not None:
                stats.setdefault(path, {})[split] = total
    return stats


def _cut(f: h5py.File, split: str, n: int, kinds: dict[str, FieldKind]) -> None:
    """Every dataset of the split back to its first ``n`` rows."""
    g = f[split]
    for path, kind in kinds.items():
        arrays.cut(g, path, kind.stored(), n)
    for name in PER_SAMPLE:
        g[name].resize(n, axis=0)
    f[sample_keys_path(split)].resize(n, axis=0)

"""Write a version that takes every unchanged sample from files already written, cleaning only the rest.

The nightly rebuild takes them from the latest version (or the files a thin version reads), a
resumed build from the partial file a killed build left. A sample is taken when its sample key
(``h5forge._ingest.incremental.inputs``) is stored in a source written under the same field rules; its rows are
copied in the order a full build would write them, so the result equals a full rebuild: same ids,
order, splits, checksums and values.

How rows are copied, per dataset of the split:
- fixed sample arrays with one sample per chunk and the same filters: the stored, compressed chunk
  is copied as is (no decode, no recompression): its bytes are read with one ``pread`` at the
  place the source's chunk index gives (``h5forge.read._direct.chunk_index``, the reader's; no HDF5
  read call) and written with ``write_direct_chunk``;
- sample arrays with several samples per chunk, and ragged fields (recordings, CT cases, whose
  chunks hold elements of several samples): the rows are read (decompressed; no raw file is
  decoded) and go to the writer as cleaned rows do, which compresses them a whole chunk at a time;
- the small per-sample columns (ids, provenance, checksums, annotations, sample keys): the rows'
  values are taken from the columns read once, so a checksum always travels with its sample.

Taken rows are buffered with the cleaned ones, so the short runs between changed samples cost no
write of their own.

Per-split statistics are additive: a source's totals, minus the rows it holds that are not taken
(read back and counted), plus the cleaned rows.

A mapped or thin version's rows lie in many files (one per batch, or a parent and its deltas), so
the sources are opened as they are read and at most ``open_sources_budget()`` of them are open at
once (the readers' budget, ``h5forge._format.mapped``), the least recently used closed first: a
rebuild reads under the same ``ulimit -n`` as its readers. A self-contained version is one source,
opened once.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import h5py
import numpy as np

from h5forge._format import arrays
from h5forge._format.catalog import KEY, input_key, sample_keys, sample_keys_path
from h5forge._format.layout import index_parts
from h5forge._format.mapped import open_sources_budget, out_of_descriptors, read_all
from h5forge._format.names import IDS, INDEX, PER_SAMPLE, SPLITS, Attr
from h5forge._ingest.clean import CleanedBatch
from h5forge._ingest.incremental.inputs import Inputs
from h5forge._ingest.writer import DatasetWriter
from h5forge.kinds import FieldKind, stored_kinds
from h5forge.kinds.index import RowIndex
from h5forge.kinds.statistics import Statistics
from h5forge.read._direct import chunk_index
from h5forge._samples import SampleRef
from h5forge.spec import DatasetSpec

COPY_ROWS = 256  # rows read and written at a time when a dataset is copied row by row
WINDOW_BYTES = 4 << 20  # a fixed-size field's taken rows are read this much at a time


@dataclass
class Source:
    """A file whose rows a build may take: up to ``limit`` rows per split (None: all of them).

    ``stats`` / ``listed``: the totals and per-row index values of those rows when the file does
    not hold them itself (a killed build's partial file); None reads them from the file.
    ``recount``: the statistics of the rows taken are counted from the rows (a partial file whose
    checkpoint could not record exact totals)."""

    path: Path
    limit: dict[str, int] | None = None
    stats: dict[str, dict[str, list]] | None = None
    listed: dict[str, dict[str, list]] | None = None
    file: Any = None  # the h5py.File, once open
    rows: dict[str, int] = field(default_factory=dict)
    recount: bool = False
    fd: int | None = None  # the file opened for pread, once a chunk is read so
    used: int = 0  # when it was last asked for (``hold``)

    def descriptor(self) -> int:
        if self.fd is None:
            try:
                self.fd = os.open(os.path.realpath(self.path), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError as err:
                short = out_of_descriptors(err, self.path)
                if short is None:
                    raise
                raise short from None
        return self.fd

    def open(self) -> h5py.File:
        if self.file is None:
            try:
                self.file = h5py.File(os.path.realpath(self.path), "r")
            except OSError as err:
                short = out_of_descriptors(err, self.path)
                if short is None:
                    raise
                raise short from None
            for split in SPLITS:
                n = int(self.file[split][IDS].shape[0])  # ids are written with every row
                self.rows[split] = n if self.limit is None else min(n, int(self.limit.get(split, 0)))
        return self.file

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


_uses = itertools.count(1)


def hold(sources: list[Source], k: int, budget: int | None = None) -> list[int]:
    """Open ``sources[k]``, first closing the least recently used of the others so that at most
    ``budget`` (``open_sources_budget()``) are open; returns the sources closed."""
    src = sources[k]
    closed: list[int] = []
    if src.file is None:
        limit = budget or open_sources_budget()
        held = sorted((s.used, j) for j, s in enumerate(sources) if j != k and (s.file is not None or s.fd is not None))
        for _, j in held[: max(0, len(held) + 1 - limit)]:
            sources[j].close()
            closed.append(j)
        src.open()
    src.used = next(_uses)
    return closed


def usable(path: Path, rules: str) -> bool:
    """A file written under the same field rules (older files without sample keys are not)."""
    try:
        with h5py.File(os.path.realpath(path), "r") as f:
            return input_key(f)[1] == rules and all(
                len(sample_keys(f, s, 1)) or not f[s].attrs.get(Attr.COUNT, 0) for s in SPLITS
            )
    except (OSError, KeyError):
        return False


@dataclass
class Taken:
    source: int
    row: int


@dataclass
class Plan:
    """For every sample of the inventory, in order: the stored row it is taken from, or None (clean it)."""

    samples: list[SampleRef]
    taken: list[Taken | None]

    @property
    def to_clean(self) -> list[SampleRef]:
        return [ref for ref, t in zip(self.samples, self.taken) if t is None]

    @property
    def reused(self) -> int:
        return sum(t is not None for t in self.taken)


def make_plan(samples: list[SampleRef], inputs: Inputs, sources: list[Source]) -> Plan:
    """Match each sample's key against the keys stored in the sources (first source wins)."""
    where: dict[tuple[str, bytes | None], Taken] = {}
    for k in reversed(range(len(sources))):
        src = sources[k]
        hold(sources, k)
        f = src.file
        for split in SPLITS:
            keys = sample_keys(f, split, src.rows[split])
            # numpy drops trailing NUL bytes of fixed-length byte strings: padded back to 32
            where.update(((split, key.ljust(KEY.itemsize, b"\0")), Taken(k, r)) for r, key in enumerate(keys.tolist()))
    taken = [where.pop((ref.split, inputs.samples.get(ref.id)), None) for ref in samples]
    return Plan(samples, taken)


# ---- copying rows ------------------------------------------------------------------------------


def _filters(ds: h5py.Dataset) -> tuple:
    dcpl = ds.id.get_create_plist()
    return tuple(dcpl.get_filter(i)[:3] for i in range(dcpl.get_nfilters()))


def _same_chunks(dst: h5py.Dataset, src: h5py.Dataset) -> bool:
    """One sample per chunk, stored alike: a chunk can be copied as it is."""
    return dst.chunks == src.chunks and dst.chunks[0] == 1 and _filters(dst) == _filters(src)


def runs(rows: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """(position in ``rows``, first row, end row) of each stretch of consecutive rows, at most COPY_ROWS long."""
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i] != rows[i - 1] + 1 or i - start >= COPY_ROWS:
            yield start, int(rows[start]), int(rows[i - 1]) + 1
            start = i


class Copier:
    """Copies rows of one source split into the same split of the file being written."""

    def __init__(
        self, src: h5py.Group, dst: h5py.Group, kinds: dict[str, FieldKind], keys: h5py.Dataset, fd: Callable[[], int]
    ):
        self.src, self.dst, self.kinds, self.keys, self.fd = src, dst, kinds, keys, fd  # fd(): the source, for pread
        self._same: dict[str, bool] = {}
        self._columns: dict[str, np.ndarray] = {}
        self._readers: dict[str, arrays.RowReader] = {}
        self._indexes: dict[str, Any] = {}  # path -> the source dataset's chunk index (None: HDF5 reads)
        self._buffer = memoryview(bytearray(0))  # one chunk's bytes at a time
        self._windows: dict[str, tuple[int, np.ndarray]] = {}  # path -> (first row, rows read at once)
        self.direct_rows = self.copied_rows = 0

    def column(self, name: str) -> np.ndarray:
        """A small per-sample column, read once."""
        if name not in self._columns:
            self._columns[name] = read_all(self.keys if name == "" else self.src[name])
        return self._columns[name]

    def __call__(self, rows: np.ndarray) -> tuple[dict[str, Any], Callable[[h5py.Group], None]]:
        """The ``rows`` as ``DatasetWriter.add_stored`` takes them: every dataset's values, but those
        of the datasets whose chunks are copied as stored, which the returned call copies."""
        values: dict[str, Any] = {}
        chunked: list[str] = []
        for path, kind in self.kinds.items():
            if self._chunk_copied(path, kind):
                chunked.append(path)
            elif kind.stored().bulk:
                values[path] = self._rows(path, kind, rows)
            else:
                values[path] = self.column(path)[rows]
        for name in PER_SAMPLE:
            values[name] = self.column(name)[rows]
        values[sample_keys_path(self.src.name.strip("/"))] = self.column("")[rows]

        def copy_chunks(g: h5py.Group) -> None:
            for path in chunked:
                self._copy_chunks(g[path], self.src[path], path, rows)

        return values, copy_chunks

    def _chunk_copied(self, path: str, kind: FieldKind) -> bool:
        """Whether the field's rows are copied as stored chunks, asked once per field."""
        if path not in self._same:
            st = kind.stored()
            self._same[path] = st.bulk and not st.ragged and _same_chunks(self.dst[path], self.src[path])
        return self._same[path]

    def _copy_chunks(self, dst: h5py.Dataset, src: h5py.Dataset, path: str, rows: np.ndarray) -> None:
        """Each row is one stored chunk: copied compressed, as it is, read with one ``pread`` where
        the source's chunk index places it (HDF5's ``read_direct_chunk`` per call costs more than
        reading the bytes; ``read_direct_chunk`` serves a chunk the index does not place)."""
        if path not in self._indexes:
            self._indexes[path] = chunk_index(src)
        index = self._indexes[path]
        fd = self.fd() if index is not None else -1
        start = dst.shape[0]
        dst.resize(start + len(rows), axis=0)
        tail = (0,) * (dst.ndim - 1)
        write = dst.id.write_direct_chunk
        for i, r in enumerate(rows.tolist()):
            place = index.place(r) if index is not None else None
            if place is not None:
                offset, size, mask = place
                if len(self._buffer) < size:
                    self._buffer = memoryview(bytearray(size))
                data = self._buffer[:size]
                if os.preadv(fd, [data], offset) != size:
                    mask, data = src.id.read_direct_chunk((r, *tail))
            else:
                mask, data = src.id.read_direct_chunk((r, *tail))
            write((start + i, *tail), data, mask)
        self.direct_rows += len(rows)

    def _rows(self, path: str, kind: FieldKind, rows: np.ndarray) -> Any:
        """The rows, decompressed (several samples share a chunk, or a ragged field's elements do).
        A fixed-size field's rows come from a window of ``WINDOW_BYTES`` read at once: the rows
        between a rebuild's changed samples are taken in short runs, in order."""
        if path not in self._readers:
            self._readers[path] = arrays.RowReader(self.src, path, kind.stored())
        reader = self._readers[path]
        read: Callable[[int, int], Any] = (
            reader if reader.starts is not None else functools.partial(self._windowed, path, reader)
        )
        parts = [read(a, b) for _, a, b in runs(rows)]
        self.copied_rows += len(rows)
        if isinstance(parts[0], arrays.Ragged):
            return arrays.Ragged.concat(parts)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _windowed(self, path: str, read: arrays.RowReader, start: int, stop: int) -> np.ndarray:
        first, values = self._windows.get(path, (0, None))
        if values is None or start < first or stop > first + len(values):
            ds = read.values
            row_bytes = max(1, ds.dtype.itemsize * int(np.prod(ds.shape[1:])))
            chunk = ds.chunks[0] if getattr(ds, "chunks", None) else 1
            first = start - start % chunk
            end = max(stop, first + WINDOW_BYTES // row_bytes)
            values = ds[first : min(ds.shape[0], end + (-end) % chunk)]
            self._windows[path] = (first, values)
        return values[start - first : stop - first]


# ---- statistics and index values of the taken rows ---------------------------------------------


def _listed_rows(src: Source, split: str, path: str) -> list[list]:
    """Per row of a source split, the values an indexed field lists it under."""
    if src.listed is not None:
        return src.listed.get(split, {}).get(path, [])
    per_row: list[list] = [[] for _ in range(src.rows[split])]
    key = f"{INDEX}/{split}/{path}"
    if key in src.file:
        for value, rows in index_parts(src.file[key]).items():
            for r in rows.tolist():
                per_row[r].append(value)
    return per_row


def count_rows(g: h5py.Group, path: str, kind: FieldKind, rows: np.ndarray) -> np.ndarray | None:
    """The kind's additive statistic of ``rows`` of a split, read back COPY_ROWS at a time (None
    for a kind that keeps none)."""
    if not isinstance(kind, Statistics):
        return None
    read = arrays.RowReader(g, path, kind.stored())
    total = None
    for _, a, b in runs(rows):
        counts = kind.counts(read(a, b))
        if counts is None:
            return None
        total = counts if total is None else total + counts
    return total


def taken_stats(src: Source, split: str, taken_rows: np.ndarray, kinds: dict[str, FieldKind]) -> dict[str, np.ndarray]:
    """The additive statistics of the rows taken from a source split: its totals minus the rows
    not taken (those are read back and counted)."""
    g = src.file[split]
    dropped = np.setdiff1d(np.arange(src.rows[split]), taken_rows)
    out = {}
    for path, kind in kinds.items():
        if not isinstance(kind, Statistics):
            continue
        if src.recount:
            total = count_rows(g, path, kind, taken_rows)
            if total is not None:
                out[path] = total
            continue
        if src.stats is not None:
            stored = src.stats.get(path, {}).get(split)
            total = None if stored is None else kind.saved_counts(stored)
        else:
            total = kind.stored_counts(g) if src.rows[split] else None
        if total is None:
            continue
        if len(dropped):
            less = count_rows(g, path, kind, dropped)
            if less is not None:
                total = total - less
        out[path] = total
    return out


# ---- the build ---------------------------------------------------------------------------------


class _Copies:
    """The taken rows waiting to be copied into ``writer``, in order, and the copiers of the
    sources open (at most ``open_sources_budget`` of them: ``hold``)."""

    def __init__(self, sources: list[Source], writer: DatasetWriter, kinds: dict[str, FieldKind], progress):
        self.sources, self.writer, self.kinds, self.progress = sources, writer, kinds, progress
        self.copiers: dict[tuple[int, str], Copier] = {}
        self.pending: dict[str, list[Taken]] = {s: [] for s in SPLITS}
        self.indexed = [p for p, kind in kinds.items() if isinstance(kind, RowIndex)]
        self.listed: dict[tuple[int, str, str], list[list]] = {}
        self.direct_rows = self.copied_rows = 0  # by the copiers of sources closed since
        self.seconds = 0.0

    def opened(self, k: int) -> h5py.File:
        """Source ``k``, open; the copiers of the sources closed to keep within the budget go with them."""
        for j in hold(self.sources, k):
            for split in SPLITS:
                gone = self.copiers.pop((j, split), None)
                if gone is not None:
                    self.direct_rows += gone.direct_rows
                    self.copied_rows += gone.copied_rows
        return self.sources[k].file

    def copier(self, k: int, split: str) -> Copier:
        f = self.opened(k)
        if (k, split) not in self.copiers:
            keys = f[sample_keys_path(split)]
            self.copiers[k, split] = Copier(
                f[split], self.writer.file[split], self.kinds, keys, self.sources[k].descriptor
            )
        return self.copiers[k, split]

    def listed_rows(self, k: int, split: str, path: str) -> list[list]:
        if (k, split, path) not in self.listed:
            self.opened(k)
            self.listed[k, split, path] = _listed_rows(self.sources[k], split, path)
        return self.listed[k, split, path]

    def emit(self) -> None:
        """Copy every pending row, a run of one source at a time."""
        t0 = time.perf_counter()
        for split, items in self.pending.items():
            for k, group in itertools.groupby(items, key=lambda t: t.source):
                rows = np.array([t.row for t in group], np.int64)
                listed = {p: [self.listed_rows(k, split, p)[r] for r in rows.tolist()] for p in self.indexed}
                self.writer.add_stored(split, *self.copier(k, split)(rows), listed)
                self.progress(len(rows), False)
            items.clear()
        self.seconds += time.perf_counter() - t0

    def add_stats(self, plan: Plan) -> None:
        """The statistics of every row taken, added once all are written (a checkpoint before that
        records the cleaned rows' statistics only, and says so)."""
        taken: dict[tuple[int, str], list[int]] = {}  # (source, split) -> the rows taken from it
        for ref, t in zip(plan.samples, plan.taken):
            if t is not None:
                taken.setdefault((t.source, ref.split), []).append(t.row)
        for k, src in enumerate(self.sources):
            self.opened(k)
            for split in SPLITS:
                rows = np.array(sorted(taken.get((k, split), [])), np.int64)
                if src.rows[split]:
                    for path, counts in taken_stats(src, split, rows, self.kinds).items():
                        self.writer.add_stats(path, split, counts)

    def counts(self) -> dict:
        return {
            "reused_chunks_copied": self.direct_rows + sum(c.direct_rows for c in self.copiers.values()),
            "reused_rows_rewritten": self.copied_rows + sum(c.copied_rows for c in self.copiers.values()),
            "reused_copy_seconds": round(self.seconds, 3),
        }


def write_reusing(
    spec: DatasetSpec,
    root: Path,
    plan: Plan,
    sources: list[Source],
    writer: DatasetWriter,
    cleaned: Iterable[CleanedBatch],
    progress: Callable[[int, bool], None] = lambda n, cleaned: None,
    inputs: Inputs | None = None,
) -> dict:
    """Write every sample of ``plan`` in order into ``writer``: taken rows copied from their
    source, the rest from ``cleaned``, the batches of ``plan.to_clean`` in order. Returns what was
    reused and how. A deferred ``inputs`` learns each cleaned sample's key before its row is written."""
    kinds = stored_kinds(spec)
    copies = _Copies(sources, writer, kinds, progress)
    to_clean = plan.to_clean
    position = {ref.id: i for i, ref in enumerate(plan.samples)}
    cursor, done = 0, 0
    cleaned_rows: dict[str, list[int]] = {s: [] for s in SPLITS}
    for batch in cleaned:
        refs = to_clean[done : done + len(batch) + len(batch.rejections)]  # every input is kept or rejected
        done += len(refs)
        if inputs is not None and inputs.deferred:
            inputs.learn(spec, root, refs, batch.ids, batch.source_sha256)
        writer.add_rejections(batch.rejections)
        batch = dataclasses.replace(batch, rejections=[])
        in_batch = {sid: i for i, sid in enumerate(batch.ids)}
        run: list[int] = []  # the batch's cleaned samples since the last taken one
        last = position[refs[-1].id]
        while cursor <= last:
            ref, t = plan.samples[cursor], plan.taken[cursor]
            if t is not None:
                if run:
                    _add_cleaned_run(writer, kinds, batch, run, cleaned_rows)
                    run = []
                copies.pending[ref.split].append(t)
            elif ref.id in in_batch:
                if any(copies.pending.values()):
                    copies.emit()
                run.append(in_batch[ref.id])
            cursor += 1
        if run:
            _add_cleaned_run(writer, kinds, batch, run, cleaned_rows)
        progress(len(refs), True)
    for ref, t in zip(plan.samples[cursor:], plan.taken[cursor:]):
        if t is not None:
            copies.pending[ref.split].append(t)
    copies.emit()
    copies.add_stats(plan)
    return {"reused": plan.reused, "cleaned": len(to_clean), "cleaned_rows": cleaned_rows, **copies.counts()}


def _add_cleaned_run(
    writer: DatasetWriter, kinds: dict[str, FieldKind], batch: CleanedBatch, keep: list[int], rows: dict[str, list[int]]
) -> None:
    """Add the cleaned samples ``keep`` of ``batch``, noting the row each one gets."""
    before = {split: writer.next_row(split) for split in SPLITS}
    for i in keep:  # each sample's row: the split's next row, after the batch's earlier samples of that split
        split = batch.splits[i]
        rows[split].append(before[split])
        before[split] += 1
    whole = keep == list(range(len(batch)))
    writer.add(batch if whole else batch.take(kinds, keep, []))

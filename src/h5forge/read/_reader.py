"""Framework-free reading of one split of a version file: the core under the torch/TF/JAX readers.

What it guarantees (docs/reading.md):
- **Pinned version.** The path is resolved once, at construction: opening ``dataset_latest.h5``
  pins the version it points to now, so a publish during training never mixes two versions.
- **Worker safe.** The HDF5 handle is opened lazily in the process that reads (again after a
  fork); pickling carries the path and the layout, never a handle.
- **Dependencies checked.** Every file a thin version maps must exist when it is opened (HDF5
  would silently return zeros for a missing one).
- **Fast batched reads.** ``read(indices)`` reads each run of consecutive rows in one call (h5py
  reads an index list row by row) and returns rows in the order asked; the chunk cache is sized
  so a chunk is decompressed once. With the ``none`` or ``lz4`` codec whole chunks are read and
  decoded in process (h5forge.read._direct), skipping HDF5's filter pipeline.
"""

from __future__ import annotations

import math
import operator
import os
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import h5py
import numpy as np

from h5forge.errors import ReadError
from h5forge._format import arrays, leases
from h5forge._format.codecs import ensure_filters
from h5forge._format.layout import decode_str
from h5forge._format.names import (
    FORMAT,
    FORMAT_VERSION,
    IDS,
    SPEC,
    SPLITS,
    VERSION_RE,
    Attr,
    column_path,
)
from h5forge._format.mapped import SOURCES, Identity, MappedDataset, opened_identity, read_all, rows_of
from h5forge._format.row_files import virtual_sources
from h5forge.kinds import FieldKind, ReadOptions, stored_kinds
from h5forge.kinds.statistics import Statistics
from h5forge.read._collate import Padded, pad_batch
from h5forge.read._direct import DirectRows, reads_rows_alone, unreadable
from h5forge.spec import spec_from_json

DEFAULT_CACHE_CHUNKS = 8  # chunks per field kept decompressed (covers the sampler's default window)
OPEN_RETRIES = 3


def slice_cache_default(context: int) -> int:
    """Decompressed slices a ``unit="slice"`` reader keeps per volume field by default: one stack's
    2k+1 with ``context`` k (the next stack shares 2k of them), else none (seldom read again)."""
    return 2 * context + 1 if context > 0 else 0


@dataclass(frozen=True)
class FieldInfo:
    name: str  # as asked for: a field, an annotation column, or meta/<column>
    path: str  # the dataset's path in the split group
    kind: FieldKind  # what the field is: how its rows become model values
    shape: tuple[int, ...]  # per sample, e.g. (3, 224, 224); () for a scalar column
    dtype: np.dtype  # as stored
    chunk_rows: int  # samples per HDF5 chunk (1 for contiguous storage: rows are independent)
    chunk_nbytes: int  # bytes of one decompressed chunk
    stats: dict[str, np.ndarray]  # the split's statistics of the field (e.g. image mean/std)
    bulk: bool  # sample arrays, read chunk by chunk; otherwise a small column, read whole and kept
    ragged: bool  # rows of different lengths: a list of arrays, batched as padded values + lengths


def _open(path: str, locking: bool | None, **kwargs) -> h5py.File:
    """Open read-only, retrying a transient OSError (e.g. a file system hiccup)."""
    last: OSError | None = None
    for attempt in range(OPEN_RETRIES):
        try:
            return h5py.File(path, "r", locking=locking, **kwargs)  # None: HDF5's default
        except FileNotFoundError:
            raise
        except OSError as err:
            if "locking flag" in str(err):
                raise ReadError(
                    f"{path}: already open in this process with a different locking= setting "
                    f"(HDF5 shares one handle per file per process); close the other reader or "
                    f"open both with the same locking="
                ) from None
            last = err  # transient (e.g. a network file system hiccup): retry
            time.sleep(0.05 * (attempt + 1))
    raise ReadError(f"{path}: cannot be opened as an HDF5 file ({last})")


def _next_prime(n: int) -> int:
    while n < 2 or any(n % k == 0 for k in range(2, math.isqrt(n) + 1)):
        n += 1
    return n


def _read_runs(d: h5py.Dataset, target: np.ndarray, runs: list[tuple[int, int, int]], positions: np.ndarray) -> None:
    """Read each run of file rows straight into its place in ``target`` by hyperslab reads
    (``positions[k]``: where the k-th unique row goes); a run going to scattered places is read
    once and scattered."""
    tail = (0,) * (target.ndim - 1)
    fspace = d.id.get_space()
    mspace = h5py.h5s.create_simple(target.shape)
    for start, stop, pos in runs:
        n = stop - start
        dest = positions[pos : pos + n]
        try:
            if n == 1 or bool(np.all(np.diff(dest) == 1)):
                fspace.select_hyperslab((start, *tail), (n, *target.shape[1:]))
                mspace.select_hyperslab((int(dest[0]), *tail), (n, *target.shape[1:]))
                d.id.read(mspace, fspace, target)
            else:
                target[dest] = d[start:stop]
        except OSError as err:  # a damaged chunk: reading the run's rows one by one names its row
            bad = next((r for r in range(start, stop) if not _readable(d, r)), None)
            raise unreadable(d, f"rows {start}:{stop}" if bad is None else f"row {bad}", err) from None


def _readable(d: h5py.Dataset, row: int) -> bool:
    try:
        d[row]
    except OSError:
        return False
    return True


def gather(source: Any, idx: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``target`` filled with rows ``idx`` of ``source`` (in any order, repeats allowed): the sorted
    unique rows are read once, by runs from an h5py dataset or by the chunk reader's ``read_rows``."""
    order = np.argsort(idx, kind="stable")
    uniq, first = np.unique(idx[order], return_index=True)
    if idx.size:
        if isinstance(source, h5py.Dataset):
            _read_runs(source, target, coalesce(uniq), order[first])
        else:
            source.read_rows(uniq, target, order[first])
    for k in np.flatnonzero(np.diff(idx[order]) == 0) + 1:  # a row asked for twice: copy it
        target[order[k]] = target[order[k - 1]]
    return target


def as_index(i: Any, what: str) -> int:
    """``i`` as a Python int; TypeError for a float or a bool, which ``int()`` would turn into a
    row that was never asked for (1.7 into 1, True into 1). numpy's integers are indices."""
    if not isinstance(i, (bool, np.bool_)):
        try:
            return operator.index(i)
        except TypeError:
            pass
    raise TypeError(f"index {i!r} of {what}: sample indices are integers, not {type(i).__name__}")


def as_indices(indices: Iterable[int], what: str) -> np.ndarray:
    """``indices`` as a flat int64 array; TypeError for floats or bools (see ``as_index``)."""
    if isinstance(indices, range):
        return np.arange(indices.start, indices.stop, indices.step, dtype=np.int64)
    idx = np.asarray(indices).reshape(-1)
    if idx.dtype.kind in "iu" or idx.size == 0:  # an empty list is float64 to numpy
        return idx.astype(np.int64, copy=False)
    if idx.dtype.kind == "O":  # e.g. tensors or Python ints too large for one dtype: each on its own
        return np.array([as_index(i, what) for i in idx], dtype=np.int64)
    raise TypeError(f"indices of {what}: sample indices are integers, not {idx.dtype} ({idx[0]!r}, ...)")


def checked_rows(indices: Iterable[int], count: int, what: str) -> np.ndarray:
    """``indices`` as int64 rows in 0..count-1 (negative ones count from the end); IndexError naming
    the first out of range, TypeError for indices that are not integers."""
    idx = as_indices(indices, what)
    if idx.size and (idx.min() < -count or idx.max() >= count):
        bad = int(idx[(idx < -count) | (idx >= count)][0])
        raise IndexError(f"index {bad} out of range for {what} ({count} samples)")
    return np.where(idx < 0, idx + count, idx)


def _rows_reader(d: Any, cache_rows: int = 0, cache_chunks: int = 0) -> "DirectRows | MappedDataset | None":
    """What reads rows of ``d`` as whole chunks: a mapped dataset's own reader (its rows are in
    other files), ``DirectRows`` for a field it decodes (one row per chunk, or several when
    ``cache_chunks`` are kept), else None (h5py reads)."""
    if isinstance(d, MappedDataset):
        return d
    if d.is_virtual:
        return rows_of(d)
    return DirectRows.of(d, cache_rows, cache_chunks)


def coalesce(sorted_unique: np.ndarray) -> list[tuple[int, int, int]]:
    """Runs of consecutive rows: [(start_row, stop_row, position_in_sorted_unique), ...]."""
    if sorted_unique.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(sorted_unique) != 1) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [sorted_unique.size]))
    return [(int(sorted_unique[a]), int(sorted_unique[b - 1]) + 1, int(a)) for a, b in zip(starts, stops)]


class SplitReader:
    """Random and batched access to the stored arrays of one split.

    ``fields=None`` reads every field the file lists. ``cache_chunks``: decompressed chunks kept
    per field (by h5forge.read._direct, else by HDF5's chunk cache, whose size ``rdcc_nbytes``
    overrides); ``slice_cache``: decompressed elements (CT slices) kept per ragged field.
    """

    identity: Identity | None = None  # the file opened first (none known: nothing to compare)

    def __init__(
        self,
        path: str | os.PathLike,
        split: str = "train",
        fields: Sequence[str] | str | None = None,
        *,
        locking: bool | None = None,
        cache_chunks: int = DEFAULT_CACHE_CHUNKS,
        rdcc_nbytes: int | None = None,
        slice_cache: int = 0,
    ):
        ensure_filters()
        self.slice_cache = max(0, int(slice_cache))
        self.cache_chunks = max(1, int(cache_chunks))
        self.path = os.fspath(path)
        self.split = split
        self.locking = locking
        if not os.path.lexists(self.path):
            raise FileNotFoundError(f"{self.path}: no such dataset file")
        # pinned before the existence check (retention deletes only versions nobody pins); a link
        # to a version deleted before the pin (latest moved on) is resolved again
        real, held = leases.pin_path(self.path)
        self.real_path = real
        self._pinned_pid: int | None = os.getpid() if held else None
        if not os.path.exists(real):
            raise FileNotFoundError(f"{self.path}: link points to {real}, which does not exist")
        if isinstance(fields, str):
            fields = (fields,)
        with _open(real, locking) as f:
            self._read_layout(f, fields)
            self.identity = opened_identity(f)  # the file read from here on: never another put at its path
        chunk_max = max([fi.chunk_nbytes for fi in self.fields.values() if fi.bulk] or [4096])
        self.rdcc_nbytes = (
            int(rdcc_nbytes) if rdcc_nbytes is not None else max(1 << 20, max(1, cache_chunks) * chunk_max + 4096)
        )
        self.rdcc_nslots = _next_prime(max(521, 100 * max(1, self.rdcc_nbytes // max(1, chunk_max))))
        self._file: h5py.File | None = None
        self._dsets: dict[str, h5py.Dataset] = {}
        # per fixed field, and per ragged field for its elements: chunk reads that skip HDF5's filter pipeline
        self._direct: dict[str, DirectRows | MappedDataset | None] = {}
        self._columns: dict[str, np.ndarray] = {}
        self._ragged: dict[str, arrays.RowReader] = {}
        self._pid: int | None = None

    # ---- layout ------------------------------------------------------------------------------
    def _where(self) -> str:
        return f"{self.path}" + (
            f" (-> {os.path.basename(self.real_path)})" if self.real_path != os.path.abspath(self.path) else ""
        )

    def _read_layout(self, f: h5py.File, fields: Sequence[str] | None) -> None:
        where = self._where()
        if f.attrs.get(Attr.FORMAT) != FORMAT:
            raise ReadError(f"{where}: not an h5forge dataset file (format attribute {f.attrs.get(Attr.FORMAT)!r})")
        if int(f.attrs.get(Attr.FORMAT_VERSION, -1)) > FORMAT_VERSION:
            raise ReadError(
                f"{where}: format_version {int(f.attrs[Attr.FORMAT_VERSION])} is newer than this h5forge reads"
            )
        self.version = int(f.attrs.get(Attr.VERSION, -1))
        self.codec = str(f.attrs.get(Attr.CODEC, ""))
        try:
            kinds = stored_kinds(spec_from_json(f[SPEC][()].decode()))
        except (KeyError, ValueError, UnicodeDecodeError) as err:
            raise ReadError(f"{where}: the spec stored in /{SPEC} is missing or unreadable ({err})") from None
        self._check_sources(f)
        if self.split not in SPLITS or self.split not in f or not isinstance(f[self.split], h5py.Group):
            present = [s for s in SPLITS if s in f]  # the file's other groups (inputs, index, ...) are no splits
            raise ReadError(f"{where}: no split {self.split!r}; the file has {present}")
        g = f[self.split]
        declared = [str(x) for x in f.attrs.get(Attr.FIELDS, [])]
        wanted = list(fields) if fields is not None else declared
        if not wanted:
            raise ReadError(f"{where}: no fields to read")
        count = int(g.attrs.get(Attr.COUNT, -1))
        infos: dict[str, FieldInfo] = {}
        together: dict[str, int] = {}  # per fixed field: the rows a random read decodes together
        for name in wanted:
            # an annotation column may be asked for by its bare name when no field has that name
            path = name if name in kinds else column_path(name)
            if path not in kinds or path not in g:
                readable = [*kinds, *(c for k in kinds.values() if (c := k.annotation_column) and c not in kinds)]
                raise ReadError(f"{where}: split {self.split!r} has no field or column {name!r}; it has {readable}")
            ds, st = g[path], kinds[path].stored()
            if arrays.rows(g, path, st) != count:
                raise ReadError(
                    f"{where}: /{self.split}/{path} has {arrays.rows(g, path, st)} rows but the split count is {count}"
                )
            shape = tuple(int(s) for s in ds.shape[1:])
            rows = int(ds.chunks[0]) if ds.chunks else 1
            cbytes = int(np.prod(ds.chunks if ds.chunks else shape)) * ds.dtype.itemsize
            kind = kinds[path]
            stats = kind.read_stats(g) if isinstance(kind, Statistics) else {}
            infos[name] = FieldInfo(name, path, kind, shape, ds.dtype, rows, cbytes, stats, st.bulk, st.ragged)
            if st.bulk and not st.ragged:
                together[name] = 1 if rows == 1 or reads_rows_alone(ds) else rows
        self.fields = infos
        self._read_together = together
        self.count = count

    def _check_sources(self, f: h5py.File) -> None:
        self.sources = sorted(virtual_sources(f))
        self._check_sources_exist()

    def _check_sources_exist(self) -> None:
        missing = [s for s in self.sources if not os.path.exists(s)]
        if missing:
            raise ReadError(
                f"{self._where()}: version {self.version} reads from files that are missing: "
                f"{', '.join(missing)} (their rows would read as zeros)"
            )

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(self.fields)

    @property
    def chunk_rows(self) -> int:
        """The samples a random read decodes together, for chunk-aware sampling: a chunk's, or 1
        where a row is read alone from its chunk (h5forge.read._direct; a ragged field's chunks
        hold elements)."""
        return max(self._read_together.values(), default=1)

    def __len__(self) -> int:
        return self.count

    # ---- pinning (docs/reading.md, "Retention and live readers") ------------------------------
    def _pin(self) -> None:
        """Hold this process's lease on the version file, so retention keeps it while we live."""
        if self._pinned_pid != os.getpid() and VERSION_RE.match(os.path.basename(self.real_path)):
            if leases.acquire(self.real_path):
                self._pinned_pid = os.getpid()

    def _unpin(self) -> None:
        if self._pinned_pid == os.getpid():
            self._pinned_pid = None
            leases.release(self.real_path)

    def _deleted(self) -> ReadError:
        return ReadError(
            f"{self._where()}: version {self.version} ({self.real_path}) no longer exists: it was "
            "deleted after this reader pinned it (by hand, or by retention on a host whose file "
            "locks this one cannot see); open the dataset again to read its current version"
        )

    def _replaced(self) -> ReadError:
        return ReadError(
            f"{self._where()}: version {self.version} ({self.real_path}) was replaced by another file of "
            "its name after this reader opened it (its folder deleted and built again?); open the "
            "dataset again to read the file there now"
        )

    def _opened(self, f: h5py.File) -> h5py.File:
        """``f``, when it is the file this reader opened first; else closed, and a ReadError."""
        now = opened_identity(f)
        if self.identity is not None and now is not None and now != self.identity:
            f.close()
            raise self._replaced()
        return f

    def _open_plain(self) -> h5py.File:
        """A short-lived handle (for ids, columns, lengths); a deleted version is a ReadError."""
        try:
            return self._opened(_open(self.real_path, self.locking))
        except FileNotFoundError:
            raise self._deleted() from None

    # ---- handles -----------------------------------------------------------------------------
    def _handles(self) -> dict[str, h5py.Dataset]:
        pid = os.getpid()
        if self._file is None or self._pid != pid:
            if self._file is not None:  # inherited through fork: never share it, open our own
                self._drop()
            ensure_filters()  # a spawned/forkserver worker has not registered hdf5plugin yet
            self._pin()  # a DataLoader worker holds its own lease
            if not os.path.exists(self.real_path):
                raise self._deleted()
            if self.sources:
                self._check_sources_exist()
            try:
                self._file = self._opened(
                    _open(self.real_path, self.locking, rdcc_nbytes=self.rdcc_nbytes, rdcc_nslots=self.rdcc_nslots)
                )
            except FileNotFoundError:
                raise self._deleted() from None
            g = self._file[self.split]
            self._dsets = {name: g[fi.path] for name, fi in self.fields.items() if fi.bulk and not fi.ragged}
            # a mapped field is read from the files it maps, never through HDF5's virtual datasets
            self._direct = {name: _rows_reader(d, cache_chunks=self.cache_chunks) for name, d in self._dsets.items()}
            self._ragged = {
                name: arrays.RowReader(g, fi.path, fi.kind.stored()) for name, fi in self.fields.items() if fi.ragged
            }
            # a ragged field stored one element per chunk (a CT case's slices): an element is a chunk too
            self._direct.update((name, _rows_reader(r.values, self.slice_cache)) for name, r in self._ragged.items())
            # small columns (labels, annotations) are read whole, once per process: a batch then
            # costs a take() instead of an HDF5 call per row
            self._columns = {name: read_all(g[fi.path]) for name, fi in self.fields.items() if not fi.bulk}
            self._pid = pid
        return self._dsets

    def _drop(self) -> None:
        f, self._file, self._dsets, self._columns, self._ragged = self._file, None, {}, {}, {}
        self._direct = {}
        if self.sources:
            SOURCES.release(self.sources)
        if f is not None:
            try:
                f.close()
            except OSError:  # a handle whose file went away: nothing left to release
                pass

    def close(self) -> None:
        """Close this process's handle (it is reopened on the next read)."""
        if self._pid == os.getpid():
            self._drop()
        else:
            self._file, self._dsets, self._columns, self._ragged = None, {}, {}, {}
            self._direct = {}

    def __enter__(self) -> "SplitReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_file=None, _dsets={}, _direct={}, _columns={}, _ragged={}, _pid=None, _pinned_pid=None)
        return state

    def __del__(self) -> None:
        try:
            self.close()
            self._unpin()
        except Exception:  # at interpreter exit modules may already be gone; nothing to report to
            pass

    # ---- reads -------------------------------------------------------------------------------
    def row(self, i) -> int:
        """The row of index ``i`` (negative counts from the end); IndexError when out of range."""
        i = as_index(i, f"split {self.split!r} of {self.path}")
        j = i + self.count if i < 0 else i
        if not 0 <= j < self.count:
            raise IndexError(f"index {i} out of range for split {self.split!r} of {self.path} ({self.count} samples)")
        return j

    def checked(self, indices: Iterable[int]) -> np.ndarray:
        return checked_rows(indices, self.count, f"split {self.split!r} of {self.path}")

    def read_one(self, i: int, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Sample ``i`` of every field. ``out`` may hold arrays (one row, the stored dtype) to read
        fixed-size fields into when they are read as whole chunks; through h5py a row is a new array."""
        j = self.row(i)
        self._handles()
        return {
            name: self._ragged[name].row(j)
            if fi.ragged
            else self._row(name, j, out)
            if fi.bulk
            else self._columns[name][j]
            for name, fi in self.fields.items()
        }

    def _row(self, name: str, j: int, out: dict[str, np.ndarray] | None = None) -> np.ndarray:
        direct = self._direct.get(name)
        if direct is None:
            try:
                return self._dsets[name][j]
            except ReadError:
                raise
            except OSError as err:  # a damaged chunk
                raise unreadable(self._dsets[name], f"row {j}", err) from None
        if out is not None and name in out:
            direct.read_into(j, out[name])
            return out[name]
        return direct.row(j)

    def read(
        self, indices: Iterable[int], out: dict[str, np.ndarray] | None = None, fields: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """Rows ``indices`` of every field, in the order asked: {field: (len(indices), *shape) uint8}.

        ``out`` may hold preallocated arrays to fill (e.g. shared-memory buffers).
        """
        idx = self.checked(indices)
        dsets = self._handles()
        result: dict[str, Any] = {}  # arrays; a ragged field's rows are a list of arrays
        for name, fi in self.fields.items():
            if fields is not None and name not in fields:
                continue
            if not fi.bulk:
                result[name] = self._columns[name][idx]
            elif fi.ragged:
                result[name] = self._read_ragged(name, idx)
            else:
                target = out[name] if out is not None and name in out else np.empty((idx.size, *fi.shape), fi.dtype)
                direct = self._direct.get(name)
                result[name] = gather(dsets[name] if direct is None else direct, idx, target)
        return result

    def _read_ragged(self, name: str, idx: np.ndarray) -> list[np.ndarray]:
        """The rows ``idx`` of a ragged field, in that order; each run of rows is one read."""
        got: dict[int, np.ndarray] = {}
        for start, stop, _ in coalesce(np.unique(idx)):
            block = self._ragged[name](start, stop)
            got.update((start + j, block[j]) for j in range(stop - start))
        return [got[int(i)] for i in idx]

    def read_element(self, name: str, element: int) -> np.ndarray:
        """One element (a CT slice) of a ragged field by its position across the split."""
        if self._file is None or self._pid != os.getpid():
            self._handles()
        direct = self._direct.get(name)
        if direct is not None:
            return direct.element(element)
        return self.read_elements(name, [element])[0]

    def read_elements(self, name: str, elements: np.ndarray | list[int]) -> np.ndarray:
        """Elements (e.g. CT slices) of a ragged field by their position across the split, in the
        order asked; runs of neighbouring elements are one read each."""
        if self._file is None or self._pid != os.getpid():
            self._handles()
        direct = self._direct.get(name)
        if direct is not None:  # one chunk per element: each read whole from the mapped file
            return direct.read_list(elements if isinstance(elements, list) else elements.tolist())
        values = self._ragged[name].values
        elements = np.asarray(elements, dtype=np.int64)
        if elements.size == 1:  # one slice: one read, no run planning
            return values[int(elements[0])][None]
        return gather(values, elements, np.empty((elements.size, *values.shape[1:]), dtype=values.dtype))

    def lengths(self, name: str) -> np.ndarray:
        """Each row's length in a ragged field (a CT case's depth)."""
        with self._open_plain() as f:
            return read_all(f[self.split][self.fields[name].path + arrays.LENGTHS])

    # ---- per-sample columns ------------------------------------------------------------------
    def ids(self) -> list[str]:
        with self._open_plain() as f:
            return decode_str(read_all(f[self.split][IDS]))

    def meta(self, column: str) -> np.ndarray:
        """A whole annotation column in row order; text as ``str``, as ``ds[i]`` returns it."""
        with self._open_plain() as f:
            g = f[self.split]
            if column_path(column) not in g:
                raise ReadError(f"{self._where()}: split {self.split!r} has no annotation column {column!r}")
            ds = g[column_path(column)]
            if h5py.check_string_dtype(ds.dtype) is None:
                return read_all(ds)
            if not ds.is_virtual:
                return ds.asstr()[()]
            values = read_all(ds)  # a mapped column: read from its files, then decoded as asstr() does
            return np.array([v.decode("utf-8") if isinstance(v, bytes) else v for v in values.ravel()], object).reshape(
                values.shape
            )


class SliceIndex:
    """The slices of a reader's ragged fields (CT cases) numbered across the split, for 2-D training:
    slice ``i`` is element ``pos`` of case ``case[i]``. With ``context`` k, a slice comes with its k
    neighbours on each side as channels (2.5-D), repeated at the case's first and last slice."""

    def __init__(self, reader: SplitReader, context: int = 0):
        ragged = [name for name, fi in reader.fields.items() if fi.ragged]
        if not ragged:
            raise ReadError(
                f"{reader.path}: unit='slice' needs a ragged field (a volume); fields are {list(reader.fields)}"
            )
        lengths = reader.lengths(ragged[0])
        for name in ragged[1:]:
            if not np.array_equal(reader.lengths(name), lengths):
                raise ReadError(
                    f"{reader.path}: {name!r} and {ragged[0]!r} differ in depth: their slices cannot be read together"
                )
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.ragged, self.context = ragged, int(context)
        self.case = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        self.first = np.repeat(starts[:-1], lengths)
        self.last = np.repeat(starts[1:] - 1, lengths)

    def __len__(self) -> int:
        return len(self.case)

    def elements(self, slices: np.ndarray) -> np.ndarray:
        """(n, 2k+1) element positions of the slices and their neighbours, clamped to each case."""
        offsets = np.arange(-self.context, self.context + 1)
        wanted = slices[:, None] + offsets[None, :]
        return np.clip(wanted, self.first[slices][:, None], self.last[slices][:, None])

    def one(self, reader: SplitReader, i: int) -> dict[str, Any]:
        """What ``read(reader, [i])`` gives, without planning a batch: {field: slice ``i``'s ([2k+1,]
        H, W) stored values, or for the other fields the case's value as a batch of one}."""
        out: dict[str, Any] = {name: self.stack(reader, name, i) for name in self.ragged}
        if len(out) < len(reader.fields):
            others = [name for name in reader.fields if name not in out]
            out.update(reader.read([self.case.item(self.position(i))], fields=others))
        return {name: out[name] for name in reader.fields}

    def position(self, i: int) -> int:
        """Slice ``i``'s position across the split (negative counts from the end); IndexError out of range."""
        n = len(self.case)
        i = as_index(i, "the slices")
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"slice index {i} out of range ({n} slices)")
        return j

    def stack(self, reader: SplitReader, name: str, i: int) -> np.ndarray:
        """Slice ``i`` of the ragged field ``name``, (H, W), or with context its (2k+1, H, W) stack."""
        j, k = self.position(i), self.context
        if not k:
            return reader.read_element(name, j)
        lo, hi = self.first.item(j), self.last.item(j)
        return reader.read_elements(name, [min(max(e, lo), hi) for e in range(j - k, j + k + 1)])

    def read(self, reader: SplitReader, slices: Iterable[int]) -> dict[str, np.ndarray]:
        """{field: (n, [2k+1,] H, W) slices, or the case's value for the other fields}."""
        idx = as_indices(list(slices) if not isinstance(slices, (np.ndarray, range)) else slices, "the slices")
        idx = np.where(idx < 0, idx + len(self), idx)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"slice index out of range ({len(self)} slices)")
        elements = self.elements(idx)
        out = {}
        for name in self.ragged:
            block = reader.read_elements(name, elements.ravel()).reshape(*elements.shape, *reader.fields[name].shape)
            out[name] = block[:, 0] if self.context == 0 else block
        others = [name for name in reader.fields if name not in self.ragged]
        if others:
            out.update(reader.read(self.case[idx], fields=others))
        return {name: out[name] for name in reader.fields}


def output_dtypes(reader: SplitReader, opts: ReadOptions) -> dict[str, np.dtype | None]:
    """What each field of ``reader`` is returned as (None: a list of Python values); refuses bad options."""
    return {name: fi.kind.output_dtype(opts) for name, fi in reader.fields.items()}


def model_values(info: FieldInfo, raw: Any, opts: ReadOptions, dtype: np.dtype | None, axis: int = 1) -> Any:
    """Model-ready values of stored rows (``axis`` is the channel axis), as the field's kind says:
    an array, a list of strings, or for a ragged field ``Padded(values, lengths)``."""
    if dtype is None:
        return decode_str(raw)
    if info.ragged:
        rows = [info.kind.windowed(_converted(info, r, opts, dtype, axis - 1), opts) for r in raw]
        if not rows:
            return Padded(np.zeros((0, 0, *info.shape), dtype), np.zeros(0, np.int64))
        return pad_batch(rows, dtype=dtype)
    return _converted(info, raw, opts, dtype, axis)


def sample_value(info: FieldInfo, raw: Any, opts: ReadOptions, dtype: np.dtype | None) -> Any:
    """The model value of one stored row (a ragged row keeps its own length, or the window's)."""
    if info.ragged:
        return (
            decode_str([raw])[0] if dtype is None else info.kind.windowed(_converted(info, raw, opts, dtype, 0), opts)
        )
    return model_values(info, np.asarray(raw)[None], opts, dtype)[0]


def dense_values(info: FieldInfo, raw: np.ndarray, opts: ReadOptions, dtype: np.dtype | None) -> Any:
    """Model values of rows that are plain arrays, whatever the field's layout (e.g. CT slices)."""
    return decode_str(raw) if dtype is None else _converted(info, raw, opts, dtype, 1)


def _converted(info: FieldInfo, raw: np.ndarray, opts: ReadOptions, dtype: np.dtype, axis: int) -> np.ndarray:
    if raw.dtype == dtype:
        return raw
    out = np.empty(raw.shape, dtype=dtype)
    info.kind.convert(raw, out, opts, info.stats, axis)
    return out


INDEX_FIELD = "index"  # the key of the row numbers when a reader is asked to return them


def model_batch(
    reader: SplitReader, indices, opts: ReadOptions, channels_last: bool = False, return_index: bool = False
) -> dict[str, Any]:
    """Rows ``indices`` as model-ready values {field: (B, C, H, W)} (or (B, H, W, C) when
    ``channels_last``), in the order asked; with ``return_index`` also {"index": the rows}."""
    dtypes = output_dtypes(reader, opts)
    out = {}
    for name, raw in reader.read(indices).items():
        v = model_values(reader.fields[name], raw, opts, dtypes[name])
        out[name] = np.ascontiguousarray(np.moveaxis(v, 1, -1)) if channels_last and getattr(v, "ndim", 0) > 2 else v
    if return_index:
        out[INDEX_FIELD] = reader.checked(indices)
    return out

"""Rows of a mapped dataset — a virtual dataset of a mapped or thin version — read from the files
it maps, never through HDF5's virtual-dataset machinery.

HDF5 keeps every source file a virtual dataset has read open for as long as the dataset is open,
and a source it cannot open (missing, unreadable, or no file descriptor left) reads as the fill
value, without an error. A version mapped onto a thousand worker files therefore returns zeros
once the process runs out of descriptors. Here the mapping (which rows of which dataset of which
file) is read from the virtual dataset's creation properties, and each row is read from its file:

- a field stored one row per chunk with the ``none``, ``lz4`` or ``gzip`` codec is read as its
  stored chunk, decoded by ``chunk_codec`` straight from the file mapped read-only (as
  ``read._direct`` reads a self-contained version), the chunk addresses listed once per source
  dataset and kept; stored several rows per chunk (``none`` or ``lz4``), a row is decoded alone
  where the writer joined the rows' chunks (``chunk_codec.row_at``), else read by h5py;
- anything else (strings, small columns, a ragged field's elements, other codecs) is read by h5py
  from the source dataset itself, which is a plain stored dataset.

Files are held open in one least-recently-used set per process (``SOURCES``) whose size stays well
under the process's ``RLIMIT_NOFILE``, shared by every reader in it. A source that cannot be
opened or read, a row no file holds, a chunk never written: each is a ``ReadError`` naming the
file, never a value the file did not hold.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import mmap
import os
import re
import resource
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from h5forge.errors import H5forgeError, ReadError, TooManyOpenFiles
from h5forge._format.chunk_codec import DEFLATE_FILTER, LZ4_FILTER, lz4_at, lz4_into, row_at

MAX_OPEN_SOURCES = 1024  # files kept open at most, whatever the descriptor limit allows
FDS_PER_SOURCE = 2  # a source may hold its map's descriptor (chunk reads) and HDF5's own


def open_sources_budget() -> int:
    """How many source files a process keeps open: an eighth of its descriptor limit (the rest is
    for the version files, the loader's pipes and sockets, the user's own files), divided by what
    one source may hold, at most ``MAX_OPEN_SOURCES`` and at least one."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 1 << 16
    return max(1, min(MAX_OPEN_SOURCES, soft // 8 // FDS_PER_SOURCE))


def out_of_descriptors(err: BaseException, what: str | os.PathLike | None = None) -> TooManyOpenFiles | None:
    """``err`` as a one-line error naming the descriptor limit when its cause is the process
    having none left (EMFILE; h5py gives that errno in its message only), else None. ``what``:
    the file being opened, when the error does not name it."""
    if isinstance(err, TooManyOpenFiles):
        return err
    if isinstance(err, H5forgeError):  # it says what happened already
        return None
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and (cause.errno == errno.EMFILE or f"errno = {errno.EMFILE}," in str(cause)):
            break
        cause = cause.__cause__ or cause.__context__
    else:
        return None
    name = what if what is not None else getattr(cause, "filename", None)
    if name is None:  # HDF5 names the file in its message
        found = re.search(r"name = '([^']+)'", str(cause))
        name = found.group(1) if found else None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    opening = f" opening {os.fsdecode(name)}" if name else ""
    return TooManyOpenFiles(f"no file descriptor left{opening}: ulimit -n is {soft}, too low for this run; raise it")


class _Map:
    """A source file mapped read-only: a row's chunk is a slice of it, decoded with no system call."""

    def __init__(self, mm: mmap.mmap | None):
        self.mm = mm
        self.length = len(mm) if mm is not None else 0
        self.view = memoryview(mm) if mm is not None else memoryview(b"")
        self._anchor = np.frombuffer(self.view, np.uint8)
        self.base = self._anchor.ctypes.data if self.length else 0

    def close(self) -> None:
        del self._anchor
        self.view.release()
        if self.mm is not None:
            self.mm.close()


Identity = tuple[int, int, int, int]  # a file's device, inode, size and modification time


def identity(path: str) -> Identity | None:
    """What tells the file now at ``path`` from another later put there; None when there is none."""
    try:
        return _identity(os.stat(path))
    except OSError:
        return None


def _identity(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def identity_of(fd: int) -> Identity:
    return _identity(os.fstat(fd))


def opened_identity(f: h5py.File) -> Identity | None:
    """``identity`` of the file HDF5 has open as ``f`` (None for a driver without a descriptor)."""
    try:
        return identity_of(f.id.get_vfd_handle())
    except (OSError, ValueError, RuntimeError, AttributeError):
        return None


class _Open:
    """One source file's open handles: the file mapped for chunk reads, HDF5's file when needed.
    Both must be the file ``ident`` names (when given): the one at the path when the version was
    opened, not another put there since (a version deleted and built again has the same names)."""

    def __init__(self, path: str, ident: Identity | None = None):
        self.path, self.ident = path, ident
        self.map: _Map | None = None
        self.h5: h5py.File | None = None
        self.datasets: dict[str, h5py.Dataset] = {}  # opened in h5, by name

    def mapped(self) -> _Map:
        if self.map is None:
            try:
                fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                try:  # the map keeps a descriptor of its own
                    st = os.fstat(fd)
                    self._check(_identity(st))
                    size = st.st_size
                    self.map = _Map(mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else None)
                finally:
                    os.close(fd)
            except (OSError, ValueError) as err:
                reason = getattr(err, "strerror", None) or str(err)
                raise ReadError(f"{self.path}: a file this version maps cannot be opened ({reason})") from None
        return self.map

    def file(self) -> h5py.File:
        if self.h5 is None:
            h5 = _open_h5(self.path)
            try:
                self._check(opened_identity(h5))
            except BaseException:
                h5.close()
                raise
            self.h5 = h5
        return self.h5

    def _check(self, opened: Identity | None) -> None:
        if self.ident is not None and opened != self.ident:
            raise ReadError(
                f"{self.path}: a file this version maps was replaced after the version was opened "
                "(open the version again)"
            )

    def close(self) -> None:
        m, self.map = self.map, None
        if m is not None:
            m.close()
        self.close_h5()

    def close_h5(self) -> None:
        h5, self.h5, self.datasets = self.h5, None, {}
        if h5 is not None:
            try:
                h5.close()
            except Exception:  # noqa: BLE001 - a handle whose file went away: nothing left to release
                pass


def _open_h5(path: str) -> h5py.File:
    try:
        try:
            return h5py.File(path, "r")
        except OSError as err:
            if "locking flag" not in str(err):
                raise
            return h5py.File(path, "r", locking=False)  # already open here without file locks
    except Exception as err:  # noqa: BLE001 - whatever stops it, the file's rows cannot be read
        reason = getattr(err, "strerror", None) or str(err).split("(")[0].strip() or type(err).__name__
        raise ReadError(f"{path}: a file this version maps cannot be opened as HDF5 ({reason})") from None


class SourceFiles:
    """Source files open in this process, the least recently used closed first past ``capacity``.
    One lock guards the set and the reads through it (HDF5 serialises its calls anyway)."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self.lock = threading.RLock()
        self._open: OrderedDict[tuple[str, Identity | None], _Open] = OrderedDict()
        self._pid = os.getpid()

    def get(self, path: str, ident: Identity | None = None) -> _Open:
        """The open handles of the file ``ident`` at ``path`` (opened lazily; call with ``lock`` held)."""
        if self._pid != os.getpid():  # inherited through fork: the parent's handles are not ours
            self._open = OrderedDict()
            self._pid = os.getpid()
        key = (path, ident)
        entry = self._open.get(key)
        if entry is not None:
            self._open.move_to_end(key)
            return entry
        limit = self.capacity if self.capacity is not None else open_sources_budget()
        while len(self._open) >= limit:
            self._open.popitem(last=False)[1].close()
        entry = self._open[key] = _Open(path, ident)
        return entry

    def close_all(self) -> None:
        with self.lock:
            while self._open:
                self._open.popitem(last=False)[1].close()

    def release(self, paths) -> None:
        """Close ``paths`` if open (a reader that closes gives back its files: a deleted version's
        files then free their space; another reader of them opens them again when it reads)."""
        with self.lock:
            gone = set(paths)
            for key in [key for key in self._open if key[0] in gone]:
                self._open.pop(key).close()

    def __len__(self) -> int:
        return len(self._open)


SOURCES = SourceFiles()
MAPPINGS_KEPT = 256  # mapped datasets whose mapping this process keeps for a next open
_mappings: "OrderedDict[tuple, MappedDataset]" = OrderedDict()
_mappings_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child starts with no source open and free locks: a lock another thread of the
    parent held at the fork would never be released in the child."""
    global _mappings_lock
    SOURCES.lock = threading.RLock()
    SOURCES._open = OrderedDict()
    SOURCES._pid = os.getpid()
    _mappings_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True)
class _Chunks:
    """Where each stored chunk lies in a source file, by chunk number, and its codec. Lists, not
    arrays: a row's look-up is then a plain index."""

    offsets: list[int]  # -1: never written
    sizes: list[int]
    masks: list[int]
    codec: str  # none | lz4 | gzip
    rows: int  # rows per chunk


def _codec_of(sd: h5py.Dataset) -> str | None:
    """The codec ``chunk_codec`` decodes for a dataset stored whole rows per chunk (several: only
    ``none`` and ``lz4``); None otherwise."""
    dcpl = sd.id.get_create_plist()
    if (
        dcpl.get_layout() != h5py.h5d.CHUNKED
        or sd.chunks is None
        or sd.chunks[1:] != sd.shape[1:]
        or not sd.dtype.isnative
        or sd.dtype.hasobject
        or len(sd.shape) < 2
    ):
        return None
    filters = [dcpl.get_filter(k)[0] for k in range(dcpl.get_nfilters())]
    codec = {(): "none", (LZ4_FILTER,): "lz4", (DEFLATE_FILTER,): "gzip"}.get(tuple(filters))
    return codec if sd.chunks[0] == 1 or codec != "gzip" else None


def _list_chunks(sd: h5py.Dataset, m: _Map) -> _Chunks | None:
    """The chunk addresses of ``sd``, when a chunk read at its address equals HDF5's own read of it."""
    codec = _codec_of(sd)
    if codec is None:
        return None
    rows = int(sd.chunks[0])
    n = -(-sd.shape[0] // rows)
    offsets, sizes, masks = np.full(n, -1, np.int64), np.zeros(n, np.int64), np.zeros(n, np.uint32)

    def visit(info) -> None:
        c = info.chunk_offset[0] // rows
        offsets[c], sizes[c], masks[c] = info.byte_offset, info.size, info.filter_mask

    try:
        sd.id.chunk_iter(visit)
    except (OSError, ValueError, RuntimeError, AttributeError):
        return None
    written = np.flatnonzero(offsets >= 0)
    if written.size:
        if int((offsets[written] + sizes[written]).max()) > m.length:
            return None  # HDF5 reads what it can of a file cut short, and says what it cannot
        first = int(written[0])
        mask, chunk = sd.id.read_direct_chunk((first * rows, *(0,) * (sd.ndim - 1)))
        o, z = int(offsets[first]), int(sizes[first])
        if mask != masks[first] or m.view[o : o + z].tobytes() != chunk:  # bytes compare with memcmp
            return None
    return _Chunks(offsets.tolist(), sizes.tolist(), masks.tolist(), codec, rows)


@dataclass(frozen=True)
class _Piece:
    start: int  # first row in the mapped dataset
    count: int
    source: int  # index into the dataset's sources
    source_start: int  # first row in the source dataset


class MappedDataset:
    """A virtual dataset read from the files it maps (see the module's docstring). Indexes like the
    h5py dataset for what h5forge asks of one: an int (a row), a slice of rows, ``()`` or ``...``."""

    is_virtual = True

    def __init__(self, d: h5py.Dataset, files: SourceFiles | None = None):
        self.name, self.shape, self.dtype = d.name, tuple(d.shape), d.dtype
        self.files = files if files is not None else SOURCES
        folder = Path(os.path.realpath(d.file.filename)).parent
        own = os.path.realpath(d.file.filename)
        dcpl = d.id.get_create_plist()
        sources: list[tuple[str, str]] = []
        known: dict[tuple[str, str], int] = {}
        pieces: list[_Piece] = []
        for i in range(dcpl.get_virtual_count()):
            name = os.fsdecode(dcpl.get_virtual_filename(i))
            path = own if name == "." else str(Path(name) if os.path.isabs(name) else folder / name)
            key = (path, dcpl.get_virtual_dsetname(i))
            where = known.setdefault(key, len(sources))
            if where == len(sources):
                sources.append(key)
            dst, src = dcpl.get_virtual_vspace(i), dcpl.get_virtual_srcspace(i)
            lo, hi = _rows_selected(dst, self.shape)
            # a source selected whole starts at its row 0 (HDF5 may keep no extent for it); its
            # length is checked against the source dataset when rows are read
            slo, shi = (0, hi - lo) if src.get_select_type() == h5py.h5s.SEL_ALL else _rows_selected(src, None)
            if lo < 0 or slo < 0 or hi - lo != shi - slo:
                raise ReadError(f"{own}: {d.name} maps {hi - lo} rows onto {shi - slo} rows of {path}")
            pieces.append(_Piece(lo, hi - lo, where, slo))
        pieces.sort(key=lambda p: p.start)
        self.sources, self.pieces = sources, pieces
        self.paths = [path for path, _ in sources]
        self.idents = [identity(path) for path in self.paths]  # the files mapped now, not later ones at their paths
        # per piece, in row order, as plain lists: a row's look-up is a bisection and a few indexes
        self.starts = [p.start for p in pieces]
        self.ends = [p.start + p.count for p in pieces]
        self.shift = [p.source_start - p.start for p in pieces]  # source row = row + shift
        self.of_source = [p.source for p in pieces]
        self.version_file = own
        self._chunks: dict[int, _Chunks | None] = {}  # per source, listed on its first row read
        self.row_shape = self.shape[1:]
        self.row_nbytes = int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    # ---- where a row is ----------------------------------------------------------------------
    def _piece(self, row: int) -> _Piece:
        k = bisect.bisect_right(self.starts, row) - 1
        if k < 0 or row >= self.pieces[k].start + self.pieces[k].count:
            raise ReadError(f"{self.version_file}: row {row} of {self.name} is mapped to no file")
        return self.pieces[k]

    def _fail(self, source: int, what: str) -> ReadError:
        path, dset = self.sources[source]
        return ReadError(f"{path}: {dset} {what} (a file {self.version_file} maps)")

    # ---- rows --------------------------------------------------------------------------------
    def read_into(self, row: int, out: np.ndarray) -> None:
        """Row ``row`` into ``out`` (one row, C order, this dataset's dtype)."""
        k = bisect.bisect_right(self.starts, row) - 1
        if k < 0 or row >= self.ends[k]:
            raise ReadError(f"{self.version_file}: row {row} of {self.name} is mapped to no file")
        source, src_row = self.of_source[k], row + self.shift[k]
        with self.files.lock:
            handles = self.files.get(self.paths[source], self.idents[source])
            chunks = self._chunks[source] if source in self._chunks else self._chunk_list(source, handles)
            if chunks is not None and out.flags.c_contiguous and out.nbytes == self.row_nbytes:
                self._chunk_into(source, chunks, src_row, handles, out)
            else:
                self._h5_into(source, handles, src_row, src_row + 1, out[None])

    def read_rows(self, rows: np.ndarray, target: np.ndarray, positions: np.ndarray) -> None:
        """Each of ``rows`` into ``target[positions[k]]`` (the reader's batched read)."""
        for row, pos in zip(rows.tolist(), positions.tolist()):
            self.read_into(row, target[pos])

    def row(self, row: int) -> np.ndarray:
        out = np.empty(self.row_shape, self.dtype)
        self.read_into(row, out)
        return out

    def element(self, row: int) -> np.ndarray:
        return self.row(row)

    def read_list(self, rows: list[int]) -> np.ndarray:
        """A new array of ``len(rows)`` rows, row ``rows[k]`` at k."""
        out = np.empty((len(rows), *self.row_shape), self.dtype)
        for k, row in enumerate(rows):
            self.read_into(row, out[k])
        return out

    def read_range(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as one new array."""
        out = np.empty((max(0, stop - start), *self.row_shape), self.dtype)
        at = start
        while at < stop:
            p = self._piece(at)
            end = min(stop, p.start + p.count)
            a = p.source_start + at - p.start
            with self.files.lock:
                handles = self.files.get(self.paths[p.source], self.idents[p.source])
                chunks = self._chunk_list(p.source, handles) if not self.dtype.hasobject else None
                if chunks is not None:
                    for k in range(end - at):
                        self._chunk_into(p.source, chunks, a + k, handles, out[at - start + k])
                else:
                    self._h5_into(p.source, handles, a, a + end - at, out[at - start : end - start])
            at = end
        return out

    def __getitem__(self, sel: Any) -> Any:
        if sel is Ellipsis or (isinstance(sel, tuple) and not sel):
            return self.read_range(0, len(self))
        if isinstance(sel, (int, np.integer)):
            i = int(sel) + (len(self) if sel < 0 else 0)
            if not 0 <= i < len(self):
                raise IndexError(f"index {int(sel)} out of range for {self.name} ({len(self)} rows)")
            return self.read_range(i, i + 1)[0]
        if isinstance(sel, slice):
            start, stop, step = sel.indices(len(self))
            block = self.read_range(start, max(start, stop) if step > 0 else start)
            return block if step == 1 else self.read_range(0, len(self))[sel]
        raise TypeError(f"{self.name}: a mapped dataset is read by row, slice or (); not {sel!r}")

    # ---- from one source ---------------------------------------------------------------------
    def _dataset(self, source: int, handles: _Open) -> h5py.Dataset:
        dset = self.sources[source][1]
        sd = handles.datasets.get(dset)
        if sd is not None:
            return sd
        f = handles.file()
        try:
            sd = f[dset]
        except KeyError:
            raise self._fail(source, "is not in the file") from None
        if not isinstance(sd, h5py.Dataset) or sd.is_virtual:
            raise self._fail(source, "is not a stored dataset")
        handles.datasets[dset] = sd
        return sd

    def _chunk_list(self, source: int, handles: _Open) -> _Chunks | None:
        if source not in self._chunks:
            # the file stays open with its entry: the version's other fields list their chunks in it too
            self._chunks[source] = _list_chunks(self._dataset(source, handles), handles.mapped())
        return self._chunks[source]

    def _chunk_into(self, source: int, chunks: _Chunks, row: int, handles: _Open, out: np.ndarray) -> None:
        """Row ``row`` of the source into ``out`` (C-contiguous, one row's bytes) from its stored chunk."""
        c, at = divmod(row, chunks.rows)
        if not 0 <= c < len(chunks.offsets) or chunks.offsets[c] < 0:
            raise self._fail(source, f"has no stored chunk for row {row}")
        offset, size, n = chunks.offsets[c], chunks.sizes[c], self.row_nbytes
        m = handles.map if handles.map is not None else handles.mapped()
        if offset + size > m.length:  # the file is shorter than when its chunks were listed
            raise self._fail(source, f"row {row}: its stored chunk is cut short")
        dst = ctypes.addressof(ctypes.c_char.from_buffer(out))  # type: ignore[arg-type]  # an ndarray is a buffer
        if chunks.rows > 1:  # a row alone from a chunk of joined rows' chunks; else through HDF5
            codec = "none" if chunks.masks[c] & 1 else chunks.codec
            if not row_at(codec, m.view[offset : offset + size], m.base + offset, dst, n, at, chunks.rows):
                self._h5_into(source, handles, row, row + 1, out[None])
            return
        if chunks.codec == "none" or chunks.masks[row] & 1:  # the bytes are the row
            if size != n:
                raise self._fail(source, f"row {row}: its stored chunk holds {size} bytes, a row {n}")
            ctypes.memmove(dst, m.base + offset, n)
            return
        stored = m.view[offset : offset + size]
        if chunks.codec == "lz4":
            if not lz4_at(stored, m.base + offset, dst, n) and not lz4_into(stored, out.reshape(-1).view(np.uint8)):
                raise self._fail(source, f"row {row}: its stored chunk does not decode")
            return
        try:
            unpacked = zlib.decompress(stored)
        except zlib.error:
            raise self._fail(source, f"row {row}: its stored chunk does not decode") from None
        if len(unpacked) != n:
            raise self._fail(source, f"row {row}: its stored chunk does not decode")
        out.reshape(-1).view(np.uint8)[:] = np.frombuffer(unpacked, np.uint8)

    def _h5_into(self, source: int, handles: _Open, a: int, b: int, out: np.ndarray) -> None:
        sd = self._dataset(source, handles)
        if b > sd.shape[0]:
            raise self._fail(source, f"has {sd.shape[0]} rows; the version maps rows up to {b}")
        try:
            out[...] = sd[a:b]
        except (OSError, ValueError, RuntimeError) as err:
            raise self._fail(source, f"rows {a}:{b} cannot be read ({err})") from None


def _rows_selected(space: h5py.h5s.SpaceID, shape: tuple[int, ...] | None) -> tuple[int, int]:
    """The rows a mapping's selection spans, [lo, hi): whole rows, one run of them (anything else
    is not a mapping h5forge writes: (-1, -1))."""
    dims = tuple(int(x) for x in space.shape)
    if space.get_select_type() == h5py.h5s.SEL_ALL:
        return (0, dims[0]) if dims else (-1, -1)
    if space.get_select_type() != h5py.h5s.SEL_HYPERSLABS or not dims:
        return -1, -1
    lo, hi = space.get_select_bounds()
    rows = int(hi[0]) + 1 - int(lo[0])
    whole = all(a == 0 and b + 1 == n for a, b, n in zip(lo[1:], hi[1:], (shape or dims)[1:]))
    if not whole or space.get_select_npoints() != rows * int(np.prod(dims[1:], dtype=np.int64)):
        return -1, -1
    return int(lo[0]), int(hi[0]) + 1


def rows_of(d: h5py.Dataset) -> Any:
    """``d`` itself, or for a virtual dataset a ``MappedDataset`` that reads from its files.

    A mapping is read once per file and dataset: a published version never changes, so the same
    file (device, inode, size, modification time) maps the same rows, and the chunk addresses
    listed for it stay valid. Verify and the rebuild's checks open one dataset per block of rows."""
    if not d.is_virtual:
        return d
    try:
        st = os.stat(os.path.realpath(d.file.filename))
    except OSError:  # a file being built in memory: nothing to key its mapping on
        return MappedDataset(d)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, d.name)
    with _mappings_lock:
        kept = _mappings.get(key)
        if kept is not None:
            _mappings.move_to_end(key)
            return kept
    made = MappedDataset(d)
    with _mappings_lock:
        _mappings[key] = made
        while len(_mappings) > MAPPINGS_KEPT:
            _mappings.popitem(last=False)
    return made


def read_all(d: h5py.Dataset) -> np.ndarray:
    """Every value of ``d`` (a virtual one read from the files it maps)."""
    return rows_of(d)[()]

"""Version files in object storage (``https://``, ``s3://``, ``gs://``), read by ranged requests.

On top of the store's objects (h5forge._format.objects; docs/reading.md, "From a bucket"):

- **One open, then ranged reads.** The open reads the metadata once through h5py over fsspec,
  and each row's chunk offset and size from the chunk index object ``push`` writes (else from
  HDF5's chunk index); a batch is then its rows' byte ranges, merged where close, fetched
  concurrently and decoded in process. No HDF5 call is made per sample.
- **Pinned version.** A pointer is followed once, at the open; the version object is pinned to
  its size and ETag, so a replaced object stops the epoch.
- **Verified rows.** ``verify_rows`` checks each row read against its stored checksum.
- **Worker safe.** Pickling carries the address and the chunk tables, never a connection.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence
from urllib.parse import urlsplit

import h5py
import numpy as np

from h5forge.errors import ReadError
from h5forge._format import arrays
from h5forge._format.checksums import PROVENANCE, file_format, row_checksum, values_digest
from h5forge._format.chunk_codec import DEFLATE_FILTER, LZ4_FILTER
from h5forge._format.codecs import ensure_filters
from h5forge._format.names import CHECKSUM, SPEC, Attr
from h5forge._format.objects import (
    RemoteObject,
    Retry,
    chunk_index_name,
    is_remote,
    parse_chunk_index,
    resolve,
    shown,
    sibling,
)
from h5forge.kinds import stored_kinds
from h5forge.read._direct import chunk_places, decode_chunk, row_chunk_codec
from h5forge.read._reader import DEFAULT_CACHE_CHUNKS, SplitReader, gather
from h5forge.spec import spec_from_json

MERGE_GAP = 4096  # two ranges closer than this are fetched as one (the gap is fetched and dropped)
MAX_MERGED = 16 << 20  # a merged range stops growing at this size, so a batch still fetches in parallel


@dataclass
class ChunkTable:
    """Where each row's chunk of one fixed field lies in the object, and how it is encoded."""

    offsets: np.ndarray  # int64, -1: never written
    sizes: np.ndarray  # int64
    masks: np.ndarray  # uint32: bit 0 set where the writer stored the chunk unfiltered
    codec: str  # none | lz4 | gzip
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @classmethod
    def of(cls, d: h5py.Dataset, index: dict[str, np.ndarray] | None = None) -> "ChunkTable | None":
        """The table of a dataset stored one row per chunk with a codec decoded here; else None.
        ``index``: its offsets, sizes and masks from a chunk index object, which saves walking
        HDF5's chunk index (a request per node)."""
        codec = row_chunk_codec(d, {(): "none", (LZ4_FILTER,): "lz4", (DEFLATE_FILTER,): "gzip"})
        if codec is None or d.chunks[0] != 1:
            return None
        n = d.shape[0]
        shape = tuple(int(s) for s in d.shape[1:])
        if index is not None and all(index[k].shape == (n,) for k in ("offsets", "sizes", "masks")):
            return cls(index["offsets"], index["sizes"], index["masks"].astype(np.uint32), codec, shape, d.dtype)
        try:
            offsets, sizes, masks = chunk_places(d)
        except (OSError, ValueError, RuntimeError, AttributeError):
            return None
        return cls(offsets, sizes, masks, codec, shape, d.dtype)

    def decode(self, chunk: bytes | memoryview, row: int, flat: np.ndarray) -> None:
        """Chunk bytes of ``row`` into ``flat`` (the row's bytes); a framing that does not add up is
        an error naming the row: never a row of zeros or of another row's bytes."""
        mask = self.masks.item(row)
        if self.codec != "gzip" or mask & 1:
            ok = decode_chunk(chunk, flat, self.codec, mask)
        else:
            try:
                plain = zlib.decompress(chunk)
            except zlib.error:
                plain = b""
            ok = len(plain) == flat.size
            if ok:
                flat[:] = np.frombuffer(plain, np.uint8)
        if not ok:
            raise ReadError(
                f"row {row}: its stored chunk does not decode to {flat.size} bytes (damaged in store or transit)"
            )


def plan_spans(
    wanted: Iterable[tuple[int, int]], gap: int = MERGE_GAP, largest: int = MAX_MERGED
) -> list[tuple[int, int, list[int]]]:
    """Byte ranges ``(start, stop)`` merged when less than ``gap`` apart (and no larger than
    ``largest``): [(start, stop, [index of each range it covers])], by start."""
    order = sorted(range(len(wanted := list(wanted))), key=lambda k: wanted[k][0])
    merged: list[tuple[int, int, list[int]]] = []
    for k in order:
        a, b = wanted[k]
        if merged and a - merged[-1][1] < gap and max(b, merged[-1][1]) - merged[-1][0] <= largest:
            s, e, members = merged[-1]
            merged[-1] = (s, max(e, b), [*members, k])
        else:
            merged.append((a, b, [k]))
    return merged


class ChunkCache:
    """Stored chunks kept on a local disk (opt-in), so a second epoch reads no network: a file per
    chunk under a folder per pinned object, renamed into place whole. The bytes kept never exceed
    ``limit``: each worker reserves a chunk's size in a shared count under a file lock first, and
    once it is full nothing more is kept (nothing is evicted)."""

    USAGE = ".usage"

    def __init__(self, folder: str | os.PathLike, obj: RemoteObject, limit: int):
        key = hashlib.sha256(f"{shown(obj.url)}\n{obj.size}\n{obj.etag}".encode()).hexdigest()[:24]
        self.root = Path(folder)
        self.folder = self.root / key
        self.limit = int(limit)
        self.hits = 0

    def get(self, start: int, stop: int) -> bytes | None:
        try:
            with open(self.folder / f"{start}-{stop}", "rb") as fh:
                data = fh.read()
        except OSError:
            return None
        if len(data) != stop - start:
            return None
        self.hits += 1
        return data

    def put(self, start: int, stop: int, data: bytes | memoryview) -> None:
        if not self._reserve(stop - start):
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / f"{start}-{stop}"
        tmp = self.folder / f".{start}-{stop}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, final)

    def _reserve(self, nbytes: int) -> bool:
        import fcntl

        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / self.USAGE, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            text = fh.read().strip()
            used = int(text) if text.isdigit() else 0
            if used + nbytes > self.limit:
                return False
            fh.seek(0)
            fh.truncate()
            fh.write(str(used + nbytes))
            return True


class RemoteSplitReader(SplitReader):
    """``SplitReader`` over a version object in a store (a URL): same values, same interface. Rows
    of fields stored one per chunk (``none``, ``lz4`` or ``gzip-N``) are fetched by ranged requests
    and decoded here, other fields are read by h5py over the fsspec file. ``verify_rows`` checks
    each row read against its stored checksum (fetching every value of the row); ``cache_dir``
    keeps fetched chunks there, at most ``cache_bytes`` (``ChunkCache``)."""

    def __init__(
        self,
        url: str,
        split: str = "train",
        fields: Sequence[str] | str | None = None,
        *,
        locking: bool | None = None,
        cache_chunks: int = DEFAULT_CACHE_CHUNKS,
        rdcc_nbytes: int | None = None,
        slice_cache: int = 0,
        verify_rows: bool = False,
        storage_options: dict | None = None,
        retry: Retry = Retry(),
        cache_dir: str | os.PathLike | None = None,
        cache_bytes: int = 10 << 30,
    ):
        ensure_filters()
        self.slice_cache = max(0, int(slice_cache))
        self.path, self.split, self.locking = url, split, locking
        self.verify_rows = bool(verify_rows)
        self.obj = resolve(url, storage_options, retry)
        self.real_path = self.obj.url
        self.cache = ChunkCache(cache_dir, self.obj, cache_bytes) if cache_dir is not None else None
        self._pinned_pid = None
        if isinstance(fields, str):
            fields = (fields,)
        with self.obj.h5() as f:
            self._read_layout(f, fields)
            self._tables = self._chunk_tables(f)
            self._kept = self._small_columns(f)
        self.rdcc_nbytes = int(rdcc_nbytes) if rdcc_nbytes is not None else 1 << 20
        self.rdcc_nslots = 521
        self._file = None
        self._dsets, self._direct, self._columns, self._ragged = {}, {}, {}, {}
        self._pid = None

    # ---- layout ------------------------------------------------------------------------------
    def _where(self) -> str:
        if self.real_path != self.path:
            return f"{shown(self.path)} (-> {os.path.basename(urlsplit(self.real_path).path)})"
        return shown(self.path)

    def _check_sources(self, f: h5py.File) -> None:
        from h5forge._format.row_files import virtual_sources

        self.sources = sorted(virtual_sources(f))
        if self.sources:  # HDF5 would look for them on this machine's disk, and read zeros without them
            raise ReadError(
                f"{self._where()}: version {self.version} is a thin version that maps other files; a store "
                "holds self-contained versions only (h5forge push copies a thin version whole)"
            )

    def _chunk_tables(self, f: h5py.File) -> dict[str, ChunkTable]:
        g = f[self.split]
        self._kinds = stored_kinds(spec_from_json(f[SPEC][()].decode()))
        paths = {fi.path for fi in self.fields.values() if fi.bulk and not fi.ragged}
        if self.verify_rows:
            paths |= {p for p, k in self._kinds.items() if k.stored().bulk and not k.stored().ragged}
        index = self._chunk_index(str(f.attrs.get(Attr.FILE_DIGEST, "")))
        tables = {}
        for path in sorted(paths):
            part = {k: index[f"{self.split}/{path}/{k}"] for k in ("offsets", "sizes", "masks")} if index else None
            table = ChunkTable.of(g[path], part if part and all(v is not None for v in part.values()) else None)
            if table is not None:
                tables[path] = table
        return tables

    def _chunk_index(self, file_digest: str) -> dict[str, Any] | None:
        """The chunk index object beside the version (``push`` writes it), when it was made for
        this very object (its size and ETag); None otherwise, and the chunk index is walked."""
        index = RemoteObject(
            sibling(self.obj.url, chunk_index_name(self.obj.url)), self.obj.storage_options, self.obj.retry
        )
        try:
            index.pin()
            data = index.fetch([(0, index.size)])[0] if index.size else b""
            return parse_chunk_index(data, self.obj, file_digest)
        except ReadError:  # none there (a folder served as it is), or unreadable: walk HDF5's own
            return None

    def _small_columns(self, f: h5py.File) -> dict[str, Any]:
        """The small columns, read once at the open: those asked for, and with ``verify_rows`` every
        value a checksum covers that is not a bulk field, the provenance columns and the checksums."""
        g = f[self.split]
        kept: dict[str, Any] = {}
        for fi in self.fields.values():
            if not fi.bulk:
                kept[fi.path] = g[fi.path][()]
        if self.verify_rows:
            self._format = file_format(f)
            for path, kind in self._kinds.items():
                st = kind.stored()
                if not st.bulk and path not in kept:
                    kept[path] = arrays.RowReader(g, path, st)(0, self.count)
            for name in (*PROVENANCE, CHECKSUM):
                kept[name] = g[name][()]
        return kept

    # ---- handles -----------------------------------------------------------------------------
    def _pin(self) -> None:  # leases are files beside a local version; a store has none
        pass

    def _unpin(self) -> None:
        pass

    def _open_plain(self) -> h5py.File:
        return self.obj.h5()

    def _handles(self) -> dict[str, h5py.Dataset]:
        pid = os.getpid()
        if self._pid != pid:
            self._file, self._dsets, self._ragged = None, {}, {}
            self._columns = {name: self._kept[fi.path] for name, fi in self.fields.items() if not fi.bulk}
            self._pid = pid
        return self._dsets

    def _h5_handles(self) -> h5py.File:
        """This process's h5py handle over the object (only fields without a chunk table use it)."""
        self._handles()
        if self._file is None:
            self._file = self.obj.h5()
            g = self._file[self.split]
            self._dsets = {name: g[fi.path] for name, fi in self.fields.items() if fi.bulk and not fi.ragged}
            self._ragged = {
                name: arrays.RowReader(g, fi.path, fi.kind.stored()) for name, fi in self.fields.items() if fi.ragged
            }
        return self._file

    def _drop(self) -> None:
        f, self._file, self._dsets, self._ragged = self._file, None, {}, {}
        if f is not None:
            try:
                f.close()
            except OSError:
                pass

    # ---- reads -------------------------------------------------------------------------------
    @property
    def requests(self) -> int:
        """Ranged requests this process made for rows so far."""
        return self.obj.requests

    @property
    def bytes_fetched(self) -> int:
        return self.obj.bytes_fetched

    def read_one(self, i: int, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        j = self.row(i)
        got = self.read([j])
        result = {}
        for name, value in got.items():
            row = value[0]
            if out is not None and name in out and isinstance(row, np.ndarray) and row.shape == out[name].shape:
                out[name][...] = row
                row = out[name]
            result[name] = row
        return result

    def read(
        self, indices: Iterable[int], out: dict[str, np.ndarray] | None = None, fields: Sequence[str] | None = None
    ) -> dict[str, Any]:
        idx = self.checked(indices)
        self._handles()
        uniq = np.unique(idx)
        fetched = self._fetch_rows(uniq)  # {path: {row: row array}} of every field with a chunk table
        if self.verify_rows:
            self._verify(uniq, fetched)
        result: dict[str, Any] = {}
        for name, fi in self.fields.items():
            if fields is not None and name not in fields:
                continue
            if not fi.bulk:
                result[name] = self._columns[name][idx]
            elif fi.path in fetched:
                target = out[name] if out is not None and name in out else np.empty((idx.size, *fi.shape), fi.dtype)
                rows = fetched[fi.path]
                for k, row in enumerate(idx.tolist()):
                    target[k] = rows[row]
                result[name] = target
            else:
                result[name] = self._through_h5py(name, idx, out)
        return result

    def _fetch_rows(self, uniq: np.ndarray) -> dict[str, dict[int, np.ndarray]]:
        wanted: list[tuple[str, int]] = []
        spans: list[tuple[int, int]] = []
        for path, table in self._tables.items():
            for row in uniq.tolist():
                o = table.offsets.item(row)
                if o < 0:
                    raise ReadError(f"{self._where()}: /{self.split}/{path} row {row} was never written")
                wanted.append((path, row))
                spans.append((o, o + table.sizes.item(row)))
        chunks: list[bytes | memoryview | None] = [None] * len(spans)
        if self.cache is not None:
            chunks = [self.cache.get(a, b) for a, b in spans]
        missing = [k for k, c in enumerate(chunks) if c is None]
        plan = plan_spans([spans[k] for k in missing])
        blobs = self.obj.fetch([(a, b) for a, b, _ in plan])
        for (start, _, members), blob in zip(plan, blobs):
            view = memoryview(blob)
            for m in members:
                k = missing[m]
                a, b = spans[k]
                chunks[k] = view[a - start : b - start]
                if self.cache is not None:
                    self.cache.put(a, b, chunks[k])  # type: ignore[arg-type]  # just set
        out: dict[str, dict[int, np.ndarray]] = {path: {} for path in self._tables}
        for (path, row), chunk in zip(wanted, chunks):
            table = self._tables[path]
            value = np.empty(table.shape, table.dtype)
            try:
                table.decode(chunk, row, value.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # all filled
            except ReadError as err:
                raise ReadError(f"{self._where()}: /{self.split}/{path} {err}") from None
            out[path][row] = value
        return out

    def _through_h5py(self, name: str, idx: np.ndarray, out: dict[str, np.ndarray] | None) -> Any:
        self._h5_handles()
        fi = self.fields[name]
        if fi.ragged:
            return [self._ragged[name].row(int(i)) for i in idx]
        target = out[name] if out is not None and name in out else np.empty((idx.size, *fi.shape), fi.dtype)
        return gather(self._dsets[name], idx, target)

    def _verify(self, uniq: np.ndarray, fetched: dict[str, dict[int, np.ndarray]]) -> None:
        """Each row's values, hashed as the file's format says, against its stored checksum."""
        kept = self._kept
        ids, files, hashes = (kept[name] for name in PROVENANCE)
        for row in uniq.tolist():
            values = []
            for path, kind in self._kinds.items():
                if path in fetched:
                    values.append(fetched[path][row])
                elif path in kept:
                    values.append(kept[path][row])
                else:  # a bulk field without a chunk table: read through HDF5
                    f = self._h5_handles()
                    values.append(arrays.RowReader(f[self.split], path, kind.stored())(row, row + 1)[0])
            made = row_checksum(values_digest(values, self._format), ids[row], files[row], hashes[row], self._format)
            stored = kept[CHECKSUM][row]
            stored = stored.decode() if isinstance(stored, bytes) else str(stored)
            if made != stored:
                sid = ids[row].decode() if isinstance(ids[row], bytes) else ids[row]
                raise ReadError(
                    f"{self._where()}: {self.split}[{row}] (id {sid!r}) does not match its checksum: "
                    "its bytes changed in the store or in transit"
                )

    def read_elements(self, name: str, elements) -> np.ndarray:
        self._h5_handles()
        return super().read_elements(name, elements)


def open_split(
    path: Any, split: str = "train", fields: Sequence[str] | str | None = None, **kwargs: Any
) -> SplitReader:
    """A ``SplitReader`` for a local path, a ``RemoteSplitReader`` for a URL; the options only a
    URL takes are refused for a local path."""
    remote_only = {
        k: kwargs.pop(k) for k in ("verify_rows", "storage_options", "retry", "cache_dir", "cache_bytes") if k in kwargs
    }
    if is_remote(path):
        return RemoteSplitReader(path, split, fields, **kwargs, **remote_only)
    if remote_only.get("verify_rows") or remote_only.get("cache_dir"):
        raise ReadError(
            f"{path}: verify_rows and cache_dir are for versions read from a store; "
            "a local version is checked whole by h5forge verify"
        )
    return SplitReader(path, split, fields, **kwargs)


def version_of(path: Any, storage_options: dict | None = None) -> str:
    """The version a path or URL names now: a local link resolved, a store's pointer followed."""
    if is_remote(path):
        return resolve(path, storage_options).url
    return os.path.realpath(path)

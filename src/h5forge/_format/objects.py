"""Objects in a store (``https://``, ``s3://``, ``gs://``, ``file://``) as h5forge uses them: one
object pinned to its size and ETag and read by ranged requests with bounded retries, the pointer
that is ``dataset_latest.h5`` on a bucket, and the chunk index object beside a version.

fsspec (s3fs for S3, gcsfs for GCS, aiohttp for HTTP) gives the connections, credentials and
clients; the readers (h5forge.read._remote) and the bucket commands (h5forge._store.remote) use what
is here (docs/reading.md, "From a bucket"):

- **Pinned object.** The object's size and ETag are taken once; every ranged GET carries
  ``If-Match`` with that ETag (and its length is checked), so an object replaced under a running
  reader is an error instead of a mix of two versions.
- **Faults.** Timeouts, 5xx answers, dropped connections and short bodies are retried with
  exponential backoff up to a bound; 403/404 is one error naming the object. Addresses are shown
  without user info or query strings (a presigned URL's signature is a credential).
- **Worker safe.** The filesystem object and its connection pool belong to the process that made
  them: after a fork a process makes its own; pickling carries the address.
"""

from __future__ import annotations

import asyncio
import gc
import io
import json
import os
import random
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import urlsplit, urlunsplit

import h5py
import numpy as np

from h5forge.errors import ReadError
from h5forge._format.codecs import ensure_filters
from h5forge._format.names import LATEST, VERSION_RE, Attr

REMOTE_SCHEMES = ("http", "https", "s3", "s3a", "gs", "gcs", "file")  # file://: a folder to serve (push)
POINTER_FORMAT = "h5forge-pointer"
POINTER_MAX_BYTES = 64 * 1024  # a pointer is a few hundred bytes; anything larger is a version file
METADATA_BLOCK = 1 << 20  # bytes per block of the metadata cache (HDF5 reads its metadata in small pieces)
CONCURRENCY = 32  # ranged requests in flight per reader
MULTI_RANGES = 32  # ranges asked for in one HTTP request (a few hundred bytes of Range header)


def is_remote(path: Any) -> bool:
    """Whether ``path`` names an object in a store (``https://…``, ``s3://…``) rather than a local file."""
    if not isinstance(path, str) or "://" not in path:
        return False
    return path.split("://", 1)[0].lower() in REMOTE_SCHEMES


def shown(url: str) -> str:
    """``url`` as it may appear in a message: without user info, query or fragment (credentials)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass(frozen=True)
class Retry:
    """How faults are retried: ``attempts`` tries per range in all, waiting ``backoff`` · 2^k
    seconds (with jitter, at most ``max_backoff``) between them; ``timeout`` seconds per request."""

    attempts: int = 6
    backoff: float = 0.2
    max_backoff: float = 5.0
    timeout: float = 60.0


class RemoteChanged(ReadError):
    """The object changed (its ETag or length) after the reader pinned it."""


class RemoteMissing(ReadError, FileNotFoundError):
    """The store answered that the object does not exist or may not be read (404/403)."""


class _Transient(Exception):
    """A failure worth retrying (a timeout, a 5xx answer, a dropped connection, a short body)."""


def _protocol(url: str) -> str:
    scheme = url.split("://", 1)[0].lower()
    return {"s3a": "s3", "gcs": "gs"}.get(scheme, scheme)


def filesystem(url: str, storage_options: dict | None = None, retry: Retry = Retry()) -> Any:
    """A new fsspec filesystem for ``url``'s store (credentials from the standard environment and
    files, as the store's library reads them; ``storage_options`` add to them)."""
    import fsspec

    protocol = _protocol(url)
    options = dict(storage_options or {})
    if protocol in ("http", "https"):
        import aiohttp

        client = dict(options.pop("client_kwargs", {}))
        client.setdefault("timeout", aiohttp.ClientTimeout(total=retry.timeout, sock_connect=min(retry.timeout, 30)))
        options["client_kwargs"] = client
    elif protocol == "s3":
        config = dict(options.pop("config_kwargs", {}))
        config.setdefault("connect_timeout", min(retry.timeout, 30))
        config.setdefault("read_timeout", retry.timeout)
        options["config_kwargs"] = config
    elif protocol == "file":
        options.setdefault("auto_mkdir", True)  # a prefix is made as it is written, as on a bucket
    try:
        return fsspec.filesystem(protocol, skip_instance_cache=True, **options)
    except ImportError as err:
        raise ReadError(
            f"{shown(url)}: reading from {protocol}:// needs the remote extra (pip install 'h5forge[remote]'; {err})"
        ) from None


class RemoteObject:
    """One object in a store, pinned to the size and ETag it had when first asked: ranged reads
    of it, retried as ``retry`` says, counted (``requests``, ``bytes_fetched``)."""

    def __init__(self, url: str, storage_options: dict | None = None, retry: Retry = Retry()):
        self.url, self.storage_options, self.retry = url, dict(storage_options or {}), retry
        self.size: int | None = None
        self.etag: str | None = None
        self.requests = 0
        self.bytes_fetched = 0
        self._multi = True  # several ranges per HTTP request, until the server shows it will not
        self._fs: Any = None
        self._pid: int | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fs": None, "_pid": None, "requests": 0, "bytes_fetched": 0}

    @property
    def fs(self) -> Any:
        if self._fs is None or self._pid != os.getpid():  # never a pool inherited through fork
            self._fs, self._pid = filesystem(self.url, self.storage_options, self.retry), os.getpid()
        return self._fs

    @property
    def name(self) -> str:
        return shown(self.url)

    def pin(self) -> "RemoteObject":
        """Take the object's size and ETag (one request); a missing object is ``RemoteMissing``."""
        info = self._with_retries(self._info)
        size = info.get("size")
        if size is None:
            raise ReadError(f"{self.name}: the server does not say how large the object is")
        self.size = int(size)
        etag = info.get("ETag") or info.get("etag")
        self.etag = str(etag) if etag else None
        return self

    def _info(self) -> dict:
        if _protocol(self.url) not in ("http", "https"):
            return self.fs.info(self.url)
        import fsspec.asyn

        info = fsspec.asyn.sync(self.fs.loop, self._head_http)
        return info if info.get("size") is not None else self.fs.info(self.url)

    async def _head_http(self) -> dict:
        """HEAD's size and ETag, its status kept (fsspec's ``info`` calls every failure a 404)."""
        session = await self.fs.set_session()
        async with session.head(self.fs.encode_url(self.url), allow_redirects=True) as r:
            if r.status == 405:  # no HEAD here: fsspec's info asks otherwise
                return {}
            if r.status >= 400:
                raise _HttpStatus(r.status)
            length = r.headers.get("Content-Length", "")
            return {"size": int(length) if length.isdigit() else None, "ETag": r.headers.get("ETag")}

    def _with_retries(self, call: Callable[[], Any]) -> Any:
        last: BaseException | None = None
        for attempt in range(self.retry.attempts):
            try:
                return call()
            except BaseException as err:  # noqa: BLE001 - classified: fatal ones are raised at once
                fatal = self._fatal(err)
                if fatal is not None:
                    raise fatal from None
                last = err
            self._sleep(attempt)
        raise ReadError(f"{self.name}: still failing after {self.retry.attempts} tries ({_cause(last)})")

    def _sleep(self, attempt: int) -> None:
        time.sleep(min(self.retry.max_backoff, self.retry.backoff * (2**attempt)) * (0.5 + random.random() / 2))

    def _fatal(self, err: BaseException) -> BaseException | None:
        """The error to raise at once for ``err``, or None when it is worth retrying."""
        if isinstance(err, (ReadError, KeyboardInterrupt, SystemExit)):
            return err
        status = _status(err)
        if isinstance(err, FileNotFoundError) or status == 404:
            return RemoteMissing(f"{self.name}: no such object (404)")
        if isinstance(err, PermissionError) or status in (401, 403):
            return RemoteMissing(
                f"{self.name}: access denied ({status or 403}); check the credentials in the environment "
                "or the store's configuration"
            )
        if status == 412 or "PreconditionFailed" in str(err):
            return self.changed()
        if status is not None and 400 <= status < 500 and status not in (408, 429):
            return ReadError(f"{self.name}: the server refused the request ({status})")
        if isinstance(err, (_Transient, _HttpStatus, OSError, asyncio.TimeoutError)) or _is_client_error(err):
            return None
        return err  # not a fault of the store or the network: a bug, raised as it is

    def changed(self) -> RemoteChanged:
        return RemoteChanged(
            f"{self.name}: the object changed while it was being read (its ETag or length is no longer "
            "the one pinned at the open); open the dataset again to read its current version"
        )

    # ---- ranged reads --------------------------------------------------------------------------
    def fetch(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(start, stop)`` span, fetched concurrently, each checked for its length."""
        if not spans:
            return []
        if self.size is None:
            self.pin()
        import fsspec.asyn

        fs = self.fs
        loop = fs.loop if getattr(fs, "async_impl", False) else None
        results: list[bytes | None] = [None] * len(spans)
        todo = list(range(len(spans)))
        last: BaseException | None = None
        for attempt in range(self.retry.attempts):
            if loop is not None:
                got = fsspec.asyn.sync(loop, self._gather, [spans[k] for k in todo])
            else:
                got = [self._blocking(*spans[k]) for k in todo]
            again = []
            for k, value in zip(todo, got):
                if isinstance(value, BaseException):
                    fatal = self._fatal(value)
                    if fatal is not None:
                        raise fatal
                    last = value
                    again.append(k)
                else:
                    results[k] = value
            if not again:
                return results  # type: ignore[return-value]  # every slot filled
            todo = again
            if attempt + 1 < self.retry.attempts:
                self._sleep(attempt)
        raise ReadError(
            f"{self.name}: {len(todo)} ranged read(s) still failing after {self.retry.attempts} tries ({_cause(last)})"
        )

    def _blocking(self, start: int, stop: int) -> bytes | BaseException:
        try:
            data = self.fs.cat_file(self.url, start=start, end=stop)
        except BaseException as err:  # noqa: BLE001 - classified by the caller
            return err
        return self._checked(data, start, stop)

    async def _gather(self, spans: list[tuple[int, int]]) -> list[bytes | BaseException]:
        if self._multi and len(spans) > 1 and _protocol(self.url) in ("http", "https"):
            groups = [spans[k : k + MULTI_RANGES] for k in range(0, len(spans), MULTI_RANGES)]
            answers = await asyncio.gather(*(self._get_http_multi(g) for g in groups))
            return [value for answer in answers for value in answer]
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(start: int, stop: int) -> bytes | BaseException:
            async with gate:
                try:
                    return self._checked(await self._get(start, stop), start, stop)
                except BaseException as err:  # noqa: BLE001 - classified by the caller
                    return err

        return list(await asyncio.gather(*(one(a, b) for a, b in spans)))

    def _checked(self, data: bytes | BaseException, start: int, stop: int) -> bytes | BaseException:
        if isinstance(data, BaseException):
            return data
        self.requests += 1
        self.bytes_fetched += len(data)
        if len(data) != stop - start:
            return _Transient(f"short answer: {len(data)} of {stop - start} bytes")
        return data

    async def _get(self, start: int, stop: int) -> bytes:
        protocol = _protocol(self.url)
        if protocol in ("http", "https"):
            return await self._get_http(start, stop)
        if protocol == "s3":
            return await self._get_s3(start, stop)
        return await self.fs._cat_file(self.url, start=start, end=stop)

    def _range_headers(self, spans: Sequence[tuple[int, int]]) -> dict[str, str]:
        """A GET of ``spans`` (``Range``), only while the object is the one pinned (``If-Match``)."""
        ranges = {"Range": "bytes=" + ",".join(f"{a}-{b - 1}" for a, b in spans)}
        return {**ranges, "If-Match": self.etag} if self.etag else ranges

    async def _get_http(self, start: int, stop: int) -> bytes:
        session = await self.fs.set_session()
        async with session.get(self.fs.encode_url(self.url), headers=self._range_headers([(start, stop)])) as r:
            if r.status == 200 and not (start == 0 and stop == self.size):
                raise ReadError(f"{self.name}: the server ignores range requests (it answered 200 to a Range)")
            if r.status not in (200, 206):
                raise _HttpStatus(r.status)
            if r.status == 200:  # the whole object, which is what was asked
                return await r.read()
            content_range = r.headers.get("Content-Range", "")
            body = await r.read()
        return self._asked_part(body, content_range, start, stop)

    async def _get_http_multi(self, spans: list[tuple[int, int]]) -> list[bytes | BaseException]:
        """Several spans in one GET (a multi-range request, answered as multipart/byteranges):
        a request per batch instead of one per chunk. A server that answers otherwise is asked
        one range at a time from then on."""
        session = await self.fs.set_session()
        try:
            async with session.get(self.fs.encode_url(self.url), headers=self._range_headers(spans)) as r:
                if r.status == 200:  # ranges ignored or refused as a set: the body is not read
                    self._multi = False
                    raise _Transient("the server answers a multi-range request with the whole object")
                if r.status != 206:
                    raise _HttpStatus(r.status)
                kind = r.headers.get("Content-Type", "")
                single = r.headers.get("Content-Range", "")
                body = await r.read()
        except BaseException as err:  # noqa: BLE001 - classified by the caller, for every span
            return [err] * len(spans)
        self.requests += 1
        self.bytes_fetched += len(body)
        try:
            parts = _multipart(body, kind) if "multipart/byteranges" in kind else [_one_part(body, single)]
            if any(total is not None and total != self.size for _, _, total in parts):
                raise self.changed()
            return [_cut(parts, a, b) for a, b in spans]
        except _Transient as err:
            self._multi = False
            return [err] * len(spans)
        except ReadError as err:
            return [err] * len(spans)

    async def _get_s3(self, start: int, stop: int) -> bytes:
        bucket, key, _ = self.fs.split_path(self.url)
        extra = {"IfMatch": self.etag} if self.etag else {}
        extra["Range"] = f"bytes={start}-{stop - 1}"
        answer = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, **extra)
        content_range = str(answer.get("ContentRange") or "")
        async with answer["Body"] as body:
            data = await body.read()
        if not content_range and (start, stop) == (0, self.size):  # the whole object, as asked
            return data
        return self._asked_part(data, content_range, start, stop)

    def _asked_part(self, body: bytes, content_range: str, start: int, stop: int) -> bytes:
        """Bytes ``start:stop`` of a single-range answer. Its length alone does not show they are
        the ones asked for: its Content-Range says which bytes it holds (as each part of a
        multi-range answer does)."""
        m = _RANGE.search(b"content-range: " + content_range.encode("latin-1"))
        if m and m[3] != b"*" and int(m[3]) != self.size:
            raise self.changed()
        return _cut([_one_part(body, content_range)], start, stop)

    def h5(self) -> h5py.File:
        """The object opened by h5py over an fsspec file with a block cache (for metadata and the
        fields read through HDF5); pinned to the ETag where the protocol can say so."""
        ensure_filters()
        kwargs: dict[str, Any] = {}
        if self.etag and _protocol(self.url) in ("http", "https"):
            kwargs["headers"] = {"If-Match": self.etag}
        try:
            handle = self.fs.open(
                self.url, "rb", block_size=METADATA_BLOCK, cache_type="blockcache", size=self.size, **kwargs
            )
        except TypeError:  # a filesystem whose open takes no size / headers
            handle = self.fs.open(self.url, "rb", block_size=METADATA_BLOCK, cache_type="blockcache")
        try:
            return h5py.File(_CollectorPausedWhileReading(handle), "r")
        except OSError as err:
            raise ReadError(f"{self.name}: cannot be opened as an HDF5 file ({err})") from None


_PAUSED_READS = 0
_COLLECTOR_WAS_ON = False
_PAUSES_LOCK = threading.Lock()


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a read waits; as it was again when the last one ends."""
    global _PAUSED_READS, _COLLECTOR_WAS_ON
    with _PAUSES_LOCK:
        if _PAUSED_READS == 0:
            _COLLECTOR_WAS_ON = gc.isenabled()
            gc.disable()
        _PAUSED_READS += 1
    try:
        yield
    finally:
        with _PAUSES_LOCK:
            _PAUSED_READS -= 1
            if _PAUSED_READS == 0 and _COLLECTOR_WAS_ON:
                gc.enable()


class _CollectorPausedWhileReading:
    """An fsspec file as h5py reads it. h5py holds its global lock while HDF5 reads through a file
    object, and fsspec does the read on its own event-loop thread. A garbage collection that starts
    on that thread and frees an h5py object waits for h5py's lock, so the read never returns and
    the reader hangs. The collector is paused while such a read waits (it runs again after)."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def readinto(self, buffer: Any) -> int:
        with _collector_paused():
            return self._handle.readinto(buffer)

    def read(self, size: int = -1) -> bytes:
        with _collector_paused():
            return self._handle.read(size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


_RANGE = re.compile(rb"content-range:\s*bytes\s+(\d+)-(\d+)/(\d+|\*)", re.I)


def _part(a: int, b: int, total: bytes) -> tuple[int, int, int | None]:
    return a, b + 1, None if total == b"*" else int(total)


def _one_part(body: bytes, content_range: str) -> tuple[int, memoryview, int | None]:
    m = _RANGE.search(b"content-range: " + content_range.encode("latin-1"))
    if not m:
        raise _Transient("a ranged answer without its Content-Range")
    a, b, total = _part(int(m[1]), int(m[2]), m[3])
    if len(body) != b - a:
        raise _Transient(f"short answer: {len(body)} of {b - a} bytes")
    return a, memoryview(body), total


def _multipart(body: bytes, content_type: str) -> list[tuple[int, memoryview, int | None]]:
    """The parts of a multipart/byteranges body: (first byte, its bytes, the object's size)."""
    boundary = content_type.partition("boundary=")[2].split(";")[0].strip().strip('"').encode()
    if not boundary:
        raise _Transient("a multipart answer without its boundary")
    marker, view, parts = b"--" + boundary, memoryview(body), []
    at = body.find(marker)
    while at >= 0 and body[at + len(marker) : at + len(marker) + 2] != b"--":
        head_end = body.find(b"\r\n\r\n", at)
        m = _RANGE.search(body, at, head_end) if head_end >= 0 else None
        if m is None:
            raise _Transient("a multipart answer cut short")
        a, b, total = _part(int(m[1]), int(m[2]), m[3])
        start = head_end + 4
        if start + (b - a) > len(body):
            raise _Transient("a multipart answer cut short")
        parts.append((a, view[start : start + b - a], total))
        at = body.find(marker, start + b - a)
    return parts


def _cut(parts: list[tuple[int, memoryview, int | None]], a: int, b: int) -> bytes:
    """Bytes ``a:b`` of the object from the part that holds them."""
    for first, data, _ in parts:
        if first <= a and b <= first + len(data):
            return bytes(data[a - first : b - first])
    raise _Transient(f"the answer holds no part with bytes {a}-{b - 1}")


class _HttpStatus(Exception):
    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.status = status


def _status(err: BaseException) -> int | None:
    """The HTTP status an error carries, if any (aiohttp, botocore and our own)."""
    status = getattr(err, "status", None)
    if isinstance(status, int):
        return status
    response = getattr(err, "response", None)
    if isinstance(response, dict):
        code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(code, int):
            return code
    cause = err.__cause__ or err.__context__
    if cause is not None and cause is not err:
        return _status(cause)
    return None


def _is_client_error(err: BaseException) -> bool:
    """A connection-level failure of aiohttp or botocore (dropped, refused, reset, timed out)."""
    try:
        import aiohttp

        if isinstance(err, aiohttp.ClientError):
            return True
    except ImportError:
        pass
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        return isinstance(err, (BotoCoreError, ClientError))
    except ImportError:
        return False


def _cause(err: BaseException | None) -> str:
    if err is None:
        return "no answer"
    text = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return text.splitlines()[0][:200]


# ---- pointers: latest on a bucket -----------------------------------------------------------------
def pointer_bytes(version_object: str, number: int, size: int) -> bytes:
    """The pointer object that makes ``dataset_latest.h5`` name ``version_object`` (a sibling's name)."""
    doc = {"format": POINTER_FORMAT, "version": number, "object": version_object, "size": size}
    return (json.dumps(doc, indent=1) + "\n").encode()


def parse_pointer(data: bytes) -> dict | None:
    """The pointer's fields, or None when ``data`` is not a pointer (an HDF5 file starts otherwise)."""
    if not data.lstrip().startswith(b"{"):
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != POINTER_FORMAT:
        return None
    name, number, size = doc.get("object"), doc.get("version"), doc.get("size")
    if not isinstance(name, str) or not VERSION_RE.match(name) or not isinstance(number, int):
        return None
    if size is not None and not isinstance(size, int):
        return None
    return doc


CHUNK_INDEX_SUFFIX = ".chunks.npz"


def chunk_index_name(url: str) -> str:
    return os.path.basename(urlsplit(url).path) + CHUNK_INDEX_SUFFIX


def chunk_index_bytes(f: h5py.File, size: int, etag: str | None) -> bytes:
    """Every fixed field's chunk offsets, sizes and filter masks, per split, as an ``.npz`` made
    for the object of ``size`` bytes, ETag ``etag`` and ``f``'s file digest (the reader uses it
    only for an object with all three)."""
    arrays_out: dict[str, np.ndarray] = {
        "size": np.array(size, np.int64),
        "etag": np.array(etag or "", dtype=np.str_),
        "file_digest": np.array(str(f.attrs.get(Attr.FILE_DIGEST, "")), dtype=np.str_),
    }
    for split in f:
        g = f[split]
        if not isinstance(g, h5py.Group):
            continue

        def visit(name: str, obj: Any, split: str = split) -> None:
            if isinstance(obj, h5py.Dataset) and obj.chunks is not None and obj.chunks[0] == 1 and obj.ndim >= 2:
                n = obj.shape[0]
                offsets, sizes, masks = np.full(n, -1, np.int64), np.zeros(n, np.int64), np.zeros(n, np.uint32)

                def one(info) -> None:
                    row = info.chunk_offset[0]
                    offsets[row], sizes[row], masks[row] = info.byte_offset, info.size, info.filter_mask

                obj.id.chunk_iter(one)
                for key, value in (("offsets", offsets), ("sizes", sizes), ("masks", masks)):
                    arrays_out[f"{split}/{name}/{key}"] = value

        g.visititems(visit)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays_out)  # type: ignore[arg-type]  # named arrays
    return buffer.getvalue()


def parse_chunk_index(data: bytes, obj: "RemoteObject", file_digest: str) -> dict[str, Any] | None:
    """The arrays of a chunk index object made for ``obj`` (its size, its ETag where both sides
    know one) and for a file of ``file_digest``, else None."""
    import zipfile

    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            found = {k: z[k] for k in z.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError):
        return None
    etag = str(found.get("etag", ""))
    if (
        int(found.get("size", -1)) != obj.size
        or not file_digest
        or str(found.get("file_digest", "")) != file_digest
        or (etag and obj.etag and etag != obj.etag)
    ):
        return None

    class _Index(dict):
        def __missing__(self, key: str) -> None:
            return None

    return _Index(found)


def sibling(url: str, name: str) -> str:
    """The object ``name`` in the same folder as ``url`` (query kept: a presigned folder URL)."""
    parts = urlsplit(url)
    folder = parts.path.rsplit("/", 1)[0]
    return urlunsplit((parts.scheme, parts.netloc, f"{folder}/{name}", parts.query, ""))


def resolve(url: str, storage_options: dict | None = None, retry: Retry = Retry()) -> RemoteObject:
    """The version object ``url`` names, pinned: a pointer (``dataset_latest.h5`` on a bucket) is
    followed to the version it names, whose size must be the one the pointer records."""
    obj = RemoteObject(url, storage_options, retry).pin()
    assert obj.size is not None  # pinned
    if obj.size > POINTER_MAX_BYTES:
        return obj
    head = obj.fetch([(0, obj.size)])[0] if obj.size else b""
    doc = parse_pointer(head)
    if doc is None:
        if os.path.basename(urlsplit(url).path) == LATEST and not head.startswith(b"\x89HDF"):
            raise ReadError(f"{obj.name}: neither an h5forge pointer nor an HDF5 file")
        return obj
    target = RemoteObject(sibling(url, doc["object"]), storage_options, retry).pin()
    if doc.get("size") is not None and target.size != int(doc["size"]):
        raise ReadError(
            f"{obj.name} names {doc['object']} of {doc['size']} bytes, but {target.name} has {target.size}: "
            "the version object was replaced after it was published"
        )
    return target

"""Versions on a bucket prefix: push, list, roll back, keep the newest K, verify.

A store has no symlinks and no rename, so a prefix holds (docs/reading.md, "From a bucket"):

    <prefix>/dataset_v0001.h5 … dataset_v0007.h5   self-contained versions, never overwritten
    <prefix>/dataset_v0007.h5.json                 its size, sha256 and file digest, for re-pushes
    <prefix>/dataset_v0007.h5.chunks.npz           where each row's chunk lies, for a one-GET open
    <prefix>/dataset_latest.h5                     a small JSON pointer, written last, in one PUT

A reader sees the pointer before or after its one PUT, so it reads the old version or the new one,
whole. A thin version is copied whole before it is uploaded (``h5forge._store.thin.export``): a
version on a bucket reads no other object, so retention there never has to ask what a kept version
reads, and a reader never meets a virtual dataset whose sources HDF5 would look for on its disk.
Credentials come from the store library's standard sources (``AWS_*`` variables, profiles); no
message here shows more of an address than ``shown`` does.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import h5py

from h5forge.errors import ReadError, UsageError, VersionError
from h5forge._format.names import LATEST, VERSION_RE, Attr, version_name
from h5forge._format.row_files import virtual_sources
from h5forge._format.objects import (
    CHUNK_INDEX_SUFFIX,
    POINTER_MAX_BYTES,
    RemoteObject,
    Retry,
    chunk_index_bytes,
    parse_pointer,
    pointer_bytes,
    resolve,
    shown,
)
from h5forge._store.verify import (
    HealthReport,
    _check_checksums,
    _check_digests,
    _check_file_digest,
    _check_header,
    _check_structure,
    _guarded,
    _why,
)

MANIFEST_SUFFIX = ".json"
HASH_BLOCK = 8 << 20


@dataclass(frozen=True)
class Pushed:
    version: int
    object: str  # the version object's address (as shown)
    uploaded: bool  # False: the same version was there already
    bytes: int
    removed: list[str]


def _join(prefix: str, name: str) -> str:
    return prefix.rstrip("/") + "/" + name


def _fs(prefix: str, storage_options: dict | None) -> Any:
    return RemoteObject(prefix, storage_options).fs


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def _file_digest(path: Path) -> str:
    with h5py.File(path, "r") as f:
        return str(f.attrs.get(Attr.FILE_DIGEST, ""))


def push(
    folder: str | Path,
    prefix: str,
    *,
    keep: int | None = None,
    storage_options: dict | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> Pushed:
    """Upload the version ``folder``'s latest points at to ``prefix`` (whole, a thin one copied
    self-contained first), check what arrived, then point the prefix's latest at it in one PUT.
    ``keep``: afterwards delete the prefix's versions beyond the newest ``keep`` (never latest)."""
    from h5forge._store.thin import export
    from h5forge._store.versions import latest, published

    folder = Path(folder)
    number = latest(folder)
    if number is None:
        raise VersionError(f"{folder}: no dataset_latest.h5; build or roll back to a version first")
    local = published(folder)[number]
    name = version_name(number)
    fs = _fs(prefix, storage_options)
    target = _join(prefix, name)
    with tempfile.TemporaryDirectory(prefix="h5forge-push-") as tmp:
        with h5py.File(os.path.realpath(local), "r") as f:
            thin = bool(virtual_sources(f))
        if thin:
            progress(f"{name} is thin: copying it whole before the upload")
            local = export(local, Path(tmp) / name)
        size = local.stat().st_size
        manifest: dict[str, Any] = {
            "version": number,
            "size": size,
            "sha256": _sha256(local),
            "file_digest": _file_digest(local),
        }
        uploaded = _upload(fs, local, target, manifest, progress)
        arrived = _check_arrived(target, manifest, storage_options)
        with h5py.File(local, "r") as f:  # where each row's chunk lies: one GET for a reader's open
            fs.pipe_file(target + CHUNK_INDEX_SUFFIX, chunk_index_bytes(f, size, arrived.etag))
    fs.pipe_file(_join(prefix, LATEST), pointer_bytes(name, number, size))  # the one PUT that publishes
    removed = retain(prefix, keep, storage_options) if keep else []
    return Pushed(number, shown(target), uploaded, size if uploaded else 0, removed)


def _upload(fs: Any, local: Path, target: str, manifest: dict, progress: Callable[[str], None]) -> bool:
    """Upload ``local`` to ``target`` unless the same version is there (its manifest says so);
    a different object under the same name is refused: a published version never changes."""
    there = _manifest(fs, target)
    if there is not None:
        if there.get("sha256") == manifest["sha256"] or (
            manifest["file_digest"] and there.get("file_digest") == manifest["file_digest"]
        ):
            progress(f"{shown(target)} is there already")
            return False
        raise VersionError(
            f"{shown(target)} already holds a different version {manifest['version']}; versions on a "
            "bucket never change: push to another prefix, or delete it there first"
        )
    progress(f"uploading {local.name} ({manifest['size'] / 1e6:.1f} MB) to {shown(target)}")
    fs.put_file(str(local), target)
    fs.pipe_file(target + MANIFEST_SUFFIX, (json.dumps(manifest, indent=1) + "\n").encode())
    return True


def _manifest(fs: Any, target: str) -> dict | None:
    try:
        data = fs.cat_file(target + MANIFEST_SUFFIX)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _check_arrived(target: str, manifest: dict, storage_options: dict | None) -> RemoteObject:
    """The uploaded object's size and stored file digest are the local version's, or nothing moves."""
    obj = RemoteObject(target, storage_options).pin()
    if obj.size != manifest["size"]:
        raise ReadError(f"{obj.name}: {obj.size} bytes arrived of {manifest['size']}; latest was not moved")
    with obj.h5() as f:
        digest = str(f.attrs.get(Attr.FILE_DIGEST, ""))
    if digest != manifest["file_digest"]:
        raise ReadError(f"{obj.name}: the uploaded file's digest differs from the local one; latest was not moved")
    return obj


# ---- a prefix's versions -----------------------------------------------------------------------
def listed(prefix: str, storage_options: dict | None = None) -> dict[int, dict]:
    """{version: {"object", "size"}} of the version objects under ``prefix``."""
    fs = _fs(prefix, storage_options)
    try:
        entries = fs.ls(prefix, detail=True)
    except FileNotFoundError:
        return {}
    found = {}
    for e in entries:
        base = str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
        m = VERSION_RE.match(base)
        if m and e.get("type", "file") == "file":
            found[int(m.group(1))] = {"object": base, "size": int(e.get("size") or 0)}
    return dict(sorted(found.items()))


def latest_of(prefix: str, storage_options: dict | None = None) -> int | None:
    """The version the prefix's pointer names; None without a pointer."""
    obj = RemoteObject(_join(prefix, LATEST), storage_options)
    try:
        obj.pin()
    except FileNotFoundError:
        return None
    if obj.size is None or obj.size > POINTER_MAX_BYTES:
        raise ReadError(f"{obj.name}: not an h5forge pointer (an object of {obj.size} bytes)")
    doc = parse_pointer(obj.fetch([(0, obj.size)])[0] if obj.size else b"")
    if doc is None:
        raise ReadError(f"{obj.name}: not an h5forge pointer")
    return int(doc["version"])


def rollback(prefix: str, number: int, storage_options: dict | None = None) -> None:
    """Point the prefix's latest at version ``number`` (which must be there and readable)."""
    versions = listed(prefix, storage_options)
    if number not in versions:
        raise VersionError(f"{shown(_join(prefix, version_name(number)))} is not a version on this prefix")
    report = verify_remote(_join(prefix, version_name(number)), checksums=False, storage_options=storage_options)
    if not report.ok:
        raise VersionError(f"refusing to roll back to a broken version: {'; '.join(report.errors)}")
    _fs(prefix, storage_options).pipe_file(
        _join(prefix, LATEST), pointer_bytes(version_name(number), number, versions[number]["size"])
    )


def retain(prefix: str, keep: int, storage_options: dict | None = None) -> list[str]:
    """Delete the prefix's versions beyond the newest ``keep``, never the one latest names. A
    version on a bucket reads no other object, so nothing else needs keeping; a reader still on a
    deleted version gets a clear 404 error naming it."""
    if keep < 1:
        raise UsageError("keep must be at least 1")
    versions = listed(prefix, storage_options)
    kept = set(sorted(versions)[-keep:])
    current = latest_of(prefix, storage_options)
    if current is not None:
        kept.add(current)
    fs = _fs(prefix, storage_options)
    removed = []
    for number, entry in versions.items():
        if number in kept:
            continue
        target = _join(prefix, entry["object"])
        fs.rm_file(target)
        for beside in (MANIFEST_SUFFIX, CHUNK_INDEX_SUFFIX):
            try:
                fs.rm_file(target + beside)
            except FileNotFoundError:
                pass
        removed.append(shown(target))
    return removed


# ---- verify ------------------------------------------------------------------------------------
def verify_remote(
    url: str, *, checksums: bool = True, storage_options: dict | None = None, retry: Retry = Retry()
) -> HealthReport:
    """``verify`` of a version in a store: its format, structure, digests and every row's checksum,
    computed from the bytes fetched. Never raises for a broken object: the report says BROKEN."""
    report = HealthReport(shown(url))
    try:
        obj = resolve(url, storage_options, retry)
        f = obj.h5()
    except ReadError as err:
        report.error("open", str(err))
        return report
    report.stats["object"] = obj.name
    report.stats["object_bytes"] = obj.size
    try:
        with f:
            spec, old_format = _check_header(f, report)
            if spec is None:
                return report
            from h5forge.kinds import stored_kinds

            kinds = stored_kinds(spec)
            if virtual_sources(f):
                report.error("dependencies", "a thin version that maps other files: a store holds whole versions")
                return report
            report.checks["dependencies"] = "ok (self-contained)"
            if not _guarded(report, "structure", _check_structure, f, spec, kinds, report) or not report.ok:
                return report
            if not old_format:
                _guarded(report, "split digests", _check_digests, f, report)
                _guarded(report, "file digest", _check_file_digest, f, report)
            if checksums:
                _guarded(report, "checksums", _check_checksums, f, spec, kinds, report, None, old_format, 1, None)
    except Exception as err:  # noqa: BLE001 - e.g. a connection lost past the retries
        report.error("read", f"{obj.name}: cannot be read ({_why(err)})")
    return report

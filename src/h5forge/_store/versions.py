"""Versions in an output folder: lock, stage, publish atomically, list, roll back, retain.

<out>/dataset_v0001.h5 ...          published, read-only, never changed
<out>/dataset_latest.h5 -> dataset_v0007.h5   relative symlink, replaced atomically
<out>/.dataset_v0008.h5.partial     a version being written (removed if the run dies)
<out>/.h5forge.lock                 held by the one writer of this folder
<out>/dataset_v0008.rows/           the rows folder: the row files a mapped version maps (storage.assemble)
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import stat
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import h5py

from h5forge.errors import LatestBroken, OutputBusy, UsageError, VersionError
from h5forge._crash_points import checkpoint
from h5forge._format.names import (
    CHUNKS_DIR,
    CHUNKS_DIR_BEFORE,
    ROWS_FOLDER_RE,
    DELTA_RE,
    LATEST,
    LOCK,
    PARTIAL_RE,
    PUBLISHING,
    RESUMABLE,
    RESUME_SUFFIX,
    VERSION_RE,
    parse_version,
    partial_name,
    rows_folder_name,
    version_name,
)
from h5forge._format import leases
from h5forge._format.row_files import virtual_sources
from h5forge._store.disk_full import as_disk_full, release_partials
from h5forge._store.whole_files import replace_file
from h5forge.kinds.base import read_bounded
from h5forge._format.mapped import out_of_descriptors

log = logging.getLogger("h5forge._store")


def version_number(text: str | int) -> int:
    """Accept 3, '3', 'v3', 'v0003', 'dataset_v0003.h5'."""
    number = parse_version(text)
    if number is None:
        raise VersionError(f"not a version: {text!r} (expected e.g. v0003)")
    return number


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable."""
    _sync(path, os.fsync, os.O_DIRECTORY)


def _sync(path: Path, sync, flags: int = 0) -> None:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        sync(fd)
    finally:
        os.close(fd)


def _synced(path: Path) -> OSError | None:
    """``fdatasync`` of ``path`` from a background thread: the error the disk reports, or None. A file
    that cannot be opened (gone, no descriptor left) is None: ``seal`` opens it again and syncs it.
    The kernel reports a failed write-back once, to the first sync after it: an error returned here
    is the caller's to raise, as the seal's own sync would not see it again."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        os.fdatasync(fd)
    except OSError as err:
        return err
    finally:
        os.close(fd)
    return None


@contextmanager
def flushing(paths: list[Path]) -> Iterator[None]:
    """Within the block, the data of ``paths`` is written to the disk in a background thread
    (``fdatasync``), which the block's end waits for: the ``seal`` that publishes them then finds
    little left to write. A write the disk failed is raised when the block ends."""
    errors: list[OSError] = []

    def flush() -> None:
        errors.extend(err for path in paths if (err := _synced(path)) is not None)

    thread = threading.Thread(target=flush, name="h5forge-flush", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()
    if errors:
        raise errors[0]


def seal(path: Path) -> None:
    """A finished file made durable and read-only (0444): what a published version reads never changes."""
    _sync(path, os.fsync)
    os.chmod(path, 0o444)


@contextmanager
def output_lock(out: str | Path, what: str = "build", wait: float = 0) -> Iterator[Path]:
    """Hold the folder's writer lock; a second writer waits up to ``wait`` seconds, then fails
    with who holds it."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        # never follow a symlink planted as the lock: writing to it would overwrite its target
        fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):  # a read-only mount, another user's folder
            raise UsageError(
                f"cannot write to the output folder {out} ({err.strerror}); nothing was changed: "
                "make it writable, or choose another output folder"
            ) from None
        if err.errno not in (errno.ELOOP, errno.EISDIR):
            raise
        raise UsageError(f"{out / LOCK} is not a regular file ({err.strerror}); remove it and retry") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"{out / LOCK} is not a regular file; remove it and retry")
    deadline = time.monotonic() + wait
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
                    continue
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
                waited = f" after waiting {wait:g} s" if wait else ""
                raise OutputBusy(
                    f"another h5forge run is writing to {out} ({holder}){waited}; "
                    "wait for it to finish, or stop it, then retry"
                ) from None
        os.ftruncate(fd, 0)
        # the host too: on a shared folder the holder may run elsewhere, where its pid means something
        mine = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "what": what,
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        os.pwrite(fd, json.dumps(mine).encode(), 0)
        _remove_partials(out)
        try:
            yield out
        except BaseException as exc:
            full = as_disk_full(exc, out)
            if full is None:
                short = out_of_descriptors(exc)
                if short is not None and short is not exc:
                    raise short from None
                raise
            release_partials()  # an HDF5 file left open after ENOSPC crashes the interpreter at exit
            _remove_partials(out)
            raise full from None
    finally:
        os.close(fd)  # closing drops the flock


@contextmanager
def output_lock_or_skip(out: str | Path, what: str, wait: float, skip: bool) -> Iterator[str | None]:
    """Like ``output_lock``; with ``skip`` a busy folder yields the reason instead of raising."""
    with ExitStack() as stack:
        try:
            stack.enter_context(output_lock(out, what, wait))
        except OutputBusy as busy:
            if not skip:
                raise
            yield str(busy)
            return
        yield None


def _remove_partials(out: Path) -> None:
    """Leftovers of a killed run (we hold the lock, so nobody is writing them)."""
    for p in out.iterdir():
        if PARTIAL_RE.match(p.name) and p.with_name(p.name + RESUME_SUFFIX).exists():
            # a killed build left rows it had made durable: kept aside for the next build to take
            os.replace(p.with_name(p.name + RESUME_SUFFIX), out / (RESUMABLE + RESUME_SUFFIX))
            os.replace(p, out / RESUMABLE)
        elif PARTIAL_RE.match(p.name) or p.name.startswith(f".{LATEST}."):
            p.unlink(missing_ok=True)
        elif p.name in (CHUNKS_DIR, CHUNKS_DIR_BEFORE):  # the workers' chunk files of a killed run: none is complete
            shutil.rmtree(p, ignore_errors=True)
    versions = published(out)
    # a delta no published version reads: its append was killed before publishing. A delta whose
    # own version retention removed is still read by the later thin versions, so the test is what
    # the published versions read, never whether the delta's own version is there
    unowned = [p for p in out.iterdir() if (m := DELTA_RE.match(p.name)) and int(m.group(1)) not in versions]
    # likewise the rows folder of a build killed before publishing (a thin version appended
    # onto a published one whose version retention removed still reads its files)
    folders = [p for p in out.iterdir() if (m := ROWS_FOLDER_RE.match(p.name)) and int(m.group(1)) not in versions]
    if unowned or folders:
        read = {q.resolve() for path in versions.values() for q in dependencies(path)}
        for p in unowned:
            if p.resolve() not in read:
                p.unlink(missing_ok=True)
        for p in folders:
            if not any(q.parent == p.resolve() for q in read):
                shutil.rmtree(p, ignore_errors=True)


def published(out: str | Path) -> dict[int, Path]:
    out = Path(out)
    if not out.is_dir():
        return {}
    found = {}
    for p in out.iterdir():
        m = VERSION_RE.match(p.name)
        if m and p.is_file() and not p.is_symlink():
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def latest(out: str | Path) -> int | None:
    """The version ``dataset_latest.h5`` points at, or None when there is no link.

    Raises ``LatestBroken`` unless the link resolves, inside ``out``, to a published version: a
    link to another folder's file of the same name, or to nothing, must not be taken for one."""
    link = Path(out) / LATEST
    try:
        target = os.readlink(link)
    except FileNotFoundError:
        return None
    except OSError:
        raise LatestBroken(
            f"{link} is not a symlink to a published version; remove it, or point it at one: "
            f"h5forge rollback {out} <version>"
        ) from None
    real = Path(os.path.realpath(link))
    m = VERSION_RE.match(real.name)
    if real.parent != Path(os.path.realpath(out)):
        why = f"points outside {out} ({target})"
    elif not os.path.lexists(real):
        why = f"points at {real.name}, which does not exist"
    elif not m or int(m.group(1)) not in published(out):
        why = f"points at {real.name}, which is not a published version"
    else:
        return int(m.group(1))
    raise LatestBroken(f"{link} {why}; point it at a version of this folder: h5forge rollback {out} <version>")


@dataclass(frozen=True)
class Candidate:
    """A version being written: its number, its temporary path, the version it follows."""

    out: Path
    number: int
    parent: int | None

    @property
    def partial(self) -> Path:
        return self.out / partial_name(version_name(self.number))

    @property
    def final(self) -> Path:
        return self.out / version_name(self.number)

    @property
    def rows_folder(self) -> Path:
        """The folder of the row files it maps, when it is a mapped version."""
        return self.out / rows_folder_name(self.number)

    def discard(self) -> None:
        self.partial.unlink(missing_ok=True)
        shutil.rmtree(self.rows_folder, ignore_errors=True)


def stage(out: str | Path) -> Candidate:
    """Reserve the next version number (call with the lock held)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return Candidate(out, max(published(out), default=0) + 1, latest(out))


def publish(candidate: Candidate) -> Path:
    """Durably move the verified candidate into place, make it read-only, then point latest at it."""
    if candidate.rows_folder.is_dir():  # the files it maps: as read-only and durable as itself
        for part in candidate.rows_folder.iterdir():
            seal(part)
        fsync_dir(candidate.rows_folder)
    seal(candidate.partial)
    # a writer killed between the two steps below leaves a published version latest does not point
    # at, as a rollback does: the marker tells the next writer to finish this one (finish_publish)
    marker = candidate.out / PUBLISHING
    replace_file(marker, str(candidate.number), durable=True)
    fsync_dir(candidate.out)
    os.replace(candidate.partial, candidate.final)
    try:
        leases.prepare(candidate.final)  # lockable by readers without write access to the folder
    except OSError:  # they then create it themselves, or rely on the minimum age
        pass
    fsync_dir(candidate.out)
    checkpoint("publish:before-latest")
    set_latest(candidate.out, candidate.number)
    marker.unlink()
    return candidate.final


def finish_publish(out: Path) -> str | None:
    """Point latest at the version a killed writer published but did not point latest at (its
    ``PUBLISHING`` marker); what it says, or None when no publish was interrupted. Call under the lock."""
    marker = Path(out) / PUBLISHING
    try:
        number = int(read_bounded(marker, 64))  # a FIFO planted there never waits for a writer
    except FileNotFoundError:
        return None
    except ValueError as err:  # a number of no version: the kill came before the marker was whole
        if os.path.isdir(marker) or not os.path.isfile(marker):
            raise UsageError(f"{marker} is not a regular file ({err}); remove it and retry") from None
        number = 0
    outcome = None
    if number in published(out) and (latest(out) or 0) < number:
        set_latest(out, number)
        outcome = f"finished publishing {version_name(number)}: latest points at it"
    marker.unlink()
    return outcome


def set_latest(out: str | Path, number: int) -> None:
    """Atomic switch: a relative symlink under a temporary name, renamed over the old one."""
    out = Path(out)
    name = version_name(number)
    if not (out / name).is_file():
        raise VersionError(f"{out / name} does not exist")
    tmp = out / f".{LATEST}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    try:
        left = os.readlink(out / LATEST)
    except OSError:
        left = None
    os.symlink(name, tmp)
    os.replace(tmp, out / LATEST)
    fsync_dir(out)
    if left is not None and left != name and VERSION_RE.match(left) and (out / left).is_file():
        _stamp_retired(out / left)


def _stamp_retired(version_file: Path) -> None:
    """Record when ``version_file`` stopped being latest, as its lease's mtime (``_retired_at``):
    readers whose locks retention cannot see may have opened it until now (after a rollback, long
    after it stopped being the newest)."""
    lease = leases.lease_path(version_file)
    try:
        os.utime(lease, follow_symlinks=False)
    except FileNotFoundError:
        try:
            leases.prepare(version_file)
        except OSError:
            pass
    except OSError:  # a lease we may not touch: the newest-based age is all there is
        pass


def dependencies(path: Path) -> set[Path]:
    """Other files a version reads from (sources of its virtual datasets)."""
    with h5py.File(os.path.realpath(path), "r") as f:
        return {Path(s) for s in virtual_sources(f)}


def retain(out: str | Path, keep: int, retire_after: float = 0) -> list[Path]:
    """Delete published versions beyond the newest ``keep``. Never latest, a version a live reader
    pins (its lease: h5forge._format.leases), one that stopped being the newest less than
    ``retire_after`` seconds ago (for readers whose locks this host cannot see), nor a file that
    any of those reads. A version kept for a reader goes at a later retention, once it is free."""
    out = Path(out)
    versions = published(out)
    kept = set(sorted(versions)[-keep:])
    current = latest(out)
    if current is not None:
        kept.add(current)
    now = time.time()
    removed = []
    with ExitStack() as held:  # exclusive leases of what is deleted, until it is gone
        doomed = []
        for number, path in versions.items():
            if number in kept:
                continue
            if now - _retired_at(versions, number) < retire_after or not held.enter_context(leases.unclaimed(path)):
                kept.add(number)
                continue
            doomed.append(number)
        protected = {versions[v].resolve() for v in kept if v in versions}
        for v in kept:
            if v in versions:
                try:
                    protected |= {p.resolve() for p in dependencies(versions[v])}
                except Exception as err:  # noqa: BLE001 - a damaged kept file: what it reads is unknown
                    log.warning(
                        "retention deletes nothing: %s cannot be read (%s), so the files it reads are not known",
                        versions[v].name,
                        err,
                    )
                    return []
        for number in doomed:
            path = versions[number]
            if path.resolve() not in protected:
                path.unlink()
                leases.drop(path)
                removed.append(path)
        for p in sorted(out.iterdir()):
            if DELTA_RE.match(p.name) and p.resolve() not in protected:
                p.unlink()
                removed.append(p)
            elif ROWS_FOLDER_RE.match(p.name) and not any(q.parent == p.resolve() for q in protected):
                shutil.rmtree(p)
                removed.append(p)
    _drop_stale_leases(out)
    if removed:
        fsync_dir(out)
    return removed


def _retired_at(versions: dict[int, Path], number: int) -> float:
    """When a version stopped being the newest (the time the next one was written), or later,
    when it stopped being latest (a version rolled back to: its lease's mtime, ``_stamp_retired``)."""
    newer = [v for v in versions if v > number]
    if not newer:
        return time.time()
    at = versions[min(newer)].stat().st_mtime
    try:
        return max(at, os.stat(leases.lease_path(versions[number]), follow_symlinks=False).st_mtime)
    except OSError:
        return at


def _drop_stale_leases(out: Path) -> None:
    """Lease files of versions that no longer exist (a reader that came after the deletion)."""
    folder = out / leases.LEASE_DIR
    if not folder.is_dir():
        return
    for lease in folder.glob("*.lease"):
        version = out / lease.name[: -len(".lease")]
        if not version.exists():
            with leases.unclaimed(version) as free:
                if free:
                    leases.drop(version)

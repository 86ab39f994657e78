"""Reader leases: a version that a live reader has pinned is not deleted by retention.

Each published version has a lease file ``<out>/readers/<version file>.lease``. A reader holds a
*shared* ``flock`` on it for as long as it pins the version (from construction until it is
garbage-collected or its process ends; a crashed process's locks are dropped by the kernel).
Retention deletes a version only after taking an *exclusive* lock on its lease without waiting;
it then unlinks the version and the lease while still holding that lock. A reader therefore locks
the lease first and only then checks that the version exists: whichever comes first wins, and a
reader that comes second sees a deleted version and says so (``VersionDeleted``).

``flock`` locks belong to an open file description, so two readers in one process, a reader and
retention in one process, and a forked DataLoader worker all behave as separate holders. Each
process keeps one descriptor per lease file and counts its readers on it.

Across hosts (docs/reading.md, "Retention and live readers"): on NFS (Linux clients since 2.6.12)
``flock`` is sent to the server as a whole-file lock, so readers on other hosts are seen, unless
the share is mounted with ``local_lock=flock``/``all`` or ``nolock``; a client that dies keeps its
lock until the server's lease time (about 90 s for NFSv4) runs out. On filesystems whose locks are
local to each host (most FUSE mounts, some SMB and object-store gateways, Lustre without
``-o flock``), only the minimum age (``output.retire_after_seconds``) protects remote readers.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from h5forge._format.names import VERSION_RE

LEASE_DIR = "readers"
RESOLVE_ATTEMPTS = 10  # a link that moves on while each version it named is deleted: tried this often
FOLDER_MODE = 0o755  # others read and lock leases; only the dataset's writer adds or removes them
LEASE_MODE = 0o644
_LOCK = threading.Lock()
_HELD: dict[str, list[int]] = {}  # lease path -> [fd, readers in this process]
_PID = os.getpid()


def lease_path(version_file: str | os.PathLike) -> Path:
    """Where the lease of a version file lives (beside it, in ``readers/``)."""
    p = Path(version_file)
    return p.parent / LEASE_DIR / f"{p.name}.lease"


def prepare(version_file: str | os.PathLike) -> None:
    """Create the lease file at publish. Readers without write access to the output folder lock it
    through a read-only descriptor (a shared ``flock`` needs no write access), so neither the lease
    nor ``readers/`` is writable by others: nobody else can put a file or a link there. Whatever is
    in the lease's place that is not this user's regular file (a symbolic link, another user's
    file) is removed, never followed, and the lease is made anew."""
    lease = lease_path(version_file)
    folder = _lease_folder(lease.parent)
    try:
        try:
            st = os.stat(lease.name, dir_fd=folder, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                os.unlink(lease.name, dir_fd=folder)
        except FileNotFoundError:
            pass
        os.close(os.open(lease.name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, LEASE_MODE, dir_fd=folder))
    finally:
        os.close(folder)


def _lease_folder(path: Path) -> int:
    """A descriptor on ``readers/``, made if missing; a link in its place is removed, and write
    access of others (an older folder's mode) is taken away when the folder is ours."""
    if path.is_symlink():
        path.unlink()
    path.mkdir(mode=FOLDER_MODE, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and st.st_mode & 0o022:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~0o022 & ~stat.S_ISVTX)
    return fd


def _open_lease(lease: Path) -> int | None:
    """A descriptor on the lease file, creating it when we may; None when it cannot be had (a
    read-only folder without a lease file: only the minimum age protects this reader)."""
    try:
        lease.parent.mkdir(mode=FOLDER_MODE, exist_ok=True)
        return os.open(lease, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, LEASE_MODE)
    except OSError:  # read-only folder or filesystem, or something in the way: never stops a reader
        pass
    try:
        return os.open(lease, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None


def acquire(version_file: str | os.PathLike) -> bool:
    """Pin ``version_file`` for this process (one more reader); True if a lease is held.

    Call before checking that the version exists: retention deletes only what no lease holds.
    """
    global _PID
    lease = lease_path(version_file)
    key = str(lease)
    with _LOCK:
        if _PID != os.getpid():  # a forked child: the parent's descriptors are the parent's pins
            _HELD.clear()
            _PID = os.getpid()
        if key in _HELD:
            _HELD[key][1] += 1
            return True
        fd = _open_lease(lease)
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while retention deletes this very version
        except OSError:
            os.close(fd)  # a filesystem without locks: the minimum age is all there is
            return False
        _HELD[key] = [fd, 1]
        return True


def pin_path(path: str | os.PathLike) -> tuple[str, bool]:
    """Resolve ``path`` (a version file, or ``dataset_latest.h5``) and pin the version it names for
    this process: ``(real path, whether a lease is held)``. Pinned before the existence check, so
    the version returned exists and retention keeps it until ``release``. A link resolved to a
    version that retention deleted before the pin (latest had moved on) is resolved again, up to
    ``RESOLVE_ATTEMPTS`` times; when the real path does not exist in the end (a link to nothing,
    a deleted version), nothing is held and the caller says so."""
    path = os.fspath(path)
    real = os.path.realpath(path)
    for _ in range(RESOLVE_ATTEMPTS):
        # nothing is leased for a file that is not there (no lease file made for it)
        held = bool(VERSION_RE.match(os.path.basename(real))) and os.path.exists(real) and acquire(real)
        if os.path.exists(real):
            return real, held
        if held:
            release(real)
        again = os.path.realpath(path)
        if again == real:  # the link has not moved: it points at nothing
            break
        real = again
    return real, False


@contextmanager
def pinned(path: str | os.PathLike) -> Iterator[str]:
    """``pin_path`` for the time of a block (``verify``, ``export``, a listing): yields the real
    path, which exists when the block starts unless nothing could be pinned (the caller's existence
    check says so), and keeps the version from retention until the block ends."""
    real, held = pin_path(path)
    try:
        yield real
    finally:
        if held:
            release(real)


def release(version_file: str | os.PathLike) -> None:
    """One reader of ``version_file`` in this process is gone; the last one drops the lease."""
    key = str(lease_path(version_file))
    with _LOCK:
        if _PID != os.getpid() or key not in _HELD:
            return
        _HELD[key][1] -= 1
        if _HELD[key][1] <= 0:
            os.close(_HELD.pop(key)[0])


def held_here(version_file: str | os.PathLike) -> bool:
    """Whether a reader in this process pins ``version_file``."""
    with _LOCK:
        return _PID == os.getpid() and str(lease_path(version_file)) in _HELD


@contextmanager
def unclaimed(version_file: str | os.PathLike) -> Iterator[bool]:
    """For retention: yields True while holding the exclusive lock of a version that no reader
    pins (delete it inside the block, then call ``drop``); False when a reader holds it."""
    if held_here(version_file):
        yield False
        return
    lease = lease_path(version_file)
    try:
        fd = os.open(lease, os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        yield True  # never leased: nobody can be reading it through h5forge
        return
    except OSError:
        yield False  # cannot tell: keep it
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        except OSError:  # no locks on this filesystem: the minimum age decides
            pass
        yield True
    finally:
        os.close(fd)


def drop(version_file: str | os.PathLike) -> None:
    """Remove a deleted version's lease file (inside ``unclaimed``)."""
    lease_path(version_file).unlink(missing_ok=True)

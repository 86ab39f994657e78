"""A full disk ends a run with one line, and leaves no open HDF5 file behind.

HDF5 reports ENOSPC as an ``OSError`` from a dataset write and then, while closing, as a
``RuntimeError`` ("Can't decrement id ref count", "Can't destroy cache") whose text alone says
"No space left on device". A file whose close failed stays open inside the library, which flushes
it again at interpreter exit, fails again and crashes the process (exit 139). A temporary file
that is being discarded anyway is therefore closed with its descriptor pointed at an anonymous
in-memory file: what the library still writes while closing goes there, and the close succeeds.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import h5py

from h5forge.errors import DiskFull, H5forgeError
from h5forge._format.names import PARTIAL_RE

# a file-size limit (EFBIG: ``ulimit -f``, a batch system's RLIMIT_FSIZE, FAT32's 4 GiB) fails the
# write the same way, and is reported the same way, in its own words
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "File too large")
_H5_FILENAME = re.compile(r"filename = '([^']+)'")


def _chain(err: BaseException | None):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def disk_full_cause(err: BaseException) -> BaseException | None:
    """The error of ``err``'s chain that says the disk (or quota) is full, or None."""
    for e in _chain(err):
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return e
        if isinstance(e, (OSError, RuntimeError)) and any(t in str(e) for t in _FULL_TEXT):
            return e
    return None


def file_of(err: BaseException) -> str | None:
    """The file the failed write was for: HDF5 names it in its message, Python in ``filename``."""
    for e in _chain(err):
        m = _H5_FILENAME.search(str(e))
        if m:
            return m.group(1)
        if isinstance(e, OSError) and e.filename:
            return os.fsdecode(e.filename)
    return None


def device_of(path: str | os.PathLike) -> str:
    """The mount point holding ``path`` and its filesystem, e.g. ``/data (ext4)``."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    fstype = ""
    try:
        with open("/proc/mounts", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) > 2 and parts[1].encode().decode("unicode_escape") == str(p):
                    fstype = parts[2]  # the last mount at a point is the one in effect
    except OSError:  # not Linux: the mount point alone
        pass
    return f"{p} ({fstype})" if fstype else str(p)


def as_disk_full(err: BaseException, fallback: str | os.PathLike) -> DiskFull | None:
    """``err`` as a one-line DiskFull (``fallback`` names the file when the error does not), or None."""
    if isinstance(err, DiskFull):
        return err
    if isinstance(err, H5forgeError):  # it says what happened already (e.g. published, but not moved)
        return None
    cause = disk_full_cause(err)
    if cause is None:
        return None
    target = file_of(err) or os.fspath(fallback)
    if getattr(cause, "errno", None) == errno.EFBIG or "File too large" in str(cause):
        return DiskFull(
            f"file too large for {device_of(target)} while writing {target} (a file-size limit: `ulimit -f`, "
            "or the filesystem's largest file); nothing was published: raise the limit, or write to "
            "another filesystem, and run it again"
        )
    return DiskFull(
        f"no space left on {device_of(target)} while writing {target}; nothing was published: "
        "free some space and run it again"
    )


def _redirect_to_scratch(file: h5py.File) -> bool:
    """Point the descriptor HDF5 writes through at an anonymous in-memory file: what the library
    still has to write while closing (dirty chunks, metadata) then lands there and is thrown away,
    however full the disk is. False where that cannot be done (then the file is emptied instead)."""
    try:
        fd = file.id.get_vfd_handle()
        scratch = os.memfd_create("h5forge-discarded")
    except (AttributeError, OSError, ValueError, RuntimeError):
        return False
    try:
        os.dup2(scratch, fd)
    finally:
        os.close(scratch)
    return True


def discard_h5(file: h5py.File, path: str | os.PathLike) -> None:
    """Close and delete an HDF5 file being written, even when the disk is full."""
    if not _redirect_to_scratch(file):
        try:
            os.truncate(path, 0)  # it is deleted anyway; this gives the library some room to close it
        except OSError:
            pass
    try:
        for attempt in range(3):  # after a failed flush the first close may fail, a second succeeds
            try:
                file.close()
                break
            except (OSError, RuntimeError):
                if attempt == 2:
                    raise
    finally:
        Path(path).unlink(missing_ok=True)


def release_partials() -> list[str]:
    """Close the temporary (``.partial``) HDF5 files this process still holds open for writing,
    emptied first (see the module doc); after a failed run, before the error is reported."""
    closed = []
    for fid in h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE):
        try:
            name = fid.name.decode(errors="replace") if isinstance(fid.name, bytes) else str(fid.name)
            if not PARTIAL_RE.match(os.path.basename(name)) or fid.get_intent() == h5py.h5f.ACC_RDONLY:
                continue
            discard_h5(h5py.File(fid), name)
            closed.append(name)
        except (OSError, RuntimeError, ValueError):  # best effort: the run is failing already
            continue
    return closed

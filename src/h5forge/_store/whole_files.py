"""Files written whole or not at all (reports, the journal, records, an in-memory HDF5 image).

On a full disk the half-written file is removed and the error names the file it was for: a
failed ``write`` alone names none, and the one-line disk-full message says which file it was.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

NAME_MAX = 255  # bytes in one file name on Linux file systems


def _named(err: OSError, path: Path) -> OSError:
    if err.filename is None:
        err.filename = os.fspath(path)
    return err


def _write(path: Path, data: bytes, durable: bool) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())


def write_new(path: Path, data: bytes, durable: bool = True) -> None:
    """``data`` as the file ``path``; nothing stays at ``path`` when the write fails."""
    try:
        _write(path, data, durable)
    except OSError as err:
        Path(path).unlink(missing_ok=True)
        raise _named(err, path) from None


def temporary_name(path: Path, owner: str = "") -> Path:
    """``.<name>.tmp`` beside ``path`` (``.<name>.<owner>.tmp`` with an ``owner``), or
    ``.<digest of the name>.tmp`` when that would exceed NAME_MAX (a name that just fits, such as
    a shortened reason file's, still gets one)."""
    tail = f".{owner}.tmp" if owner else ".tmp"
    name = f".{path.name}{tail}"
    if len(os.fsencode(name)) > NAME_MAX:
        name = f".{hashlib.sha256(os.fsencode(path.name)).hexdigest()[:24]}{tail}"
    return path.with_name(name)


def replace_file(path: Path, data: str | bytes, tmp: Path | None = None, durable: bool = False) -> None:
    """``path`` replaced atomically by ``data`` (text as UTF-8), through the temporary file ``tmp``
    (default ``temporary_name(path)``): a reader sees the old file or the new one, and a failed
    write leaves the old one and no temporary file."""
    path = Path(path)
    tmp = tmp or temporary_name(path)
    try:
        _write(tmp, data.encode("utf-8") if isinstance(data, str) else data, durable)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise _named(err, path) from None

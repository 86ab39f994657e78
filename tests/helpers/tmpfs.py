"""A small tmpfs for the full-disk tests (mounting needs root, which CI has)."""

from __future__ import annotations

import subprocess
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


@contextmanager
def mounted_tmpfs(parent: Path, size: str = "16m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on a new folder under ``parent``, unmounted afterwards; the test
    skips where it cannot be mounted (not root)."""
    mnt = parent / f"fs-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip() or res.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)

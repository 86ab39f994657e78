"""Discovery lists a field's files with its own scan of the folders (one stat per file, the states the
hash cache keeps): it must find what ``Path.glob`` finds, in the same order, on a hostile tree."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from h5forge._ingest.discover import _matches
from h5forge._ingest.incremental.hash_cache import state_of

PATTERNS = [
    "images/*.png",
    "*.png",
    "*/*.png",
    "train/*/*.png",
    "images/a.png",
    "images/[ab]*.png",
    "images/?.png",
    "*/*/*",
    "missing/*.png",
    "images/*",
    "**/*.png",
    "images/../images/*.png",
]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "raw"
    for rel in ("images/a.png", "images/b.png", "images/.hidden.png", "images/é.png", "images/c.PNG",
                "train/cat/1.png", "train/dog/2.png", "train/.dot/3.png", "other/x.png", "top.png",
                "images/dir.png/inner.png"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"\x89PNG" + rel.encode())
    (root / "images/link.png").symlink_to(root / "images/a.png")
    (root / "images/broken.png").symlink_to(root / "images/nowhere.png")
    (root / "images/outside.png").symlink_to(tmp_path / "elsewhere.png")
    (tmp_path / "elsewhere.png").write_bytes(b"x")
    (root / "train/linked").symlink_to(root / "train/cat")  # a folder reached through a symlink
    os.mkfifo(root / "images/fifo.png")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(root / "images/sock.png"))
    locked = root / "locked"
    locked.mkdir()
    (locked / "z.png").write_bytes(b"z")
    locked.chmod(0)
    yield root
    locked.chmod(0o755)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_scan_finds_what_path_glob_finds_in_its_order(tree: Path, pattern: str):
    key = lambda p: p.replace("/", "\0")  # noqa: E731 - discovery's order
    expected = sorted(map(str, tree.glob(pattern)), key=key)
    found = sorted((p for p, _ in _matches(str(tree), pattern)), key=key)
    assert found == expected
    assert expected or pattern == "missing/*.png"


def test_an_entry_tells_a_symlink_and_its_status_as_a_stat_does(tree: Path):
    for path, entry in _matches(str(tree), "images/*"):
        assert entry is not None
        assert entry.is_symlink() == os.path.islink(path)
        if os.path.isfile(path) and not entry.is_symlink():
            st = entry.stat()
            assert (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) == state_of(path)

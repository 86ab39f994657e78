"""A rebuild reads only the raw files whose state changed since the last build: an unchanged
folder is recognised from the files' states alone, a file rewritten in place with its size and
mtime put back is read again (its ctime moved), a file changed just before its state was taken
is not trusted, and a damaged or foreign cache costs a full hashing pass, never a wrong key."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from h5forge._format.names import HASH_CACHE, HASH_LOG
from h5forge._ingest.incremental import hash_cache
from h5forge._ingest.discover import discover
from h5forge._ingest.incremental.inputs import fingerprint
from h5forge._ingest.incremental.rebuild import inputs_of, unchanged_since
from tests.helpers.files import make_raw, spec_for
from tests.ingest.incremental.test_rebuild import build


@pytest.fixture
def built(tmp_path, monkeypatch):
    """A version of 40 samples whose files count as settled (RACY_SECONDS 0: no waiting here)."""
    monkeypatch.setattr(hash_cache, "RACY_SECONDS", 0.0)
    raw = make_raw(tmp_path / "raw", n=40, seed=2)
    spec = spec_for(raw, tmp_path / "out")
    _, summary = build(spec)
    files = 2 * len(discover(spec).samples)
    assert summary.timings["hash_cache_files"] == files
    return spec, raw, files


def test_an_unchanged_folder_is_recognised_without_reading_a_file(built):
    spec, _, files = built
    inputs = inputs_of(spec, discover(spec))
    assert (inputs.deferred, inputs.hashed_files) == (False, 0)
    assert inputs.key == fingerprint(spec, discover(spec)).key  # the same key as hashing every file
    assert unchanged_since(spec.output.dir, inputs) == 1


def test_a_file_rewritten_with_its_size_and_mtime_put_back_is_read_again(built):
    spec, raw, _ = built
    picture = next(iter(sorted((raw / "images").glob("*.png"))))
    st = picture.stat()
    with Image.open(picture) as img:
        inverted = ImageOps.invert(img.convert("RGB"))
    data = bytearray(picture.read_bytes())
    inverted.save(picture)
    new = bytearray(picture.read_bytes())
    size = len(data)  # same size: the new picture's bytes, cut or padded to the old length
    picture.write_bytes(bytes(new[:size]).ljust(size, b"\0"))
    os.utime(picture, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (picture.stat().st_size, picture.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    inputs = inputs_of(spec, discover(spec))
    assert inputs.hashed_files == 1
    assert unchanged_since(spec.output.dir, inputs) is None
    assert inputs.key == fingerprint(spec, discover(spec)).key


def test_a_file_changed_just_before_its_state_was_taken_is_not_trusted(tmp_path):
    raw = make_raw(tmp_path / "raw", n=12, seed=4)  # written a moment ago: every file is racy
    spec = spec_for(raw, tmp_path / "out")
    _, summary = build(spec)
    assert summary.timings["hash_cache_files"] == 0
    assert inputs_of(spec, discover(spec)).hashed_files == 2 * len(discover(spec).samples)


@pytest.mark.parametrize("damage", ["not an archive", "other root", "no hashes", "short hashes", "not hex", "missing"])
def test_a_damaged_or_foreign_cache_costs_a_full_hashing_pass(built, damage):
    spec, _, files = built
    path = Path(spec.output.dir) / HASH_CACHE
    with np.load(path) as saved:
        data = dict(saved)
    assert len(data["hexes"]) == files
    if damage == "not an archive":
        path.write_text("{")
    elif damage == "missing":
        path.unlink()
    else:
        if damage == "other root":
            data["root"] = np.array("/elsewhere")
        elif damage == "no hashes":
            del data["hexes"]
        elif damage == "short hashes":  # one row fewer than paths
            data["hexes"] = data["hexes"][1:]
        else:
            data["hexes"] = np.array([b"z" * 64] * len(data["hexes"]), "S64")
        with open(path, "wb") as f:
            np.savez(f, **data)
    inputs = inputs_of(spec, discover(spec))
    assert inputs.hashed_files == files
    assert unchanged_since(spec.output.dir, inputs) == 1


def test_the_cache_round_trips_any_file_name_and_state(tmp_path):
    """Names with undecodable bytes, a newline, a non-ASCII letter or a comma come back as saved, and
    states beyond int64 (a time set centuries ahead, a 64-bit inode) compare as they are; an empty
    cache is a cache of nothing; a racy file is left out."""
    names = ["images/a.png", "images/b\udcff.png", "x/new\nline.png", "é,1.png", "far.png"]
    states = {rel: (i + 1, 10 + i, 20 + i, 30 + i) for i, rel in enumerate(names)}
    states["far.png"] = (7, 2**64 - 5, -(10**9), 2**63 + 3)
    hexes = {rel: f"{i:064x}" for i, rel in enumerate(names)}
    late = {**states, "late.png": (1, 2, 10**19, 4)}  # changed after the states were taken
    (tmp_path / ".h5forge-hashes.json").write_text("{}")  # the cache's earlier form: replaced
    assert hash_cache.save(tmp_path, tmp_path / "raw", late, {**hexes, "late.png": "f" * 64}, 10**18) == len(names)
    assert sorted(p.name for p in tmp_path.iterdir()) == [HASH_CACHE]
    cache = hash_cache.load(tmp_path, tmp_path / "raw")
    assert cache.known(states) == hexes
    assert cache.known({"late.png": late["late.png"]}) == {}
    moved = {
        "images/a.png": (1, 10, 20, 31),
        "far.png": (7, 2**64 - 5, -(10**9), 3),
        "x/new\nline.png": (3, 12, 22, 32),
    }
    assert cache.known(moved) == {"x/new\nline.png": hexes["x/new\nline.png"]}  # another inode: another file
    assert hash_cache.load(tmp_path, tmp_path / "other").paths == []
    assert hash_cache.save(tmp_path, tmp_path / "raw", {}, {}, 10**18) == 0
    assert hash_cache.load(tmp_path, tmp_path / "raw").known(states) == {}


def _log_entries(n: int, start: int = 0, names: tuple[str, ...] = ()) -> tuple[dict, dict]:
    rels = list(names) or [f"images/{i}.png" for i in range(start, start + n)]
    return {rel: (i + 1, 10 + i, 20 + i, 30 + i) for i, rel in enumerate(rels, start)}, {
        rel: f"{i:064x}" for i, rel in enumerate(rels, start)
    }


def test_the_log_adds_what_a_build_learnt_after_the_cache_and_goes_when_it_is_written_whole(tmp_path):
    """Blocks appended to the log are read after the cache (an entry in both: the log's), with any
    name and state the cache takes; writing the cache whole removes the log."""
    raw = tmp_path / "raw"
    states, hexes = _log_entries(10)
    assert hash_cache.save(tmp_path, raw, states, hexes, 10**18) == 10
    odd = ("b\udcff.png", "new\nline.png", "far.png")
    more_states, more_hexes = _log_entries(0, 100, odd)
    more_states["far.png"] = (7, 2**64 - 5, -(10**9), 2**63 + 3)
    assert hash_cache.append(tmp_path, raw, more_states, more_hexes, 10**18, list(odd)) == 3
    states["images/0.png"] = (99, 99, 99, 99)  # the file changed and was hashed again
    hexes["images/0.png"] = "e" * 64
    assert hash_cache.append(tmp_path, raw, states, hexes, 10**18, ["images/0.png"]) == 1
    cache = hash_cache.load(tmp_path, raw)
    assert cache.known({**states, **more_states}) == {**hexes, **more_hexes}
    assert hash_cache.load(tmp_path, tmp_path / "other").paths == []  # another source folder's log
    assert hash_cache.save(tmp_path, raw, states, hexes, 10**18) == 10
    assert not (tmp_path / HASH_LOG).exists()
    assert hash_cache.load(tmp_path, raw).known(more_states) == {}


@pytest.mark.parametrize("damage", ["torn", "flipped byte", "not hex", "other root"])
def test_a_torn_or_damaged_log_block_ends_the_log(tmp_path, damage):
    """Blocks before a damaged one are kept; it and every block after it are not (a torn last
    block: a build killed while appending); a log of another source folder is started again."""
    raw = tmp_path / "raw"
    first, second = _log_entries(5), _log_entries(5, 5)
    hash_cache.append(tmp_path, raw, first[0], first[1], 10**18, list(first[0]))
    size = (tmp_path / HASH_LOG).stat().st_size
    if damage == "other root":
        hash_cache.append(tmp_path, tmp_path / "elsewhere", second[0], second[1], 10**18, list(second[0]))
        assert hash_cache.load(tmp_path, raw).known({**first[0], **second[0]}) == {}
        assert hash_cache.load(tmp_path, tmp_path / "elsewhere").known({**first[0], **second[0]}) == second[1]
        return
    hash_cache.append(tmp_path, raw, second[0], second[1], 10**18, list(second[0]))
    data = bytearray((tmp_path / HASH_LOG).read_bytes())
    if damage == "torn":
        data = data[:-3]
    elif damage == "flipped byte":
        data[size + 20] ^= 1
    else:  # a right checksum over digits that are not hex
        import struct
        import zlib

        body = data[size:-4].replace(b"0" * 60, b"z" * 60, 1)
        data = data[:size] + body + struct.pack("<I", zlib.crc32(body))
    (tmp_path / HASH_LOG).write_bytes(bytes(data))
    assert hash_cache.load(tmp_path, raw).known({**first[0], **second[0]}) == first[1]
    third = _log_entries(5, 10)
    hash_cache.append(tmp_path, raw, third[0], third[1], 10**18, list(third[0]))
    # the next build's block is read: after a torn block it takes that block's place
    expected = {**first[1], **third[1]} if damage == "torn" else first[1]
    assert hash_cache.load(tmp_path, raw).known({**first[0], **second[0], **third[0]}) == expected


def test_a_racy_file_is_not_logged(tmp_path):
    states, hexes = _log_entries(3)
    states["images/2.png"] = (1, 2, 10**19, 4)  # changed after the states were taken
    assert hash_cache.append(tmp_path, tmp_path / "raw", states, hexes, 10**18, list(states)) == 2
    assert list(hash_cache.load(tmp_path, tmp_path / "raw").known(states)) == ["images/0.png", "images/1.png"]
    assert hash_cache.append(tmp_path, tmp_path / "raw", states, hexes, 10**18, []) == 0

"""A rebuild reads only the raw files whose state changed since the last build: an unchanged
folder is recognised from the files' states alone, a file rewritten in place with its size and
mtime put back is read again (its ctime moved), a file changed just before its state was taken
is not trusted, and a damaged or foreign cache costs a full hashing pass, never a wrong key."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PIL import Image, ImageOps

from h5forge._format.names import HASH_CACHE
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


@pytest.mark.parametrize("damage", ["not json", "other root", "bad entries", "missing"])
def test_a_damaged_or_foreign_cache_costs_a_full_hashing_pass(built, damage):
    spec, _, files = built
    path = Path(spec.output.dir) / HASH_CACHE
    data = json.loads(path.read_text())
    if damage == "not json":
        path.write_text("{")
    elif damage == "other root":
        path.write_text(json.dumps({**data, "root": "/elsewhere"}))
    elif damage == "bad entries":  # entries without their hash
        path.write_text(json.dumps({"root": data["root"], "files": {k: v[:4] for k, v in data["files"].items()}}))
    else:
        path.unlink()
    inputs = inputs_of(spec, discover(spec))
    assert inputs.hashed_files == files
    assert unchanged_since(spec.output.dir, inputs) == 1

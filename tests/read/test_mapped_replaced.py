"""A thin version's files replaced by others of the same names (the output folder deleted and built
again by another process) while this process still holds the first ones open: a new reader reads
the new files, and the first reader never returns a row of the new files as its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from PIL import Image

import h5forge
from h5forge.errors import ReadError
from h5forge.read import SplitReader
from tests.helpers.data import age_files, drop_samples
from tests.helpers.files import make_raw, spec_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def thin_version(raw, new, out, inbox, codec: str) -> str:
    """A build of ``raw`` and an append of ``new``'s samples: a thin version over two files."""
    spec = spec_for(raw, out, (32, 32), codec=codec)
    spec = spec.model_copy(
        update={
            "source": spec.source.model_copy(update={"inbox": inbox}),
            "append": spec.append.model_copy(update={"settle_seconds": 0.0}),
        }
    )
    h5forge.build(spec)
    inbox.mkdir(parents=True, exist_ok=True)
    drop_samples(new, inbox, sorted(p.stem for p in (new / "images").glob("*.png")), rename="n_")
    age_files(inbox)
    return h5forge.append(spec).path


def invert(picture) -> None:
    with Image.open(picture) as img:
        inverted = 255 - np.asarray(img)
    Image.fromarray(inverted).save(picture)


def stored(path) -> np.ndarray:
    with h5py.File(os.path.realpath(path), "r") as f:
        assert f["train/images"].is_virtual
        return f["train/images"][()]


@pytest.mark.parametrize("codec", ["lz4", "none"])
def test_new_files_at_the_same_names_are_read_as_new(tmp_path, codec):
    raw, new, out, inbox = tmp_path / "raw", tmp_path / "new", tmp_path / "out", tmp_path / "inbox"
    make_raw(raw, n=20)
    make_raw(new, n=6, seed=9, prefix="x_")
    path = thin_version(raw, new, out, inbox, codec)
    first = SplitReader(path, "train", ("images",))
    before = first.read(range(len(first)))["images"]
    np.testing.assert_array_equal(before, stored(path))

    # one picture inverted, the folder built again from scratch in another process
    changed = first.ids()[5]
    picture = raw / "images" / f"{changed}.png"
    invert(picture)
    shutil.rmtree(out)
    shutil.rmtree(inbox)
    rebuild = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "from tests.read.test_mapped_replaced import thin_version;"
        "thin_version(*map(Path, sys.argv[2:6]), sys.argv[6])"
    )
    subprocess.run([sys.executable, "-c", rebuild, REPO, raw, new, out, inbox, codec], check=True, cwd=REPO)

    now = stored(path)
    assert not np.array_equal(now[5], before[5])
    second = SplitReader(path, "train", ("images",))
    np.testing.assert_array_equal(second.read(range(len(second)))["images"], now)
    np.testing.assert_array_equal(second.read_one(5)["images"], now[5])
    try:  # the first reader reads its own version's rows, or says it cannot
        again = first.read(range(len(first)))["images"]
    except ReadError:
        return
    np.testing.assert_array_equal(again, before)


def test_a_version_file_replaced_after_its_reader_opened_it_is_a_read_error(tmp_path):
    """A reader reads the file it opened, never another put at its path since (whose ids and
    statistics are not the ones it holds): a clear error, not the other file's rows."""
    raw, out = tmp_path / "raw", tmp_path / "out"
    make_raw(raw, n=20)
    spec = spec_for(raw, out, (32, 32), codec="lz4")
    path = os.path.realpath(h5forge.build(spec).path)
    with h5py.File(path, "r") as f:
        before = f["train/images"][()]
    first = SplitReader(path, "train", ("images",))  # open, no row read yet

    changed = first.ids()[5]
    picture = raw / "images" / f"{changed}.png"
    invert(picture)
    shutil.rmtree(out)
    assert os.path.realpath(h5forge.build(spec).path) == path  # the same name, another file
    assert not np.array_equal(stored_plain(path)[5], before[5])

    for read in (lambda: first.read(range(len(first))), lambda: first.read_one(5), first.ids):
        with pytest.raises(ReadError, match="replaced by another file"):
            read()


def stored_plain(path) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f["train/images"][()]

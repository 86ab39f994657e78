"""Retention and live readers: a version pinned by a reader in another process (and by its
DataLoader workers) is kept; a later retention deletes it once no reader holds it; a version
deleted anyway is a clear ReadError; the minimum age keeps a just-retired version."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from h5forge.errors import ReadError
from h5forge.format.leases import lease_path
from h5forge.store.versions import published, retain
from tests.helpers.files import make_version

READER = textwrap.dedent("""
    import sys
    from h5forge.read.torch import H5Dataset
    ds = H5Dataset(sys.argv[1], split="train", fields=("images", "masks"))
    print("pinned", ds.version, flush=True)
    sys.stdin.readline()  # the parent runs retention now
    rows = 0
    for epoch in range(2):  # new DataLoaders (and workers) after retention ran
        for images, masks in ds.loader(batch_size=2, num_workers=2, shuffle=True, seed=epoch):
            assert float(images.sum()) > 0
            rows += len(images)
    print("read", rows, flush=True)
    sys.stdin.readline()
""")


@pytest.fixture
def four_versions(tmp_path, small_inventory, raw_demo):
    out = tmp_path / "out"
    for _ in range(4):
        make_version(out, small_inventory, raw_demo)
    return out


def start_reader(path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", READER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=os.getcwd())
    line = proc.stdout.readline()
    assert line.startswith("pinned"), line + proc.stderr.read()
    return proc


def test_a_version_pinned_by_a_reader_process_survives_retention_until_the_reader_is_gone(four_versions):
    out = four_versions
    from h5forge.read.reader import SplitReader

    train_rows = len(SplitReader(out / "dataset_v0001.h5", "train"))
    reader = start_reader(out / "dataset_v0001.h5")
    try:
        removed = retain(out, keep=1)  # v1 is pinned; v2 and v3 are free
        assert sorted(p.name for p in removed) == ["dataset_v0002.h5", "dataset_v0003.h5"]
        assert list(published(out)) == [1, 4]
        reader.stdin.write("go\n")
        reader.stdin.flush()
        line = reader.stdout.readline()
        assert line.split() == ["read", str(2 * train_rows)], line + reader.stderr.read()
        assert retain(out, keep=1) == []  # still pinned while the reader lives
    finally:
        reader.stdin.write("bye\n")
        reader.stdin.close()
        assert reader.wait(timeout=60) == 0, reader.stderr.read()
    removed = retain(out, keep=1)  # the reader is gone: a later retention deletes it
    assert [p.name for p in removed] == ["dataset_v0001.h5"]
    assert list(published(out)) == [4]
    assert not lease_path(out / "dataset_v0001.h5").exists()


def test_a_killed_reader_leaves_no_pin(four_versions):
    out = four_versions
    reader = start_reader(out / "dataset_v0002.h5")
    reader.kill()
    reader.wait(timeout=30)
    removed = retain(out, keep=1)
    assert sorted(p.name for p in removed) == [f"dataset_v000{i}.h5" for i in (1, 2, 3)]


def test_a_reader_in_the_same_process_pins_too_and_release_frees_it(four_versions):
    from h5forge.read.torch import H5Dataset

    out = four_versions
    ds = H5Dataset(out / "dataset_latest.h5", split="train")  # pins v4
    old = H5Dataset(out / "dataset_v0002.h5", split="train")
    assert sorted(p.name for p in retain(out, keep=1)) == ["dataset_v0001.h5", "dataset_v0003.h5"]
    assert len(list(old.loader(batch_size=2))) > 0
    del old
    assert [p.name for p in retain(out, keep=1)] == ["dataset_v0002.h5"]
    assert ds.version == 4


def test_the_minimum_age_keeps_a_just_retired_version(four_versions):
    out = four_versions
    assert retain(out, keep=1, retire_after=3600) == []
    newest = out / "dataset_v0004.h5"
    past = time.time() - 7200
    for v in (2, 3, 4):  # published two hours ago
        os.utime(out / f"dataset_v000{v}.h5", (past, past), follow_symlinks=False)
    assert sorted(p.name for p in retain(out, keep=1, retire_after=3600)) == [
        "dataset_v0001.h5", "dataset_v0002.h5", "dataset_v0003.h5"]
    assert newest.exists()


def test_a_version_deleted_anyway_is_a_read_error_not_a_raw_file_not_found(four_versions):
    from h5forge.read.torch import H5Dataset

    out = four_versions
    ds = H5Dataset(out / "dataset_v0003.h5", split="train")
    os.unlink(out / "dataset_v0003.h5")  # by hand, or by a host whose locks are not seen here
    with pytest.raises(ReadError, match="no longer exists: it was deleted after this reader pinned it"):
        next(iter(ds.loader(batch_size=2, num_workers=1)))
    with pytest.raises(ReadError, match="no longer exists"):
        ds[0]
    with pytest.raises(ReadError, match="no longer exists"):
        ds.ids()

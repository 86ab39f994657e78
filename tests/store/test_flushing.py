"""A candidate's files are written to the disk while verify reads them: the flush runs beside the
block and is over when the block ends; a file it cannot open is left to the publish's seal, and a
write the disk failed is raised."""

import errno
import os
import threading
import time

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image, ImageOps

import h5forge
from h5forge._store import versions
from h5forge._store.verify import verify_file
from h5forge._store.versions import latest, published
from tests.helpers.data import write_spec_file
from tests.helpers.files import all_ids


def test_the_flush_runs_beside_the_block_and_ends_with_it(tmp_path, monkeypatch):
    data = tmp_path / "dataset_v0001.h5.partial"
    data.write_bytes(b"x" * (1 << 20))
    started, flushed = threading.Event(), []

    def slow_fdatasync(fd: int) -> None:
        started.set()
        time.sleep(0.3)
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(versions.os, "fdatasync", slow_fdatasync)
    with versions.flushing([tmp_path / "gone", data]):  # a missing file is no error here
        assert started.wait(60)  # the flush is under way while the block runs
        assert flushed == []
    assert flushed == [str(data)]  # and over when it ends
    versions.seal(data)
    assert data.stat().st_mode & 0o777 == 0o444


def _failing_fdatasync(fd: int) -> None:
    raise OSError(errno.EIO, os.strerror(errno.EIO))


def test_a_write_the_disk_failed_is_raised_when_the_flush_ends(tmp_path, monkeypatch):
    """The kernel reports a failed write-back to one sync only: the seal's own fsync, on a
    descriptor opened after it, would succeed. So the flush raises it."""
    data = tmp_path / "dataset_v0001.h5.partial"
    data.write_bytes(b"x" * 4096)
    monkeypatch.setattr(versions.os, "fdatasync", _failing_fdatasync)
    with pytest.raises(OSError) as failed, versions.flushing([data]):
        pass
    assert failed.value.errno == errno.EIO


def test_a_build_whose_disk_fails_a_write_publishes_nothing(raw_demo, tmp_path, monkeypatch):
    """An I/O error the disk reports while a version is written fails the build: latest stays
    where it was, and the next build publishes what a build on a healthy disk does."""
    raw, out = Path(shutil.copytree(raw_demo, tmp_path / "raw")), tmp_path / "out"
    spec_file = write_spec_file(raw, out, tmp_path / "spec.yaml")
    first = h5forge.build(str(spec_file))
    picture = sorted((raw / "images").glob("cell_*.png"))[0]
    with Image.open(picture) as img:
        inverted = ImageOps.invert(img.convert("RGB"))
    inverted.save(picture)  # one sample changed: the rebuild writes a version
    monkeypatch.setattr(versions.os, "fdatasync", _failing_fdatasync)
    with pytest.raises(OSError) as failed:
        h5forge.build(str(spec_file))
    assert failed.value.errno == errno.EIO
    assert latest(out) == first.version and list(published(out)) == [first.version]
    monkeypatch.undo()
    again = h5forge.build(str(spec_file))
    assert again.version == first.version + 1 and verify_file(again.path, resample=0).ok
    fresh = h5forge.build(str(write_spec_file(raw, tmp_path / "fresh", tmp_path / "fresh.yaml")))
    assert all_ids(again.path) == all_ids(fresh.path)
    assert same_rows(again.path, fresh.path)


def same_rows(a: str, b: str) -> bool:
    """Every split's row checksums (each covers a row's every value) equal in two versions."""
    with h5py.File(a, "r") as f, h5py.File(b, "r") as g:
        return all(np.array_equal(f[s]["checksum"][()], g[s]["checksum"][()]) for s in ("train", "val", "test"))

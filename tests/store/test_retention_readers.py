"""Retention and live readers: a version pinned by a reader in another process (and by its
DataLoader workers) is kept; a later retention deletes it once no reader holds it; a version
deleted anyway is a clear ReadError; the minimum age keeps a just-retired version; DataLoader
workers follow latest across ten publishes, each followed by retention, with no read error and
no all-zero row, while a reader pinned to the first version reads it throughout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from h5forge.errors import ReadError
from h5forge._format.leases import lease_path
from h5forge._store.versions import published, retain
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


def start_reader(path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", READER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=os.getcwd())
    line = proc.stdout.readline()
    assert line.startswith("pinned"), line + proc.stderr.read()
    return proc


def test_a_version_pinned_by_a_reader_process_survives_retention_until_the_reader_is_gone(four_versions):
    out = four_versions
    from h5forge.read._reader import SplitReader

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
        assert reader.wait(timeout=600) == 0, reader.stderr.read()
    removed = retain(out, keep=1)  # the reader is gone: a later retention deletes it
    assert [p.name for p in removed] == ["dataset_v0001.h5"]
    assert list(published(out)) == [4]
    assert not lease_path(out / "dataset_v0001.h5").exists()


def test_a_killed_reader_leaves_no_pin(four_versions):
    out = four_versions
    reader = start_reader(out / "dataset_v0002.h5")
    reader.kill()
    reader.wait(timeout=300)
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
    for v in (2, 3, 4):  # published two hours ago (latest moved on from v1-v3 then)
        os.utime(out / f"dataset_v000{v}.h5", (past, past), follow_symlinks=False)
        os.utime(lease_path(out / f"dataset_v000{v - 1}.h5"), (past, past))
    assert sorted(p.name for p in retain(out, keep=1, retire_after=3600)) == [
        "dataset_v0001.h5", "dataset_v0002.h5", "dataset_v0003.h5"]
    assert newest.exists()


def test_the_minimum_age_counts_from_when_a_version_stopped_being_latest(four_versions):
    """A version rolled back to was latest until the next publish moved latest on: a reader whose
    lock retention cannot see may have opened it until then, so its minimum age runs from that
    moment, not from when it stopped being the newest (long before)."""
    from h5forge._store.versions import set_latest

    out = four_versions
    past = time.time() - 7200
    for v in (1, 2, 3, 4):  # published two hours ago
        for p in (out / f"dataset_v000{v}.h5", lease_path(out / f"dataset_v000{v}.h5")):
            os.utime(p, (past, past), follow_symlinks=False)
    set_latest(out, 1)  # a rollback, now
    set_latest(out, 4)  # and latest moved on again (a publish, a rollback)
    assert sorted(p.name for p in retain(out, keep=1, retire_after=3600)) == ["dataset_v0002.h5", "dataset_v0003.h5"]
    assert (out / "dataset_v0001.h5").exists()
    os.utime(lease_path(out / "dataset_v0001.h5"), (past, past))  # an hour and more later
    assert [p.name for p in retain(out, keep=1, retire_after=3600)] == ["dataset_v0001.h5"]


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


# ---- readers across publishes -------------------------------------------------------------

READERS = textwrap.dedent("""
    import json, os, sys
    import torch
    from h5forge.read.torch import H5Dataset
    out, stop, progress = sys.argv[1], sys.argv[2], sys.argv[3]
    pinned = H5Dataset(os.path.join(out, "dataset_latest.h5"), split="train", fields=("images", "masks"))
    figures = {"passes": 0, "batches": 0, "rows": 0, "errors": [], "zero_rows": 0, "versions": [],
               "pinned_version": pinned.version, "pinned_passes": 0}
    print("ready", flush=True)
    while not os.path.exists(stop) or figures["passes"] < 3:
        try:
            ds = H5Dataset(os.path.join(out, "dataset_latest.h5"), split="train", fields=("images", "masks"))
            figures["versions"].append(ds.version)
            with open(progress + ".tmp", "w") as fh:  # which versions this reader has opened so far
                json.dump(sorted(set(figures["versions"])), fh)
            os.replace(progress + ".tmp", progress)
            for images, masks in ds.loader(batch_size=4, num_workers=4, shuffle=True, seed=figures["passes"],
                                           persistent_workers=False):
                figures["batches"] += 1
                figures["rows"] += len(images)
                figures["zero_rows"] += int((images.flatten(1).abs().sum(1) == 0).sum())
            del ds
            for images, masks in pinned.loader(batch_size=4, num_workers=2):  # new workers open it afresh
                figures["zero_rows"] += int((images.flatten(1).abs().sum(1) == 0).sum())
            figures["pinned_passes"] += 1
        except Exception as err:
            figures["errors"].append(f"{type(err).__name__}: {err}")
        figures["passes"] += 1
    figures["versions"] = sorted(set(figures["versions"]))
    print(json.dumps(figures), flush=True)
""")
HANG = 900  # seconds: bounds a reader that stopped reading, not how fast it reads


def wait_until_read(reader, progress, version: int) -> None:
    """Until the reader has opened ``version`` through dataset_latest.h5 (and let go of the one before)."""
    deadline = time.monotonic() + HANG
    while version not in (json.loads(progress.read_text()) if progress.exists() else []):
        if reader.poll() is not None:
            raise AssertionError(f"the reader exited ({reader.returncode}): {reader.stderr.read()}")
        assert time.monotonic() < deadline, f"the reader never opened v{version}"
        time.sleep(0.05)


@pytest.mark.slow
def test_readers_follow_latest_across_publishes_and_retention(small_inventory, raw_demo, tmp_path):
    out = tmp_path / "out"
    make_version(out, small_inventory, raw_demo)
    stop, progress = tmp_path / "stop", tmp_path / "opened"
    reader = subprocess.Popen([sys.executable, "-c", READERS, str(out), str(stop), str(progress)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "ready", reader.stderr.read()
        removed = []
        for k in range(2, 12):  # v2 ... v11, each published while the workers read
            if k in (4, 7, 10):  # the reader follows latest: it has moved on to the version before
                wait_until_read(reader, progress, k - 1)
            make_version(out, small_inventory, raw_demo)
            removed += retain(out, keep=2)
        wait_until_read(reader, progress, 11)  # reading v11 now, nothing older but the pinned v1
        removed += retain(out, keep=2)
        assert list(published(out)) == [1, 10, 11]  # the pinned v1 outlived every retention while read
        stop.touch()
        figures = json.loads(reader.stdout.readline())
        assert reader.wait(timeout=HANG) == 0, reader.stderr.read()
    finally:
        stop.touch()
        if reader.poll() is None:
            reader.kill()
    figures["published"], figures["removed_during_reads"] = 10, len(removed)
    print("readers across publishes:", json.dumps({k: v for k, v in figures.items() if k != "errors"}),
          "errors:", len(figures["errors"]))
    assert figures["errors"] == []
    assert figures["zero_rows"] == 0
    assert figures["pinned_version"] == 1 and figures["pinned_passes"] == figures["passes"]
    assert {3, 6, 9, 11} <= set(figures["versions"])  # the loop followed latest across publishes
    assert len(removed) == 8  # v2 ... v9: retention deleted everything no reader held

"""The commands that look at a dataset (info, diff, preview, versions) on damaged files: a one-line
error or a listing that names what cannot be read, never a traceback or a crash. Each damage is
a real h5py edit (or a byte flip) of a real version file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from h5forge._format.names import SPEC, Attr
from tests.helpers.tamper import raw_pair, thin_version

H5FORGE = str(Path(sys.executable).parent / "h5forge")


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([H5FORGE, *map(str, args)], capture_output=True, text=True, timeout=300)


def _said_in_one_line(done: subprocess.CompletedProcess) -> None:
    assert done.returncode in (0, 1, 2), (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and "Segmentation fault" not in done.stderr, done.stderr[-3000:]
    if done.returncode:
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and len(done.stderr.strip().splitlines()) <= 3, done.stderr[-3000:]


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> Path:
    """dataset_v0001.h5 (full) and dataset_v0002.h5 (thin over it and a delta)."""
    top = tmp_path_factory.mktemp("damaged")
    raw, raw_new = raw_pair(top)
    thin_version(top / "out", raw, raw_new)
    return top / "out"


def _spec_garbage(f: h5py.File) -> None:
    del f[SPEC]
    f.create_dataset(SPEC, data="{not json")


def _huge_count(f: h5py.File) -> None:
    f["train"].attrs[Attr.COUNT] = 2**62


def _row_files_to_dev_zero(f: h5py.File) -> None:
    f.attrs[Attr.ROW_FILES] = json.dumps([{"file": "/dev/zero", "counts": {"train": 1, "val": 0, "test": 0}}])


def _megabyte_id(f: h5py.File) -> None:
    if f["train/ids"].is_virtual:  # a thin version's rows live in its row files: rewrite the dataset
        values = list(f["train/ids"][()])
        del f["train/ids"]
        f.create_dataset("train/ids", data=values, dtype=h5py.string_dtype())
    f["train/ids"][0] = "x" * 1_000_000


DAMAGES = {"spec": _spec_garbage, "count": _huge_count, "row_files": _row_files_to_dev_zero, "id": _megabyte_id}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("which", ["dataset_v0001.h5", "dataset_v0002.h5"])
def test_info_diff_and_preview_on_a_damaged_file_say_it_in_one_line(versions, tmp_path, damage, which):
    out = tmp_path / "out"
    shutil.copytree(versions, out)
    victim = out / which
    victim.chmod(0o644)
    with h5py.File(victim, "r+") as f:
        DAMAGES[damage](f)
    other = out / ("dataset_v0002.h5" if which == "dataset_v0001.h5" else "dataset_v0001.h5")
    _said_in_one_line(_cli("info", victim))
    _said_in_one_line(_cli("diff", other, victim))
    _said_in_one_line(_cli("preview", victim, "--out", tmp_path / "p.png"))


def test_a_mapping_that_crashes_hdf5_is_one_line_for_every_command(versions, tmp_path):
    """The byte of a virtual-dataset mapping that makes HDF5 segfault in H5Dopen (the fuzz test's
    find, as in tests/store/test_verify_trust.py)."""
    out = tmp_path / "out"
    shutil.copytree(versions, out)
    thin = out / "dataset_v0002.h5"
    data = bytearray(thin.read_bytes())
    at = data.find(b"train/source_files\x00")
    assert at > 0
    data[at + 6 + 48] ^= 14
    thin.chmod(0o644)
    thin.write_bytes(bytes(data))
    for args in (("info", thin), ("diff", out / "dataset_v0001.h5", thin), ("preview", thin, "--out", tmp_path / "p.png"),
                 ("versions", out), ("info", out)):
        _said_in_one_line(_cli(*args))


def test_a_truncated_earlier_version_is_listed_as_unreadable(versions, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(versions, out)
    old = out / "dataset_v0001.h5"
    old.chmod(0o644)
    with open(old, "r+b") as fh:
        fh.truncate(old.stat().st_size // 3)
    done = _cli("versions", out)
    _said_in_one_line(done)
    assert done.returncode == 0 and "unreadable" in done.stdout
    done = _cli("info", out)
    _said_in_one_line(done)


def test_retention_with_a_damaged_kept_version_deletes_nothing_and_does_not_fail(versions, tmp_path):
    """What a damaged kept version reads is unknown: retention keeps every file this time (an
    append that has published must not fail in it)."""
    from h5forge._store.versions import retain

    out = tmp_path / "out"
    shutil.copytree(versions, out)
    (out / "dataset_latest.h5").unlink(missing_ok=True)
    (out / "dataset_latest.h5").symlink_to("dataset_v0002.h5")
    kept = out / "dataset_v0002.h5"  # the newest, kept by keep=1: the files it reads are unknown now
    kept.chmod(0o644)
    with open(kept, "r+b") as fh:
        fh.truncate(kept.stat().st_size // 3)
    before = sorted(p.name for p in out.iterdir())
    assert retain(out, keep=1, retire_after=0) == []
    assert sorted(p.name for p in out.iterdir()) == before

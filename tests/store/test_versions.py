"""Publishing, the writer lock, retention and rollback, with real processes."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from h5forge.store.versions import LATEST, OutputBusy, latest, output_lock, published, retain, set_latest, stage
from tests.helpers.files import make_version


PY = sys.executable


READER = textwrap.dedent("""
    import os, sys, time, h5py, hdf5plugin
    link, seconds = sys.argv[1], float(sys.argv[2])
    opens = failures = 0
    end = time.time() + seconds
    while time.time() < end:
        try:
            with h5py.File(os.path.realpath(link), "r") as f:
                assert f.attrs["format"] == "h5forge"
                n = int(f["train"].attrs["count"])
                assert f["train/checksum"].shape[0] == n and f["train/images"].shape[0] == n
            opens += 1
        except Exception as e:
            failures += 1
            print("FAIL", type(e).__name__, e, flush=True)
    print("OPENS", opens, "FAILURES", failures, flush=True)
""")


def test_reader_never_sees_a_missing_or_partial_latest(tmp_path, small_inventory, raw_demo):
    out = tmp_path / "out"
    make_version(out, small_inventory, raw_demo)
    reader = subprocess.Popen([PY, "-c", READER, str(out / LATEST), "6"], stdout=subprocess.PIPE, text=True)
    published_versions = 1
    deadline = time.time() + 5
    while time.time() < deadline:
        make_version(out, small_inventory, raw_demo)
        published_versions += 1
    stdout, _ = reader.communicate(timeout=60)
    assert "FAILURES 0" in stdout, stdout
    opens = int(stdout.split("OPENS")[1].split()[0])
    assert opens > 10 and published_versions >= 3  # loose: the machine may be loaded
    assert os.readlink(out / LATEST) == f"dataset_v{published_versions:04d}.h5"  # relative target
    assert not [p for p in out.iterdir() if p.name.startswith(".dataset")]


def test_published_versions_are_read_only(tmp_path, small_inventory, raw_demo):
    out = tmp_path / "out"
    n = make_version(out, small_inventory, raw_demo)
    path = published(out)[n]
    assert path.stat().st_mode & 0o222 == 0


HOLDER = textwrap.dedent("""
    import sys, time
    from h5forge.store.versions import output_lock
    with output_lock(sys.argv[1], what="test-holder"):
        open(sys.argv[1] + "/.dataset_v0009.h5.partial", "w").write("half")
        print("held", flush=True)
        time.sleep(120)
""")


def test_a_second_writer_fails_clearly_and_a_killed_one_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([PY, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputBusy) as err:
            with output_lock(out):
                pass
        assert f'"pid": {holder.pid}' in str(err.value) and "test-holder" in str(err.value)
        assert "another h5forge run is writing to" in str(err.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with output_lock(out):  # the kernel dropped the dead holder's lock
        assert not (out / ".dataset_v0009.h5.partial").exists()


def test_retention_keeps_newest_and_whatever_latest_points_at(tmp_path, small_inventory, raw_demo):
    out = tmp_path / "out"
    for _ in range(6):
        make_version(out, small_inventory, raw_demo)
    removed = retain(out, keep=3)
    assert sorted(p.name for p in removed) == [f"dataset_v000{i}.h5" for i in (1, 2, 3)]
    assert list(published(out)) == [4, 5, 6]
    set_latest(out, 4)  # rollback
    assert latest(out) == 4
    retain(out, keep=1)
    assert list(published(out)) == [4, 6]
    assert stage(out).number == 7  # numbers never reused


def test_a_lock_that_is_a_symlink_or_a_folder_is_refused_and_its_target_untouched(tmp_path):
    from h5forge.errors import UsageError

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".h5forge.lock").symlink_to(victim)
    with pytest.raises(UsageError, match="is not a regular file"):
        with output_lock(out):
            pass
    assert victim.read_text() == "precious"
    (out / ".h5forge.lock").unlink()
    (out / ".h5forge.lock").mkdir()
    with pytest.raises(UsageError, match="is not a regular file"):
        with output_lock(out):
            pass

"""Retention racing the commands that read a version: `verify` and `export` pin the version they
read for the whole run, as readers do; `versions` names a version deleted between its listing and
its read; a reader opened on `dataset_latest.h5` while latest moves on and retention deletes the
version it resolved resolves the link again. Retention runs in a process of its own, with
`keep: 1` and no minimum age (`retire_after_seconds: 0`), at a fixed point of the run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from h5forge._format import leases
from h5forge._store.versions import published, retain, set_latest

RETAIN = "import sys; from h5forge._store.versions import retain; retain(sys.argv[1], keep=1, retire_after=0)"


def retention_in_another_process(out: Path) -> None:
    subprocess.run([sys.executable, "-c", RETAIN, str(out)], check=True, cwd=os.getcwd(), timeout=600)


@pytest.mark.parametrize("isolate", [False, True], ids=["library", "forked-as-the-cli"])
def test_verify_pins_the_version_it_checks(four_versions, monkeypatch, isolate):
    import h5forge._store.verify as verify

    out = four_versions
    checks = verify._check_dependencies

    def retention_mid_run(*args):  # after the open, before the checks and the latency reads
        retention_in_another_process(out)
        return checks(*args)

    monkeypatch.setattr(verify, "_check_dependencies", retention_mid_run)
    report = verify.verify_file(out / "dataset_v0001.h5", resample=0, latency_reads=2, isolate=isolate)
    assert report.ok, report.errors
    assert list(published(out)) == [1, 4]  # retention ran, and kept the version being verified
    monkeypatch.undo()
    assert [p.name for p in retain(out, keep=1)] == ["dataset_v0001.h5"]  # the pin ends with verify


def test_export_pins_the_version_it_copies(four_versions, monkeypatch, tmp_path):
    import h5forge._store.thin as thin

    out = four_versions
    copy = thin._export

    def retention_mid_run(*args):
        retention_in_another_process(out)
        return copy(*args)

    monkeypatch.setattr(thin, "_export", retention_mid_run)
    dest = thin.export(out / "dataset_v0001.h5", tmp_path / "copy.h5")
    assert list(published(out)) == [1, 4]
    monkeypatch.undo()
    from h5forge._store.verify import verify_file

    assert verify_file(dest, resample=0, latency_reads=0).ok
    assert [p.name for p in retain(out, keep=1)] == ["dataset_v0001.h5"]


def test_versions_names_a_version_deleted_between_listing_and_reading(four_versions, monkeypatch):
    from typer.testing import CliRunner

    import h5forge._store.versions as versions
    from h5forge._cli import app

    out = four_versions
    listing = versions.published

    def listed_then_deleted(folder):  # the command's listing, then retention deletes v2
        found = listing(folder)
        victim = out / "dataset_v0002.h5"
        if victim.exists():
            with leases.unclaimed(victim) as free:  # as retention deletes a version
                assert free
                victim.unlink()
                leases.drop(victim)
        return found

    monkeypatch.setattr(versions, "published", listed_then_deleted)
    result = CliRunner().invoke(app, ["versions", str(out)])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 0, result.output
    text = " ".join(re.sub(r"[│┃┏┓┗┛━─┡┩└┘┌┐┼┬┴╇╈]+", " ", result.output).split())  # a wrapped cell, joined
    assert "v0002 deleted by retention while listing" in text, result.output
    assert "Traceback" not in result.output
    for v in ("v0001", "v0003", "v0004"):
        assert any(v in line and "MB" in line for line in result.output.splitlines()), result.output


OPEN_LATEST = textwrap.dedent("""
    import sys
    from h5forge.read._reader import SplitReader
    print(SplitReader(sys.argv[1], "train").version, flush=True)
""")


def blocked_on(lease: Path, pid: int) -> bool:
    """Whether process ``pid`` waits for a lock on ``lease`` (/proc/locks lists waiters with ->)."""
    inode = os.stat(lease).st_ino
    with open("/proc/locks") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 6 and parts[1] == "->" and int(parts[5]) == pid and parts[6].endswith(f":{inode}"):
                return True
    return False


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs /proc/locks to see a waiting lock")
def test_a_reader_on_latest_resolves_again_when_retention_deleted_what_it_resolved(four_versions):
    """The reader resolves latest to v3 and waits for its lease while retention holds it to delete
    v3 (latest has moved on to v4): it then opens v4, never fails for the race."""
    out = four_versions
    set_latest(out, 3)
    v3 = out / "dataset_v0003.h5"
    with leases.unclaimed(v3) as free:  # retention's exclusive lock on v3's lease
        assert free
        reader = subprocess.Popen([sys.executable, "-c", OPEN_LATEST, str(out / "dataset_latest.h5")],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.getcwd())
        try:
            deadline = time.monotonic() + 600  # a bound for a failure, not a timing: it waits under any load
            while not blocked_on(leases.lease_path(v3), reader.pid):
                assert reader.poll() is None, reader.stderr.read()
                assert time.monotonic() < deadline, "the reader never waited for v3's lease"
                time.sleep(0.05)
            set_latest(out, 4)  # latest moved on, and retention deletes v3 under its lock
            v3.unlink()
            leases.drop(v3)
        except BaseException:
            reader.kill()
            raise
    stdout, stderr = reader.communicate(timeout=600)
    assert reader.returncode == 0, stderr
    assert stdout.split() == ["4"]
    assert not leases.lease_path(v3).exists()  # no lease made for the deleted version

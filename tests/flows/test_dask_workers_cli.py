"""`h5forge build` (the Prefect flow) and `h5forge doctor` against a real `dask scheduler` without
workers, and with every `dask worker` SIGKILLed mid-build: one `error:` line on stderr naming the
cause and what to do; doctor counts the workers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from h5forge._store.versions import latest
from tests.helpers.dask_procs import DaskProcesses
from tests.helpers.data import write_spec_file
from tests.helpers.files import make_raw

pytestmark = pytest.mark.e2e

H5FORGE = str(Path(sys.executable).parent / "h5forge")


@pytest.fixture
def env(prefect_server):
    from prefect.settings import PREFECT_API_URL

    return {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}


def _one_error_line(r: subprocess.CompletedProcess) -> str:
    """The error line; every other line on stderr is the run's INFO/WARNING log (no traceback, no
    ERROR lines, no Prefect failure state)."""
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), r.stderr
    assert [line for line in lines[:-1] if not (" | INFO " in line or " | WARNING " in line)] == [], r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    return lines[-1]


def test_no_workers_one_error_line_and_doctor_counts_them(env, raw_demo, tmp_path):
    spec_file = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml", inline_below=0, batch_size=4)
    with DaskProcesses(tmp_path / "logs") as dask:
        address = dask.address
        doctor = subprocess.run([H5FORGE, "doctor", "--spec", str(spec_file), "--dask-address", address],
                                capture_output=True, text=True, timeout=180, env=env)
        assert doctor.returncode == 1, doctor.stdout + doctor.stderr
        assert f"{address} reachable, 0 workers" in doctor.stdout

        r = subprocess.run([H5FORGE, "build", str(spec_file), "--dask-address", address], capture_output=True,
                           text=True, timeout=300, env=env)
        line = _one_error_line(r)
        assert r.stderr.strip() == line  # refused before a run starts
        assert line.startswith(f"error: the dask scheduler at {address} has no workers"), line
        assert f"`dask worker {address}`" in line

        dask.workers(2)
        doctor = subprocess.run([H5FORGE, "doctor", "--spec", str(spec_file), "--dask-address", address],
                                capture_output=True, text=True, timeout=180, env=env)
        assert f"{address} reachable, 2 worker(s), 2 thread(s)" in doctor.stdout, doctor.stdout
    assert latest(tmp_path / "out") is None


def test_every_worker_killed_mid_build_one_error_line(env, tmp_path):
    raw = make_raw(tmp_path / "raw", n=400)
    spec_file = write_spec_file(raw, tmp_path / "out", tmp_path / "spec.yaml", inline_below=0, batch_size=1)
    with DaskProcesses(tmp_path / "logs") as dask:
        dask.workers(2)
        with open(tmp_path / "build.err", "w") as err, open(tmp_path / "build.out", "w") as out:
            build = subprocess.Popen([H5FORGE, "build", str(spec_file), "--dask-address", dask.address],
                                     stdout=out, stderr=err, text=True, env=env)
            try:
                deadline = time.monotonic() + 300
                while dask.tasks_started() < 2:  # batches are on the workers
                    assert time.monotonic() < deadline and build.poll() is None, (tmp_path / "build.err").read_text()
                    time.sleep(0.05)
                dask.kill_workers()  # SIGKILL, both
                build.wait(timeout=300)
            finally:
                if build.poll() is None:
                    build.kill()
                    build.wait()
        r = subprocess.CompletedProcess(build.args, build.returncode, (tmp_path / "build.out").read_text(),
                                        (tmp_path / "build.err").read_text())
    line = _one_error_line(r)
    assert line.startswith(f"error: all dask workers of the scheduler at {dask.address} were lost"), line
    assert f"`dask worker {dask.address}`" in line
    assert latest(tmp_path / "out") is None

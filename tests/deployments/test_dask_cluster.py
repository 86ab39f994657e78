"""Scale-out on a user's dask cluster: a real `dask scheduler` and two `dask worker` processes on
127.0.0.1, a build flow that cleans through them, and a clear error for an unreachable address.

Every process started here is stopped here (SIGTERM, wait, then SIGKILL of its process group),
also when a test fails; the fixture checks that no descendant survived.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from h5forge._store.verify import verify_file
from h5forge._store.versions import LATEST, latest
from tests.helpers.data import write_spec_file

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
BATCH = 4  # 40 good samples -> 10 dask tasks, enough for both workers to get some


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], log: Path) -> subprocess.Popen:
    """Start ``args`` in its own session (process group), output to ``log``."""
    with open(log, "w") as sink:
        return subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def stop_all(procs: list[subprocess.Popen], timeout: float = 120) -> list[str]:
    """SIGTERM each process, wait, then SIGKILL its process group; returns what had to be killed."""
    tree = {}
    for p in procs:
        try:
            tree[p.pid] = [psutil.Process(p.pid)] + psutil.Process(p.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree[p.pid] = []
    for p in reversed(procs):  # workers first, then the scheduler
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    killed = []
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            killed.append(f"pid {p.pid} (no exit {timeout} s after SIGTERM)")
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the group: a nanny's worker process too
        except ProcessLookupError:
            pass
        p.wait()
        _, alive = psutil.wait_procs(tree[p.pid], timeout=5)
        for q in alive:  # left its group (it should not): kill it by pid
            killed.append(f"descendant pid {q.pid} of {p.pid}")
            q.kill()
    return killed


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """`dask scheduler` + two single-process `dask worker`s; yields the scheduler address."""
    from distributed import Client

    logs = tmp_path_factory.mktemp("dask-logs")
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [start([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                    "--no-dashboard", "--idle-timeout", "900"], logs / "scheduler.log")]
    try:
        for i in range(2):  # two separate worker processes, as on two machines
            procs.append(start([str(BIN / "dask"), "worker", address, "--nworkers", "1", "--nthreads", "1",
                                "--host", "127.0.0.1", "--no-dashboard", "--death-timeout", "600",
                                "--name", f"w{i}"], logs / f"worker{i}.log"))
        try:
            with Client(address, timeout="600s") as client:  # bounds a hang; a loaded machine is slow
                client.wait_for_workers(2, timeout=600)
        except Exception as e:
            dead = [p.args[1] for p in procs if p.poll() is not None]
            raise RuntimeError(f"dask cluster not ready ({e!r}; exited: {dead}):\n"
                               + "\n".join(f"--- {f.name}\n{f.read_text()}" for f in sorted(logs.iterdir())))
        yield address
    finally:
        leftovers = stop_all(procs)
    assert not leftovers, f"processes did not stop on SIGTERM: {leftovers}"


def executed_per_worker(address: str) -> dict[str, int]:
    """Tasks each connected worker has executed (dask's own counter, kept by the worker)."""
    from distributed import Client

    with Client(address, timeout="120s") as client:
        return client.run(lambda dask_worker: dask_worker.state.executed_count)


def test_build_cleans_on_the_external_scheduler(prefect_server, dask_cluster, raw_demo, tmp_path):
    from h5forge.flows.build import build_dataset

    address = dask_cluster
    before = executed_per_worker(address)
    assert len(before) == 2 and sum(before.values()) == 0, before
    out = tmp_path / "out"
    # the spec says LocalCluster(1) and inline below 10k: only the address can send work to the cluster
    spec_file = write_spec_file(raw_demo, out, tmp_path / "spec.yaml", inline_below=0, batch_size=BATCH,
                                workers=2)
    result = build_dataset(str(spec_file), dask_address=address)

    assert result.version == 1 and latest(out) == 1
    assert sum(result.counts.values()) == 40 and result.rejected > 0
    assert result.timings["cleaned_in"] == address
    assert result.health["checksums"] == "ok (40 samples)"
    assert verify_file(out / LATEST, resample=4).ok

    after = executed_per_worker(address)
    assert set(after) == set(before)
    tasks = {w: after[w] - before[w] for w in after}
    n_batches = -(-40 // BATCH)  # at least: rejected samples make more batches, never fewer
    assert sum(tasks.values()) >= n_batches, tasks
    assert all(n > 0 for n in tasks.values()), f"a worker executed nothing: {tasks}"


# ---- an address nobody listens on ---------------------------------------------------------

@pytest.fixture(scope="module")
def unreachable(prefect_server, raw_demo, tmp_path_factory):
    """`h5forge build --dask-address tcp://127.0.0.1:<closed port>` as a user runs it (with the session's
    Prefect API configured, so that a run, should one start, would not wait for an ephemeral server)."""
    from prefect.settings import PREFECT_API_URL

    tmp = tmp_path_factory.mktemp("unreachable")
    spec_file = write_spec_file(raw_demo, tmp / "out", tmp / "spec.yaml", inline_below=0)
    address = f"tcp://127.0.0.1:{free_port()}"  # bound then closed: connections are refused
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}  # the session's test server
    runs_before = flow_runs()
    r = subprocess.run([str(BIN / "h5forge"), "build", str(spec_file), "--dask-address", address],
                       capture_output=True, text=True, timeout=900, env=env)
    return address, r, flow_runs() - runs_before, tmp / "out"


def flow_runs() -> int:
    """Flow runs the session's Prefect server knows of."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.count_flow_runs()


def test_unreachable_scheduler_fails_before_any_run_with_a_clear_message(unreachable):
    address, r, new_runs, out = unreachable
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [f"error: cannot reach the dask scheduler at {address}: "
                                             "Connection refused"], r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    # probed before Prefect starts: no flow run, no candidate file
    assert new_runs == 0
    assert latest(out) is None and not list(out.glob("*dataset_v*"))

"""A real external dask cluster (`dask scheduler` and `dask worker` processes on 127.0.0.1, each
in its own process group, all SIGKILLed at the end) builds the version a LocalCluster builds:
same ids, row checksums, split digests, every value and stored chunk (tests/helpers/version_identity.py).

- its workers write their batches' chunks to chunk files in the output folder, and the build's
  timings (`h5forge info`) count the batches that came that way and those sent through dask;
- a worker SIGKILLed mid-build, after it wrote chunk files: its batches are run again elsewhere, the
  files it left are removed, nothing half-written reaches the version;
- workers whose view of the output folder is not this machine's (read-only for them, or a folder of
  their own: a mount namespace per worker, as on machines without shared storage) send their
  chunks through dask instead, and the version is the same.
"""

from __future__ import annotations

import os
import signal
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

import h5forge
from h5forge._format.names import CHUNKS_DIR
from h5forge._ingest.discover import discover
from h5forge._ingest.parallel import batches
from h5forge._store.verify import verify_file
from h5forge._views.info import version_info
from tests.helpers.dask_procs import DaskProcesses
from tests.helpers.data import demo_spec
from tests.helpers.files import make_raw
from tests.helpers.version_identity import identity

pytestmark = pytest.mark.e2e

BATCH = 2  # small batches: every worker gets several


def _spec(raw: Path, out: Path, address: str | None = None, **compute):
    """The demo spec at 64 px, cleaned on dask in batches of ``BATCH`` (a LocalCluster of 2 without
    an address)."""
    spec = demo_spec(raw, out)
    images = spec.fields["images"].model_copy(update={"size": (64, 64)})
    compute = spec.compute.model_copy(
        update={"dask_address": address, "workers": 2, "inline_below": 0, "batch_size": BATCH, **compute}
    )
    return spec.model_copy(update={"fields": {**spec.fields, "images": images}, "compute": compute})


def _n_batches(spec) -> int:
    return len(batches(discover(spec).samples, spec.compute.batch_size))


def _no_chunk_files_left(out: Path) -> None:
    assert not (out / CHUNKS_DIR).exists()
    assert sorted(p.name for p in out.rglob("*.chunks")) == []


def _executed(address: str) -> dict[str, int]:
    """Tasks each connected worker has executed, by worker name."""
    from distributed import Client

    with Client(address, timeout="120s") as client:
        return client.run(lambda dask_worker: (dask_worker.name, dask_worker.state.executed_count)).values()


def _all_stopped(dask: DaskProcesses) -> None:
    assert [p.poll() is None for p in [dask.scheduler, *dask.worker_procs]] == [False] * (1 + len(dask.worker_procs))


@pytest.fixture(scope="module")
def local_demo(raw_demo, tmp_path_factory):
    """The demo raw folder built on a LocalCluster of 2: (its result, its identity)."""
    result = h5forge.build(_spec(raw_demo, tmp_path_factory.mktemp("local") / "out"))
    assert result.timings["cleaned_in"] == "LocalCluster(2)"
    return result, identity(result.path)


def test_an_external_cluster_writes_chunk_files_and_builds_the_local_version(raw_demo, local_demo, tmp_path):
    local, local_identity = local_demo
    out = tmp_path / "out"
    with DaskProcesses(tmp_path / "logs") as dask:
        dask.workers(3)
        spec = _spec(raw_demo, out, dask.address)
        result = h5forge.build(spec)
        executed = dict(_executed(dask.address))
    _all_stopped(dask)

    assert identity(result.path) == local_identity
    assert result.counts == local.counts and sum(result.counts.values()) == 40
    assert verify_file(result.path).ok
    _no_chunk_files_left(out)

    timings = version_info(result.path)["timings"]  # what `h5forge info --json` shows
    assert timings["cleaned_in"] == dask.address
    # every batch with a stored row came through a chunk file; none was sent with its chunks
    assert timings["batches_sent_through_dask"] == 0
    assert timings["batches_via_chunk_files"] == local.timings["batches_via_chunk_files"] >= 40 // BATCH
    assert local.timings["batches_sent_through_dask"] == 0
    assert sorted(executed) == ["w0", "w1", "w2"]
    assert sum(executed.values()) == _n_batches(spec)  # each batch once
    assert all(n > 0 for n in executed.values()), f"a worker cleaned nothing: {executed}"


def test_a_worker_killed_mid_build_has_its_batches_run_again_and_its_files_removed(tmp_path):
    """Worker w1 is stopped (SIGSTOP, so the scheduler's view of it holds still) once it has written
    chunk files and while it runs a batch; then SIGKILLed."""
    from distributed import Client

    raw = make_raw(tmp_path / "raw", n=240)  # batches enough that the victim is caught holding one, on a loaded machine too
    local = h5forge.build(_spec(raw, tmp_path / "local"))
    out = tmp_path / "out"
    with DaskProcesses(tmp_path / "logs") as dask:
        dask.workers(3)
        spec = _spec(raw, out, dask.address, in_flight=9)
        outcome: list = []

        def build():
            try:
                outcome.append(h5forge.build(spec))
            except BaseException as err:  # examined below
                outcome.append(err)

        runner = threading.Thread(target=build)
        with Client(dask.address, timeout="120s") as client:
            names = {name: addr for addr, name in client.run(lambda dask_worker: dask_worker.name).items()}
            victim, group = names["w1"], dask.worker_procs[1].pid
            runner.start()
            deadline = time.monotonic() + 300
            running: list = []
            while not running:
                assert time.monotonic() < deadline and runner.is_alive(), outcome
                done = client.run(lambda dask_worker: dask_worker.state.executed_count, workers=[victim])[victim]
                if done >= 2:  # its chunk files are written
                    # stopped, it still looks free to the scheduler, which may hand it the next batch
                    # the build submits; if none comes soon, it runs on and is stopped again later
                    os.killpg(group, signal.SIGSTOP)
                    for _ in range(25):
                        running = client.run_on_scheduler(
                            lambda dask_scheduler, w=victim: [ts.key for ts in dask_scheduler.workers[w].processing]
                        )
                        if running or not runner.is_alive():
                            break
                        time.sleep(0.02)
                    if not running:
                        os.killpg(group, signal.SIGCONT)
                time.sleep(0.02)
            killed_at = time.time()
            dask.kill_worker(1)
            runner.join(300)
            assert not runner.is_alive()
            story = client.run_on_scheduler(
                lambda dask_scheduler, keys=running: [(t[0], t[2], t[5]) for t in dask_scheduler.story(*keys)]
            )
            executed = dict(_executed(dask.address))
    _all_stopped(dask)

    [result] = outcome
    assert not isinstance(result, BaseException), repr(result)
    # what w1 was running when it died was run again, by another worker, after it died
    for key in running:
        assert any(k == key and finish == "memory" and at > killed_at for k, finish, at in story), (key, story)
    assert sorted(executed) == ["w0", "w2"]

    assert identity(result.path) == identity(local.path)
    assert verify_file(result.path).ok
    _no_chunk_files_left(out)
    assert result.timings["batches_via_chunk_files"] == _n_batches(spec)  # all 120 samples are good
    assert result.timings["batches_sent_through_dask"] == 0


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# a worker in a mount namespace of its own, where the output folder ($0) is read-only, or a new empty
# folder of its own holding an empty chunk folder: what a worker on another machine sees
VIEWS = {
    "read-only": 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"',
    "its own": f'mount -t tmpfs tmpfs "$0" && mkdir "$0/{CHUNKS_DIR}" && exec "$@"',
}


@pytest.mark.skipif(
    not shutil.which("unshare") or not _can_unshare(), reason="needs unshare(1) and user or mount namespaces"
)
@pytest.mark.parametrize("view", VIEWS)
def test_workers_without_the_shared_output_folder_send_their_chunks(view, raw_demo, local_demo, tmp_path):
    _, local_identity = local_demo
    out = tmp_path / "out"
    out.mkdir()
    with DaskProcesses(tmp_path / "logs") as dask:
        dask.workers(2, wrap=["unshare", "-rm", "sh", "-c", VIEWS[view], str(out)])
        spec = _spec(raw_demo, out, dask.address)
        result = h5forge.build(spec)
        executed = sum(dict(_executed(dask.address)).values())
    _all_stopped(dask)

    assert identity(result.path) == local_identity
    assert verify_file(result.path).ok
    _no_chunk_files_left(out)
    assert result.timings["batches_via_chunk_files"] == 0
    assert result.timings["batches_sent_through_dask"] >= 40 // BATCH
    if view == "read-only":  # the workers could not write a file: each batch came back with its chunks
        assert executed == _n_batches(spec)
    else:  # they wrote files this machine does not see: those batches were cleaned again, sending
        assert executed > _n_batches(spec)

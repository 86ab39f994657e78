"""Cleaning on a real `dask scheduler` whose workers are missing: none at all, or all SIGKILLed
mid-build. The plain pipeline (``h5forge.build``) fails with one error naming the cause and what to
do, publishes nothing, and leaves no traceback-only failure (TimeoutError, FutureCancelledError)."""

from __future__ import annotations

import threading
import time

import pytest

import h5forge
from h5forge.errors import DaskWorkersLost, H5forgeError, NoDaskWorkers
from h5forge._store.versions import latest
from tests.helpers.dask_procs import DaskProcesses
from tests.helpers.data import demo_spec
from tests.helpers.files import make_raw

pytestmark = pytest.mark.e2e


def _spec(raw, out, address):
    spec = demo_spec(raw, out)
    compute = spec.compute.model_copy(update={"dask_address": address, "inline_below": 0, "batch_size": 1})
    return spec.model_copy(update={"compute": compute})


def test_a_scheduler_without_workers_is_one_error(raw_demo, tmp_path):
    with DaskProcesses(tmp_path / "logs") as dask:
        with pytest.raises(NoDaskWorkers) as caught:
            h5forge.build(_spec(raw_demo, tmp_path / "out", dask.address))
    message = str(caught.value)
    assert "\n" not in message
    assert f"the dask scheduler at {dask.address} has no workers" in message
    assert f"dask worker {dask.address}" in message  # what to do
    assert latest(tmp_path / "out") is None


def test_losing_every_worker_mid_build_is_one_error(tmp_path):
    raw = make_raw(tmp_path / "raw", n=400)
    with DaskProcesses(tmp_path / "logs") as dask:
        dask.workers(2)
        outcome: list[BaseException | object] = []

        def build():
            try:
                outcome.append(h5forge.build(_spec(raw, tmp_path / "out", dask.address)))
            except BaseException as err:  # examined below
                outcome.append(err)

        runner = threading.Thread(target=build)
        runner.start()
        deadline = time.monotonic() + 300
        while dask.tasks_started() < 2:  # batches are on the workers
            assert time.monotonic() < deadline and runner.is_alive(), outcome
            time.sleep(0.05)
        dask.kill_workers()  # SIGKILL, both
        runner.join(300)
        assert not runner.is_alive()
    [err] = outcome
    assert isinstance(err, DaskWorkersLost), repr(err)
    assert isinstance(err, H5forgeError)
    message = str(err)
    assert "\n" not in message
    assert f"all dask workers of the scheduler at {dask.address} were lost" in message
    assert f"dask worker {dask.address}" in message
    assert latest(tmp_path / "out") is None

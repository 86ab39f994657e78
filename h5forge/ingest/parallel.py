"""Cleaning on dask: a LocalCluster of worker processes, or an existing scheduler by address.

h5py serialises every HDF5 call behind one lock, and Pillow decoding is CPU-bound, so cleaning
runs in processes; the single writer stays in the calling process. Results come back in input
order with a bounded number of batches in flight, so memory does not grow with the dataset.
Workers write their compressed chunks to segment files (``h5forge.ingest.segment_files``) and
send back the rest of the batch.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from h5forge.errors import DaskWorkersLost, NoDaskWorkers, SchedulerUnreachable
from h5forge.format.names import FORMAT_VERSION
from h5forge.ingest.assemble import SegmentTarget, clean_to_file
from h5forge.ingest.clean import CleanedBatch, clean_batch
from h5forge.ingest.segment_files import clean_to_segment, make_folder, read_segment, remove_folder
from h5forge.samples import SampleRef
from h5forge.spec import DatasetSpec

# dask and distributed take seconds to import: they load when a run cleans on dask, not when a
# command imports the pipeline (a build below compute.inline_below never needs them)
if TYPE_CHECKING:
    from distributed import Client


# The nanny's MALLOC_TRIM_THRESHOLD_=65536 makes workers give freed image buffers back to the kernel
# and fault them in again, and the worker's sampling profiler costs CPU on every task. Workers here
# run short CPU-bound batches and need neither.
LEAN_WORKERS = {
    "distributed.worker.profile.enabled": False,
    "distributed.nanny.pre-spawn-environ": {"OMP_NUM_THREADS": 1, "MKL_NUM_THREADS": 1, "OPENBLAS_NUM_THREADS": 1},
}


WORKER_WAIT_SECONDS = 15.0  # how long a run waits for a worker: at the start, and after losing them all
RESULT_POLL_SECONDS = 1.0  # how often a run waiting for a batch checks that the cluster still has workers


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast, before any run starts, when nothing listens at a scheduler address."""
    from urllib.parse import urlparse

    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    if not parsed.hostname or not parsed.port:
        raise SchedulerUnreachable(f"cannot reach the dask scheduler at {address}: expected tcp://host:port")
    try:
        socket.create_connection((parsed.hostname, parsed.port), timeout=timeout).close()
    except OSError as err:
        raise SchedulerUnreachable(f"cannot reach the dask scheduler at {address}: {err.strerror or err}") from None


def require_workers(client: Client, address: str) -> None:
    """Wait up to ``WORKER_WAIT_SECONDS`` for a worker; ``NoDaskWorkers`` when none joins (dask
    itself would wait for ever)."""
    try:
        client.wait_for_workers(1, timeout=WORKER_WAIT_SECONDS)
    except TimeoutError:
        raise NoDaskWorkers(
            f"the dask scheduler at {address} has no workers (none joined within "
            f"{WORKER_WAIT_SECONDS:g} s): start some (`dask worker {address}`), "
            "or run without --dask-address to clean on this machine"
        ) from None


def check_workers(address: str) -> None:
    """Before a run starts: the scheduler answers and has a worker (or gets one soon)."""
    from distributed import Client

    check_reachable(address)
    try:
        with Client(address, timeout="20s") as client:
            require_workers(client, address)
    except (OSError, TimeoutError) as err:
        raise SchedulerUnreachable(f"cannot reach the dask scheduler at {address}: {err}") from None


@contextmanager
def dask_client(address: str | None, workers: int, secure: bool = True) -> Iterator[Client]:
    """A client on ``address``, or on a fresh LocalCluster of ``workers`` processes.

    The LocalCluster listens on 127.0.0.1, where any local user could reach a plain TCP scheduler
    and run code as this user (``Client(...).run_on_scheduler``). ``secure`` makes every link of
    the cluster TLS with credentials made for this run and held in memory only: scheduler, workers
    and this client authenticate each other, and nothing without the credentials is let in. An
    address names an existing cluster, whose security is its own (docs/security.md)."""
    import dask
    from distributed import Client, LocalCluster
    from distributed.security import Security

    if address:
        check_reachable(address)
        try:
            client = Client(address, timeout="20s")
        except (OSError, TimeoutError) as err:
            raise SchedulerUnreachable(f"cannot reach the dask scheduler at {address}: {err}") from None
        try:
            require_workers(client, address)
            yield client
        finally:
            client.close()
        return
    quiet = logging.getLogger("distributed")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the shutdown chatter of worker processes is not news
    security = Security.temporary() if secure else None
    try:
        with (
            dask.config.set(LEAN_WORKERS),
            LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                protocol="tls://" if secure else "tcp://",
                security=security,
                dashboard_address="127.0.0.1:0",
                silence_logs=logging.ERROR,
            ) as cluster,
            Client(cluster, security=security) as client,
        ):
            yield client
    finally:
        quiet.setLevel(level)


def batches(samples: Sequence[SampleRef], size: int) -> list[list[SampleRef]]:
    return [list(samples[i : i + size]) for i in range(0, len(samples), size)]


def clean_all(
    spec: DatasetSpec,
    root: Path,
    samples: Sequence[SampleRef],
    timings: dict | None = None,
    status: Callable[[str], None] = lambda text: None,
    format_version: int = FORMAT_VERSION,
    segments_to: SegmentTarget | None = None,
) -> Iterator[CleanedBatch]:
    """Clean on dask, or in this process when there is too little work to pay for a cluster.

    ``status`` hears what happens before the first batch (a cluster start takes seconds);
    ``format_version`` is the format of the file the rows go to (``clean_batch``); with
    ``segments_to`` each batch's rows go to a file of their own there (``ingest.assemble``)."""
    size = spec.compute.batch_size
    timings = {} if timings is None else timings
    if not spec.compute.dask_address and len(samples) < spec.compute.inline_below:
        timings["cleaned_in"] = "calling process"
        t0 = time.perf_counter()
        for batch in batches(samples, size):
            if segments_to is not None:
                yield clean_to_file(spec, str(root), batch, segments_to)
            else:
                yield clean_batch(spec, root, batch, format_version=format_version)
        timings["clean_write_seconds"] = round(time.perf_counter() - t0, 3)
        return
    t0 = time.perf_counter()
    address, workers = spec.compute.dask_address, spec.compute.workers
    status(f"connecting to the dask scheduler at {address}…" if address else f"starting {workers} dask workers…")
    folder = make_folder(spec) if segments_to is None else None
    try:
        with dask_client(address, workers, spec.compute.secure) as client:
            timings["cleaned_in"] = address or f"LocalCluster({workers})"
            timings["cluster_start_seconds"] = round(time.perf_counter() - t0, 3)
            status(
                f"{len(client.scheduler_info()['workers'])} dask workers ready "
                f"after {timings['cluster_start_seconds']:.1f} s"
            )
            t1 = time.perf_counter()
            yield from clean_stream(
                client, spec, root, samples, size, spec.in_flight(), format_version, folder, timings, segments_to
            )
            timings["clean_write_seconds"] = round(time.perf_counter() - t1, 3)  # cluster shutdown excluded
    finally:
        if folder is not None:
            remove_folder(folder)


def clean_stream(
    client: Client,
    spec: DatasetSpec,
    root: Path,
    samples: Sequence[SampleRef],
    batch_size: int,
    in_flight: int,
    format_version: int = FORMAT_VERSION,
    folder: Path | None = None,
    timings: dict | None = None,
    segments_to: SegmentTarget | None = None,
) -> Iterator[CleanedBatch]:
    """Clean ``samples`` on the cluster; yield batches in input order, ``in_flight`` at a time.
    With a segments ``folder``, workers write their chunks there; a batch whose file this process
    cannot read (the workers' storage is not this machine's) is cleaned again sending its chunks,
    and so is every later batch. With ``segments_to``, workers write each batch's rows as a file
    of the version's (``ingest.assemble``) and send the small columns only.

    The spec goes with each task (a few kB), not scattered to the workers: data held only by
    workers is lost with them, and a batch re-run on a worker that joins later still has it."""
    timings = {} if timings is None else timings
    via_files = 0

    to_files = folder is not None

    def submit(refs: list[SampleRef]):
        if segments_to is not None:
            return client.submit(clean_to_file, spec, str(root), refs, segments_to, pure=False)
        if to_files:
            return client.submit(clean_to_segment, spec, str(root), refs, str(folder), format_version, pure=False)
        return client.submit(clean_batch, spec, str(root), refs, format_version=format_version, pure=False)

    pending: deque = deque()
    todo = iter(batches(samples, batch_size))
    for batch in todo:
        pending.append((submit(batch), batch))
        if len(pending) >= in_flight:
            break
    where = spec.compute.dask_address
    while pending:
        future, refs = pending.popleft()
        result = batch_result(client, future, where)
        future.release()
        nxt = next(todo, None)
        if nxt is not None:
            pending.append((submit(nxt), nxt))
        if folder is not None:
            placed = read_segment(result, folder)
            if placed is None:  # written on storage this machine does not see: send the chunks from now on
                to_files = False
                again = client.submit(clean_batch, spec, str(root), refs, format_version=format_version, pure=False)
                placed = batch_result(client, again, where)
            elif placed is not result:
                via_files += 1
            result = placed
        timings["batches_via_segment_files"] = via_files
        yield result


def batch_result(client: Client, future, address: str | None) -> CleanedBatch:
    """The batch's result; ``DaskWorkersLost`` once the cluster has had no worker for
    ``WORKER_WAIT_SECONDS`` (dask itself would wait for one for ever), or when a batch killed
    every worker that ran it."""
    from distributed import CancelledError, KilledWorker

    without_workers: float | None = None
    while True:
        try:
            return future.result(timeout=RESULT_POLL_SECONDS)
        except TimeoutError:
            if client.nthreads():
                without_workers = None
                continue
            without_workers = without_workers or time.monotonic()
            if time.monotonic() - without_workers >= WORKER_WAIT_SECONDS:
                raise _all_lost(address, f"none came back within {WORKER_WAIT_SECONDS:g} s") from None
        except KilledWorker as err:
            raise DaskWorkersLost(
                f"a batch of samples killed each dask worker that ran it ({err}): the workers "
                "may be running out of memory; lower compute.batch_size or give them more "
                "memory, then rerun"
            ) from None
        except CancelledError:
            if not client.nthreads():
                raise _all_lost(address, "none left") from None
            raise


def _all_lost(address: str | None, detail: str) -> DaskWorkersLost:
    if address:
        return DaskWorkersLost(
            f"all dask workers of the scheduler at {address} were lost mid-run ({detail}); "
            f"nothing was published: start workers (`dask worker {address}`) and rerun"
        )
    return DaskWorkersLost(
        f"all local dask workers were lost mid-run ({detail}), out of memory perhaps; "
        "nothing was published: lower compute.workers or compute.batch_size and rerun"
    )

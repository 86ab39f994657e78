"""Cleaning on dask: a LocalCluster of worker processes, or an existing scheduler by address.

h5py serialises every HDF5 call behind one lock, and Pillow decoding is CPU-bound, so cleaning
runs in processes; the single writer stays in the calling process. Results come back in input
order with a bounded number of batches in flight, so memory does not grow with the dataset.
Workers write their compressed chunks to chunk files (``h5forge._ingest.chunk_files``) and
send back the rest of the batch.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from h5forge.errors import DaskWorkersLost, NoDaskWorkers, SchedulerUnreachable
from h5forge._format.names import FORMAT_VERSION
from h5forge._ingest.assemble import RowFileTarget, clean_to_file
from h5forge._ingest.clean import CleanedBatch, clean_batch
from h5forge._ingest.chunk_files import clean_to_chunk_file, make_folder, read_chunk_file, remove_folder
from h5forge.kinds import sample_bytes, stored_kinds
from h5forge._samples import SampleRef
from h5forge.spec import DatasetSpec

# dask and distributed take seconds to import: they load when a run cleans on dask, not when a
# command imports the pipeline (a build below compute.inline_below never needs them)
if TYPE_CHECKING:
    from concurrent.futures import Executor

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
def dask_client(
    address: str | None, workers: int, secure: bool = True, warm: ClusterAhead | None = None
) -> Iterator[Client]:
    """A client on ``address``, or on a fresh LocalCluster of ``workers`` processes.

    The LocalCluster listens on 127.0.0.1, where any local user could reach a plain TCP scheduler
    and run code as this user (``Client(...).run_on_scheduler``). ``secure`` makes every link of
    the cluster TLS with credentials made for this run and held in memory only: scheduler, workers
    and this client authenticate each other, and nothing without the credentials is let in. An
    address names an existing cluster, whose security is its own (docs/security.md). ``warm``, the
    LocalCluster the run started ahead (``cluster_ahead``), is taken as it is when it fits, and left running."""
    import dask
    from distributed import Client
    from distributed.security import Security

    if not address and warm is not None and warm.fits(workers, secure):
        yield warm.client()  # the run's cluster, started ahead: it outlives this cleaning (``cluster_ahead``)
        return
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
            local_cluster(workers, secure, security) as cluster,
            Client(cluster, security=security) as client,
        ):
            yield client
    finally:
        quiet.setLevel(level)


def local_cluster(workers: int, secure: bool, security):
    """The LocalCluster of ``dask_client``: ``workers`` single-threaded processes on 127.0.0.1.
    Its logs (the workers', and distributed's console handlers here while it runs) show only
    critical records: a worker's heartbeat can race the worker's close and log an error with its
    traceback, and a worker's real failure reaches the run anyway, as a task's exception or a lost
    worker."""
    from distributed import LocalCluster

    return LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        protocol="tls://" if secure else "tcp://",
        security=security,
        dashboard_address="127.0.0.1:0",
        silence_logs=logging.CRITICAL,
    )


class ClusterAhead:
    """A run's LocalCluster, started in a background thread while the run does other work
    (discovery, staging), and kept until the run ends so that verify checks on its workers too.
    ``client()`` waits for it; a start that failed raises there, as ``dask_client`` would."""

    def __init__(self, workers: int, secure: bool):
        self.workers, self.secure = workers, secure
        self.started_at = time.perf_counter()
        self.ready_seconds: float | None = None  # from the start until the workers were up
        self.used = False
        self._cluster: Any = None
        self._client: Client | None = None
        self._error: BaseException | None = None
        self._closing: threading.Thread | None = None
        self._quiet = logging.getLogger("distributed")
        self._level: int | None = None  # the logger's level once distributed has set it, restored at close
        self._thread = threading.Thread(target=self._start, name="h5forge-cluster-ahead", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            import dask
            from distributed import Client
            from distributed.security import Security

            # importing distributed sets its logger's level: quieted after that (the shutdown
            # chatter of worker processes is not news)
            self._level = self._quiet.level
            self._quiet.setLevel(logging.ERROR)
            security = Security.temporary() if self.secure else None
            with dask.config.set(LEAN_WORKERS):
                self._cluster = local_cluster(self.workers, self.secure, security)
            self._client = Client(self._cluster, security=security)
            self.ready_seconds = round(time.perf_counter() - self.started_at, 3)
        except BaseException as err:  # noqa: BLE001 - raised where the run needs the cluster
            self._error = err

    def fits(self, workers: int, secure: bool) -> bool:
        return (workers, secure) == (self.workers, self.secure)

    def client(self) -> Client:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._client is not None  # the start either made it or failed
        self.used = True
        return self._client

    def executor(self) -> tuple[Executor, int] | None:
        """The cluster's workers as an executor, and how many there are; None when cleaning did
        not use the cluster (it ran in the calling process) or it has no worker left."""
        if not self.used or self._client is None:
            return None
        try:
            n = len(self._client.nthreads())
        except Exception:  # noqa: BLE001 - a cluster that cannot answer checks nothing
            return None
        return (self._client.get_executor(pure=False), n) if n else None

    def close_soon(self) -> None:
        """Start closing the cluster in the background; ``close`` waits for it."""
        if self._closing is None:
            self._closing = threading.Thread(target=self._close, name="h5forge-cluster-close", daemon=True)
            self._closing.start()

    def close(self) -> None:
        self.close_soon()
        assert self._closing is not None
        self._closing.join()
        if self._level is not None:
            self._quiet.setLevel(self._level)

    def _close(self) -> None:
        self._thread.join()
        for part in (self._client, self._cluster):
            if part is not None:
                try:
                    part.close()
                except Exception:  # noqa: BLE001 - a cluster that fails to close holds nothing of the run's
                    pass


@contextmanager
def cluster_ahead(spec: DatasetSpec, wanted: Callable[[], bool]) -> Iterator[ClusterAhead | None]:
    """Within the block, the LocalCluster the run will clean on starts in the background, when the
    run cleans on one (no ``compute.dask_address``) and ``wanted()`` says it will have enough samples
    for one (``inline_limit``); the run passes it to the steps that use it (cleaning, verify).
    Closed when the block ends."""
    if spec.compute.dask_address or not wanted():
        yield None
        return
    ahead = ClusterAhead(spec.compute.workers, spec.compute.secure)
    try:
        yield ahead
    finally:
        ahead.close()


BATCH_BYTES = 2 << 20  # stored bytes a task carries when compute.batch_size is unset
BATCH_SAMPLES = (64, 1024)


def batch_samples(spec: DatasetSpec, n: int = 0) -> int:
    """Samples per task: ``compute.batch_size``, or when unset the largest power of two of samples
    whose stored values ``BATCH_BYTES`` holds, within ``BATCH_SAMPLES``, and small enough that each
    worker gets 4 batches of ``n`` samples (the fewest when a field is ragged: its size is unknown).
    A task's own costs (scheduling, its rows' file, a checkpoint) are then a small share of cleaning
    small samples (benchmarks/results/build_peers_batch_32px_20k.md)."""
    if spec.compute.batch_size is not None:
        return spec.compute.batch_size
    lo, hi = BATCH_SAMPLES
    nbytes = _fixed_sample_bytes(spec)
    if not nbytes:
        return lo
    fits = 1 << max(0, (BATCH_BYTES // nbytes).bit_length() - 1)
    if n:
        fits = min(fits, 1 << max(0, (n // (4 * spec.compute.workers)).bit_length() - 1))
    return max(lo, min(hi, fits))


def batches(samples: Sequence[SampleRef], size: int) -> list[list[SampleRef]]:
    return [list(samples[i : i + size]) for i in range(0, len(samples), size)]


def _fixed_sample_bytes(spec: DatasetSpec) -> int:
    """A sample's stored bytes, or 0 when a field is ragged (its size is unknown before cleaning)."""
    if any(st.bulk and st.ragged for st in (k.stored() for k in stored_kinds(spec).values())):
        return 0
    return sample_bytes(spec)


INLINE_BYTES = 4 << 20  # stored values cleaned in this process whatever their count of samples


def inline_limit(spec: DatasetSpec) -> int:
    """Fewer samples than this are cleaned in this process: ``compute.inline_below``, raised to as
    many as ``INLINE_BYTES`` of stored values hold when no field is ragged (a thousand pictures of a
    few KB clean in about the time a LocalCluster takes to start: docs/benchmarks-build.md,
    "Small pictures"). ``inline_below: 0`` always cleans on a cluster."""
    below, nbytes = spec.compute.inline_below, _fixed_sample_bytes(spec)
    return max(below, INLINE_BYTES // nbytes) if below and nbytes else below


def where_to_clean(spec: DatasetSpec, n: int) -> str:
    """``external`` (``compute.dask_address``), else ``inline`` (this process) when ``n`` samples are
    too little work to pay for a cluster (``inline_limit``), else ``local`` (a LocalCluster)."""
    if spec.compute.dask_address:
        return "external"
    return "inline" if n < inline_limit(spec) else "local"


def clean_all(
    spec: DatasetSpec,
    root: Path,
    samples: Sequence[SampleRef],
    timings: dict | None = None,
    status: Callable[[str], None] = lambda text: None,
    format_version: int = FORMAT_VERSION,
    row_files_to: RowFileTarget | None = None,
    cluster: ClusterAhead | None = None,
    where: str | None = None,
    chunk_files: bool = True,
) -> Iterator[CleanedBatch]:
    """Clean ``where`` the run chose (default: ``where_to_clean``): on dask, or in this process.
    ``cluster``: the LocalCluster the run started ahead, used when it fits.

    ``status`` hears what happens before the first batch (a cluster start takes seconds);
    ``format_version`` is the format of the file the rows go to (``clean_batch``); with
    ``row_files_to`` each batch's rows go to a file of their own there (``_ingest.assemble``), else,
    on dask, to chunk files unless ``chunk_files`` is False (the workers send them)."""
    size = batch_samples(spec, len(samples))
    timings = {} if timings is None else timings
    if (where or where_to_clean(spec, len(samples))) == "inline":
        timings["cleaned_in"] = "calling process"
        t0 = time.perf_counter()
        for batch in batches(samples, size):
            if row_files_to is not None:
                yield clean_to_file(spec, str(root), batch, row_files_to)
            else:
                yield clean_batch(spec, root, batch, format_version=format_version)
        timings["clean_write_seconds"] = round(time.perf_counter() - t0, 3)
        return
    t0 = time.perf_counter()
    address, workers = spec.compute.dask_address, spec.compute.workers
    status(f"connecting to the dask scheduler at {address}…" if address else f"starting {workers} dask workers…")
    folder = make_folder(spec) if row_files_to is None and chunk_files else None
    try:
        with dask_client(address, workers, spec.compute.secure, cluster) as client:
            timings["cleaned_in"] = address or f"LocalCluster({workers})"
            timings["cluster_start_seconds"] = round(time.perf_counter() - t0, 3)
            if cluster is not None and cluster.used:
                timings["cluster_started_ahead_seconds"] = cluster.ready_seconds
            status(
                f"{len(client.scheduler_info()['workers'])} dask workers ready "
                f"after {timings['cluster_start_seconds']:.1f} s"
            )
            t1 = time.perf_counter()
            yield from clean_stream(
                client, spec, root, samples, size, spec.in_flight(), format_version, folder, timings, row_files_to
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
    row_files_to: RowFileTarget | None = None,
) -> Iterator[CleanedBatch]:
    """Clean ``samples`` on the cluster; yield batches in input order, ``in_flight`` at a time.
    With a chunk ``folder``, workers write their chunks there; a batch whose file this process
    cannot read (the workers' storage is not this machine's) is cleaned again sending its chunks,
    and so is every later batch. ``timings`` counts the batches with rows that came each way
    (``batches_via_chunk_files``, ``batches_sent_through_dask``). With ``row_files_to``, workers
    write each batch's rows as a file of the version's (``_ingest.assemble``) and send the small
    columns only.

    The spec goes with each task (a few kB), not scattered to the workers: data held only by
    workers is lost with them, and a batch re-run on a worker that joins later still has it."""
    timings = {} if timings is None else timings
    via_files = sent = 0  # batches with rows: through a chunk file; through the dask connection

    to_files = folder is not None

    def submit(refs: list[SampleRef]):
        if row_files_to is not None:
            return client.submit(clean_to_file, spec, str(root), refs, row_files_to, pure=False)
        if to_files:
            return client.submit(clean_to_chunk_file, spec, str(root), refs, str(folder), format_version, pure=False)
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
        from_file = row_files_to is not None  # its rows are in the file of the version's layout it wrote
        if folder is not None:
            placed = read_chunk_file(result, folder)
            if placed is None:  # written on storage this machine does not see: send the chunks from now on
                to_files = False
                again = client.submit(clean_batch, spec, str(root), refs, format_version=format_version, pure=False)
                placed = batch_result(client, again, where)
            else:
                from_file = placed is not result
            result = placed
        if from_file and len(result):
            via_files += 1
        elif len(result):
            sent += 1
        timings["batches_via_chunk_files"] = via_files
        timings["batches_sent_through_dask"] = sent
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

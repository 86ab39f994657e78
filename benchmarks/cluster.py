"""An external dask cluster (a `dask scheduler` and 2 or 4 `dask worker` processes writing segment files)
against a LocalCluster of 2: samples/s and CPU per sample of the caller, the scheduler and the workers.
Method: benchmarks/README.md, "cluster".
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time

from benchmarks.common import BIN, CACHE, cli, free_port, log, make_spec, med, proc_cpu, ratio, raw_folder, save
from benchmarks.common import timing_runner, version_identity, warm

WORK = CACHE / "cluster"
# what the build's timings say of where its batches went, kept for each build
TIMINGS = ("clean_write_seconds", "cluster_start_seconds", "cleaned_in", "batches_via_chunk_files")
TIMINGS += ("batches_sent_through_dask",)
# what h5forge's LocalCluster sets for its workers (parallel.LEAN_WORKERS), as environment variables
LEAN = {
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}


class External:
    """``dask scheduler`` and ``workers`` single-threaded ``dask worker`` processes (no nanny), each
    in its own session; all SIGKILLed by ``stop``."""

    def __init__(self, name: str, workers: int):
        self.logs = WORK / "logs" / name
        self.logs.mkdir(parents=True, exist_ok=True)
        port, dask = free_port(), str(BIN / "dask")
        self.address = f"tcp://127.0.0.1:{port}"
        scheduler = [dask, "scheduler", "--host", "127.0.0.1", "--port", str(port)]
        self.procs = [self._start([*scheduler, "--no-dashboard", "--idle-timeout", "3600"], "scheduler")]
        deadline = time.monotonic() + 600
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.procs[0].poll() is not None:
                    self.stop()
                    raise RuntimeError((self.logs / "scheduler.log").read_text()) from None
                time.sleep(0.2)
        single = "--nworkers 1 --nthreads 1 --no-nanny --host 127.0.0.1 --no-dashboard".split()
        for i in range(workers):
            worker = [dask, "worker", self.address, *single, "--name", f"{name}-w{i}"]
            self.procs.append(self._start(worker, f"worker{i}"))
        from distributed import Client

        with Client(self.address, timeout="600s") as client:
            client.wait_for_workers(workers, timeout=600)

    def _start(self, args: list[str], name: str) -> subprocess.Popen:
        with open(self.logs / f"{name}.log", "w") as sink:
            streams = {"stdout": sink, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}
            return subprocess.Popen(args, **streams, env={**os.environ, **LEAN}, start_new_session=True)

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far of the scheduler and of the workers."""
        return proc_cpu(self.procs[0].pid), sum(proc_cpu(p.pid) for p in self.procs[1:])

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def build_once(spec, cluster: External | None) -> dict:
    """One full build into an empty folder; wall and CPU of the caller, the scheduler and the workers."""
    import h5forge

    shutil.rmtree(spec.output.dir, ignore_errors=True)
    runner = timing_runner()
    sched0, workers0 = cluster.cpu() if cluster else (0.0, 0.0)
    children0, c0, t0 = sum(os.times()[2:4]), time.process_time(), time.perf_counter()
    result = h5forge.build(spec, runner=runner)
    wall, caller = time.perf_counter() - t0, time.process_time() - c0
    children = sum(os.times()[2:4]) - children0  # reaped: a LocalCluster's workers, verify's processes
    if cluster:
        sched1, workers1 = cluster.cpu()
        sched, workers, caller = sched1 - sched0, workers1 - workers0, caller + children
    else:  # the scheduler runs in this process; the workers were its children, reaped at the cluster's close
        sched, workers = None, children
    cpu = {"caller_cpu": caller, "scheduler_cpu": sched, "workers_cpu": workers}
    return {
        "samples": sum(result.counts.values()),
        "wall": wall,
        **cpu,
        **{k: result.timings.get(k) for k in TIMINGS},
        "steps": runner.seconds,
        "identity": version_identity(result.path),
    }


def local_start_stop_cpu(workers: int) -> float:
    """CPU seconds of a LocalCluster's workers that start and stop with no work: what a local build spends
    besides cleaning."""
    from h5forge._ingest.parallel import dask_client

    children0 = sum(os.times()[2:4])
    with dask_client(None, workers):
        pass
    return sum(os.times()[2:4]) - children0


def best(runs: list[dict], idle_workers_cpu: float | None = None) -> dict:
    """The fastest run's figures, CPU per sample of each part (``idle_workers_cpu`` taken off the workers')."""
    r = min(runs, key=lambda r: r["wall"])
    n = r["samples"]
    cpu = {k: r[k] for k in ("caller_cpu", "scheduler_cpu", "workers_cpu")}
    cpu["workers_cpu_without_start_stop"] = r["workers_cpu"] - (idle_workers_cpu or 0.0)
    return {
        "samples": n,
        "wall_seconds": round(r["wall"], 3),
        "samples_per_s": round(n / r["wall"], 1),
        "clean_write_seconds": r["clean_write_seconds"],
        "clean_write_samples_per_s": round(n / r["clean_write_seconds"], 1),
        "cluster_start_seconds": r["cluster_start_seconds"],
        "cleaned_in": r["cleaned_in"],
        **{
            k.replace("_cpu", "_cpu_ms_per_sample"): None if v is None else round(1000 * v / n, 3)
            for k, v in cpu.items()
        },
        "batches_via_chunk_files": r["batches_via_chunk_files"],
        "batches_sent_through_dask": r["batches_sent_through_dask"],
        "steps_seconds": r["steps"],
        "walls_of_reps": [round(x["wall"], 3) for x in runs],
    }


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    args = cli(__doc__, dict(n=96, size=64, batch_size=8, reps=1), n=2000, size=224, batch_size=64, reps=2)
    raw = raw_folder(args.n, args.size)
    warm([raw])
    result = {"uptime_start": uptime()}
    clusters = {"external_2": External("external_2", 2), "external_4": External("external_4", 4)}
    arms = ["local_2", *clusters]
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    idle: list[float] = []
    try:
        for rep in range(args.reps):
            idle.append(local_start_stop_cpu(2))
            for arm in arms if rep % 2 == 0 else arms[::-1]:  # the machine's load changes during the run
                cluster = clusters.get(arm)
                compute = {"batch_size": args.batch_size}
                if cluster:  # in flight: 2 batches per worker, as on a LocalCluster
                    compute.update(dask_address=cluster.address, workers=len(cluster.procs) - 1)
                spec = make_spec(raw, WORK / arm, args.size, 2, compute=compute)
                runs[arm].append(build_once(spec, cluster))
                log(f"{arm}: {runs[arm][-1]['wall']:.2f} s")
    finally:
        for cluster in clusters.values():
            cluster.stop()
    first = runs["local_2"][0]["identity"]
    same = all(r["identity"] == first for rs in runs.values() for r in rs)
    if not same:
        raise RuntimeError("the external clusters' versions differ from the LocalCluster's")
    for arm in clusters:
        for r in runs[arm]:
            if r["batches_sent_through_dask"] or not r["batches_via_chunk_files"]:
                raise RuntimeError(f"{arm}: the workers sent their chunks through dask instead of segment files")
    idle_cpu = med(idle, 9)
    figures = {arm: best(rs, None if arm in clusters else idle_cpu) for arm, rs in runs.items()}
    compared = [("external_2", "local_2", "samples_per_s"), ("external_4", "external_2", "samples_per_s")]
    compared += [("external_2", "local_2", "clean_write_samples_per_s")]
    ratios = {f"{a}_over_{b}_{key}": ratio(figures[a][key], figures[b][key]) for a, b, key in compared}
    caller = {arm: f["caller_cpu_ms_per_sample"] for arm, f in figures.items()}
    ratios["caller_cpu_external_2_over_local_2"] = ratio(caller["external_2"], caller["local_2"])
    result.update(same_version=same, local_2_workers_start_stop_cpu_seconds=round(idle_cpu, 3), arms=figures)
    save("cluster", result | {"uptime_end": uptime(), "ratios": ratios})


if __name__ == "__main__":
    main()

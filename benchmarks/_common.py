"""Shared helpers of the benchmark commands: cached raw folders, RSS sampling, machine notes."""

from __future__ import annotations

import json
import os
import platform
import shutil
import threading
import time
from pathlib import Path

import psutil

CACHE = Path(os.environ.get("H5FORGE_BENCH_CACHE", "/tmp/h5forge-bench"))
RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def raw_folder(n: int, seed: int = 0, size_range: tuple[int, int] = (150, 260), bad: bool = False,
               workers: int = 2) -> Path:
    """A generated raw folder of ``n`` good samples, cached under CACHE (reruns skip generation).

    A folder is complete only once its ``.complete`` marker exists; an interrupted generation is
    thrown away and redone.
    """
    from h5forge.ingest.demo import generate

    root = CACHE / f"raw-n{n}-s{seed}-{size_range[0]}-{size_range[1]}{'-bad' if bad else ''}"
    marker = root / ".complete"
    if marker.exists():
        return root
    if root.exists():
        shutil.rmtree(root)
    t0 = time.perf_counter()
    print(f"generating {n:,} samples into {root} ...", flush=True)
    generate(root, n=n, seed=seed, bad=bad, size_range=size_range, workers=workers)
    marker.write_text(json.dumps({"n": n, "seconds": round(time.perf_counter() - t0, 1)}))
    print(f"  generated in {time.perf_counter() - t0:.0f} s", flush=True)
    return root


class RSSSampler:
    """Samples, in a thread, the RSS of a process and all its descendants.

    Reports the peak of the sum (main + children, what the machine must hold) and the peak of each
    process separately (the largest single process: the writer, or one dask worker).
    """

    def __init__(self, pid: int | None = None, interval: float = 0.1, rescan: float = 1.0):
        self.root = psutil.Process(pid or os.getpid())
        self.interval = interval
        # finding children walks all of /proc (psutil's ppid_map): costly, and it runs in the
        # measured process, so the process list is refreshed every ``rescan`` seconds only; reading
        # the RSS of known processes is cheap
        self.rescan = rescan
        self._procs: list[psutil.Process] = []
        self._scanned = 0.0
        self.peak_sum = 0
        self.peak_main = 0
        self.peak_child = 0
        self.peak_by_pid: dict[int, int] = {}
        self.cpu_by_pid: dict[int, float] = {}  # last seen user+system CPU seconds
        self.cpu_start = sum(self.root.cpu_times()[:2])
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        total = 0
        now = time.monotonic()
        if now - self._scanned >= self.rescan:
            try:
                self._procs = [self.root] + self.root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            self._scanned = now
        for p in self._procs:
            try:
                rss = p.memory_info().rss
                self.cpu_by_pid[p.pid] = sum(p.cpu_times()[:2])
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total += rss
            self.peak_by_pid[p.pid] = max(self.peak_by_pid.get(p.pid, 0), rss)
            if p.pid == self.root.pid:
                self.peak_main = max(self.peak_main, rss)
            else:
                self.peak_child = max(self.peak_child, rss)
        self.peak_sum = max(self.peak_sum, total)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> "RSSSampler":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def result(self) -> dict:
        mib = 1 << 20
        cpu = sum(v for pid, v in self.cpu_by_pid.items() if pid != self.root.pid)
        cpu += self.cpu_by_pid.get(self.root.pid, self.cpu_start) - self.cpu_start
        return {
            # CPU seconds used by the process and its children while sampled (children that exited
            # count up to their last sample): a measure the load of other jobs barely moves
            "cpu_seconds": round(cpu, 2),
            "cpu_seconds_main": round(self.cpu_by_pid.get(self.root.pid, self.cpu_start) - self.cpu_start, 2),
            "cpu_seconds_children": sorted((round(v, 2) for pid, v in self.cpu_by_pid.items()
                                            if pid != self.root.pid), reverse=True),
            "peak_sum_mib": round(self.peak_sum / mib, 1),
            "peak_main_mib": round(self.peak_main / mib, 1),
            "peak_max_child_mib": round(self.peak_child / mib, 1),
            "processes_seen": len(self.peak_by_pid),
            "samples": self.samples,
        }


def machine() -> dict:
    """What the numbers were measured on, including how busy the box was."""
    import h5py

    freq = psutil.cpu_freq()
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "cpu_mhz": round(freq.current) if freq else None,
        "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
        "python": platform.python_version(),
        "h5py": h5py.version.version,
        "hdf5": h5py.version.hdf5_version,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "cpu_pressure": cpu_pressure(),
    }


def cpu_pressure() -> str | None:
    """Linux PSI: the share of time some runnable task waited for a CPU (avg10/60/300 %)."""
    try:
        return Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def random_read_latency(get, n_items: int, reads: int, seed: int) -> dict:
    """p50/p99/mean in µs of ``get(i)`` for random ``i`` (20 warm-up reads first)."""
    import numpy as np

    idx = np.random.default_rng(seed).integers(0, n_items, reads)
    for i in idx[:20]:
        get(int(i))
    times = []
    for i in idx:
        t = time.perf_counter_ns()
        get(int(i))
        times.append(time.perf_counter_ns() - t)
    a = np.array(times) / 1000
    return {"p50_us": round(float(np.percentile(a, 50)), 1), "p99_us": round(float(np.percentile(a, 99)), 1),
            "mean_us": round(float(a.mean()), 1)}

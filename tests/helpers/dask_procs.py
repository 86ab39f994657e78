"""A real `dask scheduler` and `dask worker` processes on 127.0.0.1, each in its own process group,
for tests that kill workers. Everything started is stopped (SIGKILL of the group) on exit."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaskProcesses:
    """``with DaskProcesses(logs) as d: d.workers(2); ...; d.kill_workers()``."""

    def __init__(self, logs: Path):
        self.logs, self.port = logs, free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.scheduler: subprocess.Popen | None = None
        self.worker_procs: list[subprocess.Popen] = []

    def _start(self, args: list[str], name: str) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "w") as sink:
            return subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)

    def __enter__(self) -> "DaskProcesses":
        self.scheduler = self._start([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port",
                                      str(self.port), "--no-dashboard", "--idle-timeout", "900"], "scheduler")
        deadline = time.monotonic() + 600  # bounds a scheduler that never listens; a loaded machine is slow
        while True:  # listening
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline or self.scheduler.poll() is not None:
                    raise RuntimeError((self.logs / "scheduler.log").read_text()) from None
                time.sleep(0.2)

    def workers(self, n: int, wrap: list[str] | None = None) -> None:
        """Start ``n`` single-threaded worker processes (no nanny: a killed one stays dead), named
        ``w<i>`` in start order, and wait for them. ``wrap``: a command that execs the rest of its
        arguments (the worker's command line), e.g. to run the worker in a mount namespace of its own."""
        from distributed import Client

        for _ in range(n):
            i = len(self.worker_procs)
            self.worker_procs.append(self._start(
                [*(wrap or []), str(BIN / "dask"), "worker", self.address, "--nworkers", "1", "--nthreads", "1",
                 "--no-nanny", "--host", "127.0.0.1", "--no-dashboard", "--name", f"w{i}"], f"worker{i}"))
        with Client(self.address, timeout="600s") as client:
            client.wait_for_workers(n, timeout=600)

    def tasks_started(self) -> int:
        """Tasks the scheduler has been given so far (any state)."""
        from distributed import Client

        with Client(self.address, timeout="20s") as client:
            return client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))

    def kill_workers(self) -> None:
        for p in self.worker_procs:
            _kill_group(p)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``w<i>`` (its process group)."""
        _kill_group(self.worker_procs[i])

    def __exit__(self, *exc) -> None:
        self.kill_workers()
        if self.scheduler is not None:
            _kill_group(self.scheduler)


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()

"""The ``h5forge`` command line: one module per group of commands, all on one typer app.

``main`` is the console entry: ``h5forge --version`` prints the version without importing the
command modules (typer, rich, pydantic and what the commands import), so it answers at once.
``app`` imports them on first use."""

from __future__ import annotations

import os
import sys

# Prefect's client-side telemetry prints a notice on a terminal the first time `prefect` is imported
# under a PREFECT_HOME, and then reports usage; h5forge sends nothing (docs/production.md). Set on
# import of the command line, before any command imports Prefect; an explicit DO_NOT_TRACK=0 in the
# environment still wins.
os.environ.setdefault("DO_NOT_TRACK", "1")

__all__ = ["app", "main"]


def _app():
    from h5forge._cli import dataset, views, doctor, inspect, server, bucket  # noqa: F401  (register their commands)
    from h5forge._cli.app import app

    # importing the submodule h5forge._cli.app bound its name here; the name means the Typer app
    globals()["app"] = app
    return app


def __getattr__(name: str):
    if name == "app":
        return _app()
    raise AttributeError(f"module 'h5forge._cli' has no attribute {name!r}")


def main() -> None:  # pragma: no cover - console entry
    if sys.argv[1:] == ["--version"]:
        from importlib.metadata import version

        print(f"h5forge {version('h5forge')}")
        return
    from h5forge.errors import H5forgeError

    try:
        app = _app()  # declaring the commands loads the field kinds: their help names the kinds' layouts
    except H5forgeError as e:  # kinds that cannot be registered (two of one name)
        print(f"error: {e}", file=sys.stderr)
        _exit(e.exit_code)
    try:
        app()
    except SystemExit as stop:
        _exit(stop.code)
    _exit(0)


def _exit(code) -> None:  # pragma: no cover - console entry
    """End the process as the interpreter would, without its teardown of every module and object
    Prefect, dask and pydantic loaded (benchmarks/results/cli_exit.md measures that teardown).

    What must happen at the end still does, in the interpreter's order: other threads are joined,
    every exit handler runs (Prefect drains its log and event queues, logging flushes its handlers,
    open HDF5 files are closed), and the standard streams are flushed. The handlers run through
    ``atexit._run_exitfuncs``, the interpreter's own call: a handler of h5forge's registered first
    would run last but could not run those registered before the command started (a coverage
    tool's, a wrapping script's), which an ``os._exit`` there would drop."""
    import atexit
    import threading

    if code is not None and not isinstance(code, int):  # SystemExit("message"): printed, exit status 1
        print(code, file=sys.stderr)
        code = 1
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or gone (a closed pipe; None: started closed)
            pass
    os._exit(code or 0)

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
    from h5forge.cli import dataset  # noqa: F401  (registers its commands)
    from h5forge.cli import views  # noqa: F401  (preview, codecs)
    from h5forge.cli import doctor, inspect  # noqa: F401  (register their commands)
    from h5forge.cli import server  # noqa: F401  (server status, server stop)
    from h5forge.cli import bucket  # noqa: F401  (push)
    from h5forge.cli.app import app

    # importing the submodule h5forge.cli.app bound its name here; the name means the Typer app
    globals()["app"] = app
    return app


def __getattr__(name: str):
    if name == "app":
        return _app()
    raise AttributeError(f"module 'h5forge.cli' has no attribute {name!r}")


def main() -> None:  # pragma: no cover - console entry
    if sys.argv[1:] == ["--version"]:
        from importlib.metadata import version

        print(f"h5forge {version('h5forge')}")
        return
    import atexit

    atexit.register(_end_without_teardown)  # before any command registers its own: it runs last
    try:
        _app()()
    except SystemExit as stop:
        _status[0] = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        raise
    _status[0] = 0


_status = [1]  # an exception that escapes the command (a bug) leaves 1


def _end_without_teardown() -> None:  # pragma: no cover - console entry
    """The last exit handler: every other one has run (the interpreter joined the other threads
    first; Prefect drained its log and event queues), so the process ends here, without the
    interpreter freeing one by one every module and object Prefect, dask and pydantic loaded
    (benchmarks/results/cli_exit.md measures that teardown). Logging's own exit handler was
    registered before this one, on import, so it runs here."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone (a closed pipe): nothing more to say
            pass
    os._exit(_status[0])

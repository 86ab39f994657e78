"""Run a look at a version file in a forked child, as ``verify`` and the commands that only look do.

A damaged file can make the HDF5 library itself crash (a corrupt virtual-dataset mapping
segfaults when the dataset is opened) or raise from anywhere while its metadata is read. ``verify``
and the commands that only look (``info``, ``diff``, ``preview``, ``versions``) call their work
through ``in_child``: a crash or an exception of the child becomes one ``ReadError`` naming the
file, and the command says it in one line; a child that gives no answer in time (HDF5 looping on a
damaged file) is stopped and said so. For callers without other threads (the command line).
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
from typing import Any, Callable

from h5forge.errors import H5forgeError, ReadError

# what a command that only looks (info, diff, preview, versions) may take: far more than any of them
# needs on a loaded machine, and an end for one that HDF5 keeps looping on a damaged file
LOOK_LIMIT = 300.0
STUCK = "the HDF5 library may be stuck on a damaged file (`h5forge verify` names the damage)"


class Crashed(ReadError):
    """The child died without an answer: the HDF5 library crashed on the file."""

    def __init__(self, what: str, exitcode: int | None):
        self.exitcode = exitcode
        super().__init__(f"cannot {what}: {crash_text(exitcode)}")


class Stuck(ReadError):
    """The child gave no answer in time: the HDF5 library loops on some damage (a global heap
    whose sizes send its walk round for ever is one; ``h5forge._format.heap``)."""


def crash_text(exitcode: int | None) -> str:
    return f"the HDF5 library crashed while reading it (exit code {exitcode}); the file is corrupt"


def in_child(fn: Callable[..., Any], *args: Any, what: str, limit: float | None = LOOK_LIMIT) -> Any:
    """``fn(*args)`` computed in a forked child; its result (picklable) returned here. An
    ``H5forgeError`` of the child is raised again as it was; any other exception becomes a
    ``ReadError`` saying ``cannot <what>``, a crash a ``Crashed``, no answer within ``limit``
    seconds (None: no limit) a ``Stuck``, the child killed. Where this process may not have
    children (a daemonic worker), ``fn`` runs here."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(send, fn, args))
    try:
        child.start()
    except (AssertionError, OSError):
        return fn(*args)
    send.close()
    if limit is not None and not receive.poll(limit):
        child.kill()
        child.join()
        raise Stuck(f"cannot {what}: no answer in {limit:.0f} s; {STUCK}")
    try:
        outcome, value = receive.recv()
    except EOFError:  # the child died without an answer
        outcome, value = None, None
    child.join()
    if outcome == "ok":
        return value
    if outcome == "h5forge":
        raise value
    if outcome == "error":
        raise ReadError(f"cannot {what}: {value}")
    raise Crashed(what, child.exitcode)


def _child(send, fn: Callable[..., Any], args: tuple) -> None:
    faulthandler.disable()  # a crash is the parent's to report, in one line
    try:
        try:
            answer = ("ok", fn(*args))
        except H5forgeError as err:
            answer = ("h5forge", err)
        except Exception as err:  # noqa: BLE001 - whatever a damaged file makes the library raise
            answer = ("error", f"{type(err).__name__}: {err}"[:2000])
        send.send(answer)
    except Exception as err:  # noqa: BLE001 - an answer that does not pickle
        send.send(("error", f"{type(err).__name__}: {err}"[:2000]))
    finally:
        send.close()
        os._exit(0)  # no atexit work of the parent's (Prefect, dask) runs twice

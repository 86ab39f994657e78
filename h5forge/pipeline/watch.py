"""The watch-folder loop: file-system events (watchfiles), a settle delay and a batching window.

It knows nothing of Prefect: ``append`` is whatever runs one append (the flow in-process, or a
deployment run) and returns how many samples are still waiting for a missing part.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Callable

from watchfiles import Change, DefaultFilter, watch

log = logging.getLogger("h5forge.pipeline.watch")


class InboxFilter(DefaultFilter):
    """New or changed sample files; not what the append itself moves into processed/ or quarantine/."""

    def __init__(self, inbox: Path):
        super().__init__()
        self.skip = (str(inbox / "processed"), str(inbox / "quarantine"))

    def __call__(self, change: Change, path: str) -> bool:
        name = Path(path).name
        return (super().__call__(change, path) and change != Change.deleted and not path.startswith(self.skip)
                and not name.startswith(".") and not name.endswith((".tmp", ".partial")))


def serve_inbox(inbox: Path, append: Callable[[], int], **options) -> None:
    """Run ``watch_inbox`` until SIGTERM or SIGINT, which stop it between appends.

    The loop runs in a worker thread and the signals are handled here, in the main thread: an
    append in progress (a Prefect flow run would otherwise turn SIGTERM into a crash of the run)
    finishes, then the loop ends.
    """
    stop = threading.Event()

    def handler(signum, frame):
        log.info("signal %d: stopping after the current append", signum)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    failure: list[BaseException] = []

    def run() -> None:
        try:
            watch_inbox(inbox, append, stop=stop, **options)
        except BaseException as err:  # reported by the main thread
            failure.append(err)
            stop.set()

    worker = threading.Thread(target=run, name="h5forge-watch")
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.5)
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
    if failure:
        raise failure[0]


def snapshot(inbox: Path, patterns: list[str]) -> frozenset:
    """The sample files in the inbox and their mtimes: a cheap way to tell whether anything is new."""
    found = set()
    for pattern in patterns:
        for p in inbox.glob(pattern):
            try:
                found.add((str(p), p.stat().st_mtime_ns))
            except FileNotFoundError:
                continue
    return frozenset(found)


def watch_inbox(inbox: Path, append: Callable[[], int], *, patterns: list[str], settle_seconds: float,
                window_seconds: float, poll_seconds: float, stop: threading.Event) -> None:
    """Append what is already there, then after every burst of changes, until ``stop``.

    Every ``poll_seconds`` without events the inbox is also compared with what the last append
    saw, so nothing dropped while an append ran (or on a filesystem without events) is missed.
    """
    inbox.mkdir(parents=True, exist_ok=True)

    def attempt() -> frozenset:
        """Append; on failure keep the old snapshot so the next poll tries again."""
        now = snapshot(inbox, patterns)
        try:
            append()
        except Exception as err:  # the service outlives one failed append
            log.error("append failed (retrying at the next change or poll): %s", err)
            return seen
        return now

    seen: frozenset = frozenset()
    seen = attempt()  # nothing dropped while the service was down is missed
    for changes in watch(inbox, watch_filter=InboxFilter(inbox), debounce=int(window_seconds * 1000),
                         step=50, stop_event=stop, rust_timeout=int(poll_seconds * 1000),
                         yield_on_timeout=True, recursive=True):
        if stop.is_set():
            break
        if not changes:
            now = snapshot(inbox, patterns)
            if now == seen or not now:
                continue
            log.info("the inbox changed without an event; appending")
        else:
            log.info("%d change(s) in %s; appending once files settle", len(changes), inbox)
            if stop.wait(settle_seconds):
                break
        seen = attempt()

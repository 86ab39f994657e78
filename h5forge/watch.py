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

log = logging.getLogger("h5forge.watch")


class InboxFilter(DefaultFilter):
    """New or changed sample files; not what the append itself moves into processed/ or quarantine/."""

    def __init__(self, inbox: Path):
        super().__init__()
        self.skip = (str(inbox / "processed"), str(inbox / "quarantine"))

    def __call__(self, change: Change, path: str) -> bool:
        name = Path(path).name
        return (super().__call__(change, path) and change != Change.deleted and not path.startswith(self.skip)
                and not name.startswith(".") and not name.endswith((".tmp", ".partial")))


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT end the loop between appends, never in the middle of one."""
    def handler(signum, frame):
        log.info("signal %d: stopping after the current append", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def watch_inbox(inbox: Path, append: Callable[[], int], *, settle_seconds: float, window_seconds: float,
                poll_seconds: float, stop: threading.Event) -> None:
    """Append what is already there, then again after every burst of changes, until ``stop``."""
    inbox.mkdir(parents=True, exist_ok=True)
    waiting = append()  # nothing dropped while the service was down is missed
    for changes in watch(inbox, watch_filter=InboxFilter(inbox), debounce=int(window_seconds * 1000),
                         step=50, stop_event=stop, rust_timeout=int(poll_seconds * 1000),
                         yield_on_timeout=True, recursive=True):
        if stop.is_set():
            break
        if not changes and not waiting:
            continue  # a quiet poll with nothing waiting
        log.info("%d change(s) in %s; appending once files settle", len(changes), inbox)
        if stop.wait(settle_seconds):
            break
        waiting = append()

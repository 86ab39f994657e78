"""The watch-folder loop: file-system events (watchfiles), a settle delay and a batching window.

It knows nothing of Prefect: ``append`` is whatever runs one append (the flow in-process, or a
deployment run) and returns how many samples are still waiting for a missing part.
"""

from __future__ import annotations

import contextvars
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from watchfiles import Change, DefaultFilter, watch

from h5forge._format.names import INBOX_MANAGED, INBOX_TEMPORARY

log = logging.getLogger("h5forge._pipeline.watch")


class InboxFilter(DefaultFilter):
    """New or changed files; nothing under the folders append manages (processed/, quarantine/)."""

    def __init__(self, inbox: Path):
        super().__init__()
        self.inbox = str(inbox)

    def __call__(self, change: Change, path: str) -> bool:
        rel = os.path.relpath(path, self.inbox)
        name = rel.rsplit("/", 1)[-1]
        return (
            super().__call__(change, path)
            and change != Change.deleted
            and rel.split("/", 1)[0] not in INBOX_MANAGED
            and not name.startswith(".")
            and not name.endswith(INBOX_TEMPORARY)
        )


def serve_inbox(inbox: Path, append: Callable[[], int | None], **options) -> None:
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

    # the loop sees the caller's context: the Prefect server and settings the command chose
    worker = threading.Thread(target=contextvars.copy_context().run, args=(run,), name="h5forge-watch")
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.5)
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
    if failure:
        raise failure[0]


# path relative to the inbox -> (mtime_ns, size, arrived_ns): arrived is the later of mtime and
# ctime, when a file moved in with an old mtime came (a sample without an optional file waits by it)
Files = dict[str, tuple[int, int, int]]


def inbox_files(inbox: Path) -> Files:
    """Every file a user may have dropped into the inbox: all of it but the folders append manages,
    hidden and temporary files."""
    found: Files = {}
    for folder, dirs, files in os.walk(inbox):
        rel = os.path.relpath(folder, inbox)
        top = rel == "."
        dirs[:] = [d for d in dirs if not d.startswith(".") and not (top and d in INBOX_MANAGED)]
        for name in files:
            if name.startswith(".") or name.endswith((".tmp", ".partial")):
                continue
            try:
                st = os.stat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            found[name if top else f"{rel}/{name}"] = (st.st_mtime_ns, st.st_size, max(st.st_mtime_ns, st.st_ctime_ns))
    return found


def watch_inbox(
    inbox: Path,
    append: Callable[[], int | None],
    *,
    settle_seconds: float,
    window_seconds: float,
    poll_seconds: float,
    stop: threading.Event,
    own_files: Iterable[str] | Callable[[], Iterable[str]] = (),
    looked: Callable[[], None] = lambda: None,
) -> None:
    """Append what is already there, then whenever the inbox holds something new, until ``stop``.

    New means a file the last append did not see as it is now. What an append writes itself (the
    inbox's annotation file and shared files such as a COCO file, ``own_files`` or what it
    returns before each append, pruned of the records it took; processed/ and quarantine/) is
    never new, so an append never starts another. A file written while an append
    ran is new to the next one; files too fresh to take (``settle_seconds``) are retried once they
    have settled. Events wake the loop; every ``poll_seconds`` without events the inbox is also
    compared with what the last append saw (a filesystem without events, an event missed).
    ``looked`` is called each time the loop wakes (an event, or a poll) and finds nothing to append:
    whoever needs to know that the loop has seen the inbox as it now is waits for it.
    ``append`` returns None when it did not run (another run held the output folder): what it
    would have taken is tried again at the next poll, as after a failed append.
    """
    inbox.mkdir(parents=True, exist_ok=True)
    own: set[str] = set()
    seen: Files = {}
    due: float | None = None  # when files too fresh for the last append have settled

    def attempt() -> None:
        nonlocal seen, due, own
        own = set(own_files() if callable(own_files) else own_files)
        before, started = inbox_files(inbox), time.time()
        try:
            ran = append()
        except Exception as err:  # the service outlives one failed append
            log.error("append failed (retrying at the next change or poll): %s", err)
            seen, due = {}, None
            return
        if ran is None:  # skipped, the folder busy: nothing was seen
            seen, due = {}, None
            return
        after = inbox_files(inbox)
        seen = {p: s for p, s in after.items() if p in own or before.get(p) == s}
        fresh = [
            s[2] / 1e9 + settle_seconds
            for p, s in after.items()
            if p in seen and p not in own and s[2] / 1e9 > started - settle_seconds
        ]
        due = min(fresh) if fresh else None

    attempt()  # nothing dropped while the service was down is missed
    for changes in watch(
        inbox,
        watch_filter=InboxFilter(inbox),
        debounce=int(window_seconds * 1000),
        step=50,
        stop_event=stop,
        rust_timeout=int(poll_seconds * 1000),
        yield_on_timeout=True,
        recursive=True,
    ):
        if stop.is_set():
            break
        new = [p for p, s in inbox_files(inbox).items() if seen.get(p) != s]
        settled = due is not None and time.time() >= due
        if not new and not settled:
            looked()
            continue  # the append's own writes, or nothing at all
        if changes:
            log.info("%d new or changed file(s) in %s; appending once files settle", len(new), inbox)
            if stop.wait(settle_seconds):
                break
        elif new:
            log.info("the inbox changed without an event; appending")
        else:
            log.info("files that were still being written have settled; appending")
        attempt()

"""Progress of a long step: a live bar on a terminal, and a line in the run log every 10 %."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


@contextmanager
def progress(total: int, label: str, log: Callable[[str], None]) -> Iterator[Callable[[int], None]]:
    done = 0
    next_log = 0.1
    bar = None
    if sys.stderr.isatty():
        bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                       transient=False)
        bar.start()
        bar_task = bar.add_task(label, total=total)

    def advance(n: int) -> None:
        nonlocal done, next_log
        done += n
        if bar is not None:
            bar.update(bar_task, completed=done)
        if total and done / total >= next_log:
            log(f"{label}: {done}/{total} ({100 * done // total} %)")
            while next_log <= done / total:
                next_log += 0.1

    try:
        yield advance
    finally:
        if bar is not None:
            bar.stop()

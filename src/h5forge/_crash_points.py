"""Named crash points for the fault tests: the process really dies (SIGKILL) where a test asks.

Set ``H5FORGE_KILL_AT=<point>`` in a child process's environment; nothing happens otherwise.
"""

from __future__ import annotations

import os
import signal


def checkpoint(point: str) -> None:
    if os.environ.get("H5FORGE_KILL_AT") == point:
        os.kill(os.getpid(), signal.SIGKILL)

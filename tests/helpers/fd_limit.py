"""Code run in a child process whose open-file limit (``ulimit -n``) is lowered before it imports
anything: the code has ``json`` and ``sys`` and prints its result as its last line, one JSON value."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

PRELUDE = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
"""


def under_fd_limit(limit: int, body: str, *args: str | Path, timeout: float = 300) -> dict:
    """What ``body`` prints, run with ``args`` as its ``sys.argv[1:]`` under ``RLIMIT_NOFILE`` ``limit``."""
    code = textwrap.dedent(PRELUDE.format(limit=limit)) + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])

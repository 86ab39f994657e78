"""Whether the h5forge source on disk is still the code this process loaded.

The fault suite checks in this process what `h5forge` commands started as child processes wrote;
each child imports the source as it is on disk when it starts. Edit the tree during a long run
and the two disagree: a file digest written under a newer rule then fails an older check. The
suite stops with that reason instead of reporting a damaged version."""

from __future__ import annotations

import hashlib
from pathlib import Path


def _packages() -> list[Path]:
    import h5forge
    import h5forge.flows
    import h5forge.tasks

    return [Path(m.__file__).parent for m in (h5forge, h5forge.flows, h5forge.tasks)]


def fingerprint() -> str:
    """sha256 of every Python file of the packages an `h5forge` command imports."""
    h = hashlib.sha256()
    for root in _packages():
        for path in sorted(root.rglob("*.py")):
            h.update(str(path).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


LOADED = fingerprint()  # taken when the suite imports this module, beside its own imports of h5forge


def require_unchanged() -> None:
    if fingerprint() != LOADED:
        raise AssertionError(
            "h5forge's source changed on disk during this run: the h5forge commands it starts run the "
            "new code while this process checks with the code it loaded; rerun on an unchanged tree"
        )

"""Worker processes that never run the caller's script again.

Python's ``spawn`` and ``forkserver`` start methods (dask's nannies spawn; verify's checkers use
the fork server) import the parent's ``__main__`` in every new process: its file, or its module
with ``python -m``. A script that calls ``h5forge.build`` at its top level, with no
``if __name__ == "__main__":`` guard, would then build again in each worker, find the output folder
locked, and leave its workers dead. The processes a run starts need nothing of ``__main__``: they
run h5forge's own functions on the spec. So while a run lasts, ``sys.modules["__main__"]`` is a
stand-in that names no file and no module, and a new process imports nothing of the script. The
script's own code is untouched: its functions keep their globals, ``__file__`` included.
"""

from __future__ import annotations

import functools
import sys
import types
from contextlib import contextmanager
from typing import Callable, Iterator, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def names_a_script(module: types.ModuleType) -> bool:
    """Whether a new spawn or forkserver process would import ``module`` as its ``__main__``."""
    return getattr(module, "__file__", None) is not None or getattr(module, "__spec__", None) is not None


@contextmanager
def main_module_hidden() -> Iterator[None]:
    """Within the block, processes started by any start method import nothing of ``__main__``."""
    real = sys.modules.get("__main__")
    if real is None or not names_a_script(real):  # an interactive session, or a run inside a run
        yield
        return
    stand_in = types.ModuleType("__main__", "the caller's __main__, hidden from the processes a run starts")
    sys.modules["__main__"] = stand_in
    try:
        yield
    finally:
        if sys.modules.get("__main__") is stand_in:
            sys.modules["__main__"] = real


def leaves_main_alone(run: Callable[P, T]) -> Callable[P, T]:
    """``run`` with ``__main__`` hidden from every process it starts (``main_module_hidden``)."""

    @functools.wraps(run)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> T:
        with main_module_hidden():
            return run(*args, **kwargs)

    return wrapped

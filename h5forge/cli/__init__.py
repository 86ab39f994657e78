"""The ``h5forge`` command line: one module per group of commands, all on one typer app."""

from __future__ import annotations

from h5forge.cli import dataset  # noqa: F401  (registers its commands)
from h5forge.cli import views  # noqa: F401  (preview, codecs)
from h5forge.cli import doctor, inspect  # noqa: F401  (register their commands)
from h5forge.cli.app import app

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover - console entry
    app()

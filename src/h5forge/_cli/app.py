"""The command line's app, consoles and error handling, shared by every command module."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from h5forge.errors import H5forgeError
from h5forge._samples import encodable

# modules of the [build] extra (pyproject.toml): a reader-only install lacks them
BUILD_MODULES = frozenset(
    "prefect prefect_dask dask distributed PIL watchfiles psutil pyedflib pydicom nibabel pylibjpeg libjpeg openjpeg rle".split()
)


class _FlagsTakeNoValue:
    """typer's rich help gives a flag the type of its parameter (``--version <bool>``) though a flag
    takes no value; with an empty metavar it shows none, as click's plain help does."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for p in params:
            if getattr(p, "is_flag", False) and p.metavar is None:
                p.metavar = ""
        return params


class _Group(_FlagsTakeNoValue, TyperGroup):
    pass


class _Command(_FlagsTakeNoValue, TyperCommand):
    pass


class _App(typer.Typer):
    """A command that needs the build extra on a reader-only install says so in one line."""

    def command(self, *args, cls=None, **kwargs):
        return super().command(*args, cls=cls or _Command, **kwargs)

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] not in BUILD_MODULES:
                raise
            err.print(
                f"[bold red]error:[/] this command needs h5forge's build extra (no module {e.name!r} "
                "here): pip install 'h5forge\\[build]'",
                highlight=False,
            )  # "\\[": a bracket, not rich markup
            raise SystemExit(2) from None


class _Settings:
    """Options of the whole command line (``h5forge --debug <command>``)."""

    debug = False


settings = _Settings()

app = _App(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    help="Labelled raw data in, versioned and verified HDF5 training sets out.",
)
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _prefect_defaults() -> None:
    """Settings that make the local ephemeral server work here even outside the repo folder."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_TASKS_DEFAULT_NO_CACHE", "true")


def say(text: str, console: Console = out) -> None:
    """A line as it is: no rich markup or highlighting in the paths, ids and reasons it holds, and
    a surrogate (a file name's undecodable byte) escaped, which no terminal can be sent."""
    console.print(encodable(text), highlight=False, markup=False)


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


@contextmanager
def _reported() -> Iterator[None]:
    """An h5forge error ends the command with its one-line message and its exit code
    (2: bad usage or spec, 1: the run failed); anything else is a bug and keeps its traceback."""
    try:
        yield
    except H5forgeError as e:
        _fail(str(e), e.exit_code)

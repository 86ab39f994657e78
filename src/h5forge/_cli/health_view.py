"""A health report on the terminal: the verdict, a table of checks, errors, warnings, figures.

Rich renders it in colour on a terminal and as plain text when piped; scripts use ``--json``.
"""

from __future__ import annotations

import os
from pathlib import Path

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from h5forge._figures import figure_rows
from h5forge._store.verify import HealthReport


BLANK = Text("")


def report_name(path: str) -> str:
    """``dataset_latest.h5 → dataset_v0002.h5`` for the link, the file name otherwise."""
    p = Path(path)
    if p.is_symlink():
        return f"{p.name} → {os.readlink(p)}"
    return p.name


def health_view(report: HealthReport) -> RenderableType:
    verdict = Text.assemble(
        (report_name(report.path), "bold"), ": ", ("HEALTHY", "bold green") if report.ok else ("BROKEN", "bold red")
    )
    checks = Table("check", "result", box=box.SIMPLE_HEAD, show_edge=False)
    for check, result in report.checks.items():
        checks.add_row(check, Text(result, style="red" if result == "FAILED" else ""))
    parts: list[RenderableType] = [verdict, BLANK, checks]
    if report.errors:
        parts += [BLANK, Text("errors", style="bold red")]
        parts += [Text(f"  ✗ {e}", style="red") for e in report.errors]
    if report.warnings:
        parts += [BLANK, Text("warnings", style="bold yellow")]
        parts += [Text(f"  ! {w}", style="yellow") for w in report.warnings]
    if report.stats:
        figures = Table("figure", "value", box=box.SIMPLE_HEAD, show_edge=False)
        for name, value in figure_rows(report.stats):
            figures.add_row(name, value)
        parts += [BLANK, figures]
    return Group(*parts)

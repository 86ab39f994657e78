"""Commands on a bucket prefix (``s3://…``, ``https://…``): push, and the store side of verify,
versions and rollback, which the local commands hand a URL to."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from h5forge._cli.app import _fail, _reported, app, err, out, say


@app.command()
def push(
    folder: Path = typer.Argument(..., help="output folder of a dataset (its latest version is pushed)"),
    prefix: str = typer.Argument(..., help="where on a bucket, e.g. s3://team-data/cells"),
    keep: Optional[int] = typer.Option(None, min=1, help="afterwards keep only the newest K versions on the prefix"),
) -> None:
    """Upload the latest version (a thin one copied whole), then move the prefix's latest to it."""
    from h5forge.read._remote import is_remote
    from h5forge._store.remote import push as push_version

    if not is_remote(prefix):
        _fail(f"{prefix}: not a bucket address (s3://…, gs://…)")
    with _reported():
        done = push_version(folder, prefix, keep=keep, progress=lambda line: say(line, err))
    what = "uploaded" if done.uploaded else "already there"
    say(f"v{done.version:04d} {what}: {done.object}; dataset_latest.h5 -> v{done.version:04d}")
    for gone in done.removed:
        say(f"removed {gone}")


def verify_url(url: str, quick: bool, as_json: bool) -> None:
    from h5forge._cli.health_view import health_view
    from h5forge._store.remote import verify_remote

    report = verify_remote(url, checksums=not quick)
    if as_json:
        print(report.to_json())
    else:
        out.print(health_view(report), highlight=False)
    raise typer.Exit(0 if report.ok else 1)


def versions_of(prefix: str) -> None:
    from h5forge._store.remote import latest_of, listed

    with _reported():
        found = listed(prefix)
        if not found:
            _fail(f"no version on {prefix}", 1)
        current = latest_of(prefix)
    t = Table("", "version", "size", "object")
    for number, entry in found.items():
        t.add_row(
            "latest →" if number == current else "", f"v{number:04d}", f"{entry['size'] / 1e6:.1f} MB", entry["object"]
        )
    out.print(t)


def rollback_of(prefix: str, version: str) -> None:
    from h5forge._format.names import version_name
    from h5forge._store.remote import rollback as rollback_prefix
    from h5forge._store.versions import version_number

    with _reported():
        number = version_number(version)
        rollback_prefix(prefix, number)
    out.print(f"dataset_latest.h5 -> {version_name(number)}")

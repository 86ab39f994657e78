"""Commands that make, change and check a dataset: init, build, append, watch, serve, export, verify,
versions, rollback, demo-data (verify, versions and rollback hand a bucket address to h5forge._cli.bucket)."""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from h5forge.errors import H5forgeError
from h5forge._cli.app import _fail, _prefect_defaults, _reported, app, err, out, say, settings
from h5forge.kinds import demos, detectors


@app.command()
def init(
    raw: Path = typer.Argument(
        ...,
        help="raw folder, one of: "
        + "; ".join(d.expects for _, d in detectors())
        + "; annotations beside pictures (*.json, *.jsonl, *.csv)",
    ),
    out_path: Path = typer.Option(..., "--out", help="where to write the spec YAML"),
    force: bool = typer.Option(False, help="overwrite an existing spec"),
) -> None:
    """Write a spec inferred from a raw folder, with comments; print what could not be inferred.
    Exits 2 when a value must be filled in first (a ``# ...: TODO`` line in the spec), 1 when a build
    with the spec would publish nothing (the reason is printed)."""
    from h5forge._init import infer_spec
    from h5forge._init.text import one_line  # names from the folder may hold line breaks

    from h5forge._store.output import refuse_version_names

    if out_path.exists() and not force:
        _fail(f"{out_path} exists; pass --force to overwrite it")
    with _reported():
        refuse_version_names(out_path, "the spec")
        inferred = infer_spec(raw, out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(inferred.text)
    for note in inferred.notes:
        say(f"note: {one_line(note)}")
    if inferred.todo:
        _fail(
            f"wrote {out_path} ({inferred.layout} layout), but it is incomplete: fill in "
            f"{', '.join(inferred.todo)} (the TODO lines), then run: h5forge build {out_path}"
        )
    if inferred.unbuildable:
        _fail(
            f"wrote {out_path} ({inferred.layout} layout), but a build with it publishes nothing: "
            f"{one_line(inferred.unbuildable)}; see the notes, fix the folder or the spec, then run: h5forge build "
            f"{out_path}",
            1,
        )
    say(f"wrote {out_path} ({inferred.layout} layout); review it, then run: h5forge build {out_path}")


@app.command()
def build(
    spec: Path = typer.Argument(..., help="dataset spec YAML"),
    output: Optional[Path] = typer.Option(None, help="output folder (overrides the spec)"),
    dask_address: Optional[str] = typer.Option(None, help="tcp://host:port of an existing dask scheduler"),
) -> None:
    """Full build: discover, clean on dask, write, verify, publish (a Prefect flow run)."""
    _check_spec(spec, output, dask_address)  # fail fast, before starting Prefect
    with _reported():
        from h5forge.flows.build import build_dataset
        from h5forge.flows.foreground import foreground_run

        # no heartbeat thread to wait for at the end (flows/foreground.py)
        with _flow_server(), foreground_run(settings.debug):
            result = build_dataset(str(spec), str(output) if output else None, dask_address)
    _print_build(result)


def _print_build(result) -> None:
    if result.unchanged:
        say(f"{result.name}: unchanged since v{result.version:04d} (same raw inputs and spec); nothing published")
        return
    t = Table(title=f"{result.name}: published v{result.version:04d}", show_header=False)
    t.add_row("file", result.path)
    t.add_row("samples", ", ".join(f"{k} {v}" for k, v in result.counts.items()))
    t.add_row("rejected", f"{result.rejected} (see quarantine/)")
    t.add_row("compression", f"{result.compression_ratio:.3f} of raw array bytes")
    for check, res in result.health.items():
        t.add_row(f"verify {check}", res)
    out.print(t)
    for warning in result.warnings:
        say(f"warning: {warning}", err)


@app.command()
def append(
    spec: Path = typer.Argument(..., help="dataset spec YAML"),
    inbox: Optional[Path] = typer.Option(None, "--from", help="inbox folder (default: source.inbox of the spec)"),
    output: Optional[Path] = typer.Option(None, help="output folder (overrides the spec)"),
    dask_address: Optional[str] = typer.Option(None, help="tcp://host:port of an existing dask scheduler"),
) -> None:
    """Append the complete samples waiting in the inbox as a new version (a Prefect flow run)."""
    _check_spec(spec, output, dask_address, inbox, needs_inbox=True)
    from h5forge.flows.append import append_samples
    from h5forge.flows.foreground import foreground_run

    with _reported(), _flow_server(), foreground_run(settings.debug):
        result = append_samples(str(spec), _opt(inbox), _opt(output), dask_address)
    _print_append(result, spec)


def _flow_server():
    """The configured Prefect server, else the local one this or an earlier command started."""
    from h5forge._cli import local_server

    def started(server) -> None:
        say(
            f"started a local Prefect server at {server.url} for this and later commands; it stops after "
            f"{local_server.idle_minutes():g} min unused (`h5forge server stop` stops it now)",
            err,
        )

    return local_server.for_flow_run(started)


def _opt(p: Optional[Path]) -> Optional[str]:
    return str(p) if p is not None else None


def _check_spec(spec: Path, output, dask_address, inbox=None, needs_inbox: bool = False):
    from h5forge.spec import load_spec
    from h5forge._store.output import preflight

    from h5forge._cli.local_server import idle_minutes

    with _reported():
        idle_minutes()  # a bad setting of the local server's: one error line before anything starts
        loaded = load_spec(spec, output, dask_address, inbox)
        preflight(loaded, inbox=needs_inbox)
        if loaded.compute.dask_address:
            from h5forge._ingest.parallel import check_workers

            check_workers(loaded.compute.dask_address)  # before a run starts: no run to mark failed
    _prefect_defaults()
    return loaded


def _print_append(result, spec: Path | None = None) -> None:
    if result.skipped:
        out.print(f"skipped: {result.skipped}")
    elif result.version:
        out.print(
            f"appended {result.added} sample(s) {result.added_counts} as v{result.version:04d}; now {result.counts}"
        )
    else:
        out.print("nothing appended")
    for r in result.rejections:
        say(f"  rejected {r.sample_id} ({r.path}): {r.reason}")
    if result.waiting:
        out.print(f"  {result.waiting} sample(s) wait for a missing part or for their files to settle")
    for warning in result.warnings:
        say(f"warning: {warning}", err)
    from h5forge._store.thin import compact_advice

    advice = compact_advice(result.version, result.chain, str(spec or "SPEC")) if result.version else None
    if advice:
        say(f"warning: {advice}", err)


@app.command()
def watch(
    spec: Path = typer.Argument(..., help="dataset spec YAML"),
    inbox: Optional[Path] = typer.Option(None, "--inbox", help="inbox folder (default: source.inbox)"),
    output: Optional[Path] = typer.Option(None, help="output folder (overrides the spec)"),
    dask_address: Optional[str] = typer.Option(None, help="tcp://host:port of an existing dask scheduler"),
    deployment: Optional[str] = typer.Option(
        None, help="run this deployment (e.g. append-samples/inbox) on a Prefect server instead of in-process"
    ),
) -> None:
    """Long-running: append samples as they settle in the inbox; Ctrl-C / SIGTERM stops between appends."""
    import logging

    from h5forge._pipeline.watch import serve_inbox

    loaded = _check_spec(spec, output, dask_address, inbox, needs_inbox=True)
    if loaded.source.inbox is None:
        _fail("no inbox: pass --inbox, or set source.inbox in the spec")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if deployment:
        from h5forge.deployments.trigger import check_append_deployment, trigger_append

        with _reported():
            check_append_deployment(deployment, spec)

        def run_once() -> int | None:
            return trigger_append(deployment, loaded.source.inbox, _opt(output), dask_address)
    else:
        from h5forge.flows.append import append_samples

        def run_once() -> int | None:
            result = append_samples(str(spec), str(loaded.source.inbox), _opt(output), dask_address, skip_if_busy=True)
            _print_append(result, spec)
            return None if result.skipped else result.waiting  # None: tried again at the next poll

    out.print(f"watching {loaded.source.inbox} (Ctrl-C to stop)")
    a = loaded.append
    # append rewrites the inbox's annotation and COCO files (the records it took leave them): not a
    # change to act on
    from h5forge._ingest.append import rewritten_by_append

    box = loaded.source.inbox
    # in-process rounds run on the server build and append share, found or started once
    with _reported(), nullcontext() if deployment else _flow_server():
        serve_inbox(
            box,
            run_once,
            own_files=lambda: rewritten_by_append(loaded, box),
            settle_seconds=a.settle_seconds,
            window_seconds=a.batch_window_seconds,
            poll_seconds=a.poll_seconds,
        )
    out.print("stopped")


@app.command()
def serve(
    spec: Path = typer.Argument(..., help="dataset spec YAML"),
    output: Optional[Path] = typer.Option(None, help="output folder (overrides the spec)"),
    dask_address: Optional[str] = typer.Option(None, help="tcp://host:port of an existing dask scheduler"),
    timezone: str = typer.Option("UTC", help="time zone of the schedules, e.g. Europe/Berlin"),
    nightly_cron: str = typer.Option("0 2 * * *", help="when the full rebuild runs"),
    poll_seconds: float = typer.Option(300, help="append-samples/inbox polling interval"),
    suffix: str = typer.Option(
        "", help="appended to the deployment names, e.g. -cells, when one server runs several datasets"
    ),
) -> None:
    """Serve the deployments build-dataset/nightly, append-samples/inbox, verify-dataset/weekly.

    Needs a Prefect server: PREFECT_API_URL (e.g. http://127.0.0.1:4200/api after `prefect server start`).
    """
    _check_spec(spec, output, dask_address)
    from h5forge._cli.local_server import configured

    if not configured():
        _fail("serve needs a Prefect server: start one (`prefect server start`) and set PREFECT_API_URL")
    from prefect import serve as prefect_serve

    from h5forge.deployments.definitions import dataset_deployments

    deps = dataset_deployments(spec, _opt(output), dask_address, timezone, nightly_cron, poll_seconds, suffix=suffix)
    prefect_serve(*deps, pause_on_shutdown=False, limit=2)


@app.command()
def export(
    version: Path = typer.Argument(..., help="a version file (thin or not) or dataset_latest.h5"),
    dest: Path = typer.Argument(..., help="the self-contained copy to write"),
    codec: Optional[str] = typer.Option(
        None,
        "--codec",
        help="recompress every sample array: gzip-1 or "
        "none make a copy any HDF5 tool reads without plugins (default: "
        "keep each field's codec)",
    ),
) -> None:
    """Write a self-contained copy of a version, to move to another machine or hand to other tools."""
    import h5py

    from h5forge._format import leases
    from h5forge._format.codecs import CODECS
    from h5forge._format.names import Attr
    from h5forge._store.output import refuse_version_names
    from h5forge._store.thin import export as export_version
    from h5forge._store.verify import verify_file

    if codec is not None and codec not in CODECS:
        _fail(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}")
    if not version.exists():
        _fail(f"{version}: no such file")
    with _reported():
        refuse_version_names(dest)
    with leases.pinned(version) as real:  # retention keeps it from the check to the end of the copy
        report = verify_file(real, checksums=False, resample=0, latency_reads=0, isolate=True)
        if not report.ok:
            _fail(f"{version} is broken: {'; '.join(report.errors)}", 1)
        export_version(Path(real), dest, codec)
    check = verify_file(dest, resample=0, latency_reads=0)
    if not check.ok:
        dest.unlink()
        _fail(f"the copy failed verification: {'; '.join(check.errors)}", 1)
    with h5py.File(dest, "r") as f:
        needs = str(f.attrs.get(Attr.CODEC_NEEDS, ""))
    out.print(
        f"wrote {dest} ({dest.stat().st_size / 1e6:.1f} MB, self-contained, {check.checks['checksums']}; "
        f"reading it needs {needs})"
    )


@app.command()
def verify(
    location: str = typer.Argument(
        ..., metavar="PATH", help="a version file or dataset_latest.h5, local or on a bucket (s3://…, https://…)"
    ),
    quick: bool = typer.Option(
        False,
        help="skip recomputing every checksum and re-deriving samples "
        "from their sources (unless --resample asks for some)",
    ),
    resample: Optional[int] = typer.Option(
        None,
        "--resample",
        "--compare",
        min=0,
        help="samples re-cleaned from sources and compared (default: the stored spec's, at most 1000)",
    ),
    latency_reads: Optional[int] = typer.Option(
        None, min=0, help="random reads timed (default: the stored spec's, at most 1000)"
    ),
    source_root: Optional[Path] = typer.Option(None, help="raw folder, if it moved"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON (for scripts)"),
) -> None:
    """Check a version; exit 0 if healthy, 1 with the reasons if not."""
    from h5forge._cli.health_view import health_view
    from h5forge._format.names import LATEST
    from h5forge._store.verify import verify_file
    from h5forge._store.versions import latest
    from h5forge.read._remote import is_remote

    if is_remote(location):
        from h5forge._cli.bucket import verify_url

        verify_url(location, quick, as_json)
    path = Path(location)
    if path.name == LATEST:  # only a link that resolves inside its folder is that folder's latest
        with _reported():
            latest(path.parent)
    if quick and resample is None:
        resample = 0
    report = verify_file(
        path, checksums=not quick, resample=resample, latency_reads=latency_reads, source_root=source_root, isolate=True
    )  # a file that crashes HDF5 is BROKEN too
    if as_json:
        print(report.to_json())
    else:
        out.print(health_view(report), highlight=False)
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def versions(
    location: str = typer.Argument(..., metavar="FOLDER", help="output folder of a dataset, or a bucket prefix"),
) -> None:
    """List published versions; the one latest points at is marked. A version that cannot be read
    is listed as such, with the reason."""
    from h5forge.read._remote import is_remote
    from h5forge._store.versions import latest, published

    if is_remote(location):
        from h5forge._cli.bucket import versions_of

        return versions_of(location)
    folder = Path(location)

    found = published(folder)
    if not found:
        _fail(f"no published version in {folder}", 1)
    with _reported():
        current = latest(folder)
    out.print(version_table(found, current))


def version_table(found: dict[int, Path], current: int | None) -> Table:
    """The listing of ``versions``: each listed version read while it is pinned (retention keeps
    it meanwhile); one that retention deleted between the listing and its read is named as such."""
    from h5forge._format import leases
    from h5forge._store.isolated import in_child
    from h5forge._views.info import brief

    t = Table("", "version", "samples", "size", "kind", "created", "parent")
    for number, p in found.items():
        mark = "latest →" if number == current else ""
        with leases.pinned(p) as real:
            if not os.path.exists(real):
                t.add_row(mark, f"v{number:04d}", "", "", "deleted by retention while listing", "", "")
                continue
            try:
                row = in_child(brief, p, what=f"read {p.name}")
            except H5forgeError as err:
                t.add_row(mark, f"v{number:04d}", "", f"{p.stat().st_size / 1e6:.1f} MB", f"unreadable: {err}", "", "")
                continue
        t.add_row(
            mark,
            f"v{number:04d}",
            str(row["samples"]),
            f"{row['file_bytes'] / 1e6:.1f} MB",
            row["kind"],
            str(row["created_at"]),
            f"v{row['parent']:04d}" if row["parent"] else "",
        )
    return t


@app.command()
def rollback(
    location: str = typer.Argument(..., metavar="FOLDER", help="output folder of a dataset, or a bucket prefix"),
    version: str = typer.Argument(..., help="version to point latest at, e.g. v0002"),
) -> None:
    """Point dataset_latest.h5 at an earlier (or later) published version."""
    from h5forge.read._remote import is_remote

    if is_remote(location):
        from h5forge._cli.bucket import rollback_of

        return rollback_of(location, version)
    folder = Path(location)
    from h5forge._store.verify import verify_file
    from h5forge._format.names import version_name
    from h5forge._store.versions import output_lock, published, set_latest, version_number
    from h5forge._pipeline.build import recover_interrupted

    if not folder.is_dir():  # the lock would make it (or fail on a file given for the folder)
        _fail(
            f"{folder} {'is not a folder' if folder.exists() else 'does not exist'}: give the dataset's output folder"
        )
    with _reported():
        number = version_number(version)
        if not published(folder):
            _fail(f"no published version in {folder}")
        with output_lock(folder, what="rollback"):
            recover_interrupted(folder)  # a killed append's journal would otherwise undo this rollback
            if number not in published(folder):
                _fail(f"{folder / version_name(number)} is not a published version")
            report = verify_file(
                folder / version_name(number), checksums=False, resample=0, latency_reads=0, isolate=True
            )
            if not report.ok:
                _fail(f"refusing to roll back to a broken version: {'; '.join(report.errors)}", 1)
            set_latest(folder, number)
    out.print(f"dataset_latest.h5 -> {version_name(number)}")


@app.command("demo-data")
def demo_data(
    folder: Path = typer.Argument(Path("data/raw/demo")),
    kind: str = typer.Option("cells", help=" | ".join(f"{d.name} ({d.about})" for d in demos().values())),
    n: Optional[int] = typer.Option(
        None,
        help="good samples to generate (default: "
        + ", ".join(f"{d.default_n} {d.name}" for d in demos().values())
        + ")",
    ),
    seed: int = typer.Option(0),
    bad: bool = typer.Option(True, help="also write the usual defects of real collections"),
    prefix: Optional[str] = typer.Option(
        None, help="sample id prefix (another one makes new samples); default: the demo's own"
    ),
) -> None:
    """Generate a realistic raw folder of one kind, with the defects real collections have."""
    found = demos()
    if kind not in found:
        _fail(f"--kind {kind!r} is not a demo kind; choose one of {', '.join(found)}")
    demo = found[kind]
    n = demo.default_n if n is None else n
    there = (folder / demo.marker).exists() if demo.marker else folder.is_dir() and any(folder.iterdir())
    if there:
        out.print(f"{folder} already holds demo data; keeping it")
        return
    options = {} if prefix is None else {"prefix": prefix}
    defects = demo.load()(folder, n=n, seed=seed, bad=bad, **options)
    out.print(f"wrote {n} {demo.noun} and {len(defects)} defective inputs to {folder}")

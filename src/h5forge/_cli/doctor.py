"""``h5forge doctor``: can this machine build and read datasets? Versions, compression filters,
the plugin path other HDF5 tools need, the Prefect API, dask and CPUs, free disk; with a FILE the
filters it needs, with ``--spec`` what that spec needs. Exit 1 when something needed is missing."""

from __future__ import annotations

import os
import shutil
from importlib.metadata import version
from pathlib import Path
from typing import Optional

import typer

from h5forge._cli.app import _reported, app, say
from h5forge._figures import size as size_text
from h5forge.errors import ReadError, SchedulerUnreachable, SourceMissing, UsageError

HEALTH_TIMEOUT = 3.0  # seconds for the Prefect API to answer /health


class Checkup:
    """The report's lines, and the problems that make the exit code 1."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def line(self, label: str, text: str) -> None:
        say(f"{label + ':' if label else '':<20} {text}")

    def problem(self, label: str, text: str) -> None:
        self.problems.append(f"{label}: {text}")
        self.line(label, f"MISSING {text}")


def _filter_name(fid: int, known: dict[int, tuple[str, str]]) -> str:
    name, source = known.get(fid, ("unknown filter", "not provided by HDF5, h5py or hdf5plugin here"))
    return f"{name} ({fid}, {source})"


def check_versions(c: Checkup) -> None:
    import platform

    import h5py

    c.line("h5forge", f"{version('h5forge')} (Python {platform.python_version()})")
    c.line("h5py / HDF5", f"h5py {h5py.version.version}, HDF5 {h5py.version.hdf5_version}")
    try:
        plugin = version("hdf5plugin")
    except Exception:  # PackageNotFoundError: reported, not fatal by itself
        plugin = "not installed (lz4/zstd/bitshuffle/blosc2 files cannot be read)"
    c.line("hdf5plugin", plugin)


def check_filters(c: Checkup) -> None:
    from h5forge._format.codecs import ensure_filters
    from h5forge._format.filters import available, known_filters

    try:
        ensure_filters()
    except ImportError:
        pass
    known = sorted(known_filters().items())
    c.line("filters available", ", ".join(f"{name} {fid}" for fid, (name, _) in known if available(fid)))
    c.line("filters absent", ", ".join(f"{name} {fid}" for fid, (name, _) in known if not available(fid)) or "none")


def check_plugin_path(c: Checkup) -> None:
    try:
        import hdf5plugin
    except ImportError:
        c.line("HDF5_PLUGIN_PATH", "hdf5plugin is not installed: `pip install hdf5plugin` first")
        return
    current = os.environ.get("HDF5_PLUGIN_PATH")
    state = (
        "set in this shell"
        if current == hdf5plugin.PLUGIN_PATH
        else (f"this shell has {current}" if current else "not set in this shell")
    )
    c.line("HDF5_PLUGIN_PATH", f"export HDF5_PLUGIN_PATH={hdf5plugin.PLUGIN_PATH}")
    c.line("", f"({state}; h5dump, HDFView and h5py without `import h5forge` need it for lz4/zstd files)")


def _read_toml(path: Path) -> dict | None:
    """The parsed file, {} when absent, None when Prefect might read it differently (not TOML)."""
    import tomllib

    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None


def api_url_in_files(cwd: Path) -> bool:
    """Whether a file Prefect reads its settings from may set the API URL: ``.env``,
    ``prefect.toml`` or ``pyproject.toml`` ([tool.prefect]) in ``cwd``, or a profile in
    ``profiles.toml``. Importing Prefect to ask takes seconds, so it is imported only then."""
    dotenv = cwd / ".env"
    if dotenv.is_file() and "PREFECT_API_URL" in dotenv.read_text(encoding="utf-8", errors="replace"):
        return True
    prefect_toml = _read_toml(cwd / "prefect.toml")
    pyproject = _read_toml(cwd / "pyproject.toml")
    if prefect_toml is None or pyproject is None:
        return True
    for table in (prefect_toml, pyproject.get("tool", {}).get("prefect", {})):
        if isinstance(table.get("api"), dict) and "url" in table["api"]:
            return True
    home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
    profiles = _read_toml(Path(os.environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser())
    if profiles is None:
        return True
    return any(isinstance(p, dict) and "PREFECT_API_URL" in p for p in profiles.get("profiles", {}).values())


def prefect_api_url() -> str | None:
    """The Prefect API URL a run here would use, or None (ephemeral): the environment's, else
    Prefect's own settings when a settings file may name one (Prefect resolves their precedence)."""
    url = os.environ.get("PREFECT_API_URL")
    if url or not api_url_in_files(Path.cwd()):
        return url or None
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def check_prefect(c: Checkup) -> None:
    url = prefect_api_url()
    if not url:
        from h5forge._cli import local_server

        server = local_server.running()
        where = f"the local one runs at {server.url}" if server else "none runs now"
        c.line(
            "Prefect API",
            f"ephemeral (no server configured): build and append use a local server they start in the "
            f"background ({where}; `h5forge server stop`); `serve` needs PREFECT_API_URL",
        )
        return
    import httpx

    health = f"{url.rstrip('/')}/health"
    try:
        response = httpx.get(health, timeout=HEALTH_TIMEOUT)
    except httpx.HTTPError as err:
        c.problem(
            "Prefect API",
            f"{url} does not answer ({type(err).__name__}: {err}); start the server "
            "(`prefect server start`) or unset PREFECT_API_URL",
        )
        return
    if response.status_code != 200:
        c.problem("Prefect API", f"{health} answered HTTP {response.status_code}")
        return
    c.line("Prefect API", f"{url} reachable")


def check_compute(c: Checkup) -> None:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    c.line("dask", f"dask {version('dask')}, distributed {version('distributed')}")
    c.line("CPUs", f"{os.cpu_count()} ({usable} usable by this process)")


def _existing(folder: Path) -> Path:
    """The folder, or its nearest existing parent (an output folder is created on the first build)."""
    folder = folder.resolve()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def check_disk(c: Checkup, folder: Path, label: str = "free disk") -> None:
    where = _existing(folder)
    usage = shutil.disk_usage(where)
    c.line(label, f"{size_text(usage.free)} free of {size_text(usage.total)} at {where}")


def check_file(c: Checkup, path: Path) -> None:
    from h5forge._format.filters import available, filters_used, known_filters

    with _reported():
        if path.is_dir():
            raise UsageError(f"{path} is a folder; doctor checks one file (e.g. its dataset_latest.h5)")
        if not path.is_file():
            raise SourceMissing(f"{path}: no such file")
        try:
            used = filters_used(path)
        except OSError as err:
            raise ReadError(f"{path}: not an HDF5 file ({err})") from None
    known = known_filters()
    import h5py

    with h5py.File(os.path.realpath(path), "r") as f:
        needs = f.attrs.get("codec_needs")
    if needs is not None:
        c.line("file records", f"needs {needs}")
    if not used:
        c.line("file filters", f"{path.name}: none (any HDF5 reader)")
    for fid, datasets in sorted(used.items()):
        where = f"{len(datasets)} dataset(s), e.g. {datasets[0]}"
        if available(fid):
            c.line("file needs", f"{_filter_name(fid, known)}: available ({where})")
        else:
            c.problem("file needs", f"{_filter_name(fid, known)}: not available in this HDF5 ({where})")


def check_spec(c: Checkup, spec_path: Path, dask_address: str | None = None) -> Path:
    """What building ``spec_path`` needs: its codecs' filters, its source folder, a writable output
    folder, the dask scheduler it names. Returns the output folder."""
    from h5forge._format.filters import available, codec_filters, known_filters
    from h5forge.kinds import stored_kinds
    from h5forge.spec import load_spec

    with _reported():
        spec = load_spec(spec_path, dask_address=dask_address)
    known = known_filters()
    codecs = sorted({k.stored().codec_of(spec.storage.codec) for k in stored_kinds(spec).values() if k.stored().bulk})
    for codec in codecs:
        try:
            ids = codec_filters(codec)
        except ImportError as err:
            c.problem("spec codec", f"{codec}: needs a package that is not installed ({err.name})")
            continue
        names = ", ".join(_filter_name(fid, known) for fid in sorted(ids)) or "no filter"
        lacking = [fid for fid in ids if not available(fid)]
        if lacking:
            c.problem("spec codec", f"{codec}: {names}: not available in this HDF5")
        else:
            c.line("spec codec", f"{codec}: {names}: available")
    root = Path(spec.source.root)
    if root.is_dir():
        c.line("spec source", f"{root} exists")
    else:
        c.problem("spec source", f"{root}: no such folder (source.root)")
    target = _existing(Path(spec.output.dir))
    if os.access(target, os.W_OK):
        made = "exists" if Path(spec.output.dir).exists() else "created on build"
        c.line("spec output", f"{spec.output.dir} ({made}, writable)")
    else:
        c.problem("spec output", f"{spec.output.dir}: {target} is not writable")
    if spec.compute.dask_address:
        check_scheduler(c, spec.compute.dask_address, "spec dask")
    return Path(spec.output.dir)


def check_scheduler(c: Checkup, address: str, label: str = "dask scheduler") -> None:
    """Reachable, and how many workers it has: a scheduler without workers cleans nothing."""
    from h5forge._ingest.parallel import check_reachable

    try:
        check_reachable(address)
    except SchedulerUnreachable as err:
        c.problem(label, str(err))
        return
    from distributed import Client

    try:
        with Client(address, timeout="10s") as client:
            threads = client.nthreads()
    except (OSError, TimeoutError) as err:
        c.problem(label, f"{address} accepts connections but does not answer as a dask scheduler ({err})")
        return
    if not threads:
        c.problem(
            label,
            f"{address} reachable, 0 workers: a build there waits for one, then fails; "
            f"start some (`dask worker {address}`)",
        )
        return
    c.line(label, f"{address} reachable, {len(threads)} worker(s), {sum(threads.values())} thread(s)")


@app.command()
def doctor(
    file: Optional[Path] = typer.Argument(
        None, help="a version file (or any HDF5 file): which filters it needs, and whether this machine has them"
    ),
    spec: Optional[Path] = typer.Option(
        None, "--spec", help="a dataset spec: its codecs, source folder, output folder (free disk) and dask scheduler"
    ),
    dask_address: Optional[str] = typer.Option(
        None, help="tcp://host:port of a dask scheduler to check (with --spec: in place of the spec's)"
    ),
) -> None:
    """Check this machine: h5py/HDF5 versions, compression filters, the HDF5_PLUGIN_PATH line for
    other HDF5 tools, the Prefect API, dask and CPUs, free disk. Exit 1 when something the FILE or
    the spec needs is missing (or a configured Prefect API does not answer)."""
    c = Checkup()
    check_versions(c)
    check_filters(c)
    check_plugin_path(c)
    check_prefect(c)
    check_compute(c)
    disk_at = Path.cwd()
    if spec is not None:
        disk_at = check_spec(c, spec, dask_address)
    elif dask_address:
        check_scheduler(c, dask_address)
    if file is not None:
        check_file(c, file)
        if spec is None:
            disk_at = file.resolve().parent
    check_disk(c, disk_at)
    if c.problems:
        c.line("result", f"{len(c.problems)} problem(s): " + "; ".join(c.problems))
        raise typer.Exit(1)
    c.line("result", "ok")

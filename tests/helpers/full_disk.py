"""Runs of the plain pipeline on a nearly full filesystem, each in a child process of its own (an
HDF5 crash, or a file HDF5 leaves open, shows as the child's exit status and stderr).

``python -m tests.helpers.full_disk MODE SPEC MOUNT SNAPSHOT REPORT [LEAVE ...]``: MODE is build
or append; before each run MOUNT's content is replaced by a copy of SNAPSHOT. Without LEAVE it
measures an undisturbed run: the bytes used before each file the run opens for writing and around
each step (the thresholds a sweep tests just below). For each LEAVE it fills MOUNT with a ballast
file that leaves LEAVE bytes free, runs, records what the failure left, removes the ballast and
runs again. REPORT is a JSON file written off the filesystem under test, after every point.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import traceback
from pathlib import Path

BALLAST = "ballast"


def free_bytes(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return st.f_bavail * st.f_frsize


def fill(mnt: Path, leave: int) -> None:
    """A ballast file that leaves ``leave`` bytes free (tmpfs counts whole pages: keep ``leave`` a
    multiple of the page size for an exact fill)."""
    assert os.path.ismount(mnt), f"{mnt} is not a mount point"
    size, block = max(0, free_bytes(mnt) - leave), b"\0" * (1 << 20)
    with open(mnt / BALLAST, "wb") as fh:
        for _ in range(size >> 20):
            fh.write(block)
        fh.write(block[: size & ((1 << 20) - 1)])
        fh.flush()
        os.fsync(fh.fileno())


def outcome(out: Path, inbox: Path) -> dict:
    """What a run left: the version latest names, its health and rows, and every file's name."""
    import h5py

    from h5forge._format.names import SPLITS, Attr
    from h5forge._format.names import IDS
    from h5forge._format.layout import decode_str
    from h5forge._store.verify import verify_file
    from h5forge._store.versions import latest
    from tests.helpers.files import strays

    number = latest(out)
    path = os.path.realpath(out / "dataset_latest.h5")
    report = verify_file(path, workers=1)
    with h5py.File(path, "r") as f:
        rows = {s: decode_str(f[s][IDS][()]) for s in SPLITS}
        digests = {s: str(f[s].attrs[Attr.DIGEST]) for s in SPLITS}

    def names(folder: Path) -> list[str]:
        return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())

    return {
        "latest": number,
        "healthy": report.ok,
        "errors": report.errors[:3],
        "rows": rows,
        "digests": digests,
        "out_files": names(out),
        "inbox_files": names(inbox) if inbox.is_dir() else [],
        "strays": strays(out),
    }


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _run(mode: str, spec: Path, runner=None):
    import h5forge
    from h5forge._pipeline.runner import PLAIN

    return (h5forge.build if mode == "build" else h5forge.append)(spec, runner=runner or PLAIN)


def measure(mode: str, spec: Path, mnt: Path) -> dict:
    """Bytes used before each file opened for writing (first open of each path) and before and
    after each step of an undisturbed run."""
    from h5forge._pipeline.runner import Runner

    start = free_bytes(mnt)
    opens: dict[str, int] = {}
    steps: list[tuple[str, int, int]] = []

    def hook(event: str, args: tuple) -> None:
        if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path, mode_, flags = args
        writes = (mode_ and any(c in mode_ for c in "wax+")) or (flags and flags & (os.O_WRONLY | os.O_RDWR))
        name = os.fsdecode(path)
        if writes and name.startswith(str(mnt)) and name not in opens:
            opens[name] = start - free_bytes(mnt)

    class Measuring(Runner):
        def step(self, name, fn, *args, **kwargs):
            before = start - free_bytes(mnt)
            try:
                return fn(*args, **kwargs)
            finally:
                steps.append((name, before, start - free_bytes(mnt)))

    sys.addaudithook(hook)
    _run(mode, spec, Measuring())
    return {"opens": opens, "steps": steps, "used": start - free_bytes(mnt)}


def failed_then_rerun(mode: str, spec: Path, mnt: Path, leave: int) -> dict:
    from h5forge.errors import H5forgeError
    from h5forge.spec import load_spec

    s = load_spec(spec)
    out, inbox = Path(s.output.dir), Path(s.source.inbox or mnt / "no-inbox")
    fill(mnt, leave)
    report: dict = {"leave": leave}
    warnings = _Warnings()
    logging.getLogger("h5forge").addHandler(warnings)
    try:
        _run(mode, spec)
        report["error"] = None
    except H5forgeError as err:
        report["error"] = [type(err).__name__, str(err)]
    except Exception as err:  # noqa: BLE001 - the sweep reports it: an unexpected error is a failure
        report["error"] = [type(err).__name__, str(err), traceback.format_exc()]
    logging.getLogger("h5forge").removeHandler(warnings)
    report["warnings"] = warnings.messages
    report["after_failure"] = outcome(out, inbox)
    (mnt / BALLAST).unlink()
    _run(mode, spec)
    report["after_rerun"] = outcome(out, inbox)
    return report


def restore(mnt: Path, snapshot: Path) -> None:
    for p in mnt.iterdir():
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    shutil.copytree(snapshot, mnt, symlinks=True, dirs_exist_ok=True)


def main() -> None:
    mode, spec, mnt, snapshot, dest = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
    leaves = [int(x) for x in sys.argv[6:]]
    if not leaves:
        restore(mnt, snapshot)
        result = measure(mode, spec, mnt)
        result["outcome"] = outcome(*_folders(spec, mnt))
        Path(dest).write_text(json.dumps(result))
        return
    points: list[dict] = []
    for leave in leaves:
        restore(mnt, snapshot)
        points.append(failed_then_rerun(mode, spec, mnt, leave))
        Path(dest).write_text(json.dumps(points))


def _folders(spec: Path, mnt: Path) -> tuple[Path, Path]:
    from h5forge.spec import load_spec

    s = load_spec(spec)
    return Path(s.output.dir), Path(s.source.inbox or mnt / "no-inbox")


if __name__ == "__main__":
    main()

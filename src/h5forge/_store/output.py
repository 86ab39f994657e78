"""Before a run writes anything: its source folders exist, its output folder lies outside them,
and the output folder belongs to this dataset.

An output folder belongs to the dataset that first published there: its name is recorded in
``<out>/h5forge-dataset.json`` (and, for a folder without the marker, read from the root
attributes of the newest version). A spec of another name is refused, so two datasets never
share a ``dataset_latest.h5`` or delete each other's versions by retention.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py

from h5forge.errors import OutputTaken, SourceMissing, SpecError, UsageError
from h5forge._format.names import DELTA_RE, LATEST, LOCK, ROWS_FOLDER_RE, VERSION_RE, Attr
from h5forge.spec import DatasetSpec
from h5forge._store.versions import latest, published
from h5forge._store.whole_files import replace_file

OWNER_FILE = "h5forge-dataset.json"


def require_folder(path: Path | None) -> None:
    if path is not None and not Path(path).is_dir():
        raise SourceMissing(f"source folder {path} does not exist")


def _inside(path: Path, folder: Path) -> bool:
    real, base = os.path.realpath(path), os.path.realpath(folder)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def check_folders(spec: DatasetSpec, inbox: bool = False) -> None:
    """The source root (and with ``inbox`` the inbox) exist; the output is in neither, and no file
    stands where its folder would be."""
    require_folder(spec.source.root)
    if inbox:
        require_folder(spec.source.inbox)
    out = Path(spec.output.dir)
    made = next(p for p in (out, *out.parents) if os.path.lexists(p))  # what a run's mkdir would start from
    if not made.is_dir():
        raise SpecError(f"output folder {out} cannot be made: {made} is not a folder")
    for key, folder in (("source.root", spec.source.root), ("source.inbox", spec.source.inbox)):
        if folder is not None and _inside(out, folder):
            where = "is" if os.path.realpath(out) == os.path.realpath(folder) else "is inside"
            raise SpecError(
                f"output.dir {out} {where} {key} {folder}: its files would be read as raw input; "
                "choose an output folder outside the sources"
            )


def refuse_version_names(dest: Path, what: str = "the copy") -> None:
    """A file a command writes (an export's copy, a preview, a spec) is never put under a name the
    versions of an output folder use (a version, its delta file, the latest link, a file in a rows
    folder): it would replace a published version, turn the link into a file, or put there a version
    no build published. An output folder is one with the latest link, the lock or the dataset
    marker; a folder of exported copies named like versions is none."""
    out = dest.parent
    if ROWS_FOLDER_RE.match(Path(os.path.realpath(out)).name):
        out = out.parent
    elif not (dest.name == LATEST or VERSION_RE.match(dest.name) or DELTA_RE.match(dest.name)):
        return
    if not out.is_dir():
        return
    markers = (LATEST, LOCK, OWNER_FILE)
    if any(os.path.lexists(out / m) for m in markers):
        raise UsageError(f"{dest} is a name the versions of the output folder {out} use; write {what} elsewhere")


def owner(out: Path) -> str | None:
    """The dataset name the folder belongs to (None: nobody's yet)."""
    marker = Path(out) / OWNER_FILE
    try:
        return str(json.loads(marker.read_text())["name"])
    except FileNotFoundError:
        pass
    except (ValueError, KeyError, TypeError, OSError) as err:
        raise OutputTaken(f"{marker} is unreadable ({err}); it names the dataset this folder belongs to") from None
    for path in reversed(list(published(out).values())):
        try:
            with h5py.File(path, "r") as f:
                name = f.attrs.get(Attr.NAME)
        except OSError:
            continue  # a broken version says nothing; verify reports it
        if name is not None:
            return name.decode() if isinstance(name, bytes) else str(name)
    return None


def check_owner(out: Path, name: str) -> None:
    found = owner(out)
    if found is not None and found != name:
        raise OutputTaken(
            f"output folder {out} holds the dataset {found!r}; the dataset {name!r} needs an output folder of its own"
        )


def claim_output(out: Path, name: str) -> None:
    """Refuse a folder of another dataset; record this one's name (call with the lock held)."""
    check_owner(out, name)
    marker = Path(out) / OWNER_FILE
    if not marker.exists():
        replace_file(marker, json.dumps({"name": name}) + "\n", tmp=marker.with_name(f".{OWNER_FILE}.tmp"))


def preflight(spec: DatasetSpec, inbox: bool = False) -> None:
    """Everything that can be refused before a run creates a file (the CLI calls it before
    starting Prefect, the flows again before taking the lock)."""
    check_folders(spec, inbox)
    if Path(spec.output.dir).is_dir():
        check_owner(Path(spec.output.dir), spec.name)
        latest(spec.output.dir)  # a dataset_latest.h5 that is not one of this folder's versions

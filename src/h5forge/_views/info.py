"""What a version holds, read from its attributes and small arrays only (never the sample arrays):
samples per split, sizes, codec, the spec in brief, lineage, label and class counts, rejections.

Everything is returned as plain JSON-ready dicts, so ``h5forge info --json`` prints them as they are.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import h5py
import numpy as np

from h5forge.errors import ReadError, SourceMissing
from h5forge._format import leases
from h5forge._format.codecs import ensure_filters
from h5forge._format.layout import decode_str, index_parts
from h5forge._format.names import (
    FORMAT,
    INDEX,
    REJECTIONS,
    SPEC,
    SPLITS,
    Attr,
    column_path,
    ROWS_FOLDER_RE,
    version_name,
)
from h5forge._format.row_files import counts_of, listed_row_files, row_files_of
from h5forge._format.summary import read_summary
from h5forge.kinds import FieldKind, stored_kinds
from h5forge.kinds.statistics import Statistics
from h5forge.spec import DatasetSpec, spec_from_json
from h5forge._store.sizes import version_sizes
from h5forge._store.versions import latest, published

MAX_CHAIN = 100  # ancestors followed when tracing a version's lineage


@contextmanager
def open_version(path: str | Path) -> Iterator[tuple[h5py.File, DatasetSpec]]:
    """A version file (or ``dataset_latest.h5``) opened read-only with the spec that built it;
    a missing, foreign or unreadable file is a one-line error."""
    path = Path(path)
    if not path.exists():
        raise SourceMissing(f"{path}: no such file")
    if path.is_dir():
        raise ReadError(f"{path} is a folder; expected a version file")
    ensure_filters()
    try:
        f = h5py.File(os.path.realpath(path), "r")
    except OSError as err:
        raise ReadError(f"{path}: not an HDF5 file ({err})") from None
    try:
        if f.attrs.get(Attr.FORMAT) != FORMAT or SPEC not in f:
            raise ReadError(f"{path}: not an h5forge file (format attribute is {f.attrs.get(Attr.FORMAT)!r})")
        yield f, spec_from_json(f[SPEC][()].decode())
    finally:
        f.close()


def plain(value: Any) -> Any:
    """numpy values as JSON-ready Python values."""
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()] if value.dtype.kind in "OSU" else value.tolist()
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _class_names(ds: h5py.Dataset) -> list[str] | None:
    """The class names of a field (its ``classes`` attribute: names, or a class count)."""
    classes = ds.attrs.get("classes")
    if classes is None:
        return None
    if np.ndim(classes) == 0:
        return [str(i) for i in range(int(classes))]
    return [str(c) for c in plain(np.asarray(classes))]


def split_stats(g: h5py.Group, kinds: dict[str, FieldKind]) -> dict[str, Any]:
    """Each field's split statistics (its kind's ``stats_attrs``): values per class keyed by class
    name where the field names its classes; per-value histograms (2-D) are left out."""
    stats: dict[str, Any] = {}
    for path, kind in kinds.items():
        if not isinstance(kind, Statistics):
            continue
        names = _class_names(g[path]) if path in g else None
        for attr in kind.stats_attrs():
            if attr not in g.attrs:
                continue
            value = np.asarray(g.attrs[attr])
            if value.ndim >= 2:
                continue
            if names is not None and value.ndim == 1 and len(value) == len(names):
                stats[attr] = dict(zip(names, plain(value)))
            else:
                stats[attr] = plain(value)
    return stats


def samples_by_value(f: h5py.File, split: str) -> dict[str, dict[str, int]]:
    """Samples per value of every row index of a split (``index_by`` columns; for a mask, the
    samples that contain each class), read from ``/index`` without touching the columns."""
    out: dict[str, dict[str, int]] = {}
    if INDEX not in f or split not in f[INDEX]:
        return out

    def visit(name: str, obj) -> None:
        if isinstance(obj, h5py.Group) and "offsets" in obj:
            out[name] = {str(v): len(rows) for v, rows in index_parts(obj).items()}

    f[INDEX][split].visititems(visit)
    return out


def sizes(path: Path, spec: DatasetSpec) -> dict[str, int]:
    """Array bytes raw and as stored (over every file holding the version's rows, as verify and
    the stored summary count them), this file's size and the size on disk of it plus the files it
    reads from."""
    real = Path(os.path.realpath(path))
    arrays = version_sizes(path, stored_kinds(spec))
    files = {real} | {real.parent / s["file"] for s in row_files_of(path) if (real.parent / s["file"]).exists()}
    return {
        "array_bytes_raw": arrays.raw,
        "array_bytes_stored": arrays.stored,
        "file_bytes": real.stat().st_size,
        "on_disk_bytes": sum(p.stat().st_size for p in files),
    }


def spec_summary(spec: DatasetSpec) -> dict[str, Any]:
    fields = {}
    columns = {column_path(c) for c in spec.annotations.columns}
    for path, kind in stored_kinds(spec).items():
        if path in columns:  # listed under columns below
            continue
        st = kind.stored()
        fields[path] = {
            "kind": kind.kind,
            "shape": "variable" if st.ragged else list(st.shape),
            "dtype": str(np.dtype(st.dtype)) if not h5py.check_string_dtype(np.dtype(st.dtype)) else "str",
            "codec": st.codec_of(spec.storage.codec) if st.bulk else None,
        }
    return {
        "name": spec.name,
        "description": spec.description,
        "source_root": str(spec.source.root),
        "fields": fields,
        "columns": dict(spec.annotations.columns),
        "index_by": list(spec.annotations.index_by),
        "splits": ({"column": spec.splits.column} if spec.splits.column else dict(spec.splits.ratios)),
        "codec": spec.storage.codec,
        "chunk_rows": spec.storage.chunk_rows,
        "output": str(spec.output.dir),
        "keep": spec.output.keep,
    }


def lineage(f: h5py.File, path: Path) -> dict[str, Any]:
    """Parent, thin or full (and the files it reads from, each marked present or missing), and the
    chain of ancestors still published beside it."""
    folder = Path(os.path.realpath(path)).parent
    files = listed_row_files(f) or []
    number = int(f.attrs.get(Attr.VERSION, 0))
    parent = int(f.attrs.get(Attr.PARENT, -1))
    chain: list[dict[str, Any]] = []
    seen: set[int] = set()
    at = parent
    while at > 0 and at not in seen and len(chain) < MAX_CHAIN:
        seen.add(at)
        ancestor = folder / version_name(at)
        if not ancestor.is_file():
            chain.append({"version": at, "present": False})
            break
        with h5py.File(ancestor, "r") as a:
            thin = listed_row_files(a) is not None
            chain.append({"version": at, "present": True, "kind": "thin" if thin else "full"})
            at = int(a.attrs.get(Attr.PARENT, -1))
    return {
        "version": number,
        "parent": parent if parent > 0 else None,
        "created_at": plain(f.attrs.get(Attr.CREATED, "")),
        "creator": plain(f.attrs.get(Attr.CREATOR, "")),
        "kind": "thin" if files else "full",
        # mapped (storage.assemble: mapped): every file it reads is in its own rows folder
        "assembled": bool(files) and all(_in_rows_folder(s["file"], number) for s in files),
        "row_files": [
            {"file": s["file"], "counts": s["counts"], "present": (folder / s["file"]).is_file()} for s in files
        ],
        "exported_from": plain(f.attrs.get(Attr.EXPORTED_FROM)) or None,
        "ancestors": chain,
        "written_with": {k: plain(f.attrs.get(f"{k}_version", "")) for k in ("h5forge", "h5py", "hdf5")},
    }


def rejected_by_reason(f: h5py.File) -> dict[str, Any]:
    """The rejected inputs of the run that wrote this file, grouped by reason."""
    if REJECTIONS not in f:
        return {"total": 0, "by_reason": []}
    table = f[REJECTIONS]
    columns = decode_str(table.attrs[Attr.COLUMNS])
    groups: dict[tuple[str, str], list[dict[str, str]]] = {}
    for row in table[()]:
        r = dict(zip(columns, decode_str(row)))
        groups.setdefault((r["reason"], r["stage"]), []).append({"id": r["sample_id"], "path": r["path"]})
    by_reason = [
        {"reason": reason, "stage": stage, "count": len(items), "inputs": items}
        for (reason, stage), items in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ]
    return {"total": int(table.shape[0]), "by_reason": by_reason}


def version_info(path: str | Path) -> dict[str, Any]:
    """Everything ``h5forge info FILE`` shows about one version."""
    path = Path(path)
    with open_version(path) as (f, spec):
        kinds = stored_kinds(spec)
        counts = counts_of(f)
        splits = {
            s: {"samples": counts[s], "stats": split_stats(f[s], kinds), "samples_by_value": samples_by_value(f, s)}
            for s in SPLITS
        }
        summary = read_summary(f)
        return {
            "path": str(path),
            "file": Path(os.path.realpath(path)).name,
            "name": plain(f.attrs.get(Attr.NAME, spec.name)),
            "samples": sum(counts.values()),
            "counts": counts,
            "splits": splits,
            "codec": plain(f.attrs.get(Attr.CODEC, spec.storage.codec)),
            "codec_needs": plain(f.attrs.get(Attr.CODEC_NEEDS, "")),
            "sizes": sizes(path, spec),
            "spec": spec_summary(spec),
            "lineage": lineage(f, path),
            "rejected": rejected_by_reason(f),
            "timings": summary.get("timings", {}),
        }


def _in_rows_folder(file: str, number: int) -> bool:
    """Whether a listed row file is in the rows folder of version ``number``."""
    folder, _, rest = file.partition("/")
    m = ROWS_FOLDER_RE.match(folder)
    return bool(rest) and m is not None and int(m.group(1)) == number


def brief(path: Path) -> dict[str, Any]:
    """One line of a folder listing."""
    with h5py.File(path, "r") as f:
        counts = counts_of(f)
        files = listed_row_files(f) or []
        parent = int(f.attrs.get(Attr.PARENT, -1))
        return {
            "version": int(f.attrs.get(Attr.VERSION, 0)),
            "file": path.name,
            "samples": sum(counts.values()),
            "counts": counts,
            "file_bytes": path.stat().st_size,
            "kind": f"thin over {len(files)} files" if files else "full",
            "created_at": plain(f.attrs.get(Attr.CREATED, "")),
            "parent": parent if parent > 0 else None,
        }


def _brief_or_why(number: int, path: Path) -> dict[str, Any]:
    """A version's line, or what is wrong with a file that cannot be read (a listing of the
    folder goes on). Read under the version's lease, as readers hold it: one that retention deleted
    since the listing is named as such."""
    line: dict[str, Any] = {"version": number, "file": path.name, "samples": 0, "counts": {}, "file_bytes": 0}
    with leases.pinned(path) as real:
        if not os.path.exists(real):
            return {**line, "kind": "deleted by retention while listing", "created_at": "", "parent": None}
        try:
            return brief(path)
        except Exception as err:  # noqa: BLE001 - a damaged file: whatever h5py raises on it
            return {
                **line,
                "file_bytes": path.stat().st_size,
                "kind": f"unreadable: {type(err).__name__}: {err}"[:300],
                "created_at": "",
                "parent": None,
            }


def folder_info(folder: str | Path) -> dict[str, Any]:
    """Every published version of an output folder in brief, and the latest in full."""
    folder = Path(folder)
    found = published(folder)
    if not found:
        raise SourceMissing(f"{folder}: no published version (no dataset_v*.h5)")
    ensure_filters()
    current = latest(folder)
    shown = current if current in found else max(found)
    return {
        "folder": str(folder),
        "latest": current,
        "versions": [{**_brief_or_why(n, p), "latest": n == current} for n, p in found.items()],
        "detail": version_info(found[shown]),
    }

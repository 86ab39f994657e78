"""Row files: the files holding a version's real rows. A full version is its own single row file;
a thin or mapped version maps every per-sample dataset onto its row files with HDF5 virtual
datasets, and lists them in its ``row_files`` attribute (``segments`` in older files).

A row file is listed as ``{"file": name, "counts": {split: n}}``; names are relative to the
version's folder.
Missing VDS sources read silently as fill values in HDF5, so ``virtual_sources`` is what every
reader and ``verify`` check first.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py

from h5forge._format.dims import plain_attrs
from h5forge._format.names import SPLITS, Attr


def counts_of(f: h5py.File) -> dict[str, int]:
    return {s: int(f[s].attrs[Attr.COUNT]) for s in SPLITS}


def listed_row_files(f: h5py.File) -> list[dict] | None:
    """The row files a thin or mapped version lists; None for a full version."""
    for name in (Attr.ROW_FILES, Attr.ROW_FILES_BEFORE):
        if name in f.attrs:
            return json.loads(f.attrs[name])
    return None


def row_files_of(path: Path) -> list[dict]:
    with h5py.File(os.path.realpath(path), "r") as f:
        listed = listed_row_files(f)
        return listed if listed is not None else [{"file": Path(os.path.realpath(path)).name, "counts": counts_of(f)}]


def virtual_sources(f: h5py.File) -> set[str]:
    """Files the virtual datasets of ``f`` read from (absolute paths)."""
    sources: set[str] = set()
    base = Path(os.path.realpath(f.filename)).parent

    # walked by links, opening each object: ``visititems`` asks HDF5 for every object's full info,
    # which walks each dataset's chunk index, so its cost grows with the rows and this walk's does
    # not (benchmarks/results/ingest_parts.md, "files_read")
    def visit(name: str, link) -> None:
        if not isinstance(link, h5py.HardLink):
            return
        obj = f[name]
        if isinstance(obj, h5py.Dataset) and obj.is_virtual:
            for vs in obj.virtual_sources():
                src = vs.file_name
                sources.add(str(Path(src) if os.path.isabs(src) or src == "." else base / src))

    f.visititems_links(visit)
    sources.discard(str(base / "."))
    return sources


def row_file_lengths(folder: Path, files: list[dict], split: str, key: str) -> list[int]:
    """How long ``<split>/<key>`` is in each row file (the elements of a ragged field)."""
    out = []
    for row_file in files:
        with h5py.File(folder / row_file["file"], "r") as f:
            out.append(int(f[split][key].shape[0]))
    return out


def map_virtual(
    g: h5py.Group, key: str, like: h5py.Dataset, files: list[dict], split: str, lengths: list[int] | None = None
) -> None:
    """``g[key]``: the rows of every row file's ``<split>/<key>``, in their order (``lengths``: each
    file's length of it, when that is not its row count)."""
    tail = like.shape[1:]
    sizes = lengths if lengths is not None else [row_file["counts"][split] for row_file in files]
    layout = h5py.VirtualLayout(shape=(sum(sizes), *tail), dtype=like.dtype)
    offset, name, rest = 0, f"{split}/{key}".encode(), (0,) * len(tail)
    for row_file, n in zip(files, sizes):
        # the mapping's two spaces made directly: h5py's VirtualSource and its slicing build the
        # same two at many times the cost, paid once per batch and split of every version
        if n:
            rows = h5py.h5s.create_simple(layout.shape)
            rows.select_hyperslab((offset, *rest), (n, *tail))
            layout.dcpl.set_virtual(rows, os.fsencode(row_file["file"]), name, h5py.h5s.create_simple((n, *tail)))
        offset += n
    fill = 0 if like.dtype.kind in "biuf" else None
    g.create_virtual_dataset(key, layout, fillvalue=fill)
    g[key].attrs.update(plain_attrs(like))

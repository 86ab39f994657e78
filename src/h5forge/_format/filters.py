"""HDF5 compression filters: which ones this HDF5 can use, which ones a file or a spec needs.

A file records its codecs in its attributes, but what HDF5 really needs to read it is the filter
pipeline of each dataset, so ``filters_used`` reads the pipelines (of the file and of every file a
thin version reads from). Opening a file never needs its filters; only reading its chunks does.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py

from h5forge._format.codecs import codec_options
from h5forge._format.row_files import virtual_sources

# filters HDF5 builds in (deflate may be missing from a minimal build; szip often is)
BUILTIN = {1: "gzip (deflate)", 2: "shuffle", 3: "fletcher32", 4: "szip", 5: "nbit", 6: "scaleoffset"}
H5PY_FILTERS = {32000: "lzf"}  # registered by h5py itself
NAMED = {"gzip": 1, "szip": 4, "lzf": 32000}  # h5py's compression names


def plugin_filters() -> dict[int, str]:
    """The filters hdf5plugin provides (empty when it is not installed)."""
    try:
        import hdf5plugin
    except ImportError:
        return {}
    return {fid: name for name, fid in hdf5plugin.FILTERS.items()}


def known_filters() -> dict[int, tuple[str, str]]:
    """Filter id -> (name, what provides it)."""
    known = {fid: (name, "HDF5") for fid, name in BUILTIN.items()}
    known.update({fid: (name, "h5py") for fid, name in H5PY_FILTERS.items()})
    known.update({fid: (name, "hdf5plugin") for fid, name in plugin_filters().items()})
    return known


def available(filter_id: int) -> bool:
    return bool(h5py.h5z.filter_avail(filter_id))


def filters_of_options(options: dict) -> set[int]:
    """The filter ids ``h5py.Group.create_dataset`` keyword arguments ask for."""
    ids: set[int] = set()
    compression = options.get("compression")
    if isinstance(compression, str):
        ids.add(NAMED[compression])
    elif compression is not None:
        ids.add(int(compression))
    if options.get("shuffle"):
        ids.add(2)
    if options.get("fletcher32"):
        ids.add(3)
    return ids


def codec_filters(codec: str) -> set[int]:
    """The filter ids a codec of the spec writes with; ImportError when its plugin package is missing."""
    return filters_of_options(codec_options(codec))


def filter_ids(ds: h5py.Dataset) -> list[int]:
    """The ids of the filters ``ds`` is stored through, in order."""
    plist = ds.id.get_create_plist()
    return [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]


def filters_used(path: str | Path) -> dict[int, list[str]]:
    """Filter id -> datasets using it (``file:dataset``), over the file and every file its virtual
    datasets read from (a missing one is skipped: ``verify`` reports it)."""
    path = Path(os.path.realpath(path))
    used: dict[int, list[str]] = {}
    with h5py.File(path, "r") as f:
        files = [path, *sorted(Path(s) for s in virtual_sources(f) if Path(s).is_file())]
    for file in files:
        with h5py.File(file, "r") as f:

            def visit(name: str, obj, file: Path = file) -> None:
                if isinstance(obj, h5py.Dataset) and not obj.is_virtual and obj.chunks is not None:
                    for fid in filter_ids(obj):
                        used.setdefault(fid, []).append(f"{file.name}:{name}")

            f.visititems(visit)
    return used

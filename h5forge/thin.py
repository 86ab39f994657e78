"""Thin versions: an append publishes a file whose sample arrays are HDF5 virtual datasets over the
earlier versions' files plus one delta file holding only the new samples.

The cost of an append is then the new samples plus the small per-sample columns (ids, hashes,
annotations: a few hundred bytes a sample), not the image bytes of the whole dataset. A thin
version is plain HDF5: h5py and other HDF5 readers follow the virtual mappings by themselves.
``export`` turns any version into one self-contained file; the nightly rebuild produces a compact
version again.

A segment is one file that holds real sample arrays: ``{"file": name, "counts": {split: n}}``.
A full version is its own single segment; file names are relative to the version's folder.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import h5py
import numpy as np

from h5forge.codecs import codec_options, ensure_filters
from h5forge.layout import PER_SAMPLE, SPLITS, STR
from h5forge.spec import DatasetSpec, ImageField, spec_from_json
from h5forge.writer import write_channel_stats, write_index


def delta_name(number: int) -> str:
    return f"dataset_v{number:04d}.delta.h5"


def counts_of(f: h5py.File) -> dict[str, int]:
    return {s: int(f[s].attrs["count"]) for s in SPLITS}


def segments_of(path: Path) -> list[dict]:
    with h5py.File(os.path.realpath(path), "r") as f:
        if "segments" in f.attrs:
            return json.loads(f.attrs["segments"])
        return [{"file": Path(os.path.realpath(path)).name, "counts": counts_of(f)}]


def _field_names(f: h5py.File) -> list[str]:
    return [str(x) for x in f.attrs["fields"]]


def write_thin(path: Path, parent: Path, delta: Path, spec: DatasetSpec, number: int, parent_number: int,
               summary: dict) -> dict:
    """Write the thin version ``path`` = ``parent`` + ``delta`` (both in ``path``'s folder)."""
    ensure_filters()
    segments = segments_of(parent)
    with h5py.File(os.path.realpath(parent), "r") as p, h5py.File(delta, "r") as d, h5py.File(path, "w") as f:
        segments.append({"file": delta.name, "counts": counts_of(d)})
        fields = _field_names(d)
        f.attrs.update({k: v for k, v in d.attrs.items()})
        f.attrs.update({
            "version": number,
            "parent_version": parent_number,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "segments": json.dumps(segments),
            "self_contained": False,
        })
        f.create_dataset("meta/spec", data=spec.to_json(), dtype=STR)
        for split in SPLITS:
            g = f.create_group(split)
            total = sum(s["counts"][split] for s in segments)
            for name in fields:
                shape = d[split][name].shape[1:]
                layout = h5py.VirtualLayout(shape=(total, *shape), dtype=np.uint8)
                offset = 0
                for seg in segments:
                    n = seg["counts"][split]
                    if n:
                        layout[offset:offset + n] = h5py.VirtualSource(seg["file"], f"{split}/{name}", shape=(n, *shape))
                    offset += n
                g.create_virtual_dataset(name, layout, fillvalue=0)
            small = [*PER_SAMPLE, *(f"meta/{c}" for c in spec.annotations.columns)]
            for key in small:
                old, new = p[split][key], d[split][key]
                data = np.concatenate([old[()], new[()]]) if len(old) or len(new) else new[()]
                g.create_dataset(key, data=data, dtype=new.dtype, maxshape=(None, *new.shape[1:]),
                                 chunks=new.chunks, compression=new.compression,
                                 compression_opts=new.compression_opts)
                g[key].attrs.update(dict(new.attrs))
            g.attrs.update({k: v for k, v in d[split].attrs.items()})
            g.attrs["count"] = total
            for name, fs in spec.fields.items():
                if isinstance(fs, ImageField):
                    hist = p[split].attrs[f"{name}_histogram"] + d[split].attrs[f"{name}_histogram"]
                    write_channel_stats(g, name, hist)
            for col in spec.annotations.index_by:
                write_index(f, split, col, g[f"meta/{col}"][()])
        diag = f.create_group("diagnostics")
        summary = {**summary, "counts": counts_of(f), "samples": sum(counts_of(f).values()),
                   "segments": len(segments)}
        diag.attrs["summary"] = json.dumps(summary)
        if "diagnostics/rejections" in d:
            d.copy(d["diagnostics/rejections"], diag, "rejections")
    return summary


def export(version: Path, dest: Path) -> Path:
    """A self-contained copy of ``version`` (thin or not) at ``dest``, written atomically."""
    ensure_filters()
    src_path = Path(os.path.realpath(version))
    tmp = dest.with_name(f".{dest.name}.partial")
    with h5py.File(src_path, "r") as src, h5py.File(tmp, "w") as out:
        spec = spec_from_json(src["meta/spec"][()].decode())
        out.attrs.update({k: v for k, v in src.attrs.items() if k != "segments"})
        out.attrs["self_contained"] = True
        out.attrs["exported_from"] = src_path.name
        fields = _field_names(src)
        for key in src:
            if key not in SPLITS:
                src.copy(src[key], out, key)
        segments = segments_of(src_path)
        for split in SPLITS:
            g_src = src[split]
            g = out.create_group(split)
            g.attrs.update(dict(g_src.attrs))
            for key in g_src:
                if key not in fields:
                    src.copy(g_src[key], g, key)
            for name in fields:
                _copy_field(src_path.parent, segments, split, name, g, spec)
        out.flush()
    os.replace(tmp, dest)
    return dest


def _copy_field(folder: Path, segments: list[dict], split: str, name: str, g: h5py.Group,
                spec: DatasetSpec) -> None:
    shape = spec.field_shape(name)
    rows = spec.storage.chunk_rows
    total = sum(s["counts"][split] for s in segments)
    dst = g.create_dataset(name, shape=(total, *shape), maxshape=(None, *shape), dtype=np.uint8,
                           chunks=(rows, *shape), **codec_options(spec.storage.codec))
    offset = 0
    for seg in segments:
        n = seg["counts"][split]
        if not n:
            continue
        with h5py.File(folder / seg["file"], "r") as sf:
            sd = sf[split][name]
            same_pipeline = sd.chunks == dst.chunks and sd._filters == dst._filters
            if same_pipeline and offset % rows == 0:
                # copy compressed chunks as they are: no decompression, no recompression
                for i in range(sd.id.get_num_chunks()):
                    info = sd.id.get_chunk_info(i)
                    mask, data = sd.id.read_direct_chunk(info.chunk_offset)
                    row = info.chunk_offset[0] + offset
                    dst.id.write_direct_chunk((row, *[0] * len(shape)), data, mask)
            else:
                step = max(rows, 64)
                for start in range(0, n, step):
                    stop = min(n, start + step)
                    dst[offset + start:offset + stop] = sd[start:stop]
        offset += n

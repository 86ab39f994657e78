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

from h5forge.format.codecs import codec_options, ensure_filters
from h5forge.format.layout import PER_SAMPLE, SPLITS, STR
from h5forge.spec import DatasetSpec, ImageField, spec_from_json
from h5forge.ingest.writer import SMALL_CODEC, SMALL_ROWS, write_channel_stats


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
            # every per-sample dataset maps onto the segments: nothing of the earlier rows is copied
            for key in [*fields, *PER_SAMPLE, *(f"meta/{c}" for c in spec.annotations.columns)]:
                _virtual(g, key, d[split][key], segments, split, total)
            g.attrs.update({k: v for k, v in d[split].attrs.items()})
            g.attrs["count"] = total
            for name, fs in spec.fields.items():
                if isinstance(fs, ImageField):
                    hist = p[split].attrs[f"{name}_histogram"] + d[split].attrs[f"{name}_histogram"]
                    write_channel_stats(g, name, hist)
            n_parent = int(p[split].attrs["count"])
            for col in spec.annotations.index_by:
                merge_index(f, split, col, p[f"index/{split}/{col}"], d[f"index/{split}/{col}"], n_parent)
        diag = f.create_group("diagnostics")
        summary = {**summary, "counts": counts_of(f), "samples": sum(counts_of(f).values()),
                   "segments": len(segments)}
        diag.attrs["summary"] = json.dumps(summary)
        if "diagnostics/rejections" in d:
            d.copy(d["diagnostics/rejections"], diag, "rejections")
    return summary


def _virtual(g: h5py.Group, key: str, like: h5py.Dataset, segments: list[dict], split: str, total: int) -> None:
    """``g[key]``: rows of every segment's ``<split>/<key>``, in segment order."""
    tail = like.shape[1:]
    layout = h5py.VirtualLayout(shape=(total, *tail), dtype=like.dtype)
    offset = 0
    for seg in segments:
        n = seg["counts"][split]
        if n:
            layout[offset:offset + n] = h5py.VirtualSource(seg["file"], f"{split}/{key}", shape=(n, *tail),
                                                           dtype=like.dtype)
        offset += n
    fill = 0 if like.dtype.kind in "biuf" else None
    g.create_virtual_dataset(key, layout, fillvalue=fill)
    g[key].attrs.update(dict(like.attrs))


def _index_parts(group: h5py.Group) -> dict:
    values = [v.decode() if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v
              for v in group["values"][()]]
    offsets, rows = group["offsets"][()], group["rows"][()]
    return {v: rows[offsets[k]:offsets[k + 1]] for k, v in enumerate(values)}


def merge_index(f: h5py.File, split: str, column: str, parent: h5py.Group, delta: h5py.Group,
                n_parent: int) -> None:
    """The parent's row index plus the delta's (rows shifted past the parent's): no column re-read."""
    old, new = _index_parts(parent), _index_parts(delta)
    g = f.require_group(f"index/{split}/{column}")
    keys = sorted(set(old) | set(new), key=str)
    parts = [np.concatenate([old.get(k, np.zeros(0, np.int64)), new.get(k, np.zeros(0, np.int64)) + n_parent])
             for k in keys]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in parts])]).astype(np.int64)
    rows = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    if keys and all(isinstance(k, str) for k in keys):
        g.create_dataset("values", data=np.array(keys, dtype=object), dtype=STR)
    else:
        g.create_dataset("values", data=np.asarray(keys))
    g.create_dataset("offsets", data=offsets)
    g.create_dataset("rows", data=rows)


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
            g_src.visititems(lambda name, obj: _materialize(name, obj, g, fields))
            for name in fields:
                _copy_field(src_path.parent, segments, split, name, g, spec)
        out.flush()
    os.replace(tmp, dest)
    return dest


def _materialize(name: str, obj, g: h5py.Group, fields: list[str]) -> None:
    """A real copy of a per-sample dataset (virtual in a thin version) other than the fields."""
    if not isinstance(obj, h5py.Dataset) or name in fields:
        return
    tail = obj.shape[1:]
    opts = {} if obj.dtype.kind == "O" else SMALL_CODEC
    g.create_dataset(name, data=obj[()], dtype=obj.dtype, maxshape=(None, *tail), chunks=(SMALL_ROWS, *tail), **opts)
    g[name].attrs.update(dict(obj.attrs))


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

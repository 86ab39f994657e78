"""Thin versions: an append publishes a file whose per-sample datasets are HDF5 virtual datasets
over the earlier versions' files plus one delta file holding only the new samples.

The cost of an append is then the new samples plus a few small arrays, not the bytes of the whole
dataset. A thin version is plain HDF5: h5py and other HDF5 readers follow the virtual mappings by
themselves. ``export`` turns any version into one self-contained file; the nightly rebuild
produces a compact version again. Row files are described in ``h5forge._format.row_files``.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import h5py

from h5forge.errors import ReadError, UsageError, VersionError
from h5forge._format import leases
from h5forge._format.checksums import drop_how_built, write_digests, write_file_digest
from h5forge._format.codecs import CODECS, codec_options, ensure_filters
from h5forge._format.dims import name_axes, plain_attrs
from h5forge._format.layout import SMALL_ROWS, merge_index, small_options
from h5forge._format.names import (
    CHECKSUMS_COVER_ALL,
    DELTA_RE,
    DIAGNOSTICS,
    INDEX,
    PER_SAMPLE,
    SPEC,
    SPLITS,
    Attr,
    block_rows,
    partial_name,
    version_name,
)
from h5forge._format.mapped import SOURCES, read_all
from h5forge._format.row_files import counts_of, map_virtual, row_file_lengths, row_files_of
from h5forge._format.summary import WriteSummary, read_summary, write_diagnostics
from h5forge.kinds import stored_kinds
from h5forge.kinds.index import RowIndex
from h5forge.kinds.statistics import Statistics
from h5forge.spec import DatasetSpec, spec_from_json
from h5forge._store.output import refuse_version_names
from h5forge._store.sizes import own_sizes, row_files_sizes
from h5forge._store.whole_files import write_new


# Appends a thin chain may hold before each append says to compact it: a thin version reads every
# delta of the appends since the last full build, and each is a file opened, listed and read from.
# Reads stay correct at any length (_format.mapped keeps a bounded set of files open); this bounds
# what a version costs to open, verify and copy. A build publishes a compact, self-contained version.
MAX_THIN_CHAIN = 64


def chain_length(row_files: list[dict]) -> int:
    """How many appends' delta files a version with these row files reads."""
    return sum(1 for row_file in row_files if DELTA_RE.match(Path(row_file["file"]).name))


def compact_advice(number: int, chain: int, spec_file: str = "SPEC") -> str | None:
    """What to run once a thin chain is longer than ``MAX_THIN_CHAIN`` appends; None before."""
    if chain <= MAX_THIN_CHAIN:
        return None
    return (
        f"{version_name(number)} reads the delta files of {chain} appends (more than {MAX_THIN_CHAIN}): "
        f"run `h5forge build {spec_file}` to publish a compact, self-contained version"
    )


def require_current_format(parent: Path, parent_number: int, spec: DatasetSpec | None = None) -> int:
    """The format an append to ``parent`` writes its delta in: the parent's, as one thin version
    holds rows checksummed one way. Refuses a version whose checksums cover less than every value,
    one that lacks a column ``spec`` stores (a version written before the column existed), and one
    whose rows ``spec`` would make otherwise (``changed_rules``)."""
    stored = [n for path, k in (stored_kinds(spec) if spec else {}).items() for n in k.stored().datasets(path)]
    with h5py.File(os.path.realpath(parent), "r") as p:
        parent_format = int(p.attrs.get(Attr.FORMAT_VERSION, 1))
        missing = [n for n in stored if f"{SPLITS[0]}/{n}" not in p]
        changed = changed_rules(p, spec) if spec is not None else []
    if parent_format < CHECKSUMS_COVER_ALL:
        raise VersionError(
            f"{version_name(parent_number)} is in format {parent_format} (older checksums); "
            "rebuild it with `h5forge build` before appending"
        )
    if missing:
        raise VersionError(
            f"{version_name(parent_number)} holds no {', '.join(missing)}, which this spec stores (it was "
            "written by an earlier h5forge); rebuild it with `h5forge build` before appending"
        )
    if changed:
        raise VersionError(
            f"the spec's rules for what a sample holds differ from those {version_name(parent_number)} was "
            f"built with ({', '.join(changed)}): an append would mix rows made under both; run "
            "`h5forge build` to rebuild every sample under the new rules (the inbox is left as it is)"
        )
    return parent_format


# what a spec says beyond a sample's values: where and how its versions are made and stored
NOT_VALUE_RULES = ("name", "description", "storage", "max_rejected", "duplicates")


def _value_rules(spec: DatasetSpec) -> dict:
    data = drop_how_built(spec.model_dump(mode="json"))
    for key in NOT_VALUE_RULES:
        data.pop(key, None)
    return data


def _differences(a: Any, b: Any, at: str, depth: int = 2) -> list[str]:
    """Where two spec sections differ, named down to ``depth`` levels (``fields.images``)."""
    if a == b:
        return []
    if depth and isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{at}.{k}", depth - 1)]
    return [at]


def changed_rules(f: h5py.File, spec: DatasetSpec) -> list[str]:
    """The spec sections whose rules for a sample's values (fields, annotations, splits, sources)
    differ from those ``f`` was written under: an append's rows must be made as its parent's were.
    Storage and the rest of how versions are made may change (the values stay the same)."""
    try:
        stored = spec_from_json(f[SPEC][()].decode())
    except Exception:  # noqa: BLE001 - a spec this h5forge cannot read is not the spec to append with
        return ["the stored spec, which this h5forge cannot read"]
    was, now = _value_rules(stored), _value_rules(spec)
    return [d.lstrip(".") for k in sorted(set(was) | set(now)) for d in _differences(was.get(k), now.get(k), f".{k}")]


@contextmanager
def built_in_memory(path: Path) -> Iterator[h5py.File]:
    """A new HDF5 file at ``path``, built in memory and written out in one plain write when the
    block ends (nothing is written if it raises).

    HDF5 never writes to the disk here, so a full disk is an ``OSError`` from that last write, and
    the library keeps no half-flushed file open: a file whose flush failed crashes the process in
    HDF5's later bookkeeping (segmentation fault). A thin version holds small arrays only (indexes,
    statistics, catalog, the virtual mappings), so its image fits in memory. Relative paths of
    virtual sources resolve against ``path``'s folder, as in a file on disk."""
    with h5py.File(path, "w", driver="core", backing_store=False) as f:
        yield f
        f.flush()
        image = f.id.get_file_image()
    write_new(path, image)


def write_thin(
    path: Path,
    parent: Path,
    delta: Path,
    spec: DatasetSpec,
    number: int,
    parent_number: int,
    summary: WriteSummary,
    extra: Callable[[h5py.File], None] = lambda f: None,
) -> WriteSummary:
    """Write the thin version ``path`` = ``parent`` + ``delta`` (both in ``path``'s folder);
    ``extra`` adds what else the file holds (the inputs catalog) before its file digest."""
    ensure_filters()
    require_current_format(parent, parent_number, spec)
    row_files = row_files_of(parent)
    kinds = stored_kinds(spec)
    with h5py.File(os.path.realpath(parent), "r") as p, h5py.File(delta, "r") as d, built_in_memory(path) as f:
        row_files.append({"file": delta.name, "counts": counts_of(d)})
        f.attrs.update(dict(d.attrs))
        f.attrs.update(
            {
                Attr.VERSION: number,
                Attr.PARENT: parent_number,
                Attr.CREATED: datetime.now(timezone.utc).isoformat(timespec="seconds"),
                Attr.ROW_FILES: json.dumps(row_files),
                Attr.SELF_CONTAINED: False,
            }
        )
        f.create_dataset(SPEC, data=spec.to_json(), dtype=d[SPEC].dtype)
        for split in SPLITS:
            g = f.create_group(split)
            # every per-sample dataset maps onto the row files: nothing of the earlier rows is copied
            for key in PER_SAMPLE:
                map_virtual(g, key, d[split][key], row_files, split)
            for key, kind in kinds.items():
                st = kind.stored()
                for name in st.datasets(key):
                    ragged = st.ragged and name == key
                    lengths = row_file_lengths(path.parent, row_files, split, key) if ragged else None
                    map_virtual(g, name, d[split][name], row_files, split, lengths)
            g.attrs.update(dict(d[split].attrs))
            g.attrs[Attr.COUNT] = sum(s["counts"][split] for s in row_files)
            for kind in kinds.values():
                if isinstance(kind, Statistics):
                    old, new = kind.stored_counts(p[split]), kind.stored_counts(d[split])
                    kind.write_stats(g, None if old is None else old + new)
            n_parent = int(p[split].attrs[Attr.COUNT])
            indexes = [*spec.annotations.index_by, *(path for path, k in kinds.items() if isinstance(k, RowIndex))]
            for name in indexes:
                merge_index(f, split, name, p[f"{INDEX}/{split}/{name}"], d[f"{INDEX}/{split}/{name}"], n_parent)
            name_axes(g, int(g.attrs[Attr.COUNT]))
        write_digests(f)  # over the merged statistics and indexes
        counts = counts_of(f)
        sizes = row_files_sizes(path.parent, row_files, kinds)  # every row's, not the delta's alone
        merged = summary.with_(counts=counts, samples=sum(counts.values()), row_files=len(row_files), **sizes.summary())
        write_diagnostics(f, merged)
        extra(f)
        write_file_digest(f)
    return merged


def export(version: Path, dest: Path, codec: str | None = None) -> Path:
    """A self-contained copy of ``version`` (thin or not) at ``dest``, written atomically.

    ``codec``: recompress every sample array with it (``gzip-1`` or ``none``: filters built into
    every HDF5, so h5dump, HDFView, MATLAB and netCDF tools read the copy without plugins); the
    default keeps each field's codec and copies compressed chunks as they are."""
    if codec is not None and codec not in CODECS:
        raise UsageError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}")
    refuse_version_names(dest)
    ensure_filters()
    tmp = dest.with_name(partial_name(dest.name))
    with leases.pinned(version) as real:  # as readers pin it: retention keeps it until the copy is done
        src_path = Path(real)
        if not src_path.exists():
            raise ReadError(f"{version}: no such version file")
        try:
            _export(src_path, tmp, codec)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            SOURCES.close_all()  # the mapped files read for the copy are not kept open after it
    os.replace(tmp, dest)
    return dest


def _export(src_path: Path, tmp: Path, codec: str | None) -> None:
    with h5py.File(src_path, "r") as src, h5py.File(tmp, "w") as out:
        spec = spec_from_json(src[SPEC][()].decode())
        kinds = stored_kinds(spec)
        out.attrs.update({k: v for k, v in src.attrs.items() if k not in (Attr.ROW_FILES, Attr.ROW_FILES_BEFORE)})
        out.attrs[Attr.SELF_CONTAINED] = True
        out.attrs[Attr.EXPORTED_FROM] = src_path.name
        if codec is not None:
            out.attrs[Attr.CODEC] = codec
            out.attrs[Attr.CODEC_NEEDS] = CODECS[codec].needs
        for key in src:
            if key not in SPLITS:
                src.copy(src[key], out, key)
        row_files = row_files_of(src_path)
        bulk = {path: kind.stored() for path, kind in kinds.items() if kind.stored().bulk}
        small = [name for path, kind in kinds.items() for name in kind.stored().datasets(path) if name not in bulk]
        for split in SPLITS:
            g_src = src[split]
            g = out.create_group(split)
            g.attrs.update(dict(g_src.attrs))
            for key in [*small, *PER_SAMPLE]:
                _materialize(g_src[key], g, key)
            for path, st in bulk.items():
                sizes = (
                    row_file_lengths(src_path.parent, row_files, split, path)
                    if st.ragged
                    else [row_file["counts"][split] for row_file in row_files]
                )
                chunks = st.chunk(spec.storage.chunk_rows, SMALL_ROWS)
                target = (g, g_src[path], chunks, codec or st.codec_of(spec.storage.codec))
                _copy_bulk(src_path.parent, row_files, sizes, split, path, *target)
            name_axes(g, int(g_src.attrs[Attr.COUNT]))
        if int(out.attrs[Attr.FORMAT_VERSION]) >= CHECKSUMS_COVER_ALL:
            write_digests(out)  # same values as the source's; recomputed over the copy's own layout
        _describe_copy(out, kinds, codec)
        if int(out.attrs[Attr.FORMAT_VERSION]) >= CHECKSUMS_COVER_ALL:
            write_file_digest(out)
        out.flush()


def _describe_copy(out: h5py.File, kinds: dict, codec: str | None) -> None:
    """The copy's stored summary: its own codec and sizes (the rows are recompressed or gathered
    from several files), the rest (timings, rejections) as the source recorded them."""
    if DIAGNOSTICS not in out:
        return
    summary = read_summary(out)
    sizes = own_sizes(out, kinds)
    counts = counts_of(out)
    summary.update(counts=counts, samples=sum(counts.values()), row_files=1, **sizes.summary())
    if codec is not None:
        summary["codec"] = codec
    out[DIAGNOSTICS].attrs[Attr.SUMMARY] = json.dumps(summary)


def _materialize(obj: h5py.Dataset, g: h5py.Group, name: str) -> None:
    """A real copy of a small per-sample dataset (virtual in a thin version)."""
    tail = obj.shape[1:]
    g.create_dataset(
        name,
        data=read_all(obj),  # a mapped dataset read from its files
        dtype=obj.dtype,
        maxshape=(None, *tail),
        chunks=(SMALL_ROWS, *tail),
        **small_options(obj.dtype),
    )
    g[name].attrs.update(plain_attrs(obj))


def _copy_bulk(
    folder: Path,
    row_files: list[dict],
    sizes: list[int],
    split: str,
    name: str,
    g: h5py.Group,
    like: h5py.Dataset,
    chunks: tuple[int, ...],
    codec: str,
) -> None:
    """The rows of every row file, copying compressed chunks as they are when the pipelines match."""
    shape = like.shape[1:]
    rows = chunks[0]
    dst = g.create_dataset(
        name,
        shape=(sum(sizes), *shape),
        maxshape=(None, *shape),
        dtype=like.dtype,
        chunks=chunks,
        **codec_options(codec),
    )
    dst.attrs.update(plain_attrs(like))
    offset = 0
    for row_file, n in zip(row_files, sizes):
        if not n:
            continue
        with h5py.File(folder / row_file["file"], "r") as sf:
            sd = sf[split][name]
            same_pipeline = sd.chunks == dst.chunks and sd._filters == dst._filters
            if same_pipeline and offset % rows == 0:
                # no decompression, no recompression
                for i in range(sd.id.get_num_chunks()):
                    info = sd.id.get_chunk_info(i)
                    mask, data = sd.id.read_direct_chunk(info.chunk_offset)
                    row = info.chunk_offset[0] + offset
                    dst.id.write_direct_chunk((row, *[0] * len(shape)), data, mask)
            else:
                step = block_rows(rows)
                for start in range(0, n, step):
                    stop = min(n, start + step)
                    dst[offset + start : offset + stop] = sd[start:stop]
        offset += n

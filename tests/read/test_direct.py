"""Direct chunk reads (one sample per chunk, decoded in process) return exactly what h5py returns."""

from __future__ import annotations

import h5py
import hdf5plugin
import numpy as np
import pytest

from h5forge._format import arrays
from h5forge.errors import ReadError
from h5forge._format.chunk_codec import EncodedRows, append_chunks
from h5forge.read._direct import DirectRows, reads_rows_alone
from h5forge.read._reader import SplitReader
from tests.helpers.files import build_file, make_raw, truth

SHAPE = (3, 20, 30)


def rows(n: int = 12) -> np.ndarray:
    """Rows LZ4 shrinks (flat, striped) and rows it cannot (noise), so both block forms occur."""
    rng = np.random.default_rng(0)
    out = rng.integers(0, 256, (n, *SHAPE), dtype=np.uint8)
    out[::3] = 0
    out[1::3] = (np.arange(SHAPE[-1]) % 7).astype(np.uint8)
    return out


def dataset(path, compression: dict, values: np.ndarray, chunk_rows: int = 1, **kw) -> h5py.Dataset:
    f = h5py.File(path, "w")
    return f.create_dataset("x", data=values, chunks=(chunk_rows, *values.shape[1:]), **compression, **kw)


def same_as_h5py(d: h5py.Dataset, codec: str) -> None:
    for mapped in (True, False):  # rows as slices of the mapped file, and through read_direct_chunk
        direct = DirectRows.of(d)
        assert direct is not None and direct.codec == codec
        if not mapped:
            direct._index = False
        rows_equal(d, direct)
        assert bool(direct._index) is mapped


def rows_equal(d: h5py.Dataset, direct: DirectRows) -> None:
    for i in range(d.shape[0]):
        assert np.array_equal(direct.row(i), d[i]), i
    want = [5, 0, 11, 5, 2]
    target = np.empty((len(want), *d.shape[1:]), d.dtype)
    uniq = np.array(sorted(set(want)))
    direct.read_rows(uniq, target, np.array([want.index(r) for r in uniq]))
    for k, r in enumerate(want):
        if want.index(r) == k:
            assert np.array_equal(target[k], d[r])


@pytest.mark.parametrize("compression", [{}, dict(hdf5plugin.LZ4())], ids=["none", "lz4"])
def test_rows_of_several_rows_per_chunk_equal_h5py(tmp_path, compression):
    """Four rows per chunk, the last chunk partial: rows one by one and batched are h5py's. HDF5
    compressed each chunk whole: a row's chunk is decoded whole and kept (two here, fewer than the
    chunks read); stored plain, a row is read alone from the map."""
    d = dataset(tmp_path / "m.h5", compression, rows(13), chunk_rows=4)
    assert DirectRows.of(d) is None  # no chunk kept: h5py reads it
    for mapped in (True, False):
        direct = DirectRows.of(d, cache_chunks=2)
        assert direct is not None and direct.codec == ("lz4" if compression else "none")
        if not mapped:
            direct._index = False
        rows_equal(d, direct)
        assert bool(direct._index) is mapped and direct.chunks is not None
        assert len(direct.chunks) == (0 if mapped and not compression else 2)


def test_rows_read_alone_only_from_chunks_that_allow_it(tmp_path):
    """What the loader's sampler shuffles by: a row is read alone from plain chunks and from LZ4
    chunks the writer joined (rows equal h5py's, no chunk decoded and kept); not from chunks HDF5
    compressed whole, nor under a codec the direct reader leaves to h5py."""
    values = rows(13)
    for compression, alone in (({}, True), (dict(hdf5plugin.LZ4()), False), (dict(compression="gzip"), False)):
        assert reads_rows_alone(dataset(tmp_path / "whole.h5", compression, values, chunk_rows=4)) is alone
    with h5py.File(tmp_path / "joined.h5", "w") as f:
        d = f.create_dataset("x", shape=(0, *SHAPE), maxshape=(None, *SHAPE), chunks=(4, *SHAPE), dtype=np.uint8,
                             **hdf5plugin.LZ4())
        append_chunks(d, EncodedRows.of("lz4", values[:12]).joined(4), rows=4)
        d.resize(13, axis=0)
        d[12] = values[12]  # the last, partial chunk: compressed whole by HDF5
        assert reads_rows_alone(d)
        direct = DirectRows.of(d, cache_chunks=2)
        assert direct is not None
        rows_equal(d, direct)
        assert list(direct.chunks.rows) == [3]  # only the chunk HDF5 compressed whole was decoded


@pytest.mark.parametrize("block", [0, 1000])  # one block per chunk (the default), and many
def test_lz4_rows_equal_h5py(tmp_path, block):
    d = dataset(tmp_path / "a.h5", dict(hdf5plugin.LZ4(nbytes=block)), rows())
    assert d.id.get_storage_size() < d.size  # some rows were compressed, so both block forms are exercised
    same_as_h5py(d, "lz4")


def test_uncompressed_rows_equal_h5py(tmp_path):
    same_as_h5py(dataset(tmp_path / "n.h5", {}, rows()), "none")
    wide = np.arange(12 * 6 * 5, dtype=np.float32).reshape(12, 6, 5)  # any native dtype
    same_as_h5py(dataset(tmp_path / "f.h5", dict(hdf5plugin.LZ4()), wide), "lz4")


def test_chunk_stored_without_its_filter_and_unwritten_chunk(tmp_path):
    values = rows()
    d = dataset(tmp_path / "s.h5", dict(hdf5plugin.LZ4()), values, maxshape=(None, *SHAPE), fillvalue=7)
    plain = np.full(SHAPE, 200, np.uint8)
    plain[0, 0, :5] = [1, 2, 3, 4, 5]
    d.id.write_direct_chunk((4, 0, 0, 0), plain.tobytes(), filter_mask=1)  # bit 0: LZ4 not applied
    d.resize(len(values) + 2, axis=0)  # two rows never written: HDF5 returns the fill value
    d.file.close()
    d = h5py.File(tmp_path / "s.h5", "r")["x"]
    assert d.id.read_direct_chunk((4, 0, 0, 0))[0] == 1
    direct = DirectRows.of(d)
    assert np.array_equal(d[4], plain) and np.array_equal(direct.row(4), plain)
    assert np.array_equal(direct.row(len(values) + 1), d[len(values) + 1]) and (d[len(values) + 1] == 7).all()
    same_as_h5py(d, "lz4")


def test_other_layouts_and_codecs_are_left_to_h5py(tmp_path):
    values = rows()
    assert DirectRows.of(dataset(tmp_path / "z.h5", dict(hdf5plugin.Zstd()), values)) is None
    assert DirectRows.of(dataset(tmp_path / "g.h5", {"compression": "gzip"}, values)) is None
    assert DirectRows.of(dataset(tmp_path / "c.h5", dict(hdf5plugin.LZ4()), values, chunk_rows=4)) is None
    with h5py.File(tmp_path / "k.h5", "w") as f:
        assert DirectRows.of(f.create_dataset("x", data=values)) is None  # contiguous
        big_endian = f.create_dataset("y", data=values.astype(">u2"), chunks=(1, *SHAPE))
        assert DirectRows.of(big_endian) is None


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    return make_raw(tmp_path_factory.mktemp("direct") / "raw", n=40)


@pytest.mark.parametrize("codec", ["lz4", "none", "zstd"])
def test_split_reader_reads_version_files_the_same(tmp_path, raw, codec):
    path = build_file(tmp_path / "dataset_v0001.h5", raw, codec=codec)
    t = truth(path)
    with SplitReader(path, "train", ("images", "masks")) as r:
        want = [7, 3, 3, -1, 0, 12, 13, 14]
        got = r.read(want)
        assert np.array_equal(got["images"], t["images"][want]) and np.array_equal(got["masks"], t["masks"][want])
        assert np.array_equal(r.read_one(5)["images"], t["images"][5])
        used = {name: (d.codec if d is not None else None) for name, d in r._direct.items()}
        assert used == ({"images": codec, "masks": codec} if codec != "zstd" else {"images": None, "masks": None})


def test_ragged_field_is_read_by_h5py(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "npy").mkdir(parents=True)
    lengths = {"a": 150, "b": 40, "c": 90}
    for name, n in lengths.items():
        np.save(root / "npy" / f"{name}.npy", np.sin(np.arange(n) * 0.1 + len(name)).astype(np.float32))
    spec = {"name": "sig", "source": {"root": str(root)}, "output": {"dir": str(tmp_path / "out")},
            "splits": {"ratios": {"train": 1.0}}, "storage": {"codec": "lz4"},
            "fields": {"cos": {"kind": "signal", "files": "npy/*.npy", "rate": 100}}}
    path, _ = build_spec(spec)
    with h5py.File(path, "r") as f:
        stored = arrays.RowReader(f["train"], "cos", arrays.Stored((), np.float32, True, True))
        want = [stored.row(i) for i in range(3)]
    with SplitReader(path, "train", ("cos",)) as r:
        got = r.read([2, 0, 1])["cos"]
        assert r._direct.get("cos") is None  # a signal is not one element per chunk: h5py reads it
    assert all(np.array_equal(g, w) for g, w in zip(got, [want[2], want[0], want[1]]))


def test_the_chunk_index_gives_each_stored_chunk_as_hdf5_does(tmp_path):
    """``chunk_index(d).place(row)``: where a row's stored chunk lies in the file, so one pread gives
    what HDF5's ``read_direct_chunk`` gives (a rebuild copies unchanged rows' chunks so); None for a
    chunk never written."""
    import os

    from h5forge.read._direct import chunk_index

    values = rows()
    d = dataset(tmp_path / "c.h5", dict(hdf5plugin.LZ4()), values, maxshape=(None, *SHAPE))
    d.id.write_direct_chunk((4, 0, 0, 0), np.full(SHAPE, 9, np.uint8).tobytes(), filter_mask=1)
    d.resize(len(values) + 1, axis=0)
    d.file.close()
    d = h5py.File(tmp_path / "c.h5", "r")["x"]
    index = chunk_index(d)
    assert index is not None
    with open(tmp_path / "c.h5", "rb") as fh:
        for r in range(len(values)):
            offset, size, mask = index.place(r)
            assert (mask, os.pread(fh.fileno(), size, offset)) == d.id.read_direct_chunk((r, 0, 0, 0)), r
    assert index.place(4)[2] == 1 and index.place(len(values)) is None


def flip_in_chunk(path, row: int, at: int) -> None:
    """Byte ``at`` of train/images row ``row``'s stored chunk flipped in place."""
    with h5py.File(path, "r") as f:
        info = f["train/images"].id.get_chunk_info_by_coord((row, 0, 0, 0))
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + at)
        value = fh.read(1)[0]
        fh.seek(info.byte_offset + at)
        fh.write(bytes([value ^ 0x5A]))


@pytest.mark.parametrize("codec", ["lz4", "zstd"])  # decoded here then by h5py, and by h5py alone
def test_a_damaged_chunk_of_a_copied_version_is_an_error_naming_file_and_row(tmp_path, raw, codec):
    path = build_file(tmp_path / "dataset_v0001.h5", raw, codec=codec)
    # lz4: the size the framing records (the decoder refuses it); zstd: the frame's magic number
    flip_in_chunk(path, 3, 4 if codec == "lz4" else 0)
    reader = SplitReader(path, "train")
    where = r"dataset_v0001\.h5: /train/images row 3 cannot be read"
    with pytest.raises(ReadError, match=where):
        reader.read_one(3)
    with pytest.raises(ReadError, match=where):
        reader.read([1, 3, 2])
    reader.read([0, 1, 2, 4])  # the other rows are fine

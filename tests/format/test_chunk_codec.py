"""Chunks made outside HDF5 read back through HDF5's own filters, and chunks HDF5 made decode here."""

import h5py
import numpy as np
import pytest

from h5forge._format.chunk_codec import (EncodedRows, accepts, append_chunks, decode, encodable, encode, lz4_at,
                                        lz4_into, pipeline, row_at)
from h5forge._format.codecs import codec_options, ensure_filters

ROWS = {
    "noise": np.random.default_rng(0).integers(0, 256, (3, 32, 32), dtype=np.uint8),  # LZ4 cannot shrink it
    "ramp": np.repeat(np.arange(32, dtype=np.uint8), 96).reshape(3, 32, 32),
    "floats": np.random.default_rng(1).normal(size=(5, 7)).astype(np.float32),
    "labels": np.arange(24, dtype=np.int64).reshape(4, 6),
}


@pytest.mark.parametrize("codec", ["none", "lz4", "gzip-1", "gzip-9"])
@pytest.mark.parametrize("name", list(ROWS))
def test_encoded_chunk_is_what_hdf5_stores(tmp_path, codec, name):
    ensure_filters()
    row = ROWS[name]
    with h5py.File(tmp_path / "f.h5", "w") as f:
        d = f.create_dataset("d", shape=(2, *row.shape), chunks=(1, *row.shape), dtype=row.dtype,
                             **codec_options(codec))
        d[0] = row  # through HDF5's filter
        assert accepts(d, codec, row.shape, row.dtype)
        d.resize(1, axis=0)
        append_chunks(d, [encode(codec, row)])  # made here, placed as is
        tail = (0,) * row.ndim
        ours, hdf5s = d.id.read_direct_chunk((1, *tail))[1], d.id.read_direct_chunk((0, *tail))[1]
        # the same framing; LZ4 and zlib builds may choose other matches, so the payload may differ
        if codec == "none":
            assert ours == hdf5s
        if codec == "lz4":
            assert ours[:12] == hdf5s[:12]  # original size, one block of it
        np.testing.assert_array_equal(decode(codec, hdf5s, row.shape, row.dtype), row)
        np.testing.assert_array_equal(d[1], row)
        assert d.shape[0] == 2
    got = decode(codec, encode(codec, row), row.shape, row.dtype)
    assert got.dtype == row.dtype and np.array_equal(got, row)


def test_lz4_block_that_does_not_shrink_is_stored_as_is():
    row = ROWS["noise"]
    chunk = encode("lz4", row)
    assert len(chunk) == 8 + 4 + 4 + row.nbytes  # header, block header, the plain bytes
    assert chunk[16:] == row.tobytes()
    assert len(encode("lz4", ROWS["ramp"])) < ROWS["ramp"].nbytes


def test_a_frame_of_another_size_is_refused():
    chunk = encode("lz4", ROWS["ramp"])
    assert not lz4_into(chunk, np.empty(ROWS["ramp"].nbytes - 1, np.uint8))
    assert not lz4_into(chunk[:10], np.empty(ROWS["ramp"].nbytes, np.uint8))
    with pytest.raises(ValueError, match="bytes"):
        decode("none", b"abc", (4,), np.uint8)


@pytest.mark.parametrize("block", [0, 1000])  # one block per chunk (the default), and many
@pytest.mark.parametrize("name", list(ROWS))
def test_lz4_at_decodes_what_hdf5_stores_between_addresses(tmp_path, name, block):
    """The chunk HDF5's LZ4 filter stores, decoded from one address to another (as the slice
    reader does from the mapped file), equals the row; a short destination or a cut chunk is refused."""
    import hdf5plugin

    ensure_filters()
    row = ROWS[name]
    with h5py.File(tmp_path / "f.h5", "w") as f:
        d = f.create_dataset("d", data=row[None], chunks=(1, *row.shape), **hdf5plugin.LZ4(nbytes=block))
        stored = d.id.read_direct_chunk((0,) * d.ndim)[1]
    src = np.frombuffer(stored, np.uint8).copy()  # the chunk at an address of its own
    out = np.zeros(row.shape, row.dtype)
    assert lz4_at(memoryview(src), src.ctypes.data, out.ctypes.data, out.nbytes)
    assert out.tobytes() == row.tobytes()
    assert not lz4_at(memoryview(src), src.ctypes.data, out.ctypes.data, out.nbytes - 1)
    cut = src[: len(src) - 1]
    assert not lz4_at(memoryview(cut), cut.ctypes.data, out.ctypes.data, out.nbytes)


def test_only_codecs_made_exactly_are_encodable(tmp_path):
    assert [c for c in ("none", "lz4", "gzip-1", "gzip-4", "zstd", "zstd-1", "lzf", "blosc2-zstd", "bitshuffle-lz4")
            if encodable(c)] == ["none", "lz4", "gzip-1", "gzip-4"]
    with pytest.raises(ValueError, match="zstd"):
        encode("zstd", ROWS["ramp"])
    ensure_filters()
    row = ROWS["ramp"]
    with h5py.File(tmp_path / "f.h5", "w") as f:
        lz4 = f.create_dataset("a", shape=(0, *row.shape), maxshape=(None, *row.shape), chunks=(1, *row.shape),
                               dtype=row.dtype, **codec_options("lz4"))
        two_rows = f.create_dataset("b", shape=(0, *row.shape), maxshape=(None, *row.shape), chunks=(2, *row.shape),
                                    dtype=row.dtype, **codec_options("lz4"))
        assert pipeline("lz4") == [(32004, (0,))] and pipeline("gzip-4") == [(1, (4,))]
        assert accepts(lz4, "lz4", row.shape, row.dtype)
        assert not accepts(lz4, "gzip-1", row.shape, row.dtype)
        assert not accepts(lz4, "lz4", row.shape, np.int16)
        assert accepts(two_rows, "lz4", row.shape, row.dtype)  # rows' chunks joined (EncodedRows.joined)
        assert not accepts(two_rows, "gzip-1", row.shape, row.dtype)


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_rows_chunks_joined_read_back_through_hdf5s_filter(tmp_path, codec):
    """Three rows LZ4 shrinks and cannot (a block stored as is) joined two by two: HDF5 and the
    reader's decoder both read the rows back."""
    ensure_filters()
    block = np.stack([ROWS["ramp"], ROWS["noise"], ROWS["ramp"] // 2, ROWS["noise"][::-1]])
    rows = EncodedRows.of(codec, block)
    with h5py.File(tmp_path / "f.h5", "w") as f:
        d = f.create_dataset("d", shape=(0, *block.shape[1:]), maxshape=(None, *block.shape[1:]),
                             chunks=(2, *block.shape[1:]), dtype=block.dtype, **codec_options(codec))
        assert accepts(d, codec, block.shape[1:], block.dtype)
        append_chunks(d, rows.joined(2), rows=2)
        np.testing.assert_array_equal(d[()], block)
        if codec == "lz4":
            flat = np.empty(2 * block[0].nbytes, np.uint8)
            assert lz4_into(d.id.read_direct_chunk((2, 0, 0, 0))[1], flat) and flat.tobytes() == block[2:].tobytes()
    with pytest.raises(ValueError, match="do not join"):
        rows[:3].joined(2)
    with pytest.raises(ValueError, match="do not join"):
        EncodedRows.of("gzip-1", block).joined(2)


def _row_at(codec: str, chunk: bytes, n: int, row: int, rows: int) -> np.ndarray | None:
    """``row_at`` over a copy of ``chunk``: the row it gives, or None when it declines."""
    src, out = np.frombuffer(chunk, np.uint8).copy(), np.zeros(n, np.uint8)
    ok = row_at(codec, memoryview(src.data), src.ctypes.data, out.ctypes.data, n, row, rows)
    return out if ok else None


def test_row_at_gives_a_joined_chunks_row_or_declines_a_chunk_that_does_not_add_up():
    """Each row of joined chunks alone, as stored; a chunk HDF5 compressed whole, a header that
    names other rows, a block size past the chunk's end, a chunk cut short or a block that does not
    decode are declined (the caller decodes the whole chunk, or HDF5 reads it), never a wrong row."""
    block = np.stack([ROWS["ramp"], ROWS["noise"], ROWS["ramp"] // 2, ROWS["noise"][::-1]])
    n = block[0].nbytes
    for codec in ("none", "lz4"):
        (chunk,) = EncodedRows.of(codec, block).joined(4)
        for r in range(4):
            got = _row_at(codec, bytes(chunk), n, r, 4)
            assert got is not None and got.tobytes() == block[r].tobytes()
    (chunk,) = EncodedRows.of("lz4", block).joined(4)
    chunk = bytes(chunk)
    whole = encode("lz4", block)  # one block of the four rows, as HDF5's filter writes a chunk
    assert _row_at("lz4", whole, n, 1, 4) is None
    assert _row_at("lz4", chunk, n, 1, 2) is None  # the header says four rows
    assert _row_at("none", chunk, n, 1, 4) is None  # not the rows' bytes end to end
    assert all(_row_at("lz4", chunk[:k], n, 3, 4) is None for k in (8, 12, 16, len(chunk) - 1))
    first = int.from_bytes(chunk[12:16], "big")  # row 0's block: its compressed size, then its bytes
    past = chunk[:12] + (len(chunk)).to_bytes(4, "big") + chunk[16:]
    assert _row_at("lz4", past, n, 0, 4) is None and _row_at("lz4", past, n, 2, 4) is None
    assert first < n  # LZ4 shrinks the ramp: its block is compressed
    spoiled = chunk[:16] + bytes(first) + chunk[16 + first :]  # row 0's LZ4 block zeroed
    assert _row_at("lz4", spoiled, n, 0, 4) is None


def test_encoded_rows_index_like_the_block():
    block = np.stack([ROWS["ramp"], ROWS["noise"], ROWS["ramp"] // 2])
    rows = EncodedRows.of("lz4", block)
    assert len(rows) == 3 and rows[1] == encode("lz4", block[1])
    picked = rows[np.array([2, 0])]
    np.testing.assert_array_equal(picked.decoded(), block[[2, 0]])
    both = EncodedRows.concat([picked, rows[1:2]])
    np.testing.assert_array_equal(both.decoded(), block[[2, 0, 1]])
    assert rows.nbytes == sum(len(encode("lz4", r)) for r in block)

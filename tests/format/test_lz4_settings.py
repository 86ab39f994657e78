"""hdf5plugin's LZ4 filter at every block size it accepts (0, its default of 1 GiB, and 1 to
2,113,929,215 bytes): the chunks HDF5 wrote decode here to what HDF5 reads, through the ctypes
``LZ4_decompress_safe`` and through ``lz4.block``, from the chunk's bytes and from the mapped file;
and the frames made here at the same block size read back through HDF5's own filter."""

import h5py
import hdf5plugin
import numpy as np
import pytest

from h5forge._format import chunk_codec
from h5forge._format.chunk_codec import LZ4_DEFAULT_BLOCK, lz4_frame, lz4_into
from h5forge.read._direct import DirectRows

SHAPE = (3, 20, 30)
ROW = int(np.prod(SHAPE))  # bytes of a uint8 row: one chunk
BLOCKS = [0, 1, 7, 4096 // 8, ROW - 1, ROW, ROW + 1, 2_113_929_215]


def rows() -> np.ndarray:
    """Rows LZ4 shrinks (zeros, stripes) and rows it cannot (noise), so both block forms occur."""
    out = np.random.default_rng(0).integers(0, 256, (6, *SHAPE), dtype=np.uint8)
    out[0] = 0
    out[2] = (np.arange(SHAPE[-1]) % 7).astype(np.uint8)
    out[4, :, :10] = 9  # a third compressible, the rest noise: some blocks shrink, some do not
    return out


@pytest.fixture(params=["ctypes", "lz4.block"])
def decompressor(request, monkeypatch):
    if request.param == "ctypes":
        assert chunk_codec._LZ4_SAFE is not None
    else:
        monkeypatch.setattr(chunk_codec, "_LZ4_SAFE", None)
    return request.param


@pytest.mark.parametrize("block", BLOCKS)
def test_hdf5s_chunks_decode_here_at_every_block_size(tmp_path, block, decompressor):
    values = rows()
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("x", data=values, chunks=(1, *SHAPE), **hdf5plugin.LZ4(nbytes=block))
    with h5py.File(tmp_path / "a.h5", "r") as f:
        d = f["x"]
        for i in range(len(values)):
            mask, chunk = d.id.read_direct_chunk((i, 0, 0, 0))
            assert mask == 0
            flat = np.empty(ROW, np.uint8)
            assert lz4_into(chunk, flat), (block, i)
            assert np.array_equal(flat.reshape(SHAPE), d[i]) and np.array_equal(d[i], values[i])
        for mapped in (True, False):  # rows as slices of the mapped file, and through read_direct_chunk
            direct = DirectRows.of(d)
            if not mapped:
                direct._index = False
            assert all(np.array_equal(direct.row(i), values[i]) for i in range(len(values)))
            assert bool(direct._index) is mapped


@pytest.mark.parametrize("block", BLOCKS)
def test_frames_made_here_read_through_hdf5s_filter_at_every_block_size(tmp_path, block):
    values = rows()
    with h5py.File(tmp_path / "b.h5", "w") as f:
        d = f.create_dataset("x", data=values, chunks=(1, *SHAPE), **hdf5plugin.LZ4(nbytes=block))
        for i, row in enumerate(values):
            frame = lz4_frame(memoryview(row.tobytes()), block or LZ4_DEFAULT_BLOCK)
            assert frame[:12] == d.id.read_direct_chunk((i, 0, 0, 0))[1][:12]  # original size and block size
            d.id.write_direct_chunk((i, 0, 0, 0), frame)
    with h5py.File(tmp_path / "b.h5", "r") as f:
        assert np.array_equal(f["x"][()], values)


def test_a_frame_that_does_not_add_up_is_refused(tmp_path, decompressor):
    values = rows()
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("x", data=values, chunks=(1, *SHAPE), **hdf5plugin.LZ4(nbytes=7))
    with h5py.File(tmp_path / "c.h5", "r") as f:
        chunk = f["x"].id.read_direct_chunk((2, 0, 0, 0))[1]
    flat = np.empty(ROW, np.uint8)
    assert not lz4_into(chunk[:-1], flat)  # the last block cut short
    assert not lz4_into(chunk, np.empty(ROW - 1, np.uint8))  # a row of another size
    assert not lz4_into(chunk[:8] + (0).to_bytes(4, "big") + chunk[12:], flat)  # block size 0

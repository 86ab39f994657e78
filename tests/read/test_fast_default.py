"""The converting reading paths at full speed, to exactly the workers' values: a loader that converts after
the transfer refills its workers' shared-memory blocks, converts on a device when asked, and ds[i]
decompresses into a per-thread buffer (LZ4 straight from the mapped file into the row)."""

from __future__ import annotations

import threading

import h5py
import hdf5plugin
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from h5forge.kinds import ReadOptions
from h5forge._format import chunk_codec
from h5forge.read._direct import DirectRows
from h5forge.read._reader import SplitReader
from h5forge.read.torch import H5Dataset, torch_convert
from tests.helpers.files import build_file, make_raw

FLOAT = {"image_dtype": "float32", "mask_dtype": "int64"}  # the values h5forge converts to (torch's default: uint8)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    base = tmp_path_factory.mktemp("fast")
    return build_file(base / "dataset_v0001.h5", make_raw(base / "raw", n=40), codec="lz4")


def old_values(path, normalize=False) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Every sample as the workers convert it (the explicit float32/int64 path, numpy conversion)."""
    ds = H5Dataset(path, fields=("images", "masks"), image_dtype="float32", mask_dtype="int64", normalize=normalize)
    return {i: ds.__getitems__([i]).stacked for i in range(len(ds))}


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.numpy().tobytes() == b.numpy().tobytes()


def check_epoch(batches, want) -> None:
    seen = []
    for x, m, rows in batches:
        assert x.dtype == torch.float32 and m.dtype == torch.int64 and rows.dtype == torch.int64
        for k, r in enumerate(rows.tolist()):
            assert bit_equal(x[k], want[r][0][0]) and bit_equal(m[k], want[r][1][0]), r
        seen += rows.tolist()
    assert sorted(seen) == list(range(len(want)))


def test_workers_refill_their_blocks_and_every_batch_keeps_its_values(path):
    want = old_values(path)
    ds = H5Dataset(path, fields=("images", "masks"), **FLOAT, return_index=True)
    loader = ds.loader(batch_size=2, num_workers=2, shuffle=True, seed=1)  # more batches than blocks
    assert loader.dataset._pool.size == 5  # prefetch_factor 2, plus 3
    for epoch in range(2):
        held = list(loader)  # every batch held until the epoch ends: none may change under us
        check_epoch(held, want)
    it = iter(loader)  # an epoch left after 3 batches, then a whole one
    for _ in range(3):
        next(it)
    assert any(t.name.startswith("h5forge-convert") for t in threading.enumerate())  # converting the next batch
    del it
    assert not any(t.name.startswith("h5forge-convert") for t in threading.enumerate())  # stopped with its epoch
    check_epoch(list(loader), want)
    # the stored batches as they crossed: at most pool-size blocks per worker, each refilled in turn
    blocks = {b[0].untyped_storage().data_ptr() for b in DataLoader.__iter__(loader)}
    assert 2 <= len(blocks) <= 2 * 5


def test_a_conversion_error_reaches_the_caller(path):
    ds = H5Dataset(path, fields=("images", "masks"), **FLOAT)
    loader = ds.loader(batch_size=4, num_workers=0, device="cpu")
    loader.dataset.options = None  # what the converter thread reads: its failure must surface here
    with pytest.raises(AttributeError):
        next(iter(loader))


def test_pass_through_columns_are_copied_out_of_the_refilled_block(path):
    ds = H5Dataset(path, fields=("images", "masks"), **FLOAT, return_index=True)
    assert len(ds) >= 20  # more batches than the two workers' ten blocks
    rows = [b[2] for b in ds.loader(batch_size=2, num_workers=2, shuffle=False)]
    assert torch.cat(rows).tolist() == list(range(len(ds)))  # each still right after every later batch
    assert len({r.untyped_storage().data_ptr() for r in rows}) == len(rows)


def test_plain_dataloader_and_convert_none_use_no_pool(path):
    ds = H5Dataset(path, fields=("images", "masks"), **FLOAT)
    assert ds.loader(batch_size=4, num_workers=2, convert=None).dataset._pool is None
    assert ds.loader(batch_size=4, num_workers=2, convert="worker").dataset._pool is None
    assert ds._pool is None  # the loader's copy has the pool, never the dataset itself
    u8 = H5Dataset(path, fields=("images", "masks"), image_dtype="uint8", mask_dtype="uint8")
    x = [b[0] for b in DataLoader(u8, batch_size=2, num_workers=2)]  # the user keeps these: fresh blocks
    assert len({t.untyped_storage().data_ptr() for t in x}) == len(x) > 8


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_device_conversion_is_bit_equal(path, normalize, workers):
    want = old_values(path, normalize)
    ds = H5Dataset(path, fields=("images", "masks"), **FLOAT, return_index=True, normalize=normalize)
    loader = ds.loader(batch_size=8, num_workers=workers, shuffle=True, seed=2, device="cpu")
    assert loader.dataset._ship_stored and loader.pin_memory is False  # pinned only for CUDA
    check_epoch(list(loader), want)


def test_device_needs_convert_after(path):
    ds = H5Dataset(path, fields=("images", "masks"), **FLOAT)
    with pytest.raises(ValueError, match="convert='after'"):
        ds.loader(device="cpu", convert="worker")
    single = H5Dataset(path, fields="images", image_dtype="float32")
    x = next(iter(single.loader(batch_size=4, shuffle=False, device="cpu")))
    assert bit_equal(x, torch.stack([single[i] for i in range(4)]))


@pytest.mark.parametrize("normalize", [False, True])
def test_torch_conversion_equals_the_kinds_for_every_byte(path, normalize):
    ds = H5Dataset(path, fields=("images", "masks"), **FLOAT, normalize=normalize)
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    opts = ReadOptions(normalize=normalize)
    for name, shape in (("images", (1, 3, 256, 1)), ("masks", (1, 1, 256, 1))):
        fi = ds.reader.fields[name]
        raw = every.repeat(shape[1]).view(shape)
        dtype = ds._tensor_dtypes[name]
        got = torch_convert(fi.kind, raw, dtype, opts, fi.stats)
        want = torch.empty(shape, dtype=dtype)
        fi.kind.convert(raw.numpy(), want.numpy(), opts, fi.stats)
        assert bit_equal(got, want), name
    assert normalize is False or "mean" in ds.reader.fields["images"].stats  # the standardisation ran


def test_item_reads_into_a_per_thread_buffer_to_the_same_values(path):
    want = old_values(path)
    ds = H5Dataset(path, fields=("images", "masks"), **FLOAT)
    first = ds[0]
    for i in range(len(ds)):
        x, m = ds[i]
        assert bit_equal(x, want[i][0][0]) and bit_equal(m, want[i][1][0]), i
    assert bit_equal(first[0], want[0][0][0])  # what a sample returned is its own

    errors = []

    def read(offset: int) -> None:
        for i in list(range(offset, len(ds))) * 3:
            x, m = ds[i]
            if not (bit_equal(x, want[i][0][0]) and bit_equal(m, want[i][1][0])):
                errors.append(i)

    threads = [threading.Thread(target=read, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_read_one_into_given_rows_through_either_path(path):
    r = SplitReader(path, fields=("images", "masks"))
    want = r.read([7])
    for use_direct in (True, False):
        r._handles()
        if not use_direct:
            r._direct = {k: None for k in r._direct}
        out = {"images": np.zeros((3, 64, 64), np.uint8)}
        got = r.read_one(7, out)
        assert (got["images"] is out["images"]) is use_direct  # through h5py: a new array
        assert np.array_equal(got["images"], want["images"][0])
        assert np.array_equal(got["masks"], want["masks"][0])
        r.close()


def test_lz4_is_decompressed_into_the_row_and_without_the_library_too(tmp_path):
    assert chunk_codec._LZ4_SAFE is not None  # the lz4 package's bundled library (or the system's) loaded
    rng = np.random.default_rng(0)
    values = rng.integers(0, 256, (9, 3, 20, 30), dtype=np.uint8)
    values[::2] = (np.arange(30) % 5).astype(np.uint8)  # rows LZ4 shrinks; the noisy ones it stores as is
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("x", data=values, chunks=(1, 3, 20, 30), **hdf5plugin.LZ4())
    calls = []

    def counted(*args):
        calls.append(args[3])
        return chunk_codec._LZ4_SAFE.__wrapped__(*args)

    counted.__wrapped__ = chunk_codec._LZ4_SAFE
    with h5py.File(tmp_path / "a.h5", "r") as f:
        for loaded in (counted, None):
            saved, chunk_codec._LZ4_SAFE = chunk_codec._LZ4_SAFE, loaded
            try:
                rows = DirectRows.of(f["x"])
                assert all(np.array_equal(rows.row(i), values[i]) for i in range(9))
                assert rows._index  # read from the mapped file
            finally:
                chunk_codec._LZ4_SAFE = saved
    assert calls == [3 * 20 * 30] * 5  # the compressed rows, each decompressed in place once


def test_a_corrupt_lz4_block_is_refused_by_the_direct_call():
    import lz4.block
    plain = bytes(range(256)) * 64
    packed = lz4.block.compress(plain, store_size=False)
    out = np.zeros(len(plain), np.uint8)
    assert chunk_codec._LZ4_SAFE(packed, out.ctypes.data, len(packed), len(plain)) == len(plain)
    assert out.tobytes() == plain
    assert chunk_codec._LZ4_SAFE(packed[:40], out.ctypes.data, 40, len(plain)) < 0
    assert chunk_codec._LZ4_SAFE(packed, out.ctypes.data, len(packed), len(plain) - 1) < 0  # never past the row


def test_refilled_blocks_under_spawn(path):
    want = old_values(path)
    ds = H5Dataset(path, fields=("images", "masks"), **FLOAT, return_index=True)
    loader = ds.loader(batch_size=2, num_workers=1, shuffle=True, seed=4, multiprocessing_context="spawn")
    check_epoch(list(loader), want)  # the worker starts with an empty pool of its own

"""The torch reader against real version files: values, order, shards, workers, fds, versions."""

from __future__ import annotations

import gc
import hashlib
import os
import time
import pickle
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from h5forge.read._reader import ReadError, SplitReader, coalesce
from h5forge.read._direct import DirectRows
from h5forge.read._sampler import epoch_order, shard
from h5forge.read.torch import ChunkShuffleSampler, H5Dataset
from h5forge._store.versions import LATEST, set_latest, version_name
from tests.helpers.files import build_file, make_raw, n_fds, truth


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("reader")
    raw = make_raw(base / "raw", n=200)
    c1 = build_file(base / "c1" / "dataset_v0001.h5", raw, chunk_rows=1)
    c4 = build_file(base / "c4" / "dataset_v0001.h5", raw, chunk_rows=4, codec="lz4")
    return {"raw": raw, "c1": c1, "c4": c4, "truth": truth(c1), "base": base}


def as_float(u8: np.ndarray) -> np.ndarray:
    return u8.astype(np.float32) / 255


def epoch_tensors(loader) -> tuple[torch.Tensor, torch.Tensor]:
    imgs, masks = [], []
    for x, m in loader:
        imgs.append(x)
        masks.append(m)
    return torch.cat(imgs), torch.cat(masks)


# ---- values -------------------------------------------------------------------------------------
def test_items_equal_what_was_written_in_order(data):
    ds = H5Dataset(data["c1"], split="train", fields=("images", "masks"))
    t = data["truth"]
    assert len(ds) == len(t["ids"]) > 100
    for i in range(len(ds)):
        x, m = ds[i]
        assert x.dtype == torch.uint8 and m.dtype == torch.uint8  # torch's default: the stored values
        assert np.array_equal(x.numpy(), t["images"][i])
        assert np.array_equal(m.numpy(), t["masks"][i])
    x, m = ds[-1]
    assert np.array_equal(m.numpy(), t["masks"][-1])
    assert ds.ids() == list(t["ids"])
    assert set(np.unique(t["masks"])) <= {0, 1, 255}  # 255: padding
    as_model = H5Dataset(data["c1"], split="train", fields=("images", "masks"), image_dtype="float32", mask_dtype="int64")
    for i in (0, 7, -1):
        x, m = as_model[i]
        assert x.dtype == torch.float32 and m.dtype == torch.int64
        assert np.array_equal(x.numpy(), as_float(t["images"][i])) and np.array_equal(m.numpy(), t["masks"][i])


@pytest.mark.parametrize("which", ["c1", "c4"])
def test_getitems_any_order_with_duplicates(data, which):
    ds = H5Dataset(data[which], split="train", fields=("images", "masks"))
    t = truth(data[which])
    ds.reader.read_one(0)
    if which == "c4":  # lz4, four rows per chunk joined by the writer: a row is decoded alone
        assert all(isinstance(ds.reader._direct[f], DirectRows) for f in ("images", "masks"))
    rng = np.random.default_rng(1)
    for idx in ([5, 3, 4, 9, 10, 11, 0], list(range(40, 72)), list(rng.integers(0, len(ds), 33)) + [7, 7, -1], []):
        batch = ds.__getitems__(idx)
        want = np.array(idx, dtype=np.int64) % len(ds)
        if len(idx) == 0:
            assert len(batch) == 0
            continue
        x, m = batch.stacked
        assert x.shape == (len(idx), 3, 64, 64)
        assert np.array_equal(x.numpy(), t["images"][want])
        assert np.array_equal(m.numpy(), t["masks"][want])
        # the per-sample list torch's default collate would see holds the same values
        assert torch.equal(batch[0][0], x[0]) and len(batch) == len(idx)
    if which == "c4":  # only the split's last chunk, partial, is HDF5's: decoded whole and kept
        assert all(len(ds.reader._direct[f].chunks) <= 1 for f in ("images", "masks"))


def test_uint8_and_normalize_options(data):
    t = data["truth"]
    raw = H5Dataset(data["c1"], fields=("images", "masks"), image_dtype="uint8", mask_dtype="uint8")
    x, m = raw.__getitems__([2, 1]).stacked
    assert x.dtype == torch.uint8 and m.dtype == torch.uint8
    assert np.array_equal(x.numpy(), t["images"][[2, 1]])
    norm = H5Dataset(data["c1"], fields="images", normalize=True)
    fi = norm.info["images"]
    got = norm[0]  # one field: the tensor itself, not a tuple
    want = (as_float(t["images"][0]) - fi.stats["mean"][:, None, None]) / fi.stats["std"][:, None, None]
    assert np.allclose(got.numpy(), want, atol=1e-5)
    with pytest.raises(ValueError, match="image_dtype"):
        H5Dataset(data["c1"], image_dtype="float16")


def test_coalesce_runs():
    assert coalesce(np.array([0, 1, 2, 5, 6, 9])) == [(0, 3, 0), (5, 7, 3), (9, 10, 5)]
    assert coalesce(np.array([], dtype=np.int64)) == []


# ---- loaders ------------------------------------------------------------------------------------
@pytest.mark.parametrize("which,workers", [("c1", 0), ("c1", 2), ("c4", 2)])
def test_loader_shuffled_values_exactly_once(data, which, workers):
    ds = H5Dataset(data[which], split="train", fields=("images", "masks"))
    t = truth(data[which])
    loader = ds.loader(batch_size=16, num_workers=workers, shuffle=True, seed=3)
    for epoch in range(2):
        order = loader.sampler.indices(epoch)
        assert sorted(order.tolist()) == list(range(len(ds)))  # every sample exactly once
        x, m = epoch_tensors(loader)
        assert np.array_equal(x.numpy(), t["images"][order])
        assert np.array_equal(m.numpy(), t["masks"][order])
    assert not np.array_equal(loader.sampler.indices(0), loader.sampler.indices(1))


def _sample_hashes(images, masks) -> list[str]:
    return sorted(hashlib.sha1(np.ascontiguousarray(a).tobytes() + np.ascontiguousarray(b).tobytes()).hexdigest()
                  for a, b in zip(images, masks))


def test_plain_dataloader_shuffle(data):
    """A standard DataLoader(shuffle=True) with torch's own collate and sampler works too."""
    ds = H5Dataset(data["c4"], split="train", fields=("images", "masks"), image_dtype="uint8")
    t = truth(data["c4"])
    loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=2)
    x, m = epoch_tensors(loader)
    assert x.shape[0] == len(ds) and m.dtype == torch.uint8
    assert _sample_hashes(x.numpy(), m.numpy().astype(np.uint8)) == _sample_hashes(t["images"], t["masks"])
    assert not np.array_equal(x.numpy(), t["images"])  # it did shuffle


def test_determinism_and_epochs():
    a = ChunkShuffleSampler(1000, chunk_rows=4, seed=7)
    b = ChunkShuffleSampler(1000, chunk_rows=4, seed=7)
    c = ChunkShuffleSampler(1000, chunk_rows=4, seed=8)
    first = [list(a) for _ in range(3)]  # each pass advances the epoch
    b_orders = []
    for e in range(3):
        b.set_epoch(e)  # the DistributedSampler habit gives the same sequence
        b_orders.append(list(b))
    assert first == b_orders
    assert first[0] != first[1] != first[2]
    assert list(c) != first[0]
    assert np.array_equal(epoch_order(50, 1, seed=1, epoch=2), epoch_order(50, 1, seed=1, epoch=2))


def test_chunk_aware_order():
    n, rows, window = 103, 4, 3
    order = epoch_order(n, rows, seed=0, epoch=0, window=window)
    assert sorted(order.tolist()) == list(range(n))
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    chunks = sorted(range(-(-n // rows)), key=lambda c: position[c * rows:(c + 1) * rows].min())
    start = 0
    for w in range(0, len(chunks), window):  # each window of chunks fills one contiguous stretch
        pos = np.sort(np.concatenate([position[c * rows:(c + 1) * rows] for c in chunks[w:w + window]]))
        assert np.array_equal(pos, np.arange(start, start + pos.size))
        start += pos.size
    assert start == n
    assert not np.array_equal(order, np.arange(n))
    assert np.array_equal(epoch_order(n, rows, shuffle=False), np.arange(n))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ddp_shards_equal_and_disjoint(data, world):
    ds = H5Dataset(data["c4"], split="train", fields=("images", "masks"))
    n = len(ds)
    for epoch in range(2):
        shards = [ChunkShuffleSampler(ds, seed=5, num_replicas=world, rank=r).indices(epoch) for r in range(world)]
        assert {len(s) for s in shards} == {n // world}
        flat = np.concatenate(shards)
        assert len(set(flat.tolist())) == flat.size  # disjoint
        padded = [ChunkShuffleSampler(ds, seed=5, num_replicas=world, rank=r, drop_last=False).indices(epoch)
                  for r in range(world)]
        assert {len(s) for s in padded} == {-(-n // world)}
        assert set(np.concatenate(padded).tolist()) == set(range(n))  # every sample read
    with pytest.raises(ValueError, match="rank"):
        ChunkShuffleSampler(ds, num_replicas=2, rank=2)


def test_ddp_loaders_read_every_sample_once(data):
    ds = H5Dataset(data["c1"], split="train", fields=("images", "masks"), image_dtype="uint8")
    t = data["truth"]
    world = 3
    seen = []
    for rank in range(world):
        loader = ds.loader(batch_size=8, num_workers=0, seed=2, num_replicas=world, rank=rank, drop_last=False)
        x, m = epoch_tensors(loader)
        seen.append((x.numpy(), m.numpy().astype(np.uint8)))
    assert len({s[0].shape[0] for s in seen}) == 1
    hashes = [h for x, m in seen for h in _sample_hashes(x, m)]
    assert len(set(hashes)) == len(hashes)  # disjoint across ranks
    assert len(hashes) == (len(ds) // world) * world
    assert set(hashes) <= set(_sample_hashes(t["images"], t["masks"]))
    assert shard(np.arange(10), 3, 2).tolist() == [6, 7, 8]


# ---- processes, handles, fds --------------------------------------------------------------------
def test_pickle_carries_the_path_not_a_handle(data):
    ds = H5Dataset(data["c1"], split="train", fields=("images", "masks"))
    ds[0]  # opens the handle in this process
    assert ds.reader._file is not None
    blob = pickle.dumps(ds)
    assert len(blob) < 20_000
    clone = pickle.loads(blob)
    assert clone.reader._file is None
    assert torch.equal(clone[5][1], ds[5][1])
    ds.close()
    assert ds.reader._file is None


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_worker_start_methods(data, context):
    ds = H5Dataset(data["c4"], split="train", fields=("images", "masks"))
    t = truth(data["c4"])
    loader = ds.loader(batch_size=32, num_workers=2, seed=1, multiprocessing_context=context,
                       persistent_workers=False)
    order = loader.sampler.indices(0)
    x, m = epoch_tensors(loader)
    assert np.array_equal(x.numpy(), t["images"][order])
    assert np.array_equal(m.numpy(), t["masks"][order])


def h5_fds() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").endswith(".h5")
        except OSError:
            pass
    return n


def with_worker_fds(batch):
    """batch_transform that reports the worker's open fds (all, and HDF5 files) with the batch."""
    x, m = batch
    return x, m, torch.tensor([n_fds(), h5_fds()])


def settled_fds(limit: int, seconds: float = 120.0) -> int:
    """The fd count once exited workers' pipes are closed (they may close a moment after the
    epoch ends, later on a loaded machine); a real leak never drops back to ``limit``, so it still
    shows, after ``seconds``."""
    deadline = time.monotonic() + seconds
    while n_fds() > limit and time.monotonic() < deadline:
        time.sleep(0.05)
    return n_fds()


@pytest.mark.parametrize("persistent", [True, False])
def test_no_fd_leak_over_epochs(data, persistent):
    ds = H5Dataset(data["c1"], split="train", fields=("images", "masks"), batch_transform=with_worker_fds)
    loader = ds.loader(batch_size=16, num_workers=2, persistent_workers=persistent)
    before, before_h5 = n_fds(), h5_fds()
    main_counts, worker = [], []
    for _ in range(5):
        epoch = []
        for x, m, fds in loader:
            epoch.append(fds.tolist())
        del x, m, fds  # the last batch's shared-memory tensors hold fds
        gc.collect()
        worker.append(np.array(epoch))
        main_counts.append(n_fds() if persistent else settled_fds(before))
    assert before_h5 == 0 and h5_fds() == 0  # the main process never holds the file open
    if persistent:
        assert len(set(main_counts)) == 1, main_counts
    else:  # workers are gone after each epoch (their pipes may close a moment later)
        assert max(main_counts[1:]) <= before, (before, main_counts)
    for epoch in worker:  # one HDF5 handle per worker, however many epochs
        assert set(epoch[:, 1].tolist()) == {1}
    # all fds of a worker: shared-memory batches in flight (up to 2 per worker, 3 tensors each)
    # make the count wobble by a few; a per-batch leak would add 5 or more per epoch
    counts = [w[:, 0].tolist() for w in worker]
    assert max(counts[-1]) <= max(counts[0]) + 3, counts
    del loader
    gc.collect()
    assert settled_fds(before) <= before  # the workers' pipes close a moment after they exit


def test_workers_zero_reuses_one_handle(data):
    ds = H5Dataset(data["c1"], split="train", fields=("images", "masks"))
    loader = ds.loader(batch_size=32, num_workers=0)
    list(loader)
    after_one = n_fds()
    for _ in range(4):
        list(loader)
    assert n_fds() == after_one
    ds.close()
    assert n_fds() == after_one - 1


def test_locking_false_and_cache_size(data, tmp_path):
    path = tmp_path / "copy.h5"  # HDF5 refuses a second open of one file with other locking flags
    shutil.copy(data["c4"], path)
    ds = H5Dataset(path, split="train", fields=("images", "masks"), locking=False)
    x, m = ds[3]
    assert x.shape == (3, 64, 64)
    f = ds.reader._file
    nbytes = f.id.get_access_plist().get_cache()[2]
    chunk = 4 * 3 * 64 * 64
    assert nbytes >= chunk  # at least one chunk per field
    assert nbytes == ds.reader.rdcc_nbytes
    with pytest.raises(ReadError, match="locking"):
        H5Dataset(path, split="train", locking=True)[0]
    big = SplitReader(path, "train", ("images",), cache_chunks=64, locking=False)
    assert big.rdcc_nbytes >= 64 * chunk


# ---- versions -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def versions(data):
    """out/ with v1, v2 (images inverted) and dataset_latest.h5 -> v1."""
    out = data["base"] / "versions"
    out.mkdir()
    v1 = out / version_name(1)
    shutil.copy(data["c1"], v1)
    v2 = out / version_name(2)
    shutil.copy(data["c1"], v2)
    with h5py.File(v2, "a") as f:
        f.attrs["version"] = 2
        for split in ("train", "val", "test"):
            d = f[split]["images"]
            if d.shape[0]:
                d[...] = 255 - d[...]
    set_latest(out, 1)
    return out


def test_publish_mid_epoch_keeps_the_pinned_version(data, versions):
    set_latest(versions, 1)
    link = versions / LATEST
    ds = H5Dataset(link, split="train", fields=("images", "masks"))
    assert ds.version == 1 and Path(ds.real_path).name == version_name(1)
    t = data["truth"]
    loader = ds.loader(batch_size=16, num_workers=2, persistent_workers=False, seed=4)
    try:
        for epoch in range(2):
            order = loader.sampler.indices(epoch)
            got = []
            for k, (x, m) in enumerate(loader):
                if epoch == 0 and k == 2:
                    set_latest(versions, 2)  # publish during the epoch
                got.append(x)
            assert np.array_equal(torch.cat(got).numpy(), t["images"][order])
        fresh = H5Dataset(link, split="train", fields=("images",), image_dtype="uint8")
        assert fresh.version == 2
        assert np.array_equal(fresh[0].numpy(), 255 - t["images"][0])
    finally:
        set_latest(versions, 1)


def test_missing_virtual_source_is_an_error(data, tmp_path):
    src = tmp_path / "delta.h5"
    t = data["truth"]
    with h5py.File(src, "w") as f:
        f.create_dataset("train/images", data=t["images"])
    vfile = tmp_path / "dataset_v0003.h5"
    shutil.copy(data["c1"], vfile)
    with h5py.File(vfile, "a") as f:
        del f["train/images"]
        layout = h5py.VirtualLayout(shape=t["images"].shape, dtype=np.uint8)
        layout[:] = h5py.VirtualSource(str(src), "train/images", shape=t["images"].shape)
        f.create_virtual_dataset("train/images", layout, fillvalue=0)
    ds = H5Dataset(vfile, split="train", fields=("images", "masks"), image_dtype="uint8")
    assert np.array_equal(ds.__getitems__([0, 9, 3]).stacked[0].numpy(), t["images"][[0, 9, 3]])
    assert ds.reader.sources == [str(src)]
    ds.close()
    src.rename(tmp_path / "moved.h5")
    with pytest.raises(ReadError, match="delta.h5") as err:
        ds[0]  # a reopen (e.g. a new worker) checks again
    assert "missing" in str(err.value)
    with pytest.raises(ReadError, match="delta.h5"):
        H5Dataset(vfile, split="train")


# ---- errors ------------------------------------------------------------------------------------
def test_clear_errors(data, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.h5"):
        H5Dataset(tmp_path / "nope.h5")
    dangling = tmp_path / "dataset_latest.h5"
    os.symlink("dataset_v0099.h5", dangling)
    with pytest.raises(FileNotFoundError, match="dataset_v0099.h5"):
        H5Dataset(dangling)
    with pytest.raises(ReadError, match=r"dataset_v0001.h5.*no split 'training'"):
        H5Dataset(data["c1"], split="training")
    for group in ("inputs", "meta", "diagnostics"):  # the file's groups that hold no split
        with pytest.raises(ReadError, match=rf"no split '{group}'; the file has \['train', 'val', 'test'\]"):
            H5Dataset(data["c1"], split=group)
    with pytest.raises(ReadError, match=r"dataset_v0001.h5.*split 'val' has no field or column 'labels'"):
        H5Dataset(data["c1"], split="val", fields=("images", "labels"))
    other = tmp_path / "plain.h5"
    with h5py.File(other, "w") as f:
        f.create_dataset("train/images", data=np.zeros((2, 3, 4, 4), np.uint8))
    with pytest.raises(ReadError, match="not an h5forge"):
        H5Dataset(other)
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5 at all")
    with pytest.raises((ReadError, OSError), match="junk.h5"):
        H5Dataset(junk)
    ds = H5Dataset(data["c1"], split="val", fields=("masks",))
    with pytest.raises(IndexError, match="split 'val'"):
        ds[len(ds)]
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([0, len(ds) + 5])
    with pytest.raises(ReadError, match="annotation column 'nope'"):
        ds.meta("nope")
    assert len(ds.meta("label")) == len(ds)


def test_an_index_that_is_not_an_integer_is_refused(data):
    """int() would take 1.7 (or True) for row 1 and return a sample that was never asked for."""
    reader = SplitReader(data["c1"], "train")
    ds = H5Dataset(data["c1"], split="train", fields=("images",))
    for bad in (1.7, True, np.float64(2.9), np.bool_(True), torch.tensor(1.0)):
        for read in (reader.read_one, ds.__getitem__):
            with pytest.raises(TypeError, match="integers"):
                read(bad)
    for bad in ([0.5, 1.9], np.array([0.0, 1.0]), [True, False], [1, 2.5]):
        for read in (reader.read, ds.__getitems__):
            with pytest.raises(TypeError, match="integers"):
                read(bad)
    want = data["truth"]["images"]
    for good in (2, np.int64(2), np.uint8(2), torch.tensor(2)):  # numpy's (and torch's) integers are indices
        assert np.array_equal(ds[good].numpy(), want[2])
    got = ds.__getitems__(np.array([3, 1], np.int32))
    assert np.array_equal(got[0].numpy(), want[3]) and np.array_equal(got[1].numpy(), want[1])
    assert reader.read([])["images"].shape == (0, *want.shape[1:])


# ---- transforms ------------------------------------------------------------------------------
def flip(sample):
    x, m = sample
    return torch.flip(x, dims=[-1]), torch.flip(m, dims=[-1])


def test_transform_hook(data):
    t = data["truth"]
    ds = H5Dataset(data["c1"], split="train", fields=("images", "masks"), transform=flip)
    x, m = ds[4]
    assert np.array_equal(x.numpy(), t["images"][4][..., ::-1])
    loader = ds.loader(batch_size=16, num_workers=2, seed=0)
    order = loader.sampler.indices(0)
    xs, ms = epoch_tensors(loader)
    assert np.array_equal(xs.numpy(), t["images"][order][..., ::-1])
    assert np.array_equal(ms.numpy(), t["masks"][order][..., ::-1])

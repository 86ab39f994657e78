"""CT slices for 2-D and 2.5-D training (``unit="slice"``) through every read path: a single
``ds[i]``, a batch, a 2-worker loader; stored ``lz4`` (decompressed from the mapped file), ``none``
(copied from it) and ``gzip-1`` (read by h5py); with and without the decompressed-slice cache.
Every value equals h5py's and the source volume's. The volumes are pydicom's real CT slice
(CT_small.dcm), shifted per slice and written as NIfTI with nibabel."""

from __future__ import annotations

import h5py
import nibabel
import numpy as np
import pydicom
import pytest
import torch
from pydicom.data import get_testdata_file

from h5forge._format.layout import decode_str
from h5forge.read.torch import H5Dataset

PAD = 8  # in-plane padding each side, with AIR
AIR = -1024
DEPTHS = {"a": 5, "b": 3, "c": 4}
CODECS = ("lz4", "none", "gzip-1")


def source_volumes() -> dict[str, np.ndarray]:
    """(D, H, W) int16 per case: the real slice rolled by a different step per slice and case."""
    ct = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    hu = (ct.pixel_array * float(ct.RescaleSlope) + float(ct.RescaleIntercept)).astype(np.int16)
    return {name: np.stack([np.roll(hu, 3 * k + 11 * c, axis=1) for k in range(depth)])
            for c, (name, depth) in enumerate(DEPTHS.items())}


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> dict[str, str]:
    """{codec: the published version}, each built from the same NIfTI cases."""
    import h5forge
    from h5forge.spec import DatasetSpec

    root = tmp_path_factory.mktemp("slices")
    (root / "raw" / "cases").mkdir(parents=True)
    for name, vol in source_volumes().items():  # (D, H, W) -> NIfTI's (x, y, z)
        nibabel.save(nibabel.Nifti1Image(np.ascontiguousarray(vol.transpose(2, 1, 0)), np.eye(4)),
                     root / "raw" / "cases" / f"{name}.nii.gz")
    size = [128 + 2 * PAD, 128 + 2 * PAD]
    built = {}
    for codec in CODECS:
        result = h5forge.build(DatasetSpec.model_validate({
            "name": "ct", "source": {"root": str(root / "raw")}, "output": {"dir": str(root / codec)},
            "splits": {"ratios": {"train": 1.0}}, "compute": {"batch_size": 2},
            "fields": {"ct": {"kind": "volume", "files": "cases/*.nii.gz", "size": size, "fill": AIR,
                              "codec": codec}}}))
        assert result.rejections == ()
        built[codec] = result.path
    return built


def stored(path) -> tuple[np.ndarray, list[str], np.ndarray]:
    """h5py's slices, the case ids and their depths."""
    with h5py.File(path, "r") as f:
        g = f["train"]
        return g["ct"][()], decode_str(g["ids"][()]), g["ct_lengths"][()]


def source_slices(ids: list[str]) -> np.ndarray:
    """The source volumes' slices in the split's case order, padded as the field says."""
    src = source_volumes()
    return np.concatenate([np.pad(src[i], ((0, 0), (PAD, PAD), (PAD, PAD)), constant_values=AIR) for i in ids])


def stacks(flat: np.ndarray, depths, k: int) -> np.ndarray:
    """(n, 2k+1, H, W): each slice with its k neighbours each side, its case's end slice repeated."""
    rows, start = [], 0
    for depth in map(int, depths):
        rows += [[start + min(max(j + o, 0), depth - 1) for o in range(-k, k + 1)] for j in range(depth)]
        start += depth
    return flat[np.array(rows)]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("context", [0, 2])
@pytest.mark.parametrize("cache", [0, 3, None])  # off, smaller than a stack, the default (one stack)
def test_slices_equal_h5py_and_the_source_through_every_path(versions, codec, context, cache):
    path = versions[codec]
    flat, ids, depths = stored(path)
    assert np.array_equal(flat, source_slices(ids))
    want = flat if context == 0 else stacks(flat, depths, context)
    ds = H5Dataset(path, fields=("ct",), unit="slice", context=context, slice_cache=cache)
    n = len(ds)
    assert n == len(flat) == sum(DEPTHS.values())
    order = [*range(n), *np.random.default_rng(0).permutation(n).tolist(), -1, -n]  # a sweep, then random
    for i in order:
        got = ds[i]
        assert got.dtype == torch.int16 and np.array_equal(got.numpy(), want[i]), i
    batch = ds.__getitems__([5, 0, 5, n - 1, 3]).stacked
    assert np.array_equal(batch.numpy(), want[[5, 0, 5, n - 1, 3]])
    with_case = H5Dataset(path, fields=("ct",), unit="slice", context=context, slice_cache=cache, return_index=True)
    cases = np.repeat(np.arange(len(depths)), depths)
    for i in (0, n - 1, -2):  # a sample of several values: the slice (or stack) and its case's row
        got, case = with_case[i]
        assert np.array_equal(got.numpy(), want[i]) and case.dtype == torch.int64 and int(case) == cases[i]
    direct = ds.reader._direct["ct"]
    if codec == "gzip-1":
        assert direct is None  # read by h5py
    else:
        assert direct is not None and direct.codec == codec and direct._index  # from the mapped file
        kept = direct.cache
        if codec == "none" or context == 0 and cache is None or cache == 0:
            assert kept is None
        else:  # full after the batch, and no larger than asked
            assert len(kept) == (cache or 2 * context + 1)


def test_with_two_loader_workers_every_stack_once_and_handles_bounded(versions):
    path = versions["lz4"]
    flat, _, depths = stored(path)
    want = stacks(flat, depths, 1)
    ds = H5Dataset(path, fields=("ct",), unit="slice", context=1, return_index=True,
                   batch_transform=lambda b: (*b, torch.tensor(open_files(path))))
    loader = ds.loader(batch_size=3, num_workers=2, shuffle=True, seed=1, persistent_workers=True)
    handles = []
    for _ in range(3):
        seen = []
        for x, case, files in loader:
            seen += [next(j for j in range(len(want)) if torch.equal(x[k], torch.from_numpy(want[j])))
                     for k in range(len(x))]
            handles.append(files.tolist())
            assert x.shape[1:] == (3, 128 + 2 * PAD, 128 + 2 * PAD)
            assert case.tolist() == [int(np.searchsorted(np.cumsum(depths), s, side="right")) for s in seen[-len(x):]]
        assert sorted(seen) == list(range(len(want)))
    # each worker holds the HDF5 handle and the map of the file (its own descriptor), in every
    # batch of every epoch: a reopen or a map per read would add to them
    assert len({pid for pid, _ in handles}) == 2 and {mine for _, mine in handles} == {2}, handles


def open_files(path: str) -> tuple[int, int]:
    """This process's id, and its descriptors on ``path``'s real file."""
    import os

    real = os.path.realpath(path)
    mine = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            mine += os.readlink(f"/proc/self/fd/{fd}") == real
        except OSError:
            pass
    return os.getpid(), mine


def test_slice_cache_keeps_the_latest_slices_and_is_bounded(versions):
    path = versions["lz4"]
    flat, _, depths = stored(path)
    want = stacks(flat, depths, 2)
    ds = H5Dataset(path, fields=("ct",), unit="slice", context=2, slice_cache=4)
    sizes = []
    for i in range(len(flat)):  # a sweep, as a 2.5-D model's validation reads a volume
        assert np.array_equal(ds[i].numpy(), want[i])
        sizes.append(len(ds.reader._direct["ct"].cache))
    assert max(sizes) == 4
    cache = ds.reader._direct["ct"].cache
    last = len(flat) - 1  # the last stack read: last-2, last-1, last, last, last (its case's end repeated)
    assert list(cache.rows)[-3:] == [last - 2, last - 1, last]
    for row, plain in cache.rows.items():  # kept as decompressed
        assert np.array_equal(plain.view(np.int16).reshape(flat.shape[1:]), flat[row])


def _save_case(folder, name: str, vol: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    image = nibabel.Nifti1Image(np.ascontiguousarray(vol.transpose(2, 1, 0)), np.eye(4))  # (D, H, W) -> (x, y, z)
    nibabel.save(image, folder / f"{name}.nii.gz")


@pytest.mark.parametrize("codec,chunk_rows,assemble", [("lz4", 4, "mapped"), ("none", 3, "copy")])
def test_stacks_stay_within_their_case_across_appends_and_rebuilds(tmp_path, codec, chunk_rows, assemble):
    """2.5-D stacks never take a neighbour from another case while the cases move: after an append
    (a thin version, the new cases read from the delta file, one sorting before every case held),
    and after a rebuild that puts a case between two others, drops one and changes another's depth.
    Every stack is its case's slices around it, the case's end slice repeated, as the source has them."""
    import h5forge
    from h5forge.read._reader import SplitReader
    from h5forge.spec import DatasetSpec
    from tests.helpers.data import age_files

    base = source_volumes()["a"][:, :64, :64]
    cases = {name: np.roll(base[:1], 7 * i, axis=2).repeat(depth, 0) + np.arange(depth, dtype=np.int16)[:, None, None]
             * 100 + i for i, (name, depth) in enumerate({"c2": 3, "c4": 1, "c6": 5, "c8": 2, "c0": 4, "c5": 2,
                                                          "c7": 6}.items())}
    raw, inbox = tmp_path / "raw", tmp_path / "inbox"
    for name in ("c2", "c4", "c6", "c8"):
        _save_case(raw / "cases", name, cases[name])
    data = {"name": "ct", "source": {"root": str(raw), "inbox": str(inbox)}, "output": {"dir": str(tmp_path / "out")},
            "splits": {"ratios": {"train": 1.0}}, "compute": {"batch_size": 2}, "append": {"settle_seconds": 1},
            "storage": {"chunk_rows": chunk_rows, "assemble": assemble}, "verify": {"resample": 2, "latency_reads": 0},
            "fields": {"ct": {"kind": "volume", "files": "cases/*.nii.gz", "size": [64, 64], "codec": codec}}}
    spec = DatasetSpec.model_validate(data)

    def check(order: list[str]) -> None:
        latest = tmp_path / "out" / "dataset_latest.h5"
        with SplitReader(latest, "train", fields=("ct",)) as r:
            assert r.ids() == order
        want = np.concatenate([[cases[c][np.clip(np.arange(j - 2, j + 3), 0, len(cases[c]) - 1)]
                                for j in range(len(cases[c]))] for c in order])
        ds = H5Dataset(latest, fields=("ct",), unit="slice", context=2)
        assert len(ds) == len(want)
        assert np.array_equal(ds.__getitems__(list(range(len(ds)))[::-1]).stacked.numpy(), want[::-1])
        for i in np.random.default_rng(0).permutation(len(ds)):
            assert np.array_equal(ds[int(i)].numpy(), want[i]), i

    assert h5forge.build(spec).rejections == ()
    check(["c2", "c4", "c6", "c8"])
    for name in ("c0", "c5"):
        _save_case(inbox / "cases", name, cases[name])
    age_files(inbox)
    assert h5forge.append(spec).added == 2
    check(["c2", "c4", "c6", "c8", "c0", "c5"])  # an append's cases follow those latest held
    _save_case(raw / "cases", "c7", cases["c7"])
    cases["c6"] = cases["c6"][:4]
    _save_case(raw / "cases", "c6", cases["c6"])
    (raw / "cases" / "c4.nii.gz").unlink()
    data["output"]["allow_removals"] = True
    assert h5forge.build(DatasetSpec.model_validate(data)).rejections == ()
    check(["c0", "c2", "c5", "c6", "c7", "c8"])

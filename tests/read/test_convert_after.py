"""A loader asked for float32 images and int64 masks ships stored uint8 arrays from its workers and
converts them after the transfer, to exactly the values the workers produce (convert="worker")."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from h5forge.read.torch import H5Dataset
from tests.helpers.files import build_file, make_raw


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    base = tmp_path_factory.mktemp("convert")
    return build_file(base / "dataset_v0001.h5", make_raw(base / "raw", n=40), codec="lz4")


FLOAT = {"image_dtype": "float32", "mask_dtype": "int64"}  # model values h5forge converts (torch's default: uint8)


def explicit(path, **kw) -> H5Dataset:
    return H5Dataset(path, fields=("images", "masks"), **FLOAT, **kw)


def by_row(loader) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    got = {}
    for x, m, rows in loader:
        for k, r in enumerate(rows.tolist()):
            got[r] = (x[k], m[k])
    return got


@pytest.mark.parametrize("normalize", [False, True])
def test_float_loader_ships_uint8_and_converts_to_the_same_values(path, normalize):
    ds = explicit(path, return_index=True, normalize=normalize)
    loader = ds.loader(batch_size=8, num_workers=2, shuffle=True, seed=3)
    shipped = next(iter(DataLoader.__iter__(loader)))  # what crossed from a worker to this process
    assert shipped[0].dtype == torch.uint8 and shipped[1].dtype == torch.uint8
    got = by_row(loader)
    ref = explicit(path, return_index=True, normalize=normalize)
    want = by_row(ref.loader(batch_size=8, num_workers=2, shuffle=True, seed=3, convert="worker"))
    assert sorted(got) == list(range(len(ds))) == sorted(want)
    for r in got:
        assert got[r][0].dtype == torch.float32 and got[r][1].dtype == torch.int64
        assert torch.equal(got[r][0], want[r][0]) and torch.equal(got[r][1], want[r][1]), r
        assert torch.equal(got[r][0], ref[r][0])  # and what one item of the explicit path is


def test_convert_none_yields_stored_dtypes_and_convert_matches(path):
    ds = explicit(path)
    ref = explicit(path)
    for workers in (0, 2):
        loader = ds.loader(batch_size=16, num_workers=workers, shuffle=False, convert=None)
        x, m = next(iter(loader))
        assert x.dtype == torch.uint8 and m.dtype == torch.uint8
        cx, cm = ds.convert((x, m))
        want = ref.__getitems__(list(range(16))).stacked
        assert torch.equal(cx, want[0]) and torch.equal(cm, want[1])
        assert ds.convert((cx, cm))[0] is cx  # already converted: left as it is
    single = H5Dataset(path, fields="images", image_dtype="float32")
    x = next(iter(single.loader(batch_size=4, shuffle=False, convert=None)))
    assert torch.equal(single.convert(x), torch.stack([single[i] for i in range(4)]))


def test_in_process_and_explicit_dtypes_are_unchanged(path):
    ds = explicit(path)
    loader = ds.loader(batch_size=8, num_workers=0, shuffle=False)
    assert type(loader) is DataLoader and loader.dataset is ds  # nothing to transfer: converted as read
    x, m = next(iter(loader))
    assert x.dtype == torch.float32 and m.dtype == torch.int64
    u8 = H5Dataset(path, fields=("images", "masks"), image_dtype="uint8", mask_dtype="uint8")
    x8, m8 = next(iter(u8.loader(batch_size=8, num_workers=2, shuffle=False)))
    assert x8.dtype == torch.uint8 and torch.equal(x8.float() / 255, x) and torch.equal(m8.long(), m)
    with pytest.raises(ValueError, match="convert must be"):
        ds.loader(convert="gpu")


def test_transform_hooks_see_model_values_in_the_workers(path):
    seen = explicit(path, batch_transform=lambda b: (b[0] * 2, b[1]))
    x, m = next(iter(seen.loader(batch_size=4, num_workers=2, shuffle=False, convert=None)))
    assert x.dtype == torch.float32 and m.dtype == torch.int64
    assert torch.equal(x, explicit(path).__getitems__([0, 1, 2, 3]).stacked[0] * 2)


def test_plain_dataloader_stacks_the_samples_as_default_collate_stacks_them(path):
    ds = H5Dataset(path, fields=("images", "masks"), image_dtype="uint8", mask_dtype="uint8", return_index=True)
    ref = explicit(path)
    seen = 0
    for batch in DataLoader(ds, batch_size=8, shuffle=True, num_workers=2):
        assert isinstance(batch, list) and len(batch) == 3  # what default_collate makes of tuple samples
        x, m, rows = batch
        assert x.dtype == torch.uint8 and x.shape == (len(rows), 3, 64, 64)
        for k, r in enumerate(rows.tolist()):
            assert torch.equal(x[k].float() / 255, ref[r][0]) and torch.equal(m[k].long(), ref[r][1])
        seen += len(rows)
    assert seen == len(ds)
    samples = ds.__getitems__([3, 1])
    assert samples[0] == tuple(samples[0])  # each sample is still a tuple to its users
    by_torch = torch.utils.data.default_collate(list(samples))  # samples alone: stacked by torch as usual
    assert all(torch.equal(a, b) for a, b in zip(by_torch, samples.stacked))

"""The torch reader's defaults: images and masks come as stored (uint8, the same values as the
file), standardised images are float32, a plain DataLoader batches the stored values, and importing
the reader changes nothing in torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, get_worker_info

from h5forge.read.torch import H5Dataset, collate
from tests.helpers.files import build_file, make_raw

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    base = tmp_path_factory.mktemp("defaults")
    return build_file(base / "dataset_v0001.h5", make_raw(base / "raw", n=40), codec="lz4")


def stored(path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {name: f["train"][name][()] for name in ("images", "masks")}


def check_rows(batches, want: dict[str, np.ndarray]) -> None:
    seen = []
    for x, m, rows in batches:
        assert x.dtype == torch.uint8 and m.dtype == torch.uint8
        assert np.array_equal(x.numpy(), want["images"][rows.numpy()])
        assert np.array_equal(m.numpy(), want["masks"][rows.numpy()])
        seen += rows.tolist()
    assert sorted(seen) == list(range(len(want["images"])))


def test_items_and_loaders_return_the_stored_values_by_default(path):
    want = stored(path)
    ds = H5Dataset(path, fields=("images", "masks"), return_index=True)
    for i in range(len(ds)):
        x, m, row = ds[i]
        assert int(row) == i and x.dtype == torch.uint8 and m.dtype == torch.uint8
        assert np.array_equal(x.numpy(), want["images"][i]) and np.array_equal(m.numpy(), want["masks"][i])
    for workers in (0, 2):
        check_rows(ds.loader(batch_size=8, num_workers=workers, shuffle=True, seed=workers), want)
    check_rows(ds.loader(batch_size=8, num_workers=2, device="cpu"), want)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_plain_dataloader_batches_the_stored_values(path, workers):
    want = stored(path)
    ds = H5Dataset(path, fields=("images", "masks"), return_index=True)
    check_rows(DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers), want)
    single = H5Dataset(path, fields="images")
    got = torch.cat(list(DataLoader(single, batch_size=8, num_workers=workers)))
    assert got.dtype == torch.uint8 and np.array_equal(got.numpy(), want["images"])


def _collate_and_tell(batch):
    """h5forge's collate, and whether the batch it passed through was read into shared memory."""
    x, m, rows = collate(batch)
    assert get_worker_info() is not None
    return x, m, rows, torch.tensor(x.is_shared())


def test_h5forge_collate_in_a_plain_dataloader_sends_batches_as_read(path):
    want = stored(path)
    ds = H5Dataset(path, fields=("images", "masks"), return_index=True)
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=1, collate_fn=_collate_and_tell)
    for epoch in range(2):  # a new worker each epoch, its first batch in ordinary memory, the others shared
        batches = list(loader)
        check_rows([b[:3] for b in batches], want)
        assert [bool(b[3]) for b in batches] == [False] + [True] * (len(batches) - 1), epoch
    assert ds._shared_out is False  # only the workers' copies changed
    plain = DataLoader(H5Dataset(path, fields=("images", "masks"), return_index=True), batch_size=4, collate_fn=collate)
    check_rows(plain, want)  # in process: nothing to send


def test_standardised_images_are_float32(path):
    norm = H5Dataset(path, fields="images", normalize=True)
    assert norm[0].dtype == torch.float32
    with pytest.raises(ValueError, match="normalize=True"):
        H5Dataset(path, fields="images", normalize=True, image_dtype="uint8")


def test_importing_the_reader_changes_nothing_in_torch():
    code = (
        "import torch.utils.data._utils.collate as c\n"
        "before = dict(c.default_collate_fn_map)\n"
        "import h5forge.read.torch\n"
        "assert c.default_collate_fn_map == before, set(c.default_collate_fn_map) ^ set(before)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    source = (REPO / "src" / "h5forge" / "read" / "torch.py").read_text()
    assert "_utils" not in source  # torch's public API only

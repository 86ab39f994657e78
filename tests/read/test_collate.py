"""Variable-length collate: pad to the longest and return the lengths (numpy and torch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from h5forge.read._collate import Padded, VarlenCollate, pad_batch, varlen_collate


def test_pad_batch_numpy_and_torch():
    arrays = [np.full((n, 2), n, dtype=np.float32) for n in (3, 1, 5)]
    values, lengths = pad_batch(arrays, pad_value=-1)
    assert values.shape == (3, 5, 2) and lengths.tolist() == [3, 1, 5]
    assert (values[1, 1:] == -1).all() and (values[2] == 5).all() and (values[0, :3] == 3).all()
    tv, tl = pad_batch([torch.from_numpy(a) for a in arrays])
    assert isinstance(tv, torch.Tensor) and tl.dtype == torch.int64
    assert np.array_equal(tv.numpy(), np.where(values == -1, 0, values))
    # another axis (e.g. (C, T) signals)
    v, l = pad_batch([np.ones((2, 4)), np.ones((2, 6))], axis=1)
    assert v.shape == (2, 2, 6) and l.tolist() == [4, 6] and v[0, :, 4:].sum() == 0
    with pytest.raises(ValueError, match="differ"):
        pad_batch([np.ones((2, 3)), np.ones((3, 4))])


class Signals(Dataset):
    """Synthetic variable-length samples: (signal (T_i, 3) float32, label int, name str)."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.arange((i + 1) * 3, dtype=torch.float32).reshape(i + 1, 3), i % 3, f"s{i}"


def test_varlen_collate_in_a_dataloader():
    loader = DataLoader(Signals(), batch_size=4, collate_fn=VarlenCollate(varlen=(0,), pad_value=0), num_workers=2)
    batches = list(loader)
    (sig, lengths), labels, names = batches[0]
    assert isinstance(batches[0][0], Padded)
    assert sig.shape == (4, 4, 3) and lengths.tolist() == [1, 2, 3, 4]
    assert labels.tolist() == [0, 1, 2, 0] and names == ["s0", "s1", "s2", "s3"]
    for k in range(4):  # the valid part equals the sample, the rest is padding
        ref = Signals()[k][0]
        assert torch.equal(sig[k, : lengths[k]], ref) and sig[k, lengths[k]:].abs().sum() == 0
    assert batches[-1][0].values.shape == (2, 10, 3)


def test_varlen_collate_dicts():
    batch = [{"x": np.ones((n,)), "y": np.float32(n)} for n in (2, 5)]
    out = varlen_collate(batch, varlen=("x",))
    assert out["x"].values.shape == (2, 5) and out["x"].lengths.tolist() == [2, 5]
    assert out["y"].tolist() == [2.0, 5.0]

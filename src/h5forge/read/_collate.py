"""Collating variable-length samples: pad to the longest in the batch and return the lengths.

Works on numpy arrays and on torch tensors (torch in, torch out), and is importable without torch.
The variable axis is ``axis`` (the first by default, e.g. (T, C) signals); every other axis must
agree within the batch.

    padded, lengths = pad_batch([np.ones((3, 2)), np.ones((5, 2))])   # (2, 5, 2), [3, 5]
    loader = DataLoader(ds, batch_size=8, collate_fn=VarlenCollate(varlen=("signal",)))
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np


class Padded(NamedTuple):
    values: Any  # (B, L_max, ...) array/tensor
    lengths: Any  # (B,) int64: the true length of each row


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def pad_batch(arrays: Sequence[Any], pad_value: float = 0, axis: int = 0, dtype: Any = None) -> Padded:
    """Stack arrays that differ in length along ``axis`` into one padded array plus lengths."""
    if len(arrays) == 0:
        raise ValueError("pad_batch needs at least one array")
    torch_in = _is_torch(arrays[0])
    if torch_in:
        import torch

        arrs = [a if dtype is None else a.to(dtype) for a in arrays]
    else:
        arrs = [np.asarray(a) if dtype is None else np.asarray(a, dtype=dtype) for a in arrays]
    nd = arrs[0].ndim
    ax = axis % max(nd, 1)
    lengths = [a.shape[ax] for a in arrs]
    if len({tuple(s for k, s in enumerate(a.shape) if k != ax) for a in arrs}) != 1 or any(a.ndim != nd for a in arrs):
        raise ValueError(f"arrays differ in more than axis {axis}: shapes {[tuple(a.shape) for a in arrs]}")
    shape = (len(arrs), *arrs[0].shape[:ax], max(lengths), *arrs[0].shape[ax + 1 :])
    if torch_in:
        out = torch.full(shape, pad_value, dtype=arrs[0].dtype)
        for i, t in enumerate(arrs):
            out[i].narrow(ax, 0, t.shape[ax]).copy_(t)
        return Padded(out, torch.tensor(lengths, dtype=torch.int64))
    padded = np.full(shape, pad_value, dtype=np.result_type(*arrs))
    for i, a in enumerate(arrs):
        padded[i][(slice(None),) * ax + (slice(0, a.shape[ax]),)] = a
    return Padded(padded, np.array(lengths, dtype=np.int64))


def _stack(items: Sequence[Any]) -> Any:
    first = items[0]
    if _is_torch(first):
        import torch

        return torch.stack(list(items))
    if isinstance(first, (np.ndarray, np.generic, int, float, bool)):
        return np.stack([np.asarray(x) for x in items])
    return list(items)  # strings and other objects: a list


class VarlenCollate:
    """Collate samples (tuples, dicts or single arrays); the fields named in ``varlen`` (tuple
    positions or dict keys) become ``Padded(values, lengths)``, the others are stacked.
    Picklable, so it can be a DataLoader ``collate_fn`` under spawn."""

    def __init__(self, varlen: Iterable[int | str] = (), pad_value: float = 0, axis: int = 0):
        self.varlen = set(varlen)
        self.pad_value = pad_value
        self.axis = axis

    def _one(self, key: Any, items: Sequence[Any]) -> Any:
        if key in self.varlen:
            return pad_batch(items, self.pad_value, self.axis)
        return _stack(items)

    def __call__(self, batch: Sequence[Any]) -> Any:
        if len(batch) == 0:
            raise ValueError("empty batch")
        first = batch[0]
        if isinstance(first, dict):
            return {k: self._one(k, [b[k] for b in batch]) for k in first}
        if isinstance(first, (tuple, list)):
            return tuple(self._one(i, [b[i] for b in batch]) for i in range(len(first)))
        return self._one(0, batch)


def varlen_collate(batch: Sequence[Any], varlen: Iterable[int | str] = (0,), pad_value: float = 0) -> Any:
    """Functional form of :class:`VarlenCollate`."""
    return VarlenCollate(varlen, pad_value)(batch)

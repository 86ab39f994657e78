"""JAX reader: numpy batches, and a random-access source usable by Grain.

    from h5forge.read.jax import Source, batches
    for batch in batches("data/demo/dataset_latest.h5", split="train", batch_size=32, seed=0, epoch=e):
        images, masks = batch["images"], batch["masks"]   # numpy float32 (B,3,H,W), int32 (B,1,H,W)
        step(jax.device_put(images), ...)                 # or batches(..., as_jax=True)

    source = Source("data/demo/dataset_latest.h5", split="train")   # grain.MapDataset.source(source)
    len(source); source[7] -> {"images": (3,H,W) float32, "masks": (1,H,W) int32}

Masks default to int32, as JAX truncates int64 unless ``jax_enable_x64`` is set. The source pins
its version and pickles without a handle, like the torch reader; jax itself is imported only for
``as_jax=True``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterator, Sequence

import numpy as np

from h5forge.errors import ReadError
from h5forge.kinds import read_options
from h5forge.read._reader import (
    DEFAULT_CACHE_CHUNKS,
    INDEX_FIELD,
    SplitReader,
    model_batch,
    output_dtypes,
    sample_value,
)
from h5forge.read._sampler import DEFAULT_WINDOW, ChunkOrder

__all__ = ["Source", "batches", "ReadError"]


class Source:
    """Grain-style random-access data source over one split: ``__len__`` and ``__getitem__``
    (records are dicts of numpy arrays), plus ``get_batch(indices)`` for a coalesced batched read."""

    def __init__(
        self,
        path: str | os.PathLike,
        split: str = "train",
        fields: Sequence[str] | str | None = None,
        *,
        channels_last: bool = False,
        locking: bool | None = None,
        cache_chunks: int = DEFAULT_CACHE_CHUNKS,
        return_index: bool = False,
        **options: Any,
    ):
        self.reader = SplitReader(path, split, fields, locking=locking, cache_chunks=cache_chunks)
        self.options = read_options("jax", options)
        self._dtypes = output_dtypes(self.reader, self.options)
        self.channels_last = channels_last
        self.return_index = return_index

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, record_key: int) -> dict[str, np.ndarray]:
        raw = self.reader.read_one(record_key)  # checked there: int() would take 1.7 for row 1
        out = {}
        for name, a in raw.items():
            v = sample_value(self.reader.fields[name], a, self.options, self._dtypes[name])
            channels = self.channels_last and np.ndim(v) > 1 and not self.reader.fields[name].ragged
            out[name] = np.ascontiguousarray(np.moveaxis(v, 0, -1)) if channels else v
        if self.return_index:
            out[INDEX_FIELD] = np.int64(self.reader.row(record_key))
        return out

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        return model_batch(self.reader, indices, self.options, self.channels_last, self.return_index)

    @property
    def version(self) -> int:
        return self.reader.version

    @property
    def chunk_rows(self) -> int:
        return self.reader.chunk_rows

    def close(self) -> None:
        self.reader.close()

    def __repr__(self) -> str:
        return f"h5forge.read.jax.Source({self.reader.path!r}, split={self.reader.split!r}, n={len(self)})"


def batches(
    source: Source | str | os.PathLike,
    split: str = "train",
    fields: Sequence[str] | str | None = None,
    *,
    batch_size: int = 32,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    drop_last: bool = True,
    window: int = DEFAULT_WINDOW,
    num_replicas: int | None = None,
    rank: int | None = None,
    as_jax: bool = False,
    **source_kwargs: Any,
) -> Iterator[dict[str, np.ndarray]]:
    """One epoch of batches {field: array}: chunk-aware shuffled order seeded by (seed, epoch),
    this process's equal-length shard when ``num_replicas`` > 1 (defaults to
    ``jax.process_count()`` / ``jax.process_index()`` when jax is already imported)."""
    src = source if isinstance(source, Source) else Source(source, split, fields, **source_kwargs)
    if num_replicas is None or rank is None:
        world, me = 1, 0
        if "jax" in sys.modules:
            jax = sys.modules["jax"]
            world, me = jax.process_count(), jax.process_index()
        num_replicas = world if num_replicas is None else num_replicas
        rank = me if rank is None else rank
    order = ChunkOrder(
        len(src), src.chunk_rows, shuffle=shuffle, seed=seed, window=window, num_replicas=num_replicas, rank=rank
    ).indices(epoch)
    put = None
    if as_jax:
        import jax

        put = jax.device_put
    stop = len(order) - (len(order) % batch_size if drop_last else 0)
    for start in range(0, stop, batch_size):
        batch = src.get_batch(order[start : start + batch_size])
        yield {k: put(v) for k, v in batch.items()} if put is not None else batch

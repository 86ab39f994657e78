"""TensorFlow reader: ``tf.data.Dataset.from_generator`` with a declared output signature.

    import h5forge.read.tf
    ds = h5forge.read.tf.dataset("data/demo/dataset_latest.h5", split="train", batch_size=32, shuffle=True)
    for images, masks in ds:   # float32 (B,H,W,3) in [0,1], int64 (B,H,W,1)
        ...
    model.fit(ds, epochs=10)   # each pass over ds is a new epoch (new chunk-aware order)

Channels last by default (Keras' convention); the version is pinned when ``dataset`` is called.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import tensorflow as tf

from h5forge.errors import ReadError
from h5forge.kinds import read_options
from h5forge.read._reader import DEFAULT_CACHE_CHUNKS, INDEX_FIELD, SplitReader, model_batch, output_dtypes
from h5forge.read._sampler import DEFAULT_WINDOW, ChunkOrder

__all__ = ["dataset"]


def dataset(
    path: str | os.PathLike,
    split: str = "train",
    fields: Sequence[str] | str | None = None,
    *,
    batch_size: int | None = 32,
    shuffle: bool = False,
    seed: int = 0,
    drop_remainder: bool = False,
    channels_last: bool = True,
    window: int = DEFAULT_WINDOW,
    num_replicas: int = 1,
    rank: int = 0,
    locking: bool | None = None,
    cache_chunks: int = DEFAULT_CACHE_CHUNKS,
    prefetch: int | None = 2,
    return_index: bool = False,
    **options: Any,
) -> tf.data.Dataset:
    """A tf.data.Dataset of tuples in ``fields`` order (a single tensor for one field), batched
    when ``batch_size`` is given; ``num_replicas``/``rank`` give this worker's shard, text columns
    come as tf.string, ``return_index`` adds each sample's row last."""
    reader = SplitReader(path, split, fields, locking=locking, cache_chunks=cache_chunks)
    ragged = [name for name, fi in reader.fields.items() if fi.ragged]
    if ragged:
        raise ReadError(
            f"{path}: {ragged} vary in length per sample; the TF reader serves fixed-size fields "
            "(read them with h5forge.read.torch or h5forge.read.jax)"
        )
    opts = read_options("tf", options)
    dtypes = output_dtypes(reader, opts)
    order = ChunkOrder(
        len(reader), reader.chunk_rows, shuffle=shuffle, seed=seed, window=window, num_replicas=num_replicas, rank=rank
    )
    names = (*reader.field_names, *((INDEX_FIELD,) if return_index else ()))
    lead = () if batch_size is None else ((batch_size,) if drop_remainder else (None,))
    specs = []
    for name in reader.field_names:
        fi = reader.fields[name]
        shape = tuple(fi.shape[1:]) + (fi.shape[0],) if channels_last and len(fi.shape) > 1 else fi.shape
        dtype = tf.string if dtypes[name] is None else tf.as_dtype(dtypes[name])
        specs.append(tf.TensorSpec(shape=lead + tuple(shape), dtype=dtype, name=name))
    if return_index:
        specs.append(tf.TensorSpec(shape=lead, dtype=tf.int64, name=INDEX_FIELD))
    signature = specs[0] if len(specs) == 1 else tuple(specs)

    def generate():
        idx = order.next_epoch()
        step = batch_size or 1
        stop = len(idx) - (len(idx) % step if (batch_size and drop_remainder) else 0)
        for start in range(0, stop, step):
            b = model_batch(reader, idx[start : start + step], opts, channels_last, return_index)
            cols = tuple(b[n] if batch_size else b[n][0] for n in names)
            yield cols[0] if len(cols) == 1 else cols

    ds = tf.data.Dataset.from_generator(generate, output_signature=signature)
    return ds.prefetch(prefetch) if prefetch else ds

"""Chunk-aware, seeded, shardable sample orders (framework-free; torch wraps it as a Sampler).

An epoch's order permutes the chunks, cuts them into windows of ``window`` chunks and permutes the
samples inside each window, so a chunk cache of ``window`` chunks decompresses each chunk once per
epoch (with one sample per chunk: a plain shuffle). Seeded by ``(seed, epoch)``, the same on every
rank. For DDP the order is cut into ``num_replicas`` contiguous, equal-length shards: with
``drop_last=True`` the ``n % num_replicas`` last samples are left out, else the order wraps around
to pad the last shard.
"""

from __future__ import annotations

import numpy as np

DEFAULT_WINDOW = 8  # chunks shuffled together (matches the reader's default chunk cache)


def epoch_order(
    n: int, chunk_rows: int = 1, *, shuffle: bool = True, seed: int = 0, epoch: int = 0, window: int = DEFAULT_WINDOW
) -> np.ndarray:
    """A permutation of ``range(n)`` (``arange(n)`` when not shuffling)."""
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    chunk_rows = max(1, int(chunk_rows))
    window = max(1, int(window))
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch) & 0xFFFFFFFF])
    if chunk_rows == 1:
        return rng.permutation(n).astype(np.int64)
    n_chunks = -(-n // chunk_rows)
    chunk_perm = rng.permutation(n_chunks)
    parts = []
    for w in range(0, n_chunks, window):
        chunks = chunk_perm[w : w + window]
        rows = np.concatenate([np.arange(c * chunk_rows, min(n, (c + 1) * chunk_rows)) for c in chunks])
        parts.append(rng.permutation(rows))
    return np.concatenate(parts).astype(np.int64)


def shard(order: np.ndarray, num_replicas: int = 1, rank: int = 0, drop_last: bool = True) -> np.ndarray:
    """This rank's contiguous, equal-length share of an epoch order."""
    if num_replicas < 1 or not 0 <= rank < num_replicas:
        raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
    n = order.size
    if num_replicas == 1:
        return order
    per = shard_len(n, num_replicas, drop_last)
    if per * num_replicas > n and n:  # without drop_last: wrapped around to fill the last shard
        order = np.concatenate([order, np.resize(order, per * num_replicas - n)])
    return order[rank * per : (rank + 1) * per]


def shard_len(n: int, num_replicas: int = 1, drop_last: bool = True) -> int:
    return n // num_replicas if drop_last else -(-n // num_replicas)


class ChunkOrder:
    """Epoch orders for one rank. Each pass uses ``self.epoch`` and then advances it by one, so
    calling ``set_epoch(e)`` before every epoch (the DistributedSampler habit) and never calling it
    give the same sequence of orders."""

    def __init__(
        self,
        n: int,
        chunk_rows: int = 1,
        *,
        shuffle: bool = True,
        seed: int = 0,
        window: int = DEFAULT_WINDOW,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = True,
    ):
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.n, self.chunk_rows, self.shuffle, self.seed = int(n), int(chunk_rows), shuffle, int(seed)
        self.window, self.num_replicas, self.rank, self.drop_last = int(window), int(num_replicas), int(rank), drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        e = self.epoch if epoch is None else int(epoch)
        order = epoch_order(self.n, self.chunk_rows, shuffle=self.shuffle, seed=self.seed, epoch=e, window=self.window)
        return shard(order, self.num_replicas, self.rank, self.drop_last)

    def next_epoch(self) -> np.ndarray:
        """The current epoch's indices; then advances the epoch."""
        out = self.indices()
        self.epoch += 1
        return out

    def __len__(self) -> int:
        return shard_len(self.n, self.num_replicas, self.drop_last)

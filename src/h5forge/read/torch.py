"""PyTorch reader: a map-style Dataset with a batched fast path and a chunk-aware sampler.

    from h5forge.read.torch import H5Dataset
    ds = H5Dataset("data/demo/dataset_latest.h5", split="train", fields=("images", "masks"))
    for images, masks in ds.loader(batch_size=32, num_workers=2, shuffle=True, seed=0):
        images = images.cuda().float().div_(255)   # uint8 as stored: converted on the device

Values come as stored unless asked otherwise (``image_dtype="float32"``, ``mask_dtype="int64"``);
``H5Dataset.loader`` says where they are then converted. ``ds`` also works in a plain
``DataLoader`` (``collate_fn=collate`` sends each batch as read, as ``ds.loader()`` does).
Importing this module changes nothing in torch. docs/reading.md has the guarantees (pinned
version, lazy per-worker handles, DDP shards).
"""

from __future__ import annotations

import math
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
import copy
import sys
import threading
from typing import Any, Callable, Iterator, Literal, Sequence, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate, get_worker_info

from h5forge.errors import ReadError
from h5forge.kinds import FieldKind, ReadOptions, read_options
from h5forge.read._collate import Padded
from h5forge.read._reader import (
    DEFAULT_CACHE_CHUNKS,
    INDEX_FIELD,
    SliceIndex,
    dense_values,
    model_values,
    output_dtypes,
    sample_value,
    slice_cache_default,
)
from h5forge.read._remote import open_split
from h5forge.read._sampler import DEFAULT_WINDOW, ChunkOrder

__all__ = ["H5Dataset", "ChunkShuffleSampler", "ReadError", "ShardedTwice", "collate"]


ALIGN = 64  # bytes: every output of a batch starts on a cache line of the shared block
_SCRATCH = threading.local()  # per thread: the stored rows of one sample, before ds[i] converts them


def _empty_batch(
    specs: dict[str, tuple[tuple[int, ...], torch.dtype]], pool: "_BlockPool | None" = None, shared: bool = False
) -> dict[str, torch.Tensor]:
    """New tensors for one batch. In a loader worker (``shared``) they are views into ONE
    shared-memory block (from ``pool`` when given), so the batch crosses to the main process in a
    single transfer however many fields it has; elsewhere they are ordinary tensors."""
    if not shared or get_worker_info() is None:
        # separate tensors: a block over glibc's 32 MiB mmap ceiling would be mapped afresh (and
        # page-faulted) every batch, while smaller ones are reused from the heap
        return {name: torch.empty(shape, dtype=dtype) for name, (shape, dtype) in specs.items()}
    sizes = {name: math.prod(shape) * dtype.itemsize for name, (shape, dtype) in specs.items()}
    total = max(1, sum(-(-b // ALIGN) * ALIGN for b in sizes.values()))
    block = pool.take(total) if pool is not None else _shared_block(total)
    out, at = {}, 0
    for name, (shape, dtype) in specs.items():
        out[name] = block[at : at + sizes[name]].view(dtype).view(shape)
        at += -(-sizes[name] // ALIGN) * ALIGN
    return out


def _shared_block(nbytes: int) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes, device="cpu"))


class _BlockPool:
    """The shared-memory blocks one loader worker writes its batches into, in turn: refilling a
    mapped block costs no page faults, where a new one faults every page.

    Only ``convert="after"`` uses a pool, which drops each batch once converted. A worker is at
    most ``prefetch_factor`` batches ahead and the main process converts one batch while receiving
    the next, so with ``size`` = prefetch_factor + 3 the block being refilled is no longer read."""

    def __init__(self, size: int):
        self.size = size
        self._pid: int | None = None
        self._blocks: list[torch.Tensor | None] = []
        self._turn = 0

    def take(self, nbytes: int) -> torch.Tensor:
        if self._pid != os.getpid():  # each worker process has its own blocks (none inherited by fork)
            self._pid, self._blocks, self._turn = os.getpid(), [None] * self.size, 0
        k = self._turn % self.size
        self._turn += 1
        block = self._blocks[k]
        if block is None or block.numel() < nbytes:
            block = self._blocks[k] = _shared_block(nbytes)
        return block[:nbytes]

    def __getstate__(self) -> dict:  # a spawned worker starts with no blocks
        return {"size": self.size, "_pid": None, "_blocks": [], "_turn": 0}


def _row(column: Any, k: int) -> Any:
    """Sample ``k`` of a batch column (a padded ragged column gives back its row's own length)."""
    if isinstance(column, Padded):
        return column.values[k, : int(column.lengths[k])]
    return column[k]


class _Batch(list):
    """What ``__getitems__`` returns: the samples torch expects (views into the batch tensors),
    plus the batch already stacked, which :func:`collate` passes through, and the dataset that
    read it (``owner``)."""

    def __init__(self, samples: list, stacked: Any, owner: "H5Dataset | None" = None):
        super().__init__(samples)
        self.stacked = stacked
        self.owner = owner


def collate(batch: Any) -> Any:
    """``collate_fn`` for H5Dataset: a batch from ``__getitems__`` as it is, anything else through
    torch's default_collate. In a worker, the dataset then reads its later batches straight into
    shared memory, so they are sent without a copy."""
    if isinstance(batch, _Batch):
        if batch.owner is not None and not batch.owner._shared_out and get_worker_info() is not None:
            batch.owner._shared_out = True  # this worker's own copy of the dataset
        return batch.stacked
    return default_collate(batch)


class H5Dataset(Dataset):
    """One split of an h5forge version file as a torch map-style Dataset.

    Items are tuples in ``fields`` order (a single tensor for one field), each value as its
    field's kind returns it: images and masks uint8 as stored unless ``**options`` (the kinds'
    options, ``h5forge.kinds.reader_options()``: ``image_dtype="float32"``, ``normalize=True``,
    ``mask_dtype="int64"``, ``window=seconds``, ...) ask otherwise; labels int64; annotation
    columns (``"label"`` or ``"meta/label"``) as tensors or lists of strings. A ragged field (a
    signal, a CT case) comes at its own length, batched as ``Padded(values, lengths)``.
    ``return_index=True`` adds each sample's row last, to match shuffled batches to ``ids()``.

    ``unit="slice"`` serves the slices of the volume fields one by one for 2-D training ((H, W), or
    (2k+1, H, W) with ``context=k``); other fields give their case's value, ``return_index`` its row.

    ``transform`` runs on each sample, ``batch_transform`` on each batch in the worker.
    ``locking=False`` opens without HDF5 file locks; ``cache_chunks`` (keep it at least the
    sampler's window) or ``rdcc_nbytes`` size the per-worker chunk cache. ``path`` may be a URL
    (docs/reading.md, "From a bucket"), read with ``verify_rows``, ``storage_options`` and
    ``cache_dir``.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        split: str = "train",
        fields: Sequence[str] | str | None = None,
        *,
        transform: Callable[[Any], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        locking: bool | None = None,
        cache_chunks: int = DEFAULT_CACHE_CHUNKS,
        rdcc_nbytes: int | None = None,
        return_index: bool = False,
        unit: Literal["sample", "slice"] = "sample",
        context: int = 0,
        slice_cache: int | None = None,
        verify_rows: bool = False,
        storage_options: dict | None = None,
        cache_dir: str | os.PathLike | None = None,
        **options: Any,
    ):
        if slice_cache is None:
            slice_cache = slice_cache_default(context) if unit == "slice" else 0
        remote = {  # only for a URL: open_split refuses them for a local file
            k: v
            for k, v in dict(verify_rows=verify_rows, storage_options=storage_options, cache_dir=cache_dir).items()
            if v
        }
        self.reader = open_split(
            path,
            split,
            fields,
            locking=locking,
            cache_chunks=cache_chunks,
            rdcc_nbytes=rdcc_nbytes,
            slice_cache=slice_cache,
            **remote,
        )
        self.slices = SliceIndex(self.reader, context) if unit == "slice" else None
        self.options = read_options("torch", options)
        self._dtypes = output_dtypes(self.reader, self.options)  # refuses unknown dtypes here, not in a worker
        self._tensor_dtypes = {name: _torch_dtype(d) for name, d in self._dtypes.items() if d is not None}
        self.transform, self.batch_transform = transform, batch_transform
        self.return_index = return_index
        self._single = len(self.reader.fields) == 1 and not return_index
        # fixed-size fields whose model dtype differs from the stored one: ds[i] reads their rows into
        # a per-thread buffer and converts from there
        self._converted_rows = frozenset(
            name
            for name, fi in self.reader.fields.items()
            if fi.bulk and not fi.ragged and self._dtypes[name] is not None and self._dtypes[name] != fi.dtype
        )
        # fields a loader may ship as stored and convert after the transfer (unless a transform needs
        # model values in the worker)
        hooks = transform is not None or batch_transform is not None
        self._deferrable = frozenset() if hooks or unit != "sample" else self._converted_rows
        # unit="slice" over one volume field returned as stored: ds[i] is the slice read, as a tensor
        stored = all(fi.ragged and self._dtypes[n] == fi.dtype for n, fi in self.reader.fields.items())
        plain = self.slices is not None and self._single and not hooks and stored
        self._plain_slice = next(iter(self.reader.fields)) if plain else None
        self._ship_stored = False  # True on the copy a loader with convert="after"/None hands to its workers
        self._pool: _BlockPool | None = None  # on the copy a loader with convert="after" hands to its workers
        self._shared_out = False  # True on the copy ds.loader() hands to its workers: batches read into shared memory

    # ---- description -------------------------------------------------------------------------
    path = property(lambda self: self.reader.path)
    real_path = property(lambda self: self.reader.real_path, doc="the version file actually read (pinned)")
    version = property(lambda self: self.reader.version)
    split = property(lambda self: self.reader.split)
    fields = property(lambda self: self.reader.field_names)
    chunk_rows = property(lambda self: self.reader.chunk_rows)
    info = property(lambda self: dict(self.reader.fields))

    def ids(self) -> list[str]:
        return self.reader.ids()

    def meta(self, column: str) -> np.ndarray:
        return self.reader.meta(column)

    def __len__(self) -> int:
        return len(self.slices) if self.slices is not None else len(self.reader)

    def __repr__(self) -> str:
        return (
            f"H5Dataset({self.path!r}, split={self.split!r}, fields={self.fields}, version={self.version}, "
            f"n={len(self)})"
        )

    def close(self) -> None:
        self.reader.close()

    # ---- conversion --------------------------------------------------------------------------
    def _one(self, name: str, raw: Any) -> Any:
        fi, dtype = self.reader.fields[name], self._dtypes[name]
        if name in self._converted_rows:  # as model_values converts a batch of one row, straight into the tensor
            out = np.empty(fi.shape, dtype)
            fi.kind.convert(raw[None], out[None], self.options, fi.stats)
            return torch.from_numpy(out)
        v = sample_value(fi, raw, self.options, dtype)
        return v if isinstance(v, str) else torch.as_tensor(v)

    def _scratch(self) -> dict[str, np.ndarray]:
        """This thread's buffers for the stored rows of the fields ``ds[i]`` converts: read there,
        then converted into the new tensor, so a sample allocates only what it returns. One per
        field, even for fields of one shape and dtype: every field is read before any is converted."""
        bufs = _SCRATCH.__dict__.setdefault("bufs", {})
        out = {}
        for name in self._converted_rows:
            fi = self.reader.fields[name]
            key = (name, fi.shape, fi.dtype.str)
            if key not in bufs:
                bufs[key] = np.empty(fi.shape, fi.dtype)
            out[name] = bufs[key]
        return out

    def _value(self, name: str, raw: np.ndarray, out: torch.Tensor | None = None) -> Any:
        """The model value of stored rows: a tensor (written into ``out`` when given), or a list of
        strings for a text column."""
        fi, dtype = self.reader.fields[name], self._dtypes[name]
        if dtype is None or out is None:
            v = model_values(fi, raw, self.options, dtype)
            if isinstance(v, Padded):
                return Padded(torch.from_numpy(v.values), torch.from_numpy(v.lengths))
            return v if dtype is None else torch.from_numpy(np.asarray(v))
        if raw.dtype == dtype:
            np.copyto(out.numpy(), raw)
        else:
            fi.kind.convert(raw, out.numpy(), self.options, fi.stats)
        return out

    # ---- access ------------------------------------------------------------------------------
    def __getitem__(self, i: int) -> Any:
        if self._plain_slice is not None:
            return torch.from_numpy(self.slices.stack(self.reader, self._plain_slice, i))  # type: ignore[union-attr]
        if self.slices is not None:
            if self.transform is not None or self.batch_transform is not None:
                return self.__getitems__([i])[0]
            sample = self._slice_sample(i)  # no batch to build around one slice
            return sample[0] if self._single else sample
        raw = self.reader.read_one(i, self._scratch() if self._converted_rows else None)
        sample = tuple(self._one(n, a) for n, a in raw.items())
        if self.return_index:
            sample += (torch.tensor(self.reader.row(i)),)
        sample = sample[0] if self._single else sample
        return self.transform(sample) if self.transform is not None else sample

    def __getitems__(self, indices: Sequence[int]) -> _Batch:
        """A whole batch in one go: sorted, coalesced slice reads, each chunk decompressed once,
        converted batch-wise; returned in the requested order."""
        n = len(indices)
        if self.slices is not None:
            return self._batch(self._slice_columns(indices), n)
        shipped = self._deferrable if self._ship_stored else frozenset()  # left as stored, converted later
        dense = {
            name: ((n, *fi.shape), _torch_dtype(fi.dtype) if name in shipped else self._tensor_dtypes[name])
            for name, fi in self.reader.fields.items()
            if name in self._tensor_dtypes and not fi.ragged
        }
        if self.return_index:
            dense[INDEX_FIELD] = ((n,), torch.int64)
        outs = _empty_batch(dense, self._pool if shipped else None, self._shared_out)
        raw_out = {
            name: outs[name].numpy()
            for name, fi in self.reader.fields.items()
            if name in outs and (self._dtypes[name] == fi.dtype or name in shipped) and fi.bulk
        }  # read straight into place
        raw = self.reader.read(indices, out=raw_out)
        cols = tuple(
            outs[name] if name in raw_out else self._value(name, raw[name], outs.get(name))
            for name in self.reader.fields
        )
        if self.return_index:
            np.copyto(outs[INDEX_FIELD].numpy(), self.reader.checked(indices))
            cols += (outs[INDEX_FIELD],)
        return self._batch(cols, n)

    def _slice_sample(self, i: int) -> tuple:
        """unit="slice": ``ds[i]``'s values, as ``_slice_columns([i])`` would give them."""
        slices = self.slices
        assert slices is not None  # unit="slice"
        raw = slices.one(self.reader, i)
        sample = []
        for name, fi in self.reader.fields.items():
            value, dtype = raw[name], self._dtypes[name]
            if name in slices.ragged:
                if value.dtype != dtype:  # e.g. a volume_mask's labels, widened as model values
                    value = dense_values(fi, value[None], self.options, dtype)[0]
                sample.append(torch.from_numpy(value))
            else:  # the case's value, from a batch of one
                v = dense_values(fi, value, self.options, dtype)
                sample.append(v[0] if isinstance(v, list) else torch.from_numpy(np.ascontiguousarray(v))[0])
        if self.return_index:
            sample.append(torch.tensor(slices.case.item(slices.position(i))))
        return tuple(sample)

    def _slice_columns(self, indices: Sequence[int]) -> tuple:
        """unit="slice": each volume field as (B, [2k+1,] H, W), the others per case; the case rows last."""
        slices = self.slices
        assert slices is not None  # unit="slice"
        raw = slices.read(self.reader, indices)
        cols = []
        for name, fi in self.reader.fields.items():
            v = dense_values(fi, raw[name], self.options, self._dtypes[name])
            cols.append(v if isinstance(v, list) else torch.from_numpy(np.ascontiguousarray(v)))
        if self.return_index:
            cols.append(torch.from_numpy(slices.case[np.asarray(indices, dtype=np.int64)]))  # checked by read
        return tuple(cols)

    def _batch(self, cols: tuple, n: int) -> _Batch:
        def rows(columns: Sequence) -> list:
            per_column = [
                list(c.unbind(0)) if isinstance(c, torch.Tensor) else [_row(c, k) for k in range(n)] for c in columns
            ]
            return per_column[0] if self._single else list(zip(*per_column))

        if self.transform is not None:
            samples = [self.transform(sample) for sample in rows(cols)]
            stacked = collate(samples) if n else cols
            if not self._single and isinstance(stacked, list):
                stacked = tuple(stacked)
            return _Batch(samples, self.batch_transform(stacked) if self.batch_transform is not None else stacked, self)
        stacked = cols[0] if self._single else cols
        if self.batch_transform is None:
            return _Batch(rows(cols), stacked, self)
        stacked = self.batch_transform(stacked)
        columns = (stacked,) if self._single else stacked
        batched = isinstance(columns, (tuple, list)) and all(
            isinstance(c, (torch.Tensor, Padded)) and len(c.values if isinstance(c, Padded) else c) == n
            for c in columns
        )
        return _Batch(rows(columns) if batched else rows(cols), stacked, self)  # samples of the transformed batch

    def convert(self, batch: Any, device: str | torch.device | None = None) -> Any:
        """Model values of a batch whose fixed-size fields arrived as stored (``loader(convert=None)``;
        ``convert="after"`` calls this in the main process): each stored column becomes what ``ds[i]``
        returns, columns already converted stay as they are. With ``device`` every tensor column is
        moved there and the stored ones are converted there by torch kernels (``torch_convert``), to
        the same values."""
        target = None if device is None else torch.device(device)
        return self._convert(batch, target, self._targets(batch) if target is None else {})

    def _columns(self, batch: Any) -> Iterator[tuple[str, Any, bool]]:
        """(name, column, whether it is stored and converts) for each column of a batch."""
        cols = (batch,) if self._single else tuple(batch)
        for name, col in zip([*self.reader.fields, INDEX_FIELD], cols):
            fi = self.reader.fields[name] if name in self._deferrable else None
            yield name, col, fi is not None and isinstance(col, torch.Tensor) and col.dtype == _torch_dtype(fi.dtype)

    def _targets(self, batch: Any) -> dict[str, torch.Tensor]:
        """New CPU tensors for the model values of the batch's stored columns."""
        return {
            name: torch.empty(col.shape, dtype=self._tensor_dtypes[name])
            for name, col, stored in self._columns(batch)
            if stored
        }

    def _convert(self, batch: Any, device: torch.device | None, targets: dict[str, torch.Tensor]) -> Any:
        out = []
        for name, col, stored in self._columns(batch):
            fi = self.reader.fields[name] if stored else None
            if fi is not None and device is not None:
                col = torch_convert(
                    fi.kind, col.to(device, non_blocking=True), self._tensor_dtypes[name], self.options, fi.stats
                )
            elif fi is not None:
                fi.kind.convert(col.numpy(), targets[name].numpy(), self.options, fi.stats)
                col = targets[name]
            elif device is not None:
                col = _to_device(col, device)
            out.append(col)
        return out[0] if self._single else tuple(out)

    # ---- loading -----------------------------------------------------------------------------
    def sampler(
        self,
        *,
        shuffle: bool = True,
        seed: int = 0,
        window: int = DEFAULT_WINDOW,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = True,
    ) -> "ChunkShuffleSampler":
        return ChunkShuffleSampler(
            self, shuffle=shuffle, seed=seed, window=window, num_replicas=num_replicas, rank=rank, drop_last=drop_last
        )

    def loader(
        self,
        batch_size: int = 32,
        *,
        shuffle: bool = True,
        seed: int = 0,
        num_workers: int = 0,
        drop_last: bool = False,
        window: int = DEFAULT_WINDOW,
        num_replicas: int | None = None,
        rank: int | None = None,
        persistent_workers: bool | None = None,
        multiprocessing_context: Any = None,
        pin_memory: bool | None = None,
        prefetch_factor: int | None = None,
        convert: Literal["after", "worker"] | None = "after",
        device: str | torch.device | None = None,
        sampler: Any = None,
        **kwargs: Any,
    ) -> DataLoader:
        """A DataLoader with the chunk-aware sampler (sharded by rank under DDP; equal-length
        shards) and the batched fetch; the epoch advances on each pass.

        ``convert``, for a dataset asked for other dtypes than the stored ones: ``"after"`` (default)
        ships the stored dtypes from the workers, 4-8x fewer bytes, and converts each batch in the
        main process; ``"worker"`` converts in the workers; ``None`` keeps the stored dtypes (see
        ``ds.convert``). With a ``transform`` or ``batch_transform`` the workers always convert.
        ``device`` (with ``"after"``) moves each batch there as stored and converts it there
        (``pin_memory`` defaults to True for CUDA). ``sampler`` replaces the chunk-aware one
        (``shuffle``, ``seed``, ``window``, ``num_replicas`` and ``rank`` then do nothing)."""
        if convert not in ("after", "worker", None):
            raise ValueError(f"convert must be 'after', 'worker' or None, got {convert!r}")
        if device is not None:
            if convert != "after":
                raise ValueError(f"device= converts after the transfer: it needs convert='after', not {convert!r}")
            device = torch.device(device)
        if pin_memory is None:
            pin_memory = device is not None and device.type == "cuda"
        if sampler is None:
            sampler = self.sampler(shuffle=shuffle, seed=seed, window=window, num_replicas=num_replicas, rank=rank)
        extra: dict[str, Any] = {}
        if num_workers > 0:
            extra["persistent_workers"] = True if persistent_workers is None else persistent_workers
            if prefetch_factor is not None:
                extra["prefetch_factor"] = prefetch_factor
            if multiprocessing_context is not None:
                extra["multiprocessing_context"] = multiprocessing_context
        dataset = self
        # in process (num_workers=0) there is no transfer to spare: "after" converts as it reads,
        # unless the conversion is on a device
        ship = bool(self._deferrable) and (
            convert is None or (convert == "after" and (num_workers > 0 or device is not None))
        )
        if ship or num_workers > 0:
            dataset = copy.copy(self)  # shares the reader; only how the workers read and ship differs
            dataset._shared_out = num_workers > 0  # collate sends each batch as read: read it into shared memory
            dataset._ship_stored = ship
            if ship and convert == "after":  # each batch is dropped once converted: its block can be refilled
                dataset._pool = _BlockPool((2 if prefetch_factor is None else prefetch_factor) + 3)
        converting = convert == "after" and (ship or device is not None)
        loader = (_ConvertingLoader if converting else DataLoader)(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=num_workers,
            collate_fn=collate,
            drop_last=drop_last,
            pin_memory=pin_memory,
            **extra,
            **kwargs,
        )
        if converting:
            cast(_ConvertingLoader, loader).device = device
        return loader


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype


def _to_device(col: Any, device: str | torch.device) -> Any:
    if isinstance(col, torch.Tensor):
        return col.to(device, non_blocking=True)
    if isinstance(col, Padded):
        return Padded(*(_to_device(c, device) for c in col))
    return col  # a list of strings


def torch_convert(
    kind: FieldKind,
    raw: torch.Tensor,
    dtype: torch.dtype,
    opts: ReadOptions,
    stats: dict[str, np.ndarray],
    axis: int = 1,
) -> torch.Tensor:
    """What ``kind.convert`` makes of the stored rows ``raw``, by torch kernels on ``raw``'s device,
    following the kind's ``conversion`` steps: each is one IEEE operation per value, so the result
    is bit-equal to numpy's. The divisors are tensors because CUDA multiplies by the reciprocal of a
    Python-number divisor, off in the last bit. A kind without such steps converts on the CPU."""
    c = kind.conversion(opts, stats)
    if c is not None and (dtype.is_floating_point or (c.scale is None and c.mean is None)):
        out = raw.to(dtype)
        if not dtype.is_floating_point:
            return out
        if c.scale is not None:
            out.div_(torch.full((), c.scale, dtype=dtype, device=out.device))
        if c.mean is not None and c.std is not None:
            shape = [1] * out.dim()
            shape[axis] = -1
            std = np.where(c.std > 0, c.std, 1).astype(np.float32)
            out.sub_(torch.from_numpy(np.asarray(c.mean, np.float32)).to(out.device).view(shape))
            out.div_(torch.from_numpy(std).to(out.device).view(shape))
        return out
    dst = torch.empty(raw.shape, dtype=dtype)
    kind.convert(raw.cpu().numpy(), dst.numpy(), opts, stats, axis)
    return dst.to(raw.device, non_blocking=True)


class _ConvertingLoader(DataLoader):
    """A DataLoader whose dataset ships stored arrays: each batch is converted to model values in
    this process, after the transfer from the workers (``H5Dataset.convert``), on ``device``."""

    device: torch.device | None = None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # yields batches, as a DataLoader's iterator does
        """Batch k+1 is converted on a thread while batch k is with the caller and the next one is
        received (numpy and torch release the GIL while they convert)."""
        dataset, device = cast(H5Dataset, self.dataset), self.device
        # the last received batches stay referenced, so a block a worker sends again is found in
        # torch's mapping cache instead of being mapped (and page-faulted) afresh
        recent: deque = deque(maxlen=max(1, self.num_workers) * (self.prefetch_factor or 2) * 2 + 2)
        with ThreadPoolExecutor(1, thread_name_prefix="h5forge-convert") as converter:
            pending: Future | None = None
            for batch in super().__iter__():
                recent.append(batch)
                # the new tensors are made here: in the converter thread they would come from its own
                # malloc arena, which gives memory back to the kernel more often (more page faults)
                targets = dataset._targets(batch) if device is None else {}
                following = converter.submit(_converted, dataset, batch, device, targets)
                if pending is not None:
                    yield pending.result()
                pending = following
            if pending is not None:
                yield pending.result()


def _converted(dataset: H5Dataset, batch: Any, device: torch.device | None, targets: dict[str, torch.Tensor]) -> Any:
    return _own(dataset._convert(batch, device, targets), batch)


def _own(converted: Any, raw: Any) -> Any:
    """Columns a conversion passed through (labels, row numbers) copied out of the received block,
    which its worker refills a few batches later."""
    blocks = {
        c.untyped_storage().data_ptr()
        for c in ((raw,) if isinstance(raw, torch.Tensor) else raw)
        if isinstance(c, torch.Tensor)
    }
    if isinstance(converted, torch.Tensor):
        return converted.clone() if converted.untyped_storage().data_ptr() in blocks else converted
    return type(converted)(
        c.clone() if isinstance(c, torch.Tensor) and c.untyped_storage().data_ptr() in blocks else c for c in converted
    )


class ShardedTwice(ReadError):
    """A per-rank sampler handed to something that shards it again (each rank would see 1/world of its share)."""


class ChunkShuffleSampler(DistributedSampler):
    """Chunk-aware shuffling sampler (h5forge.read._sampler explains the order).

    ``chunk_rows`` defaults to the dataset's layout. Under torch.distributed, ``num_replicas`` and
    ``rank`` default to the world size and rank: each rank gets an equal-length, disjoint shard of
    the same epoch order (``drop_last=False`` pads by wrapping). Without ``set_epoch(e)`` each pass
    advances the epoch.

    It is a ``DistributedSampler`` so that frameworks leave it unsharded (Lightning's
    ``use_distributed_sampler``); one that shards it anyway would give each rank 1/world of its
    shard, and iterating it that way raises ``ShardedTwice``.
    """

    def __init__(
        self,
        data_source: Any,
        chunk_rows: int | None = None,
        *,
        shuffle: bool = True,
        seed: int = 0,
        window: int = DEFAULT_WINDOW,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = True,
    ):
        n = data_source if isinstance(data_source, int) else len(data_source)
        if chunk_rows is None:
            chunk_rows = int(getattr(data_source, "chunk_rows", 1) or 1)
        if num_replicas is None or rank is None:
            world, me = 1, 0
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                world, me = torch.distributed.get_world_size(), torch.distributed.get_rank()
            num_replicas = world if num_replicas is None else num_replicas
            rank = me if rank is None else rank
        self.order = ChunkOrder(
            n,
            chunk_rows,
            shuffle=shuffle,
            seed=seed,
            window=window,
            num_replicas=num_replicas,
            rank=rank,
            drop_last=drop_last,
        )
        # DistributedSampler's attributes, for code that reads them (its __init__ is not run: it
        # would need a process group, and it sizes shards its own way)
        self.dataset = data_source
        self.num_replicas, self.rank, self.shuffle, self.seed = num_replicas, rank, shuffle, seed
        self.drop_last = drop_last
        self.num_samples = len(self.order)
        self.total_size = self.num_samples * num_replicas

    @property
    def epoch(self) -> int:
        return self.order.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.order.set_epoch(value)

    def set_epoch(self, epoch: int) -> None:
        self.order.set_epoch(epoch)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        return self.order.indices(epoch)

    def __iter__(self) -> Iterator[int]:
        if self.num_replicas > 1 and isinstance(sys._getframe(1).f_locals.get("self"), Dataset):
            # a sampler read by a Dataset's method is being turned into a dataset to be sharded again
            # (Lightning's DistributedSamplerWrapper, _DatasetSamplerWrapper)
            world = self.num_replicas
            raise ShardedTwice(
                f"this loader's sampler already gives rank {self.rank} its 1/{world} share, and it is being sharded "
                f"again (each rank would read 1/{world} of its share): with Lightning use "
                "h5forge.read.lightning.H5DataModule, or Trainer(use_distributed_sampler=False), or for "
                "trainer.predict a loader with num_replicas=1, rank=0; elsewhere, do not wrap it in a "
                "DistributedSampler"
            )
        return iter(self.order.next_epoch().tolist())

    def __len__(self) -> int:
        return len(self.order)

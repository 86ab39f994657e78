"""What an image and its high-resolution partner (``paired``) share once stored: exact
per-channel histograms as split statistics (mean/std of value/255 follow; appends add the
histograms), float32 in [0, 1] (or uint8 as stored) for readers, and the picture as its preview.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import h5py
import numpy as np

from h5forge.kinds.preview import Preview
from h5forge.kinds.reading import Conversion, ReadOption, ReadOptions, Reading
from h5forge.kinds.statistics import Statistics

IMAGE_DTYPES = ("float32", "uint8")


def channel_counts(block: np.ndarray) -> np.ndarray:
    """(C, 256) exact counts of each 8-bit value per channel of a (n, C, ...) uint8 block, counted
    two pixels at a time (a pair of bytes is one uint16 bin, whose table's row and column sums are
    the two bytes' counts), which halves bincount's work."""
    n, channels = block.shape[:2]
    out = np.zeros((channels, 256), np.int64)
    if n == 0:
        return out
    flat = np.ascontiguousarray(block).reshape(n, channels, -1)
    even = flat.shape[2] - flat.shape[2] % 2
    for c in range(channels):
        plane = flat[:, c]
        if even:
            pairs = np.ascontiguousarray(plane[:, :even]).view(np.uint16).reshape(-1)
            table = np.bincount(pairs, minlength=65536).reshape(256, 256)
            out[c] = table.sum(axis=0) + table.sum(axis=1)
        if even < flat.shape[2]:
            out[c] += np.bincount(plane[:, even:].reshape(-1), minlength=256)
    return out


def channel_stats(hist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of value/255 from exact 8-bit histograms (C, 256)."""
    levels = np.arange(256, dtype=np.float64) / 255.0
    n = hist.sum(axis=1).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, (hist * levels).sum(axis=1) / n, 0.0)
        var = np.where(n > 0, (hist * levels**2).sum(axis=1) / n - mean**2, 0.0)
    return mean, np.sqrt(np.maximum(var, 0.0))


class Pictures(Reading, Statistics, Preview):
    """A field of (N, C, H, W) uint8 pictures."""

    name: str
    read_options = (
        ReadOption(
            "image_dtype",
            "float32",
            "uint8 as stored, or float32 in [0, 1]; torch returns uint8 unless asked (convert on the GPU), and"
            " float32 whenever normalize=True",
            {"torch": "uint8"},
        ),
        ReadOption("normalize", False, "standardise images with the split's per-channel mean/std"),
    )

    @property
    @abstractmethod
    def channels(self) -> int:
        """C, the channels of a picture."""

    # ---- statistics
    def _attr(self, what: str) -> str:
        return f"{self.name}_{what}"

    def counts(self, block: np.ndarray) -> np.ndarray:
        return channel_counts(block)

    def write_stats(self, group: h5py.Group, counts: np.ndarray | None) -> None:
        hist = np.zeros((self.channels, 256), np.int64) if counts is None else np.asarray(counts, np.int64)
        mean, std = channel_stats(hist)
        group.attrs[self._attr("mean")] = mean
        group.attrs[self._attr("std")] = std
        group.attrs[self._attr("histogram")] = hist

    def stored_counts(self, group: h5py.Group) -> np.ndarray:
        return np.asarray(group.attrs[self._attr("histogram")], np.int64)

    def stats_attrs(self) -> tuple[str, ...]:
        return tuple(self._attr(w) for w in ("mean", "std", "histogram"))

    def read_stats(self, group: h5py.Group) -> dict[str, np.ndarray]:
        return {
            w: np.asarray(group.attrs[self._attr(w)], np.float32)
            for w in ("mean", "std")
            if self._attr(w) in group.attrs
        }

    # ---- reading
    def output_dtype(self, opts: ReadOptions) -> np.dtype:
        """The reader's default dtype, or the one asked for; standardised values (``normalize``) are
        float32 whatever the reader's default, and refused as uint8 (they would come back unchanged)."""
        dtype, normalize = opts.values.get("image_dtype"), self.option(opts, "normalize")
        if dtype is None:
            dtype = "float32" if normalize else self.option(opts, "image_dtype")
        if dtype not in IMAGE_DTYPES:
            raise ValueError(f"image_dtype must be one of {IMAGE_DTYPES}, got {dtype!r}")
        if normalize and dtype != "float32":
            raise ValueError(f"normalize=True standardises images to float32; image_dtype={dtype!r} cannot hold them")
        return np.dtype(dtype)

    def conversion(self, opts: ReadOptions, stats: dict[str, np.ndarray]) -> Conversion:
        """uint8 as stored, or float32 value/255, standardised with the split's per-channel mean/std
        when the reader asks to ``normalize``."""
        standardise = self.option(opts, "normalize") and "mean" in stats and "std" in stats
        return Conversion(255.0, stats["mean"] if standardise else None, stats["std"] if standardise else None)

    def preview(self, value: Any) -> np.ndarray:
        tile = np.asarray(value).transpose(1, 2, 0)
        return np.repeat(tile, 3, axis=2) if tile.shape[2] == 1 else tile

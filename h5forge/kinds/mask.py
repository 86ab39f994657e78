"""``kind: mask``: a single-channel label mask that follows an image field.

Values must be a subset of {0,1} or {0,255} (stored {0,1}); anything else, such as 128, rejects
the sample, since it would otherwise become a silent NaN loss. Three equal channels are accepted.
A mask has its image's raw size and is cropped, shrunk (nearest) and padded exactly like it.
Readers get integers (int64 by default), shape (1, H, W).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from h5forge.kinds.base import Decoded, FieldKind, ReadOptions, Stored, StrictModel, read_source
from h5forge.kinds.image import apply_geometry, open_picture
from h5forge.samples import Reject, SampleRef

OVERLAY = np.array([230, 40, 40], dtype=np.uint8)  # preview colour of the mask's pixels


class MaskField(StrictModel):
    """A single-channel label mask with values {0,1} or {0,255}, stored as {0,1}."""

    kind: Literal["mask"] = "mask"
    files: str
    like: str = Field(description="the image field whose size and geometry this mask follows")
    max_pixels: int = Field(64_000_000, gt=0)


def mask_values(img, path: str) -> np.ndarray:
    """HW uint8 with values {0,1}."""
    mode = img.mode
    if mode == "1":
        return np.asarray(img, dtype=np.uint8)
    arr = np.asarray(img)
    if arr.ndim == 3:
        if mode in ("RGBA", "LA") and (arr[..., -1] != 255).any():
            raise Reject(path, "mask has transparency; masks must be a single opaque channel")
        colour = arr[..., :3] if arr.shape[2] >= 3 else arr[..., :1]
        if not (colour == colour[..., :1]).all():
            raise Reject(path, f"mask has {colour.shape[2]} different channels ({mode}); masks must be single-channel")
        arr = colour[..., 0]
    values = np.unique(arr) if arr.dtype != np.uint8 else np.flatnonzero(np.bincount(arr.ravel(), minlength=256))
    present = set(int(v) for v in values)
    if present <= {0, 1}:
        return arr.astype(np.uint8, copy=False)
    if present <= {0, 255}:
        return (arr == 255).astype(np.uint8)
    shown = sorted(present)[:8]
    raise Reject(path, f"mask values {shown}{'...' if len(present) > 8 else ''} not allowed: "
                       "a mask must hold {0,1} or {0,255}")


class MaskKind(FieldKind):
    kind = "mask"
    Spec = MaskField
    layout_doc = "(N, 1, H, W) uint8 with values {0,1}, chunked and compressed like its image"

    @classmethod
    def check_spec(cls, name: str, spec: MaskField, dataset: Any) -> None:
        target = dataset.fields.get(spec.like)
        if getattr(target, "kind", None) != "image":
            raise ValueError(f"fields.{name}.like: {spec.like!r} is not an image field")

    @property
    def after(self) -> tuple[str, ...]:
        return (self.spec.like,)

    def stored(self) -> Stored:
        return Stored((1, *self.dataset.fields[self.spec.like].size), np.uint8, bulk=True)

    def decode(self, root: Path, ref: SampleRef, done: dict[str, Decoded]) -> Decoded:
        rel = ref.files[self.name]
        data, digest = read_source(root, rel)
        values = mask_values(open_picture(data, rel, self.spec.max_pixels), rel)
        geometry = done[self.spec.like].context
        if values.shape != geometry.raw:
            ih, iw = geometry.raw
            raise Reject(rel, f"mask is {values.shape[0]}x{values.shape[1]} (HxW) but its image "
                              f"{ref.files[self.spec.like]} is {ih}x{iw}")
        arr = apply_geometry(values[..., None], geometry, 0, nearest=True)
        return Decoded(np.ascontiguousarray(arr.transpose(2, 0, 1)), digest)

    def output_dtype(self, opts: ReadOptions) -> np.dtype:
        dtype = np.dtype(opts.mask_dtype)
        if dtype.kind not in "iu":
            raise ValueError(f"mask_dtype must be an integer type, got {opts.mask_dtype!r}")
        return dtype

    def preview(self, value: Any) -> np.ndarray:
        return np.asarray(value)[0][..., None] * OVERLAY

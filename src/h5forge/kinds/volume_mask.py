"""``kind: volume_mask``: the label volume of a ``volume`` field, slice for slice.

    fields:
      ct:   {kind: volume, files: "cases/*", size: [512, 512]}
      ct_mask: {kind: volume_mask, files: "masks/*", like: ct, classes: 3}

A case's mask is a folder of one PNG per slice (numbered in slice order: ``0.png`` or
``slice_017.png``), a 3-D NIfTI label volume, or a DICOM SEG of a DICOM case (alone, in a folder,
or beside its slices; ``h5forge.kinds._volume_seg``). It must have the volume's depth and size
(a NIfTI label volume its voxel grid: spacing, axes and first voxel)
and values by the mask rules (a slice's picture is read as the 2-D mask reads one: a palette by
index, 16-bit and float values as they are); it is cropped and padded like the volume, and stored
ragged like it, with class counts and index as for 2-D masks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Mapping

import numpy as np
from pydantic import Field, model_validator

from h5forge._format.arrays import Ragged, Stored
from h5forge.kinds.base import Decoded, FieldModel, Globs, field_of
from h5forge.kinds.image import decode_picture
from h5forge.kinds.mask import (
    PAD_DOC,
    ClassMasks,
    binary_array,
    check_pad,
    class_array,
    class_picture,
    class_pixels,
    pad_of,
    picture_values,
)
from h5forge.kinds.image import plan_geometry
from h5forge.kinds.volume import (
    SPACING_TOLERANCE,
    VolumeField,
    crop_or_pad,
    is_dicom,
    is_nifti,
    load_case,
    moved_origin,
    physical_planes,
    read_case,
)
from h5forge.kinds._volume_seg import seg_labels
from h5forge._samples import Reject, SampleRef


class VolumeMaskField(FieldModel):
    """Per-slice labels of a volume field."""

    kind: Literal["volume_mask"] = "volume_mask"
    files: Globs = Field(description="a folder of per-slice PNGs per case, or NIfTI label volumes")
    like: str = Field(description="the volume field this mask labels")
    classes: int | None = Field(None, ge=2, le=255)
    ignore_value: int | None = Field(None, ge=0, le=255)
    pad_value: int | None = Field(None, ge=0, le=255, description=PAD_DOC)
    max_pixels: int = Field(64_000_000, gt=0)

    @property
    def pad(self) -> int:
        return pad_of(self.pad_value, self.ignore_value)

    @model_validator(mode="after")
    def _consistent(self) -> "VolumeMaskField":
        check_pad(self.pad, self.classes)
        return self


def _mm(values: Any) -> str:
    return "[" + ", ".join(f"{float(v):.4g}" for v in np.asarray(values).ravel()) + "]"


def _slice_number(name: str) -> int:
    digits = re.findall(r"\d+", Path(name).stem)
    if not digits:
        raise ValueError(name)
    return int(digits[-1])


class VolumeMaskKind(ClassMasks[VolumeMaskField]):
    kind = "volume_mask"
    Spec = VolumeMaskField
    follows = "volume"
    reads_folders = True
    layout_doc = (
        "ragged like its volume: (total slices, H, W) uint8 labels, plus <field>_lengths; split attr "
        "<field>_class_pixels (K,); /index/<split>/<field>: cases by class present"
    )

    def stored(self) -> Stored:
        return Stored(self.volume.size, np.uint8, bulk=True, ragged=True, chunk_elements=1)

    @property
    def volume(self) -> VolumeField:
        return field_of(self.dataset, self.spec.like, VolumeField)

    def _labels(self, root: Path, rel: str, parts: list, volume: dict, volume_rel: str) -> np.ndarray:
        """The case's labels as read (``parts``: its files, by ``read_case``)."""
        if is_nifti(rel):
            values, meta, _ = load_case(root, rel, labels=True)
            if not np.array_equal(values, np.round(values)):
                raise Reject(rel, "label volume holds values that are not whole numbers")
            if values.shape == volume["raw"]:
                self._same_grid(meta, volume, rel, volume_rel)
            return values.astype(np.int64)
        dicom = [(name, data) for name, data in parts if is_dicom(name, data)]
        if dicom:
            return seg_labels(dicom, rel, volume, volume_rel, self.spec.classes, self.spec.max_pixels)
        try:
            parts = sorted(parts, key=lambda p: _slice_number(p[0]))
        except ValueError as err:
            raise Reject(f"{rel}/{err}", "a slice mask's file name has no slice number") from None
        # each slice by the 2-D mask's rules: a palette slice by index (a binary one of black and
        # white by its colours), a 16-bit or float one by value, a class mask in a lossy format rejected
        binary = self.spec.classes is None
        decode = decode_picture if binary else class_picture
        slices = [
            picture_values(decode(data, f"{rel}/{name}", self.spec.max_pixels), f"{rel}/{name}", binary)
            for name, data in parts
        ]
        if len(sizes := {s.shape for s in slices}) > 1:
            listed = ", ".join("x".join(map(str, size)) for size in sorted(sizes))
            raise Reject(rel, f"slice masks of several sizes (HxW): {listed}")
        return np.stack(slices) if slices else np.zeros((0, 0, 0), np.uint8)

    def _same_grid(self, meta: dict, volume: dict, rel: str, volume_rel: str) -> None:
        """A NIfTI label volume's voxels must be its volume's: the same spacing, directions and first
        voxel (a label file flipped or turned, as canonical-orientation tools write them, would
        otherwise be stored mirrored against its volume)."""
        spacing, theirs = np.asarray(meta["spacing"], float), np.asarray(volume["spacing"], float)
        (_, rows, columns), (height, width) = volume["raw"], self.volume.size
        g = plan_geometry(rows, columns, height, width, self.volume.larger, rel)
        origin = moved_origin(meta, g.crop[0] - g.pad[0], g.crop[1] - g.pad[2])
        off = []
        if not np.allclose(spacing, theirs, rtol=1e-3, atol=0):
            off.append(f"spacing {_mm(spacing)} mm, its volume's {_mm(theirs)}")
        if not np.allclose(meta["direction"], volume["direction"], atol=1e-3):
            off.append(
                f"axes (LPS) {_mm(np.asarray(meta['direction']).ravel())}, its volume's "
                f"{_mm(np.asarray(volume['direction']).ravel())}"
            )
        elif np.abs(origin - volume["origin"]).max() > SPACING_TOLERANCE * min(theirs):
            off.append(f"first voxel at {_mm(origin)} mm (LPS), its volume's at {_mm(volume['origin'])}")
        if off:
            raise Reject(
                rel,
                f"label volume is not on the voxel grid of its volume {volume_rel}: "
                + "; ".join(off)
                + " (resample or reorient it onto the volume's grid)",
            )

    def source_digest(self, root: Path, rel: str) -> str:
        return read_case(root, rel)[1]

    def decode(self, root: Path, ref: SampleRef, done: dict[str, Decoded]) -> Decoded:
        rel = ref.files[self.name]
        parts, digest = read_case(root, rel)
        volume = done[self.spec.like].context
        labels = self._labels(root, rel, parts, volume, ref.files[self.spec.like])
        if labels.shape != volume["raw"]:
            raise Reject(
                rel,
                f"mask is {'x'.join(map(str, labels.shape))} (DxHxW) but its volume "
                f"{ref.files[self.spec.like]} is {'x'.join(map(str, volume['raw']))}",
            )
        if labels.size and (labels.min() < 0 or labels.max() > 255):
            raise Reject(rel, f"mask values {labels.min()}..{labels.max()} are outside 0..255")
        if labels.dtype.kind in "iub":  # whole numbers in 0..255: exact as uint8; floats are judged as they are
            labels = labels.astype(np.uint8)
        labels = (
            binary_array(labels, rel)
            if self.spec.classes is None
            else class_array(labels, self.spec.classes, self.spec.ignore_value, rel)
        )
        values = crop_or_pad(labels, self.volume.size, self.volume.larger, self.spec.pad, rel)
        return Decoded(np.ascontiguousarray(values, dtype=np.uint8), digest)

    def row_counts(self, block: Ragged) -> np.ndarray:
        """(cases, K) voxels of each class per case."""
        per_case = [class_pixels(block[i].reshape(1, -1), self.n_classes)[0] for i in range(len(block))]
        return np.array(per_case, dtype=np.int64).reshape(len(block), self.n_classes)

    def preview(self, value: Any) -> np.ndarray:
        """The labels of the three middle planes, laid out as its volume's preview."""
        return self._draw(value, None)

    def preview_of(self, values: Mapping[str, Any]) -> np.ndarray:
        return self._draw(values[self.name], values.get(f"{self.spec.like}_spacing"))

    def _draw(self, value: Any, spacing: Any) -> np.ndarray:
        labels = np.asarray(value)
        if labels.size == 0:
            return np.zeros((*self.stored().shape, 3), np.uint8)
        return self.paint(physical_planes(labels, spacing))

"""The frames of a DICOM file as slices of a ``volume``: one per single-frame file, NumberOfFrames
per multi-frame file, each with its own geometry and rescale.

Enhanced files give each frame's position, orientation, spacing and rescale in their functional
groups (the frame's item of PerFrameFunctionalGroupsSequence, else the shared one, else the top
level). A legacy multi-frame file places its first frame at ImagePositionPatient and the others
along the slice normal at GridFrameOffsetVector, else SpacingBetweenSlices, else SliceThickness.
A multi-frame file without such geometry (ultrasound cine) is rejected: its frames cannot be placed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from h5forge._samples import Reject

SEGMENTATION_STORAGE = (
    "1.2.840.10008.5.1.4.1.1.66.4",  # Segmentation Storage (BINARY, FRACTIONAL)
    "1.2.840.10008.5.1.4.1.1.66.7",  # Label Map Segmentation Storage (LABELMAP)
)


@dataclass(frozen=True)
class Frame:
    """One slice: the dataset holding it, its frame number (1-based; 0 for a single-frame file),
    its geometry and the item that holds its RescaleSlope/Intercept."""

    ds: Any
    number: int
    orientation: tuple[float, ...]
    position: tuple[float, ...]
    pixel_spacing: tuple[float, ...]
    thickness: float
    rescale: Any


def is_segmentation(ds) -> bool:
    return str(ds.get("SOPClassUID", "")) in SEGMENTATION_STORAGE


def frame_count(ds, where: str) -> int:
    """NumberOfFrames from the header (1 when absent)."""
    value = ds.get("NumberOfFrames")
    try:
        n = 1 if value is None or value == "" else int(value)
    except (TypeError, ValueError):
        raise Reject(where, f"NumberOfFrames {value!r} is not a whole number") from None
    if n < 1:
        raise Reject(where, f"NumberOfFrames is {n}: the file holds no frame")
    return n


def _functional_groups(ds) -> bool:
    return "PerFrameFunctionalGroupsSequence" in ds or "SharedFunctionalGroupsSequence" in ds


def group_item(ds, index: int, sequence: str):
    """The item of ``sequence`` that applies to frame ``index`` (0-based): the frame's own
    functional group, else the shared one; None when neither has it."""
    per_frame = ds.get("PerFrameFunctionalGroupsSequence")
    shared = ds.get("SharedFunctionalGroupsSequence")
    for groups in (per_frame[index] if per_frame else None, shared[0] if shared else None):
        inner = groups.get(sequence) if groups is not None else None
        if inner:
            return inner[0]
    return None


def _floats(value, count: int, what: str, where: str) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise Reject(where, f"{what} {value!r} is not a list of numbers") from None
    if len(out) != count:
        raise Reject(where, f"{what} holds {len(out)} values, not {count}")
    return out


def _number(value, default: float = 0.0) -> float:
    try:
        return default if value is None or value == "" else float(value)
    except (TypeError, ValueError):
        return default


def frames_of(ds, name: str, rel: str) -> list[Frame]:
    """The slices a file holds, in frame order, each placed in patient space."""
    n = frame_count(ds, f"{rel}/{name}")
    if _functional_groups(ds):
        return _enhanced(ds, n, name, rel)
    if n > 1:
        return _legacy(ds, n, name, rel)
    try:
        iop = _floats(ds.ImageOrientationPatient, 6, "ImageOrientationPatient", rel)
        ipp = _floats(ds.ImagePositionPatient, 3, "ImagePositionPatient", rel)
    except AttributeError as err:
        raise Reject(rel, f"a slice lacks its position or orientation: {err}") from None
    spacing = ds.get("PixelSpacing") or (0, 0)
    return [Frame(ds, 0, iop, ipp, _floats(spacing, 2, "PixelSpacing", rel), _number(ds.get("SliceThickness")), ds)]


def _enhanced(ds, n: int, name: str, rel: str) -> list[Frame]:
    where = f"{rel}/{name}"
    per_frame = ds.get("PerFrameFunctionalGroupsSequence")
    if per_frame is not None and len(per_frame) != n:
        raise Reject(where, f"PerFrameFunctionalGroupsSequence has {len(per_frame)} items for {n} frames")
    frames = []
    for i in range(n):
        plane = group_item(ds, i, "PlanePositionSequence")
        orient = group_item(ds, i, "PlaneOrientationSequence")
        ipp = plane.get("ImagePositionPatient") if plane is not None else ds.get("ImagePositionPatient")
        iop = orient.get("ImageOrientationPatient") if orient is not None else ds.get("ImageOrientationPatient")
        if ipp is None or iop is None:
            missing = "ImagePositionPatient (PlanePositionSequence)" if ipp is None else "ImageOrientationPatient"
            raise Reject(
                where,
                f"frame {i + 1} of {n} has no {missing} in its per-frame or shared functional groups: "
                "its place in the volume is unknown",
            )
        measures = group_item(ds, i, "PixelMeasuresSequence") or ds
        transform = group_item(ds, i, "PixelValueTransformationSequence") or ds
        frames.append(
            Frame(
                ds,
                i + 1,
                _floats(iop, 6, f"frame {i + 1}: ImageOrientationPatient", where),
                _floats(ipp, 3, f"frame {i + 1}: ImagePositionPatient", where),
                _floats(measures.get("PixelSpacing") or (0, 0), 2, "PixelSpacing", where),
                _number(measures.get("SliceThickness")),
                transform,
            )
        )
    return frames


def _legacy(ds, n: int, name: str, rel: str) -> list[Frame]:
    where = f"{rel}/{name}"
    if "ImagePositionPatient" not in ds or "ImageOrientationPatient" not in ds:
        kind = getattr(ds.get("SOPClassUID"), "name", "") or "a multi-frame file"
        raise Reject(
            where,
            f"{kind} with {n} frames and no patient geometry (no functional groups, no "
            "ImagePositionPatient/ImageOrientationPatient): its frames cannot be placed as slices",
        )
    iop = _floats(ds.ImageOrientationPatient, 6, "ImageOrientationPatient", where)
    ipp = np.array(_floats(ds.ImagePositionPatient, 3, "ImagePositionPatient", where))
    offsets = ds.get("GridFrameOffsetVector")
    if offsets:
        steps = np.array(_floats(offsets, n, "GridFrameOffsetVector", where))
        steps = steps - steps[0]  # relative to the first frame, whether the vector is relative or absolute
    else:
        step = _number(ds.get("SpacingBetweenSlices")) or _number(ds.get("SliceThickness"))
        if not step:
            raise Reject(
                where,
                f"a legacy multi-frame file with {n} frames gives one ImagePositionPatient and no "
                "GridFrameOffsetVector, SpacingBetweenSlices or SliceThickness: the frames' positions are unknown",
            )
        steps = step * np.arange(n)
    normal = np.cross(iop[:3], iop[3:])
    spacing = _floats(ds.get("PixelSpacing") or (0, 0), 2, "PixelSpacing", where)
    thickness = _number(ds.get("SliceThickness"))
    return [Frame(ds, i + 1, iop, tuple(ipp + s * normal), spacing, thickness, ds) for i, s in enumerate(steps)]


def rescale_of(item) -> tuple[float, float] | str:
    """(slope, intercept) of a slice: 1 and 0 when the tags are absent or empty (an RT Dose grid's
    slope is its DoseGridScaling, to Gy); a slope of 0 or a value that is not finite is what is
    wrong with it (a string), never replaced by the default."""
    slope, intercept = item.get("RescaleSlope", item.get("DoseGridScaling")), item.get("RescaleIntercept")
    slope = 1.0 if slope is None or slope == "" else float(slope)
    intercept = 0.0 if intercept is None or intercept == "" else float(intercept)
    if not (np.isfinite(slope) and np.isfinite(intercept)):
        return "RescaleSlope or RescaleIntercept is not a finite number"
    if slope == 0:
        return "RescaleSlope is 0"  # every value would be the intercept
    return slope, intercept


def frame_pixels(decoded: dict[int, np.ndarray], frame: Frame) -> np.ndarray:
    """The frame's pixels out of its file's decoded array (each file decoded once)."""
    arr = decoded[id(frame.ds)]
    return arr if frame.number == 0 or arr.ndim == 2 else arr[frame.number - 1]

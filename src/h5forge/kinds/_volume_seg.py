"""A DICOM SEG (Segmentation Storage) file as the label volume of a DICOM ``volume`` case.

Each frame goes to the volume slice at its ImagePositionPatient (within SEG_POSITION_TOLERANCE),
else to the slice it was derived from (DerivationImageSequence). Segment k becomes class k,
anything else 0; a FRACTIONAL frame is thresholded at one half, a LABELMAP frame holds segment
numbers, and overlapping segments are rejected. The SEG must match the volume's frame of
reference, size, spacing and orientation, every frame on one of its slices.
"""

from __future__ import annotations

import io

import numpy as np

from h5forge.kinds._volume_frames import frame_count, group_item, is_segmentation
from h5forge._samples import Reject

SEG_POSITION_TOLERANCE = 0.1  # mm between a SEG frame's position and its slice's, in 3-D
ORIENTATION_TOLERANCE = 1e-4
SPACING_TOLERANCE = 1e-3  # relative


def _mm(values) -> str:
    return "(" + ", ".join(f"{float(v):.2f}" for v in values) + ")"


def find_segmentation(parts: list[tuple[str, bytes]], rel: str):
    """(name, dataset) of the one SEG file among the mask's files; other DICOM files (the case's
    own slices, when the SEG sits in the case folder) are passed over."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    found = []
    for name, data in parts:
        try:
            ds = pydicom.dcmread(io.BytesIO(data))
        except (InvalidDicomError, ValueError, EOFError, OSError) as err:
            raise Reject(f"{rel}/{name}", f"not a readable DICOM file: {err}") from None
        if is_segmentation(ds):
            found.append((name, ds))
    if not found:
        raise Reject(rel, "no DICOM SEG (Segmentation Storage) file among the mask's DICOM files")
    if len(found) > 1:
        raise Reject(rel, f"{len(found)} DICOM SEG files ({', '.join(n for n, _ in found)}): one per case is read")
    return found[0]


def seg_labels(
    parts: list[tuple[str, bytes]], rel: str, volume: dict, volume_rel: str, classes: int | None, max_pixels: int
) -> np.ndarray:
    """(D, H, W) class values of a DICOM SEG, on the slices of its volume (``volume``: the
    geometry the volume's decode recorded)."""
    if "positions" not in volume:
        raise Reject(rel, f"a DICOM SEG mask needs a DICOM volume; {volume_rel} is not one")
    name, ds = find_segmentation(parts, rel)
    where = f"{rel}/{name}" if name != rel.rsplit("/", 1)[-1] else rel
    depth, height, width = volume["raw"]
    kind = str(ds.get("SegmentationType", ""))
    if kind not in ("BINARY", "FRACTIONAL", "LABELMAP"):
        raise Reject(where, f"SegmentationType {kind or 'missing'}: BINARY, FRACTIONAL and LABELMAP SEGs are read")
    n = frame_count(ds, where)
    rows, columns = int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0)
    if (rows, columns) != (height, width):
        raise Reject(
            where, f"SEG frames are {rows}x{columns} but the slices of its volume {volume_rel} are {height}x{width}"
        )
    if n * rows * columns > max_pixels:
        raise Reject(where, f"{n} frames of {rows}x{columns} are more than max_pixels {max_pixels:,}")
    theirs, ours = str(ds.get("FrameOfReferenceUID", "")), volume.get("frame_of_reference", "")
    if theirs and ours and theirs != ours:
        raise Reject(where, f"FrameOfReferenceUID {theirs} differs from its volume's ({volume_rel}: {ours})")
    described = sorted(int(s.get("SegmentNumber", 0) or 0) for s in ds.get("SegmentSequence", []))
    segments = [k for k in described if k != 0 or kind != "LABELMAP"]  # a label map's segment 0: background
    if not segments:
        raise Reject(where, "the SEG describes no segment (SegmentSequence is empty)")
    if segments[-1] > 255 or segments[0] < 1:
        raise Reject(where, f"segment numbers {segments[0]}..{segments[-1]} do not fit class values 1..255")
    if classes is None and len(segments) > 1:
        raise Reject(where, f"the SEG holds {len(segments)} segments; set classes: {segments[-1] + 1} to read them")
    if classes is not None and segments[-1] >= classes:
        raise Reject(where, f"segment number {segments[-1]} is not a class 0..{classes - 1}; set classes")
    slices = _slice_of_each_frame(ds, n, where, volume, volume_rel)
    frame_segments = [0 if kind == "LABELMAP" else _segment_of(ds, i, where, segments) for i in range(n)]
    try:
        pixels = ds.pixel_array.reshape(n, rows, columns)
    except (NotImplementedError, RuntimeError, ValueError) as err:
        syntax = ds.file_meta.TransferSyntaxUID
        raise Reject(where, f"SEG pixel data in {syntax.name} ({syntax}) cannot be decoded here: {err}") from None
    if kind == "LABELMAP":
        values = pixels
        unknown = sorted(set(np.unique(values).tolist()) - {0, *segments})
        if unknown:
            raise Reject(where, f"label values {unknown[:5]} are no segment of the SegmentSequence {segments}")
    elif kind == "FRACTIONAL":
        top = int(ds.get("MaximumFractionalValue", 255) or 255)
        inside = pixels >= (top + 1) // 2  # a fraction of at least one half
    else:
        inside = pixels > 0
    labels = np.zeros((depth, height, width), np.int64)
    for i, (k, segment) in enumerate(zip(slices, frame_segments)):
        value = values[i] if kind == "LABELMAP" else inside[i] * segment
        clash = (value != 0) & (labels[k] != 0) & (labels[k] != value)
        if clash.any():
            first = np.argwhere(clash)[0]
            raise Reject(
                where,
                f"segments {int(labels[k][tuple(first)])} and {int(value[tuple(first)])} overlap in "
                f"{int(clash.sum())} voxels of slice {k}: a voxel holds one class",
            )
        labels[k] = np.where(value != 0, value, labels[k])
    return labels


def _segment_of(ds, index: int, where: str, segments: list[int]) -> int:
    item = group_item(ds, index, "SegmentIdentificationSequence")
    number = item.get("ReferencedSegmentNumber") if item is not None else None
    if number is None:
        raise Reject(where, f"frame {index + 1} names no segment (SegmentIdentificationSequence)")
    if int(number) not in segments:
        raise Reject(where, f"frame {index + 1} names segment {number}, which the SegmentSequence does not describe")
    return int(number)


def _slice_of_each_frame(ds, n: int, where: str, volume: dict, volume_rel: str) -> list[int]:
    """The volume slice of each SEG frame: by position, else by the source image it names."""
    positions = np.asarray(volume["positions"], float)
    orientation = np.asarray(volume["orientation"], float)
    spacing = np.asarray(volume["spacing"], float)[1:]
    plane = group_item(ds, 0, "PlaneOrientationSequence")
    iop = plane.get("ImageOrientationPatient") if plane is not None else None
    if iop is not None and np.abs(np.array([float(v) for v in iop]) - orientation).max() > ORIENTATION_TOLERANCE:
        raise Reject(
            where,
            f"SEG orientation {[round(float(v), 4) for v in iop]} differs from its volume's ({volume_rel}: "
            f"{[round(float(v), 4) for v in orientation]})",
        )
    measures = group_item(ds, 0, "PixelMeasuresSequence")
    theirs = measures.get("PixelSpacing") if measures is not None else None
    if theirs is not None and spacing.all():
        theirs = np.array([float(v) for v in theirs])
        if np.abs(theirs - spacing).max() > SPACING_TOLERANCE * spacing.max():
            raise Reject(
                where,
                f"SEG pixel spacing {theirs.tolist()} mm differs from its volume's ({volume_rel}: {spacing.tolist()} mm)",
            )
    out = []
    for i in range(n):
        item = group_item(ds, i, "PlanePositionSequence")
        ipp = item.get("ImagePositionPatient") if item is not None else None
        if ipp is None:
            out.append(_slice_by_source(ds, i, where, volume, volume_rel))
            continue
        q = np.array([float(v) for v in ipp])
        distance = np.linalg.norm(positions - q, axis=1)
        k = int(np.argmin(distance))
        if not distance[k] <= SEG_POSITION_TOLERANCE:
            raise Reject(
                where,
                f"SEG frame {i + 1} at {_mm(q)} mm lies on no slice of its volume {volume_rel} (nearest: slice "
                f"{k} at {_mm(positions[k])} mm, {distance[k]:.2f} mm away)",
            )
        out.append(k)
    return out


def _slice_by_source(ds, index: int, where: str, volume: dict, volume_rel: str) -> int:
    per_frame = ds.get("PerFrameFunctionalGroupsSequence")
    derivation = per_frame[index].get("DerivationImageSequence") if per_frame else None
    source = derivation[0].get("SourceImageSequence") if derivation else None
    if not source:
        raise Reject(
            where, f"SEG frame {index + 1} gives neither its position nor its source image: its slice is unknown"
        )
    uid = str(source[0].get("ReferencedSOPInstanceUID", ""))
    number = int(source[0].get("ReferencedFrameNumber", 0) or 0)
    sources = list(volume["sources"])
    for k, (their_uid, their_number) in enumerate(sources):
        if their_uid == uid and (number == their_number or their_number == 0):
            return k
    raise Reject(where, f"SEG frame {index + 1} was derived from {uid}, which is no slice of its volume {volume_rel}")

"""``kind: volume``: a CT/MR case, a stack of slices of any depth, from a DICOM series or NIfTI.

    fields:
      ct: {kind: volume, files: "cases/*", size: [512, 512]}      # a folder of .dcm per case
      ct: {kind: volume, files: "cases/*.nii.gz", size: [256, 256]}

DICOM: a case folder's files are grouped by SeriesInstanceUID (``series`` picks one of several).
Slices are ordered by their position along the slice normal, never by file name or
InstanceNumber; a gap, duplicate positions, uneven spacing, differing orientation, size or pixel
spacing (or none), and pixel data no installed handler decodes reject the case with the reason. Values are pixel_array x
RescaleSlope + RescaleIntercept (HU for CT). A multi-frame file is a case of its own frames
(``h5forge.kinds._volume_frames``); a DICOM SEG is no slice but a ``volume_mask``'s mask.
NIfTI-1/-2: slices along the third axis; a file whose sform scales its voxels other than its
pixdim does is rejected (nibabel and ITK would place them apart). A 4-D file is read only with ``fourth_axis``:
``channels`` stores (D, C, H, W), ``time`` makes each time point a sample ``<case>@t0000`` with a
raw digest of its own (``sample_digest``), decoded alone without holding the whole file.
In-plane, slices are centre-cropped / padded to ``size`` (no resampling); the depth is kept.
Geometry companions (``<field>_spacing``, ...) are in LPS for the stored (D, H, W) order: voxel
(d, h, w) lies at origin + d·spacing[0]·direction[0] + h·spacing[1]·direction[1] +
w·spacing[2]·direction[2], the origin being that of the first voxel stored. Stored ragged, one
slice per chunk (docs/format.md; docs/reading.md, "CT slices").
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
import zlib
from pathlib import Path
from typing import Any, Literal, Mapping, cast

import h5py
import numpy as np
from pydantic import Field, ValidationInfo, field_validator, model_validator

from h5forge._format.arrays import Stored
from h5forge._format.codecs import CodecName
from h5forge._format.layout import STR
from h5forge.kinds.base import (
    DEFAULT_MAX_BYTES,
    STORED,
    Decoded,
    Companion,
    FieldKind,
    FieldModel,
    Globs,
    read_source,
    stored_as,
    warnings_logged,
)
from h5forge.kinds.image import plan_geometry
from h5forge.kinds.parts import SampleParts
from h5forge.kinds.plugins import Demo, Detector, Plugins
from h5forge.kinds.preview import Preview
from h5forge.kinds.statistics import Statistics
from h5forge.kinds._volume_frames import frame_count, frame_pixels, frames_of, is_segmentation, rescale_of
from h5forge._samples import Reject, SampleRef

DEFAULT_MAX_DECODED_VOLUME = 2 << 30  # e.g. 1,024 slices of 512 x 512, at 8 bytes a voxel while decoded
DEFAULT_MAX_TIME_POINTS = 10_000  # samples one 4-D file may make (long fMRI runs hold a few thousand)
MAX_DEFLATE_RATIO = 1032  # deflate's most: a gzip file decompresses to at most this many times its size
DECODED_VOXEL_BYTES = 8  # values are rescaled in float64
POSITION_TOLERANCE = 0.01  # mm: positions closer than this are duplicates
SPACING_TOLERANCE = 0.1  # fraction of the median step allowed between neighbouring slices
PIXEL_SPACING_TOLERANCE = 1e-3  # relative: slices' PixelSpacing this close are one (rounded decimal strings)
VOXEL_SIZE_TOLERANCE = 1e-3  # relative: a NIfTI sform's scale this close to the pixdim is the pixdim (float32)


class VolumeField(FieldModel):
    """A stack of slices per case (DICOM series folder or NIfTI file)."""

    kind: Literal["volume"] = "volume"
    files: Globs = Field(description="case folders of DICOM files (e.g. cases/*), or NIfTI files (*.nii.gz)")
    size: tuple[int, int] = Field(description="in-plane target (rows, columns): centre crop / even pad")
    series: str | dict[str, str | list[str]] | None = Field(
        None, description="'largest', a SeriesDescription regex, or rules {uid: [...], <DICOM keyword>: <regex>}"
    )

    @field_validator("series")
    @classmethod
    def _series_rules(cls, v):
        if isinstance(v, dict):
            if not v:
                raise ValueError("series rules are empty: name uid or a DICOM keyword")
            for key, value in v.items():
                if key != "uid" and not re.fullmatch(r"[A-Z][A-Za-z0-9]*", key):
                    raise ValueError(f"series rule {key!r}: uid or a DICOM keyword (e.g. SeriesNumber) is needed")
                for pattern in ([value] if isinstance(value, str) else value) if key != "uid" else ():
                    try:
                        re.compile(pattern)
                    except re.error as err:
                        raise ValueError(f"series rule {key}: {pattern!r} is not a regular expression: {err}") from None
        return v

    dtype: Literal["int16", "float32"] = "int16"
    larger: Literal["crop", "reject"] = "crop"
    fill: int | None = Field(None, description="padding value; default: the case's background (air for CT)")
    max_slices: int = Field(4096, gt=0)
    max_bytes: int = Field(DEFAULT_MAX_BYTES, gt=0, description="a file of a case larger than this is rejected unread")
    max_decoded_bytes: int = Field(
        DEFAULT_MAX_DECODED_VOLUME, gt=0, description="a case larger decoded (8 bytes a voxel) is rejected unread"
    )
    fourth_axis: Literal["channels", "time"] | None = Field(
        None, description="a 4-D NIfTI file's fourth axis: channels of each slice, or a sample per time point"
    )
    max_time_points: int = Field(
        DEFAULT_MAX_TIME_POINTS, gt=0, description="with fourth_axis: time, a file with more is rejected"
    )
    channels: int | None = Field(
        None, ge=1, le=1024, description="with fourth_axis: channels, how many the fourth axis holds (every case)"
    )
    codec: CodecName | None = Field(
        None,
        description="this field's codec (default: storage.codec); 'none' for 2-D slice training",
        # unset, it is left out of the stored spec: a file's spec and its field rules stay what they
        # were without the option, so earlier h5forge versions read the file and rebuilds reuse rows
        exclude_if=lambda v: v is None,
    )

    frame: Literal["LPS", "as-read"] = Field(
        "LPS",
        description="the frame of the geometry columns: a build writes LPS; 'as-read' marks an earlier "
        "version's (NIfTI in RAS, no _direction column), which is still read",
    )

    @model_validator(mode="before")
    @classmethod
    def _stored_before_one_frame(cls, data: Any, info: ValidationInfo) -> Any:
        """A stored spec without ``frame`` is from a version whose NIfTI geometry is in RAS."""
        if isinstance(data, dict) and "frame" not in data and (info.context or {}).get(STORED):
            return {**data, "frame": "as-read"}
        return data

    @field_validator("frame")
    @classmethod
    def _frame_written(cls, v: str, info: ValidationInfo) -> str:
        if v != "LPS" and not (info.context or {}).get(STORED):
            raise ValueError(f"frame {v!r} is how earlier versions stored geometry; a build writes LPS")
        return v

    @model_validator(mode="after")
    def _fourth_axis(self) -> "VolumeField":
        if self.fourth_axis == "channels" and self.channels is None:
            raise ValueError("fourth_axis: channels needs channels: <how many the fourth axis holds>")
        if self.channels is not None and self.fourth_axis != "channels":
            raise ValueError("channels is the length of a 4-D file's fourth axis: set fourth_axis: channels too")
        return self


def read_case(
    root: Path, rel: str, max_bytes: int = DEFAULT_MAX_BYTES, max_total: int = DEFAULT_MAX_DECODED_VOLUME
) -> tuple[list[tuple[str, bytes]], str]:
    """The files of a case (a folder's files by name, or one file), each read by ``read_source``,
    and one sha256 over them all; at most ``max_total`` bytes in all."""
    path = root / rel
    try:
        files = (
            sorted(p for p in path.rglob("*") if not p.name.startswith(".") and not p.is_dir())
            if path.is_dir()
            else [path]
        )
    except OSError as err:
        raise Reject(rel, f"cannot read: {err.strerror or err}") from None
    parts, total, h = [], 0, hashlib.sha256()
    for p in files:
        name = p.relative_to(path).as_posix() if path.is_dir() else p.name
        data, _ = read_source(root, p.relative_to(root).as_posix(), max_bytes)
        total += len(data)
        if total > max_total:
            raise Reject(rel, f"the case's files hold more than {max_total:,} bytes (max_decoded_bytes)")
        parts.append((name, data))
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return parts, h.hexdigest()


def _matches(ds, uid: str, rule: dict[str, str | list[str]]) -> bool:
    """Whether a series (its first slice's header) meets every rule: the UID is one named, each
    keyword's value matches one of its regexes."""
    for key, want in rule.items():
        wanted = [want] if isinstance(want, str) else want
        hit = uid in wanted if key == "uid" else any(re.search(p, str(ds.get(key, ""))) for p in wanted)
        if not hit:
            return False
    return True


def _series(datasets: list, rule: str | dict | None, rel: str) -> list:
    groups: dict[str, list] = {}
    for ds in datasets:
        groups.setdefault(str(getattr(ds, "SeriesInstanceUID", "")), []).append(ds)
    if len(groups) == 1:
        return next(iter(groups.values()))
    described = {uid: str(getattr(g[0], "SeriesDescription", "")) for uid, g in groups.items()}
    if rule == "largest":
        depth = {uid: sum(frame_count(ds, rel) for ds in g) for uid, g in groups.items()}  # every frame a slice
        most = max(depth.values())
        tied = sorted(described[uid] for uid, n in depth.items() if n == most)
        if len(tied) > 1:
            others = sorted((described[uid], n) for uid, n in depth.items() if n < most)
            raise Reject(
                rel,
                f"series: largest is a tie: {len(tied)} series hold {most} slices each ({tied})"
                + (f"; the others hold fewer ({', '.join(f'{d!r} {n}' for d, n in others)})" if others else "")
                + "; pick one by its SeriesDescription or series: {uid: ...}",
            )
        return groups[max(depth, key=lambda uid: depth[uid])]
    if isinstance(rule, dict):
        hits = [uid for uid, g in groups.items() if _matches(g[0], uid, rule)]
        if len(hits) == 1:
            return groups[hits[0]]
        raise Reject(
            rel,
            f"series rules {rule} match {len(hits)} of the {len(groups)} series (UIDs and "
            f"descriptions: {sorted(described.items())})",
        )
    if rule:
        hits = [uid for uid, d in described.items() if re.search(rule, d)]
        if len(hits) == 1:
            return groups[hits[0]]
        raise Reject(rel, f"series rule {rule!r} matches {len(hits)} of the series {sorted(described.values())}")
    raise Reject(
        rel,
        f"ambiguous: {len(groups)} series in one case folder ({sorted(described.values())}); "
        "set the field's series: largest, a SeriesDescription pattern, or {uid: ...}",
    )


def _from_dicom(
    parts: list[tuple[str, bytes]], rel: str, rule: str | dict | None, max_slices: int, max_decoded: int
) -> tuple[np.ndarray, dict]:
    datasets, names = _image_datasets(parts, rel)
    series = _series(datasets, rule, rel)
    counts = [frame_count(ds, f"{rel}/{names[id(ds)]}") for ds in series]
    multiframe = max(counts) > 1
    try:
        sizes: set[tuple[int, int, int]] = {
            (int(ds.Rows), int(ds.Columns), int(ds.get("SamplesPerPixel", 1) or 1)) for ds in series
        }
    except (AttributeError, TypeError, ValueError) as err:
        raise Reject(rel, f"a slice has no valid Rows/Columns: {err}") from None
    if len(sizes) > 1:
        raise Reject(rel, f"slices have different sizes {sorted(s[:2] for s in sizes)}")
    depth = sum(counts)
    if depth > max_slices:
        raise Reject(rel, f"{depth} slices, more than max_slices {max_slices}")
    rows, columns, samples = next(iter(sizes))
    _check_decoded(depth * rows * columns * samples, max_decoded, rel, f"{depth} slices of {rows}x{columns}")
    if samples != 1:
        raise Reject(rel, f"colour pixels ({samples} samples per pixel): a volume holds one value per voxel")
    frames = [f for ds in series for f in frames_of(ds, names[id(ds)], rel)]
    iop = np.array([f.orientation for f in frames])
    ipp = np.array([f.position for f in frames])
    for name, values in (("ImagePositionPatient", ipp), ("ImageOrientationPatient", iop)):
        bad = int((~np.isfinite(values).all(axis=1)).sum())
        if bad:  # NaN sorts last and makes the spacing NaN: no order of the slices can be trusted
            raise Reject(rel, f"{name} is not a finite position in {bad} of {len(frames)} slices")
    if np.abs(iop - iop[0]).max() > 1e-4:
        if multiframe:
            planes = len(np.unique(np.round(iop, 4), axis=0))
            raise Reject(
                rel,
                f"frames lie in {planes} different orientations (ImageOrientationPatient): not one stack "
                "of slices (a multi-plane localizer?)",
            )
        raise Reject(rel, "slices have different orientations (ImageOrientationPatient)")
    _one_pixel_spacing(np.array([f.pixel_spacing for f in frames], np.float64), rel)
    normal = np.cross(iop[0][:3], iop[0][3:])
    order = np.argsort(ipp @ normal, kind="stable")
    frames = [frames[i] for i in order]
    step = _slice_step((ipp @ normal)[order], multiframe, rel) if len(frames) > 1 else frames[0].thickness
    rescale = [rescale_of(f.rescale) for f in frames]
    wrong = [r for r in rescale if isinstance(r, str)]
    if wrong:
        raise Reject(rel, f"{wrong[0]} in {wrong.count(wrong[0])} of {len(frames)} slices")
    decoded = {id(ds): _pixels(ds, f"{rel}/{names[id(ds)]}") for ds in series}
    slices = [
        frame_pixels(decoded, f).astype(np.float64) * slope + intercept
        for f, (slope, intercept) in zip(frames, cast(list[tuple[float, float]], rescale))  # none is a str here
    ]
    first = frames[0]
    meta = {
        "spacing": np.array([step, *first.pixel_spacing]),
        # DICOM patient coordinates are LPS already; the slices run along the normal they are sorted by
        **geometry(ipp[order[0]], np.stack([normal, iop[0][3:], iop[0][:3]])),
        "modality": str(getattr(first.ds, "Modality", "")),
        "series": str(getattr(first.ds, "SeriesInstanceUID", "")),
        # what a DICOM SEG mask of the case is checked against and mapped by
        "positions": ipp[order],
        "sources": [(str(f.ds.get("SOPInstanceUID", "")), f.number) for f in frames],
        "frame_of_reference": str(first.ds.get("FrameOfReferenceUID", "")),
    }
    return np.stack(slices), meta


def _image_datasets(parts: list[tuple[str, bytes]], rel: str) -> tuple[list, dict[int, str]]:
    """The DICOM files of a case folder that hold a slice, and their names by ``id``: other files
    (notes, thumbnails) are no part of any series, a SEG is a mask, and a file that holds no
    pixels must not be a slice cut off (``_no_slice_lost``)."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    datasets, names, segmentations, imageless = [], {}, 0, []
    for name, data in parts:
        if not is_dicom(name, data):
            continue
        try:
            with warnings_logged(f"{rel}/{name}") as warned:
                ds = pydicom.dcmread(io.BytesIO(data))
        except (InvalidDicomError, ValueError, EOFError, OSError) as err:
            raise Reject(f"{rel}/{name}", f"not a readable DICOM file: {err}") from None
        if is_segmentation(ds):  # a SEG beside its series is a mask (kind: volume_mask), no slice
            segmentations += 1
        elif "PixelData" in ds:
            datasets.append(ds)
            names[id(ds)] = name
        else:  # a DICOMDIR or a report holds no slice; a truncated slice must not pass for one
            imageless.append((name, ds, len(data), [str(w.message) for w in warned]))
    _no_slice_lost(imageless, {str(ds.get("SeriesInstanceUID", "")) for ds in datasets}, rel)
    if not datasets:
        raise Reject(
            rel,
            "no DICOM image in the case folder"
            + (" (a DICOM SEG is read as the mask of a volume_mask field)" if segmentations else ""),
        )
    return datasets, names


def _slice_step(positions: np.ndarray, multiframe: bool, rel: str) -> float:
    """The spacing of slices at ``positions`` (mm along their normal, sorted): one stack, evenly
    spaced, no slice twice and none missing, or the case is refused with what is wrong."""
    steps = np.diff(positions)
    if (steps < POSITION_TOLERANCE).any():
        if multiframe:
            distinct = int((steps >= POSITION_TOLERANCE).sum()) + 1
            raise Reject(
                rel,
                f"{len(positions)} frames at {distinct} positions: not one stack of slices (several "
                "stacks, echoes or time points in one series?)",
            )
        k = int(np.argmax(steps < POSITION_TOLERANCE))
        raise Reject(rel, f"duplicate slice positions: {positions[k]:.2f} mm appears twice")
    step = float(np.median(steps))
    gaps = np.flatnonzero(steps > (1 + SPACING_TOLERANCE) * step)
    if gaps.size and np.any(np.abs(steps[gaps] / step - np.round(steps[gaps] / step)) < SPACING_TOLERANCE):
        k = int(gaps[0])
        raise Reject(
            rel,
            f"missing slice: a gap of {steps[k]:.2f} mm between {positions[k]:.2f} and "
            f"{positions[k + 1]:.2f} mm (spacing {step:.2f} mm)",
        )
    if np.abs(steps - step).max() > SPACING_TOLERANCE * step:
        raise Reject(rel, f"uneven slice spacing: steps from {steps.min():.2f} to {steps.max():.2f} mm")
    return step


def _pixels(ds, where: str) -> np.ndarray:
    """A DICOM file's pixel data, decoded; a syntax no handler decodes (NotImplementedError,
    RuntimeError) or a damaged or short pixel data element (ValueError) refuses the case, naming the file."""
    try:
        with warnings_logged(where) as warned:
            return ds.pixel_array
    except (NotImplementedError, RuntimeError, ValueError) as err:
        how = "here" if not isinstance(err, ValueError) else "(damaged or cut short?)"
        said = f"; pydicom warns: {warned[0].message}" if warned else ""
        syntax = ds.file_meta.TransferSyntaxUID
        raise Reject(where, f"pixel data in {syntax.name} ({syntax}) cannot be decoded {how}: {err}{said}") from None


def _one_pixel_spacing(spacings: np.ndarray, rel: str) -> None:
    """Every slice's PixelSpacing (rows, columns; mm) known, positive and one: the stored spacing is
    the first slice's, and a slice at another is no slice of the same grid."""
    bad = ~(np.isfinite(spacings).all(axis=1) & (spacings > 0).all(axis=1))
    if bad.any():
        example = spacings[int(np.argmax(bad))]
        raise Reject(
            rel,
            f"PixelSpacing is missing or not a positive size in {int(bad.sum())} of {len(spacings)} slices "
            f"(e.g. [{example[0]:g}, {example[1]:g}]): the in-plane spacing is unknown",
        )
    if np.abs(spacings - spacings[0]).max() > PIXEL_SPACING_TOLERANCE * spacings[0].min():
        found, counts = np.unique(spacings, axis=0, return_counts=True)
        listed = ", ".join(f"[{a:g}, {b:g}] in {n}" for (a, b), n in zip(found, counts))
        raise Reject(
            rel, f"slices have different pixel spacings (PixelSpacing, mm): {listed} of {len(spacings)} slices"
        )


FRAME = "LPS"  # the patient coordinates every volume's origin and directions are stored in
RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0])  # NIfTI's frame to DICOM's: x and y change sign


def geometry(origin: np.ndarray, axes: np.ndarray) -> dict[str, np.ndarray]:
    """A case's origin and directions as stored: ``axes`` rows are the LPS unit vectors along the
    slice, row and column index; ``orientation`` is DICOM's ImageOrientationPatient."""
    axes = np.asarray(axes, np.float64)
    return {
        "origin": np.asarray(origin, np.float64),
        "direction": axes,
        "orientation": np.concatenate([axes[2], axes[1]]),
    }


def nifti_geometry(affine: np.ndarray) -> dict[str, np.ndarray]:
    """``geometry`` of a NIfTI affine (voxel (i, j, k) to RAS mm) for the stored (k, j, i) order."""
    lps = RAS_TO_LPS @ np.asarray(affine, np.float64)[:3]
    columns = lps[:, :3] / np.maximum(np.linalg.norm(lps[:, :3], axis=0), 1e-12)
    return geometry(lps[:, 3], columns.T[::-1])


def moved_origin(meta: dict, rows: int, columns: int) -> np.ndarray:
    """The origin once the first stored row and column are ``rows`` and ``columns`` of the slices
    as read (negative when padded)."""
    row_mm, column_mm = np.asarray(meta["spacing"], np.float64)[1:]
    axes = np.asarray(meta["direction"], np.float64)
    return meta["origin"] + rows * row_mm * axes[1] + columns * column_mm * axes[2]


def _no_slice_lost(imageless: list[tuple[str, Any, int, list[str]]], series: set[str], rel: str) -> None:
    """Rejects the case for a file without pixel data that looks like a slice all the same (an
    empty data set, a header describing an image, a series of the case's, pydicom's warnings: a
    copy cut short), which skipping would leave a slice short."""
    for name, ds, size, warned in imageless:
        uid = str(ds.get("SeriesInstanceUID", ""))
        if len(ds) == 0:
            what = "pydicom reads no data set from it beyond its file meta"
        elif "Rows" in ds and "Columns" in ds:
            what = f"its header describes a {ds.Rows}x{ds.Columns} image ({ds.get('Modality', 'no modality')}), but it holds no pixel data"
        elif uid and uid in series:
            what = "it belongs to the series of the case's slices, but holds no pixel data"
        elif not warned:
            continue  # a DICOMDIR, a report: no slice of any series
        else:
            what = "it holds no pixel data"
        said = f"; pydicom warns: {warned[0]}" if warned else ""
        raise Reject(f"{rel}/{name}", f"not a whole slice ({size:,} bytes): {what}{said}")


def is_dicom(name: str, data: bytes) -> bool:
    """A DICOM file by its preamble's magic, or by its name when it has none."""
    return data[128:132] == b"DICM" or name.lower().endswith(".dcm")


NIFTI_HEADER_SIZES = {348: "Nifti1Image", 540: "Nifti2Image"}  # sizeof_hdr of NIfTI-1 and NIfTI-2


def _nifti_class(raw: bytes, rel: str):
    """nibabel's image class for the header's first field, sizeof_hdr (in either byte order)."""
    import nibabel

    if len(raw) < 4:
        raise Reject(rel, f"not a NIfTI file: {len(raw)} bytes, shorter than a header")
    for order in "<>":
        name = NIFTI_HEADER_SIZES.get(struct.unpack(f"{order}i", raw[:4])[0])
        if name:
            return getattr(nibabel, name)
    found = struct.unpack("<i", raw[:4])[0]
    raise Reject(
        rel, f"not a NIfTI file: its header's first field (sizeof_hdr) is {found}, not 348 (NIfTI-1) or 540 (NIfTI-2)"
    )


def _three_or_four(shape: tuple[int, ...], rel: str) -> tuple[tuple[int, ...], str]:
    """A header's shape without trailing axes of length 1 (3 or 4 axes), and the shape as text."""
    dims = tuple(int(n) for n in shape)
    while len(dims) > 3 and dims[-1] == 1:
        dims = dims[:-1]  # (x, y, z, 1) is a 3-D volume written with a time axis of one
    text = "x".join(map(str, shape))
    if len(dims) < 3:
        raise Reject(rel, f"a NIfTI volume must have 3 dimensions; found shape {tuple(shape)}")
    if len(dims) > 4:
        raise Reject(
            rel,
            f"a {len(dims)}-D NIfTI file ({text}) is not read: a volume is 3-D, or 4-D with fourth_axis: "
            "channels or time",
        )
    return dims, text


def time_dims(shape: tuple[int, ...], rel: str) -> tuple[int, int, int, int]:
    """(x, y, z, time points) of a NIfTI header's shape; a 3-D file is one time point."""
    (x, y, z, *time), text = _three_or_four(shape, rel)
    if time == [0]:
        raise Reject(rel, f"a 4-D NIfTI file ({text}) holds no time point")
    return x, y, z, time[0] if time else 1


def nifti_dims(shape: tuple[int, ...], channels: int | None, rel: str, labels: bool = False) -> tuple[int, ...]:
    """The (x, y, z) or, with ``channels``, (x, y, z, c) a NIfTI header's shape is read as; what the
    field cannot store is rejected naming the option that would read it."""
    dims, text = _three_or_four(shape, rel)
    if labels:
        if len(dims) == 4:
            raise Reject(rel, f"a label volume must be 3-D (one label per voxel); this one is 4-D ({text})")
        return dims
    if channels is None:
        if len(dims) == 4:
            raise Reject(
                rel,
                f"a 4-D NIfTI file ({text}): set the field's fourth_axis: channels and channels: {dims[3]} "
                "to store its fourth axis as the channels of each slice, or fourth_axis: time to make each "
                "time point a sample",
            )
        return dims
    if len(dims) == 3:
        if channels != 1:
            raise Reject(rel, f"a 3-D NIfTI file ({text}) has one channel; the field's channels is {channels}")
        dims = (*dims, 1)
    if dims[3] != channels:
        raise Reject(rel, f"the fourth axis holds {dims[3]} channels ({text}); the field's channels is {channels}")
    return dims


def _from_nifti(
    parts: list[tuple[str, bytes]], rel: str, max_decoded: int, channels: int | None = None, labels: bool = False
) -> tuple[np.ndarray, dict]:
    """(D, H, W), or (D, C, H, W) with ``channels``, from a NIfTI file, sized from its header
    before any voxel is decoded."""
    from nibabel.filebasedimages import ImageFileError
    from nibabel.spatialimages import HeaderDataError

    raw = _gunzipped(parts[0][1], max_decoded + NIFTI_HEADER_ROOM, rel)
    image_class = _nifti_class(raw, rel)
    try:
        img = image_class.from_bytes(raw)
        shape, dtype = img.header.get_data_shape(), img.header.get_data_dtype()
        offset = int(getattr(img.dataobj, "offset", 0))  # the header copy of a loaded image says 0
    except (ImageFileError, HeaderDataError, ValueError, OSError, EOFError) as err:
        raise Reject(rel, f"not a readable NIfTI file: {type(err).__name__}: {err}") from None
    voxels = int(np.prod(shape, dtype=object))
    _check_decoded(voxels, max_decoded, rel, f"a volume of {'x'.join(map(str, shape))}")
    if offset + voxels * dtype.itemsize > len(raw):
        raise Reject(
            rel,
            f"the header declares {voxels * dtype.itemsize:,} bytes of voxels, the file holds "
            f"{max(0, len(raw) - offset):,}",
        )
    dims = nifti_dims(shape, channels, rel, labels)
    data = np.asanyarray(img.dataobj).reshape(dims)
    zooms = img.header.get_zooms()[:3]
    scales = np.linalg.norm(np.asarray(img.affine, np.float64)[:3, :3], axis=0)  # a qform's are the pixdim
    if not np.allclose(scales, zooms, rtol=VOXEL_SIZE_TOLERANCE, atol=0):

        def mm(values) -> str:
            return " x ".join(f"{float(v):.6g}" for v in values)

        raise Reject(
            rel,
            f"the sform's voxel sizes {mm(scales)} mm (x, y, z) differ from the header's pixdim {mm(zooms)} mm: "
            "where its voxels lie cannot be told (nibabel reads the sform, ITK the pixdim)",
        )
    meta = {
        "spacing": np.array([zooms[2], zooms[1], zooms[0]], float),
        **nifti_geometry(img.affine),
        "modality": "",
        "series": "",
        "unsigned": data.dtype.kind == "u",
    }
    # (x, y, z[, c]) -> (z[, c], y, x): slices first, each a (rows, columns) picture as for DICOM
    axes = (2, 1, 0) if data.ndim == 3 else (2, 3, 1, 0)
    return np.ascontiguousarray(np.transpose(data, axes)).astype(np.float64), meta


NIFTI_HEADER_ROOM = 1 << 20  # header and extensions, beyond the voxels
NIFTI_HEAD_READ = 64 << 10  # bytes of a file read at discovery: a header, gzipped or not, and to spare
INFLATE_STEP = 1 << 20  # bytes decompressed at a time while skipping to a time point
TIME_POINT = re.compile(r"@t(\d+)$")


def time_point_id(t: int) -> str:
    """The end of the id of a file's time point ``t``."""
    return f"@t{t:04d}"


def time_index(sample_id: str, rel: str) -> int:
    match = TIME_POINT.search(sample_id)
    if match is None:
        raise Reject(rel, f"the sample id {sample_id!r} names no time point (<case>@t<number>)")
    return int(match.group(1))


class _Stream:
    """A file's bytes in order, decompressed while read when gzipped: what is skipped is never
    held, and nothing after the part read is decompressed."""

    def __init__(self, data: bytes, rel: str):
        self.rel, self.data, self.at = rel, data, 0
        self.inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if data[:2] == b"\x1f\x8b" else None

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes, fewer at the end of the file."""
        if self.inflate is None:
            out = self.data[self.at : self.at + n]
            self.at += len(out)
            return out
        parts, want = [], n
        while want > 0 and not self.inflate.eof:
            try:
                out = self.inflate.decompress(self.data, min(want, INFLATE_STEP))
            except zlib.error as err:
                raise Reject(self.rel, f"not a readable gzip file: {err}") from None
            self.data = self.inflate.unconsumed_tail
            if not out and not self.data:
                break
            parts.append(out)
            want -= len(out)
        return b"".join(parts)

    def skip(self, n: int) -> None:
        if self.inflate is None:
            self.at += n
            return
        while n > 0 and (got := len(self.read(min(n, INFLATE_STEP)))):
            n -= got


def _nifti_header(stream: _Stream, rel: str):
    """The header at the start of a NIfTI file (NIfTI-1 or NIfTI-2) and its bytes."""
    from nibabel.spatialimages import HeaderDataError

    first = stream.read(4)
    header_class = _nifti_class(first, rel).header_class
    size = header_class.sizeof_hdr  # 348 or 540
    block = first + stream.read(size - 4)
    if len(block) < size:
        raise Reject(rel, f"not a NIfTI file: {len(block)} bytes, shorter than a header")
    try:
        return header_class.from_fileobj(io.BytesIO(block)), block
    except (HeaderDataError, ValueError, OSError, EOFError) as err:
        raise Reject(rel, f"not a readable NIfTI file: {type(err).__name__}: {err}") from None


def nifti_time_points(root: Path, rel: str, max_bytes: int, max_time_points: int = DEFAULT_MAX_TIME_POINTS) -> int:
    """How many time points of a NIfTI file become samples: those its header declares, but at most
    one more than its size can hold (that one's decoding says where the file ends): ids are made
    for each, so the header alone is not trusted. More than ``max_time_points`` rejects the file."""
    head, _ = read_source(root, rel, max_bytes, head=NIFTI_HEAD_READ)
    header, _ = _nifti_header(_Stream(head, rel), rel)
    x, y, z, n = time_dims(header.get_data_shape(), rel)
    each = x * y * z * header.get_data_dtype().itemsize
    if each == 0:
        raise Reject(rel, f"a time point of {x}x{y}x{z} holds no voxel")
    try:
        size = (root / rel).stat().st_size
    except OSError as err:
        raise Reject(rel, f"cannot read file: {err.strerror or err}") from None
    gzipped = head[:2] == b"\x1f\x8b"
    held = max(0, size * MAX_DEFLATE_RATIO if gzipped else size - int(header.get_data_offset())) // each
    count = n if n <= held else held + 1  # the first time point it cannot hold is rejected, with where it ends
    if count > max_time_points:
        can = f" (a file of {size:,} bytes{' gzipped' if gzipped else ''} holds at most {held:,})" if n > held else ""
        raise Reject(rel, f"the header declares {n:,} time points{can}, more than max_time_points {max_time_points:,}")
    return count


def _nifti_time_point(data: bytes, rel: str, t: int, max_decoded: int) -> bytes:
    """Time point ``t`` of a 4-D NIfTI file as a 3-D one: the header, extensions and that time
    point's voxels, decompressing no further than its end."""
    stream = _Stream(data, rel)
    header, block = _nifti_header(stream, rel)
    x, y, z, n = time_dims(header.get_data_shape(), rel)
    if t >= n:
        raise Reject(rel, f"the file holds {n} time points; there is no time point {t}")
    offset = int(header.get_data_offset())
    if not len(block) <= offset <= NIFTI_HEADER_ROOM:
        raise Reject(rel, f"the voxels start at byte {offset} (vox_offset), not after the header")
    rest = stream.read(offset - len(block))  # the extension flag and extensions
    _check_decoded(x * y * z, max_decoded, rel, f"a time point of {x}x{y}x{z}")
    size = x * y * z * header.get_data_dtype().itemsize
    stream.skip(t * size)
    voxels = stream.read(size)
    if len(voxels) < size:
        raise Reject(
            rel,
            f"the header declares {n:,} time points of {size:,} bytes; the file ends before time point {t} does",
        )
    one = header.copy()
    one.set_data_shape((x, y, z))
    return one.binaryblock + rest + voxels


def _gunzipped(data: bytes, limit: int, rel: str) -> bytes:
    """A gzip file's content, decompressed no further than ``limit`` bytes."""
    if data[:2] != b"\x1f\x8b":
        return data
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflate.decompress(data, limit + 1)
    except zlib.error as err:
        raise Reject(rel, f"not a readable gzip file: {err}") from None
    if len(out) > limit or inflate.unconsumed_tail:
        raise Reject(rel, f"decompresses to more than {limit:,} bytes (max_decoded_bytes)")
    return out


def _check_decoded(voxels: int, max_decoded: int, rel: str, what: str) -> None:
    if voxels * DECODED_VOXEL_BYTES > max_decoded:
        raise Reject(
            rel,
            f"{what} would take {voxels * DECODED_VOXEL_BYTES:,} bytes decoded, more than "
            f"max_decoded_bytes {max_decoded:,}; rejected before decoding",
        )


def load_case(
    root: Path,
    rel: str,
    rule: str | dict | None = None,
    *,
    max_slices: int = 4096,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_decoded: int = DEFAULT_MAX_DECODED_VOLUME,
    channels: int | None = None,
    labels: bool = False,
    time: int | None = None,
) -> tuple[np.ndarray, dict, str]:
    """(D, H, W) values in slice order ((D, C, H, W) with ``channels``), the case's geometry, and
    the digest of its files. ``labels``: a label volume (3-D); ``time``: that time point of a 4-D
    NIfTI file."""
    parts, digest = read_case(root, rel, max_bytes, max_decoded)
    if not parts:
        raise Reject(rel, "empty case folder")
    if is_nifti(rel):
        if time is not None:
            parts = [(parts[0][0], _nifti_time_point(parts[0][1], rel, time, max_decoded))]
        values, meta = _from_nifti(parts, rel, max_decoded, channels, labels)
    else:
        if time:
            raise Reject(rel, f"a DICOM series is one time point; there is no time point {time}")
        values, meta = _from_dicom(parts, rel, rule, max_slices, max_decoded)
        if channels is not None:
            if channels != 1:
                raise Reject(rel, f"a DICOM series has one channel per slice; the field's channels is {channels}")
            values = values[:, None]
    return values, meta, digest


def is_nifti(rel: str) -> bool:
    return rel.lower().endswith((".nii", ".nii.gz"))


AIR_HU = -1024


def background(values: np.ndarray, meta: dict) -> float:
    """The default fill: air (-1024 HU) for CT, 0 for another DICOM modality or unsigned NIfTI
    data, else the case's lowest finite value (NIfTI has no modality)."""
    modality = meta.get("modality", "")
    if modality:
        return AIR_HU if modality.upper() == "CT" else 0
    if meta.get("unsigned"):
        return 0
    finite = values[np.isfinite(values)]
    return float(finite.min()) if finite.size else 0


def crop_or_pad(values: np.ndarray, size: tuple[int, int], larger: str, fill: float, rel: str) -> np.ndarray:
    """(D, [C,] H, W) brought to (D, [C,] *size) in-plane by ``plan_geometry``."""
    g = plan_geometry(values.shape[-2], values.shape[-1], size[0], size[1], larger, rel)
    top, left, ch, cw = g.crop
    pt, pb, pl, pr = g.pad
    out = values[..., top : top + ch, left : left + cw]
    if not (pt or pb or pl or pr):
        return out
    return np.pad(out, ((0, 0),) * (values.ndim - 2) + ((pt, pb), (pl, pr)), constant_values=fill)


PLANES = ("axial", "coronal", "sagittal")
PLANE_GAP = 0.03  # blank space after each plane of a volume preview, as a share of the tallest plane
MAX_PLANE_SIDE = 1024  # pixels: a plane's longest side in the drawn picture, at most
# display windows by modality: (width, level) in the stored unit (CT: Hounsfield units)
WINDOWS = {"CT": (400.0, 40.0, "CT soft tissue")}


def _mm(spacing: Any) -> tuple[float, float, float] | None:
    """(slice, row, column) spacing in mm, or None when it is missing or not positive."""
    s = np.asarray(spacing if spacing is not None else (), np.float64).ravel()
    if s.size != 3 or not np.all(np.isfinite(s)) or np.any(s <= 0):
        return None
    return float(s[0]), float(s[1]), float(s[2])


def plane_layout(shape: tuple[int, ...], spacing: Any) -> tuple[tuple[int, int], dict[str, tuple[int, int, int, int]]]:
    """Where the middle axial, coronal and sagittal planes of a (D, H, W) volume go in its preview:
    side by side, top-aligned, each at its physical aspect ratio (unknown spacing: square voxels).
    Returns ((height, width), (left, top, width, height) by plane name)."""
    d, h, w = (max(1, int(n)) for n in shape)
    dz, dy, dx = _mm(spacing) or (1.0, 1.0, 1.0)
    pixel = max(min(dz, dy, dx), max(d * dz, h * dy, w * dx) / MAX_PLANE_SIDE)

    def px(n: int, mm: float) -> int:
        return max(1, round(n * mm / pixel))

    sizes = {"axial": (px(h, dy), px(w, dx)), "coronal": (px(d, dz), px(w, dx)), "sagittal": (px(d, dz), px(h, dy))}
    tall = max(ph for ph, _ in sizes.values())
    gap = max(2, round(PLANE_GAP * tall))
    boxes, left = {}, 0
    for name in PLANES:
        ph, pw = sizes[name]
        boxes[name] = (left, 0, pw, ph)
        left += pw + gap
    return (tall, left - gap), boxes


def physical_planes(v: np.ndarray, spacing: Any) -> np.ndarray:
    """(D, H, W) -> one 2-D picture of its three middle planes laid out by ``plane_layout``, each
    resampled by nearest neighbour (nothing between slices is invented); blank space is 0."""
    d, h, w = v.shape
    (height, width), boxes = plane_layout(v.shape, spacing)
    planes = {"axial": v[d // 2], "coronal": v[:, h // 2, :], "sagittal": v[:, :, w // 2]}
    out = np.zeros((height, width), v.dtype)
    for name, (left, top, pw, ph) in boxes.items():
        plane = planes[name]
        rows = (np.arange(ph) * plane.shape[0]) // ph
        cols = (np.arange(pw) * plane.shape[1]) // pw
        out[top : top + ph, left : left + pw] = plane[rows[:, None], cols[None, :]]
    return out


def display_window(v: np.ndarray, modality: str) -> tuple[float, float, str]:
    """(lowest, highest) value drawn black to white, and how it was chosen: the modality's
    standard window (``WINDOWS``), else the 1st..99th percentile of the finite voxels."""
    if modality in WINDOWS:
        width, level, name = WINDOWS[modality]
        return level - width / 2, level + width / 2, f"W/L {width:g}/{level:g} ({name})"
    finite = v[np.isfinite(v)]
    if finite.size == 0:
        return 0.0, 1.0, "no finite voxel"
    lo, hi = float(np.percentile(finite, 1)), float(np.percentile(finite, 99))
    return lo, hi, f"window {lo:.4g}..{hi:.4g} (1st..99th percentile)"


def first_channel(v: np.ndarray) -> np.ndarray:
    """(D, H, W) of a case: a (D, C, H, W) case with channels is previewed by its first channel."""
    return v[:, 0] if v.ndim == 4 else v


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value if value is not None else "")


class VolumeKind(Plugins, SampleParts, Statistics, Preview, FieldKind[VolumeField]):
    kind = "volume"
    Spec = VolumeField
    reads_folders = True
    detectors = (
        Detector("h5forge._init.dicom:detect", 40, "DICOM case folders <case>/*.dcm"),
        Detector("h5forge._init.nifti:detect", 41, "*.nii.gz volumes (+ masks/)"),
    )
    demos = (
        Demo(
            "ct",
            "h5forge._demo.ct:generate_ct",
            30,
            "DICOM series per case folder + per-slice masks",
            noun="ct samples",
        ),
    )
    layout_doc = (
        "ragged: (total slices, H, W) int16 (or float32), (total slices, C, H, W) with fourth_axis: "
        "channels, one slice per chunk, plus <field>_lengths (N,) depths; companions <field>_spacing (N, 3) mm "
        "(slice, row, column), _origin (N, 3): the LPS point of the first stored voxel, _direction (N, 3, 3): row k "
        "the LPS unit vector along stored axis k (D, H, W), _orientation (N, 6): (_direction[2], _direction[1]) as "
        "DICOM's ImageOrientationPatient, _modality, _series; geometry in LPS (x to the patient's left, y to the "
        "back, z to the head: DICOM's, ITK's), NIfTI's RAS turned by x, y -> -x, -y (a version whose stored spec "
        "has the field's frame 'as-read' keeps NIfTI in RAS and has no _direction); a float32 volume has split "
        "attr <field>_nonfinite (NaN/inf voxels kept)"
    )

    def stored(self) -> Stored:
        slice_shape = tuple(self.spec.size) if self.spec.channels is None else (self.spec.channels, *self.spec.size)
        return Stored(
            slice_shape, np.dtype(self.spec.dtype), bulk=True, ragged=True, chunk_elements=1, codec=self.spec.codec
        )

    def companions(self) -> dict[str, FieldKind]:
        stored = {
            "spacing": Stored((3,), np.float64, bulk=False),
            "origin": Stored((3,), np.float64, bulk=False),
            "orientation": Stored((6,), np.float64, bulk=False),
            "direction": Stored((3, 3), np.float64, bulk=False),
            "modality": Stored((), STR, bulk=False),
            "series": Stored((), STR, bulk=False),
        }
        if self.spec.frame != FRAME:  # a version written before the direction column
            del stored["direction"]
        return {f"{self.name}_{key}": CaseMeta(self, key, st) for key, st in stored.items()}

    def source_digest(self, root: Path, rel: str) -> str:
        return read_case(root, rel)[1]

    def samples_in(self, root: Path, rel: str) -> tuple[str, ...] | None:
        """With ``fourth_axis: time``, a sample per time point (from the NIfTI header)."""
        if self.spec.fourth_axis != "time":
            return None
        count = nifti_time_points(root, rel, self.spec.max_bytes, self.spec.max_time_points) if is_nifti(rel) else 1
        return tuple(time_point_id(t) for t in range(count))

    def sample_digest(self, file_digest: str, ref: SampleRef) -> str:
        """A time point's own: the file's sha256 and the time point, hashed together."""
        match = TIME_POINT.search(ref.id)
        if self.spec.fourth_axis != "time" or not file_digest or match is None:
            return file_digest
        return hashlib.sha256(f"{file_digest}@t{int(match.group(1))}".encode()).hexdigest()

    def decode(self, root: Path, ref: SampleRef, done: dict[str, Decoded]) -> Decoded:
        f, rel = self.spec, ref.files[self.name]
        values, meta, digest = load_case(
            root,
            rel,
            f.series,
            max_slices=f.max_slices,
            max_bytes=f.max_bytes,
            max_decoded=f.max_decoded_bytes,
            channels=f.channels,
            time=time_index(ref.id, rel) if f.fourth_axis == "time" else None,
        )
        if len(values) > f.max_slices:
            raise Reject(rel, f"{len(values)} slices, more than max_slices {f.max_slices}")
        raw = (values.shape[0], *values.shape[-2:])  # (D, H, W): what a label volume must match
        if values.ndim == 4 and f.fill is None:  # each channel (contrast) is padded with its own background
            values = np.stack(
                [crop_or_pad(c, f.size, f.larger, background(c, meta), rel) for c in values.transpose(1, 0, 2, 3)],
                axis=1,
            )
        else:
            values = crop_or_pad(values, f.size, f.larger, background(values, meta) if f.fill is None else f.fill, rel)
        values = np.ascontiguousarray(stored_as(values, f.dtype, rel, "voxel"))
        g = plan_geometry(raw[1], raw[2], f.size[0], f.size[1], f.larger, rel)
        origin = moved_origin(meta, g.crop[0] - g.pad[0], g.crop[1] - g.pad[2])  # that of the first voxel stored
        return Decoded(values, self.sample_digest(digest, ref), {**meta, "origin": origin, "raw": raw})

    # ---- statistics: a float32 volume counts the NaN/inf voxels it keeps (an MR scan's NaN
    # background, say), which the health report shows; int16 rejects them at decode
    def counts(self, block: Any) -> np.ndarray | None:
        if self.spec.dtype != "float32":
            return None
        return np.array([np.count_nonzero(~np.isfinite(block.values))], np.int64)

    def write_stats(self, group: h5py.Group, counts: np.ndarray | None) -> None:
        if self.spec.dtype == "float32":
            group.attrs[f"{self.name}_nonfinite"] = 0 if counts is None else int(np.asarray(counts).sum())

    def stored_counts(self, group: h5py.Group) -> np.ndarray | None:
        if self.spec.dtype != "float32":
            return None
        return np.array([int(group.attrs.get(f"{self.name}_nonfinite", 0))], np.int64)

    def nonfinite(self, group: h5py.Group) -> int:
        stored = self.stored_counts(group)
        return 0 if stored is None else int(stored.sum())

    # ---- preview: the three middle planes at the voxel spacing, in the modality's window
    def _geometry(self, values: Mapping[str, Any]) -> tuple[Any, str]:
        return values.get(f"{self.name}_spacing"), _text(values.get(f"{self.name}_modality"))

    def preview(self, value: Any) -> np.ndarray:
        """The three middle planes of the first channel, voxels square, in the percentile window."""
        return self._draw(value, None, "")

    def preview_of(self, values: Mapping[str, Any]) -> np.ndarray:
        return self._draw(values[self.name], *self._geometry(values))

    def _draw(self, value: Any, spacing: Any, modality: str) -> np.ndarray:
        v = first_channel(np.asarray(value, np.float64))
        if v.size == 0:
            return np.zeros((*self.spec.size, 3), np.uint8)
        lo, hi, _ = display_window(v, modality)
        scaled = np.clip(
            np.nan_to_num(np.round((v - lo) / max(hi - lo, 1e-9) * 255), nan=0.0, posinf=0.0, neginf=0.0), 0, 255
        ).astype(np.uint8)
        return np.repeat(physical_planes(scaled, spacing)[..., None], 3, axis=2)

    def preview_parts(self, values: Mapping[str, Any]) -> dict[str, tuple[int, int, int, int]]:
        v = first_channel(np.asarray(values[self.name]))
        return plane_layout(v.shape, self._geometry(values)[0])[1] if v.size else {}

    @property
    def preview_tiles(self) -> int:
        return len(PLANES)

    def caption_of(self, values: Mapping[str, Any]) -> str | None:
        """The spacing (mm) and the display window the planes are drawn with."""
        v = first_channel(np.asarray(values[self.name], np.float64))
        spacing, modality = self._geometry(values)
        mm = _mm(spacing)
        where = "spacing " + ("unknown (voxels drawn square)" if mm is None else " x ".join(f"{x:.2f}" for x in mm))
        where += " mm (slice x row x column)" if mm is not None else ""
        return f"{where}; {display_window(v, modality)[2] if v.size else 'empty'}"


class CaseMeta(Companion[Stored]):
    """A per-case geometry column of a volume field."""

    kind = "case-meta"
    checksummed = False

    def stored(self) -> Stored:
        return self.spec

"""The ``ct`` demo: real DICOM series written with pydicom from its bundled ``CT_small.dcm``, shuffled
as scanners and PACS exports leave them, a sphere of +400 HU in each case and per-slice PNG masks
of it, so a build can be checked against a known answer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

CT_SPACING = (2.0, 2.5, 3.0)  # mm between slices, one per case
CT_SPHERE_HU = 400


def _uid(*parts: object) -> str:
    """A DICOM UID derived from ``parts``: the same arguments give the same file bytes."""
    from pydicom.uid import generate_uid

    return generate_uid(entropy_srcs=[str(p) for p in parts])


def _ct_case(
    root: Path,
    case: str,
    base,
    seed: int,
    depth: int,
    *,
    skip: tuple[int, ...] = (),
    mask_depth: int | None = None,
    scout: int = 0,
    suffix: str = ".dcm",
) -> None:
    """A case folder of ``depth`` axial slices (minus ``skip``) at a fixed spacing, a sphere of
    +400 HU in it, saved in shuffled order with shuffled InstanceNumbers; its per-slice PNG masks
    (``mask_depth`` of them); and ``scout`` slices of a second series (a localizer) beside it."""
    import copy

    rng = np.random.default_rng([seed, sum(map(ord, case))])
    folder, masks = root / case, root / "masks" / case
    folder.mkdir(parents=True, exist_ok=True)
    masks.mkdir(parents=True, exist_ok=True)
    spacing = float(CT_SPACING[int(rng.integers(len(CT_SPACING)))])
    rows, cols = int(base.Rows), int(base.Columns)
    row_mm, col_mm = (float(v) for v in base.PixelSpacing)
    x0, y0, z0 = -col_mm * cols / 2, -row_mm * rows / 2, float(rng.uniform(-200, -100))
    radius = float(rng.uniform(8, 14))  # mm
    centre = np.array(
        [
            rng.uniform(0.35, 0.65) * depth * spacing,
            rng.uniform(0.3, 0.7) * rows * row_mm,
            rng.uniform(0.3, 0.7) * cols * col_mm,
        ]
    )  # (z, y, x) in mm from the first voxel
    yy, xx = np.mgrid[0:rows, 0:cols].astype(np.float64)
    study, series = _uid(seed, case, "study"), _uid(seed, case, "series")
    pixels = base.pixel_array.astype(np.int32)
    numbers = rng.permutation(depth) + 1

    def write(ds, name: str) -> None:
        ds.save_as(folder / name, enforce_file_format=True)

    for k in rng.permutation(depth):
        inside = (
            (k * spacing - centre[0]) ** 2 + (yy * row_mm - centre[1]) ** 2 + (xx * col_mm - centre[2]) ** 2
        ) <= radius**2
        if mask_depth is None or k < mask_depth:
            Image.fromarray(inside.astype(np.uint8) * 255).save(masks / f"slice_{k:03d}.png")
        if k in skip:
            continue
        values = pixels + CT_SPHERE_HU * inside + np.round(rng.normal(0, 12, pixels.shape)).astype(np.int32)
        ds = copy.deepcopy(base)
        ds.PixelData = np.clip(values, -32768, 32767).astype(np.int16).tobytes()
        ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = _uid(seed, case, "slice", k)
        ds.PatientID, ds.PatientName = case, case
        ds.SeriesDescription, ds.SeriesNumber = "axial", 2
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.ImagePositionPatient = [x0, y0, z0 + k * spacing]
        ds.SliceLocation, ds.SliceThickness = z0 + k * spacing, spacing
        ds.InstanceNumber = int(numbers[k])  # deliberately not the slice order
        write(ds, f"{ds.SOPInstanceUID}{suffix}" if suffix else f"IM{numbers[k]:04d}")
    for k in range(scout):  # a localizer series in the same folder: coronal, its own series UID
        ds = copy.deepcopy(base)
        ds.StudyInstanceUID, ds.SeriesInstanceUID = study, _uid(seed, case, "scout")
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = _uid(seed, case, "scout", k)
        ds.SeriesDescription, ds.SeriesNumber = "scout", 1
        ds.ImageOrientationPatient = [1, 0, 0, 0, 0, -1]
        ds.ImagePositionPatient = [x0, y0 + 40.0 * k, z0]
        ds.InstanceNumber = k + 1
        write(ds, f"{ds.SOPInstanceUID}{suffix}" if suffix else f"IM{depth + k + 1:04d}")


def generate_ct(
    root: str | Path,
    n: int = 6,
    seed: int = 0,
    bad: bool = True,
    prefix: str = "case_",
    depth_range: tuple[int, int] = (8, 20),
) -> dict[str, str]:
    """``n`` good CT cases ROOT/<prefix>NNN/ of 8-20 slices with masks/<case>/, plus (``bad``) a case
    missing a slice, a case holding a second (scout) series, and a case whose mask lacks a slice."""
    import pydicom
    from pydicom.data import get_testdata_file

    root = Path(root)
    base = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    for i in range(n):
        depth = int(np.random.default_rng([seed, i]).integers(depth_range[0], depth_range[1] + 1))
        _ct_case(root, f"{prefix}{i:03d}", base, seed, depth, suffix="" if i == 1 else ".dcm")
    defects: dict[str, str] = {}
    if bad:
        _ct_case(root, f"{prefix}missing_slice", base, seed, 12, skip=(5,))
        defects[f"{prefix}missing_slice"] = "slice 5 of 12 is missing (a gap in the positions)"
        _ct_case(root, f"{prefix}two_series", base, seed, 12, scout=3)
        defects[f"{prefix}two_series"] = (
            "two series in one folder: 12 axial slices and a 3-slice scout "
            "(series: largest takes the axial one; without it, ambiguous)"
        )
        _ct_case(root, f"{prefix}mask_depth", base, seed, 10, mask_depth=9)
        defects[f"masks/{prefix}mask_depth"] = "the mask has 9 slices, its volume 10"
    return defects

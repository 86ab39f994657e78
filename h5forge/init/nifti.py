"""The NIfTI layout: ``*.nii.gz`` (or ``*.nii``) volumes in the raw folder or a case folder such as
``images/``; the case id is the file name without its ending. Label volumes are expected in
``labels/`` (or another mask folder), so files named like labels among the volumes get a note."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np

from h5forge.kinds import Layout
from h5forge.errors import UsageError
from h5forge.init.folders import named, sample
from h5forge.init.pictures import SIZE_SAMPLE
from h5forge.init.text import SpecText
from h5forge.init.volumes import (
    CASE_DIRS,
    VOLUME_MASK_DIRS,
    is_nifti,
    most_common_size,
    nifti_globs,
    nifti_id,
    volume_field,
    volume_mask_field,
    volume_masks,
)


def nifti_body(raw: Path, notes: list[str]):
    """The body of a spec for the NIfTI volumes of ``raw`` (or its first case folder holding some),
    or None if there are none."""
    for base in [raw, *named(raw, CASE_DIRS)]:
        if base.name.lower() in VOLUME_MASK_DIRS and base != raw:
            continue
        files = sorted(p for p in base.iterdir() if is_nifti(p))
        if files:
            return _nifti_volumes_body(raw, base, files, notes)
    return None


def _nifti_volumes_body(raw: Path, base: Path, files: list[Path], notes: list[str]):
    import nibabel
    from nibabel.filebasedimages import ImageFileError

    sizes: Counter = Counter()
    odd, unreadable, fractional = [], [], False
    sampled = sample(files, SIZE_SAMPLE)
    for p in sampled:
        try:
            img = nibabel.load(p)
        except (ImageFileError, OSError, ValueError, EOFError):
            unreadable.append(p.name)
            continue
        if len(img.shape) != 3:
            odd.append(f"{p.name} {tuple(img.shape)}")
            continue
        sizes[(int(img.shape[1]), int(img.shape[0]))] += 1  # stored (z, y, x): a slice is y rows of x
        slope, inter = img.header.get_slope_inter()
        fractional |= img.get_data_dtype().kind == "f" or any(
            v is not None and np.isfinite(v) and not float(v).is_integer() for v in (slope, inter)
        )
    if unreadable:
        notes.append(
            f"{len(unreadable)} of {len(sampled)} sampled NIfTI files cannot be read by nibabel "
            f"(e.g. {unreadable[0]}): they will be rejected"
        )
    if odd:
        notes.append(f"{len(odd)} sampled NIfTI files are not 3-D volumes (e.g. {odd[0]}): they will be rejected")
    if not sizes:
        raise UsageError(f"no 3-D NIfTI volume in {base} can be read by nibabel")
    size = most_common_size(sizes, "volumes", notes)
    prefix = "" if base == raw else f"{base.name}/"
    labelled = [p.name for p in files if re.search(r"[_-](seg|mask|label|labels|gt)$", nifti_id(p), re.I)]
    if labelled:
        notes.append(
            f"{', '.join(labelled[:3])} look like label volumes but are read as volumes: move them into "
            "labels/, named like their volume"
        )
    mask = volume_masks(raw, base, {nifti_id(p) for p in files}, notes)
    what = f"NIfTI volumes ({len(files)} in {prefix or './'}), slices along the third axis"

    def body(t: SpecText) -> None:
        t(0, "fields:")
        volume_field(t, "volume", nifti_globs(prefix, files), size, sum(sizes.values()), what, False, fractional)
        if mask is not None:
            volume_mask_field(t, "volume_mask", "volume", mask)

    return "volume", body


def detect(kind, raw: Path, notes: list[str], todo: list[str]) -> Layout | None:
    """The ``volume`` layout (NIfTI): two cases per task, as cases are large."""
    found = nifti_body(raw, notes)
    if found is None:
        return None
    name, body = found
    return Layout(name, body, batch_size=2)

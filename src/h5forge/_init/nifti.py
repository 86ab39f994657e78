"""The NIfTI layout: ``*.nii.gz`` (or ``*.nii``) volumes, NIfTI-1 or NIfTI-2, in the raw folder or
one of its folders (``images/``, ``func/``, ...), or one folder per case holding them
(``<case>/*.nii.gz``); the case id is the file name without its ending (``<case>/<file>`` when
every case folder names its file alike). 4-D files under ``func/`` (or ``*_bold``) are functional
runs: each time point is a sample (``fourth_axis: time``). Label volumes
are expected in ``labels/`` (or another mask folder), so files named like labels among the volumes
get a note. When most sampled volumes are 4-D, the field keeps their fourth axis as channels
(``fourth_axis: channels`` with its most common length) and a note says so, and how to make each
time point a sample instead (``fourth_axis: time``): nothing in a header tells contrasts from time."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from h5forge.kinds import Layout
from h5forge.errors import UsageError
from h5forge._init.folders import named, sample, subdirs
from h5forge._init.pictures import SIZE_SAMPLE
from h5forge._init.text import SpecText
from h5forge._init.volumes import (
    CASE_DIRS,
    VOLUME_MASK_DIRS,
    is_nifti,
    lz4_saving,
    most_common_size,
    nifti_globs,
    nifti_id,
    volume_field,
    volume_mask_field,
    volume_masks,
)


TIME_DIRS = ("func",)  # BIDS: functional runs, whose fourth axis is time
CASE_FOLDERS_SHARE = 0.5  # case folders: at least this share of the sub-folders hold a NIfTI file


def _volume_folders(raw: Path) -> list[Path]:
    """Where flat NIfTI files are looked for first: the raw folder and the folders named for cases
    or functional runs (not a mask folder)."""
    return [
        d for d in (raw, *named(raw, (*CASE_DIRS, *TIME_DIRS))) if d == raw or d.name.lower() not in VOLUME_MASK_DIRS
    ]


def _niftis(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if is_nifti(p))
    except OSError:
        return []


def detect(kind, raw: Path, notes: list[str], todo: list[str]) -> Layout | None:
    """The ``volume`` layout of the NIfTI volumes of ``raw``: files in it or in one of its folders
    (``images/``, ``func/``, ...), else one folder per case holding them; None if there are none."""
    for base in _volume_folders(raw):
        if files := _niftis(base):
            return _nifti_volumes_body(raw, base, files, notes)
    for top in [raw, *named(raw, CASE_DIRS)]:
        found = _case_folders(raw, top, notes)
        if found is not None:
            return found
    for base in subdirs(raw):  # a folder of another name holding the volumes (one only: else case folders)
        if base.name.lower() not in VOLUME_MASK_DIRS and (files := _niftis(base)):
            return _nifti_volumes_body(raw, base, files, notes)
    return None


def _case_folders(raw: Path, top: Path, notes: list[str]) -> Layout | None:
    """``<case>/<file>.nii.gz`` below ``top``, when most of its sub-folders hold NIfTI files. The
    ids are the file names when they differ from case to case, else (``image.nii.gz`` in every
    folder) their paths below ``top``: ``<case>/image``."""
    cases = [d for d in subdirs(top) if d.name.lower() not in VOLUME_MASK_DIRS]
    holding = {d: files for d in cases if (files := _niftis(d))}
    if len(holding) < 2 or len(holding) < CASE_FOLDERS_SHARE * len(cases):
        return None
    files = [p for found in holding.values() for p in found]
    stems = [nifti_id(p) for p in files]
    ids = "stem" if len(set(stems)) == len(stems) else "path"
    several = [d.name for d, found in holding.items() if len(found) > 1]
    if several:
        notes.append(
            f"{len(several)} of {len(holding)} case folders hold more than one NIfTI file (e.g. {several[0]}/): "
            "each file is a sample of its own"
        )
    if ids == "path":
        notes.append(
            f"the NIfTI files of different case folders share names (e.g. {stems[0]}): a sample's id is its "
            "path below the case folders, <case>/<file> (source.ids: path)"
        )
    prefix = "" if top == raw else f"{top.name}/"
    return _nifti_volumes_body(raw, top, files, notes, f"{prefix}*/", ids)


def _nifti_volumes_body(
    raw: Path, base: Path, files: list[Path], notes: list[str], prefix: str | None = None, ids: str = "stem"
) -> Layout:
    """Two cases per task, as cases are large."""
    import nibabel
    from nibabel.filebasedimages import ImageFileError

    sizes: Counter = Counter()
    fourth: Counter = Counter()  # lengths of the fourth axis of the 4-D files
    odd, unreadable, fractional = [], [], False
    sampled = sample(files, SIZE_SAMPLE)
    for p in sampled:
        try:
            img = nibabel.load(p)
        except (ImageFileError, OSError, ValueError, EOFError):
            unreadable.append(p.name)
            continue
        dims = _dims(img.shape)
        if len(dims) not in (3, 4):
            odd.append(f"{p.name} {tuple(img.shape)}")
            continue
        if len(dims) == 4:
            fourth[dims[3]] += 1
        sizes[(dims[1], dims[0])] += 1  # stored (z, y, x): a slice is y rows of x
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
        notes.append(
            f"{len(odd)} sampled NIfTI files are neither 3-D nor 4-D volumes (e.g. {odd[0]}): they will be rejected"
        )
    if not sizes:
        raise UsageError(f"no 3-D or 4-D NIfTI volume in {base} can be read by nibabel")
    time = base.name.lower() in TIME_DIRS or sum("_bold" in p.name.lower() for p in files) * 2 > len(files)
    fourth_axis = _fourth_axis(fourth, sum(sizes.values()), notes, time)
    size = most_common_size(sizes, "volumes", notes)
    if prefix is None:
        prefix = "" if base == raw else f"{base.name}/"
    labelled = [p.name for p in files if re.search(r"[_-](seg|mask|label|labels|gt)$", nifti_id(p), re.I)]
    if labelled:
        notes.append(
            f"{', '.join(labelled[:3])} look like label volumes but are read as volumes: move them into "
            "labels/, named like their volume"
        )
    mask = volume_masks(raw, base, {nifti_id(p) for p in files}, notes)
    what = f"NIfTI volumes ({len(files)} in {prefix or './'}), slices along the third axis"
    axis: dict[str, Any] = {"fourth_axis": "time"} if fourth_axis == "time" else {}
    if fourth_axis and fourth_axis != "time":
        axis = {"fourth_axis": "channels", "channels": fourth_axis}
    rels = [p.relative_to(raw).as_posix() for p in sampled]
    saving = lz4_saving(raw, rels, size, "float32" if fractional else "int16", **axis)

    def body(t: SpecText) -> None:
        t(0, "fields:")
        named_by = "its path below the case folders, <case>/<file>" if ids == "path" else "its name"
        globs, sampled = nifti_globs(prefix, files), sum(sizes.values())
        volume_field(t, "volume", globs, size, sampled, what, False, fractional, fourth_axis, named_by, saving)
        if mask is not None:
            volume_mask_field(t, "volume_mask", "volume", mask)

    return Layout("volume", body, ids="path" if ids == "path" else None, batch_size=2)


def _dims(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A header's shape without trailing axes of length 1, as the volume kind reads it."""
    dims = tuple(int(n) for n in shape)
    while len(dims) > 3 and dims[-1] == 1:
        dims = dims[:-1]
    return dims


def _fourth_axis(fourth: Counter, readable: int, notes: list[str], time: bool = False) -> int | str | None:
    """The ``channels`` to write when most sampled volumes are 4-D (their most common fourth-axis
    length), or ``"time"`` for functional runs (a ``func/`` folder, ``*_bold`` files), else None;
    either way a note says which files the choice leaves rejected."""
    if not fourth:
        return None
    four = sum(fourth.values())
    channels, n = fourth.most_common(1)[0]
    if four * 2 < readable and not time:
        notes.append(
            f"{four} of {readable} sampled NIfTI volumes are 4-D: they will be rejected unless the volume "
            "field sets fourth_axis: channels and channels: <length of the fourth axis>"
        )
        return None
    if time:
        notes.append(
            f"{four} of {readable} sampled NIfTI volumes are 4-D functional runs: each time point becomes a "
            "sample (fourth_axis: time), <case>@t0000, ..., all in the case's split; a 3-D file is one time point"
        )
        return "time"
    others = readable - n
    notes.append(
        f"{four} of {readable} sampled NIfTI volumes are 4-D: their fourth axis (length {channels} in {n}) is "
        "kept as the channels of each slice (fourth_axis: channels); if it is time, set fourth_axis: time "
        "without channels: each time point becomes a sample (<case>@t0000, ...), all in the case's split"
        + (f"; the other {others} sampled volume{'s' if others != 1 else ''} will be rejected" if others else "")
    )
    return int(channels)

"""What the two volume layouts (DICOM case folders, NIfTI files) share: the folder names they are
found under, NIfTI naming, the masks beside the volumes (per-slice pictures or NIfTI label
volumes), the slice size (the most common one: slices are cropped or padded to it, never
resampled), the codec (what LZ4 saves on a few sampled slices, as the volume kind decodes them)
and the ``volume`` field's lines. ``compute.batch_size`` is 2 for them, as cases are large."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, cast

import numpy as np

from h5forge._init.folders import named, sample, subdirs, visible
from h5forge._init.masks import MaskClasses, class_lines, mask_classes, pad_line
from h5forge._init.pictures import pictures_in
from h5forge._init.text import SpecText, files_value

if TYPE_CHECKING:
    from h5forge.spec import DatasetSpec

CASE_DIRS = tuple("cases volumes scans series studies patients subjects dicom images imagestr ct mr".split())
VOLUME_MASK_DIRS = tuple(
    "masks mask labels labelstr segmentations segmentation seg gt ground_truth groundtruth".split()
)
CASE_SAMPLE, LABEL_SAMPLE = 20, 5
SLICES_MEASURED, CASES_MEASURED = 8, 2  # slices LZ4 compresses at init, spread through the first cases
# LZ4 is kept from this saving on. A random slice stored none reads within 1.3x of a memory-mapped
# .npy's at every slice size; lz4 reads a 512² one within 1.1x from 44 % saved, but at 1.4-1.6x
# where it saves 30 % or less, and a smaller slice at more (benchmarks/results/kinds_ct_codec.md)
LZ4_WORTH = 0.4
SEG_CLASSES = ("1.2.840.10008.5.1.4.1.1.66.4", "1.2.840.10008.5.1.4.1.1.66.7")  # (label map) segmentation storage


def seg_segments(path: Path) -> list[int] | None:
    """The segment numbers a DICOM SEG file describes; None when the file is no SEG."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    try:
        ds = pydicom.dcmread(path, stop_before_pixels=True)
    except (InvalidDicomError, ValueError, EOFError, OSError, TypeError, KeyError):
        return None
    if str(ds.get("SOPClassUID", "")) not in SEG_CLASSES:
        return None
    return sorted(int(s.get("SegmentNumber", 0) or 0) for s in ds.get("SegmentSequence", []))


def seg_classes(segments: list[list[int]]) -> MaskClasses:
    """Binary for one segment a SEG, else classes 0..the highest segment number."""
    found = sorted({k for numbers in segments for k in numbers if k})
    info = MaskClasses(sampled=len(segments))
    if len(found) > 1:
        info.classes, info.found = found[-1] + 1, [0, *found]
    return info


def is_nifti(p: Path) -> bool:
    return visible(p) and p.name.lower().endswith((".nii.gz", ".nii")) and p.is_file()


def nifti_id(p: Path) -> str:
    return p.name[:-7] if p.name.lower().endswith(".nii.gz") else p.name[:-4]


def nifti_globs(prefix: str, files: Iterable[Path]) -> list[str]:
    """One glob per NIfTI ending found, spelled as found (``*.nii.gz``, ``*.nii``)."""
    endings = Counter(p.name[-7:] if p.name.lower().endswith(".nii.gz") else p.name[-4:] for p in files)
    return [f"{prefix}*{e}" for e, _ in endings.most_common()]


@dataclass
class VolumeMask:
    globs: list[str]
    what: str
    classes: MaskClasses


def _label_volume_classes(files: list[Path], notes: list[str]) -> MaskClasses:
    """Binary or ``classes``/``ignore_value`` from the values of a few NIfTI label volumes."""
    import nibabel
    from nibabel.filebasedimages import ImageFileError

    info, values = MaskClasses(), set()
    for p in sample(files, LABEL_SAMPLE):
        try:
            data = np.asanyarray(nibabel.load(p).dataobj)
        except (ImageFileError, OSError, ValueError, EOFError):
            continue
        found = np.unique(data)
        if not np.array_equal(found, np.round(found)):
            notes.append(
                f"{p.name} holds values that are not whole numbers: label volumes must hold class "
                "indices, so such masks will be rejected"
            )
            return info
        values |= {int(v) for v in found}
        info.sampled += 1
    if values <= {0, 1} or values <= {0, 255}:
        return info
    if min(values) < 0 or max(values) > 255:
        notes.append(
            f"label volumes hold values {min(values)}..{max(values)}: only class indices 0..255 are "
            "supported; the mask is declared binary and such masks will be rejected"
        )
        return info
    info.classes = max(max(values - {255}, default=0) + 1, 2)
    info.ignore_value = 255 if 255 in values else None
    info.found = sorted(values)
    return info


def volume_masks(raw: Path, base: Path, ids: set[str], notes: list[str]) -> VolumeMask | None:
    """masks/<case>/ folders of per-slice pictures, or masks/<case>.nii.gz label volumes."""
    for d in named(raw, VOLUME_MASK_DIRS):
        if d == base:
            continue
        nifti = sorted(p for p in d.iterdir() if is_nifti(p))
        folders = [c for c in subdirs(d) if pictures_in(c)]
        dicom = sorted(p for p in d.iterdir() if visible(p) and p.is_file() and p.suffix.lower() == ".dcm")
        segs = [n for n in (seg_segments(p) for p in sample(dicom, LABEL_SAMPLE)) if n is not None]
        if segs:
            mask_ids = {p.stem for p in dicom}
            mask = VolumeMask([f"{d.name}/*.dcm"], "a DICOM SEG per case, segment k as class k", seg_classes(segs))
        elif nifti:
            mask_ids = {nifti_id(p) for p in nifti}
            classes = _label_volume_classes(nifti, notes)
            mask = VolumeMask(nifti_globs(f"{d.name}/", nifti), "label volumes (NIfTI)", classes)
        elif folders:
            mask_ids = {c.name for c in folders}
            slices = [p for c in sample(folders, CASE_SAMPLE) for p in pictures_in(c)]
            what = "a folder of per-slice pictures per case, numbered in slice order"
            mask = VolumeMask([f"{d.name}/*"], what, mask_classes(slices, notes, by_colour=False))
        else:
            continue
        if ids - mask_ids:
            notes.append(
                f"{len(ids - mask_ids)} of {len(ids)} cases have no mask in {d.name}/ "
                f"(e.g. {sorted(ids - mask_ids)[0]}): they are quarantined as incomplete samples"
            )
        if mask_ids - ids:
            notes.append(
                f"{len(mask_ids - ids)} masks in {d.name}/ have no case (e.g. {sorted(mask_ids - ids)[0]}): "
                "they are quarantined as incomplete samples"
            )
        return mask
    return None


def volume_mask_field(t: SpecText, name: str, like: str, mask: VolumeMask) -> None:
    t(1, f"{name}:")
    t(2, "kind: volume_mask", mask.what)
    t(2, f"files: {files_value(mask.globs)}")
    t(2, f"like: {like}", "must have its volume's depth and slice size; cropped/padded with it")
    class_lines(t, mask.classes, "voxels to ignore in the loss; padding uses it")
    pad_line(t, mask.classes)


@dataclass(frozen=True)
class Saving:
    """What LZ4 saves on sampled slices: the share of their bytes, and how many were compressed."""

    share: float
    slices: int


def lz4_saving(root: Path, rels: list[str], size: tuple[int, int], dtype: str, **field: Any) -> Saving | None:
    """What LZ4 saves on up to ``SLICES_MEASURED`` slices spread through the first
    ``CASES_MEASURED`` of the cases ``rels`` (relative to ``root``) that decode, as the build
    decodes and stores them: the registered volume kind's ``decode`` for a field of ``size`` and
    ``dtype`` (``field``: its other keys, e.g. series, fourth_axis, channels); None when none
    decodes."""
    from h5forge._format.chunk_codec import encode
    from h5forge.kinds import REGISTRY
    from h5forge._samples import SampleRef

    cls = REGISTRY["volume"]
    spec = cls.Spec.model_validate({"kind": "volume", "files": ["*"], "size": size, "dtype": dtype, **field})
    kind = cls("volume", spec, cast("DatasetSpec", None))  # its decode reads the field's own spec alone
    part = "@t0000" if field.get("fourth_axis") == "time" else ""  # a 4-D file's first time point
    plain = packed = slices = 0
    cases = 0
    for rel in rels:
        if cases == CASES_MEASURED:
            break
        try:
            values = np.asarray(kind.decode(root, SampleRef(rel + part, "train", {"volume": rel}, {}), {}).value)
        except Exception:  # a case the build would reject (with its reason): the next one is measured
            continue
        cases += 1
        for d in np.unique(np.linspace(0, len(values) - 1, SLICES_MEASURED // CASES_MEASURED).astype(int)):
            one = np.ascontiguousarray(values[d])
            plain, packed, slices = plain + one.nbytes, packed + len(encode("lz4", one)), slices + 1
    return Saving(1 - packed / plain, slices) if plain else None


def codec_lines(t: SpecText, saving: Saving | None) -> None:
    """``codec: none`` for slices LZ4 saves little on, else the line commented, with the rule."""
    if saving is None:
        t.comment(2, 'codec: none  <- for slice training (unit="slice"): each slice read straight from the')
        t.comment(2, "file's map, at memory speed; lz4 (the default) saves disk (docs/reading.md, 'CT slices')")
        return
    measured = f"LZ4 saves {saving.share:.0%} on {saving.slices} sampled slices"
    if saving.share < LZ4_WORTH:
        t(2, "codec: none", f"{measured}, under {LZ4_WORTH:.0%}: stored as they are,")
        t.more(f"a random slice read straight from the file's map; lz4 from {LZ4_WORTH:.0%} on")
        t.more("(docs/reading.md, 'CT slices')")
    else:
        t.comment(2, f"codec: none  <- {measured}, {LZ4_WORTH:.0%} or more: lz4 (the default) kept; none")
        t.comment(2, "reads a random slice faster, for slice training (docs/reading.md, 'CT slices')")


def most_common_size(sizes: Counter, what: str, notes: list[str]) -> tuple[int, int]:
    (rows, cols), n = sizes.most_common(1)[0]
    if len(sizes) > 1:
        seen = ", ".join(f"{r}x{c} in {k}" for (r, c), k in sizes.most_common(4))
        notes.append(
            f"slice sizes differ among the sampled {what} ({seen}): others are centre-cropped or padded "
            f"to {rows}x{cols}, never resampled"
        )
    return rows, cols


def volume_field(
    t: SpecText,
    name: str,
    globs: list[str],
    size: tuple[int, int],
    sampled: int,
    what: str,
    series: bool,
    fractional: bool,
    fourth_axis: int | str | None = None,
    ids: str = "its name",
    saving: Saving | None = None,
) -> None:
    t(1, f"{name}:")
    t(2, "kind: volume", what)
    t(2, f"files: {files_value(globs)}", f"one case each; the sample id is {ids}")
    t(2, f"size: [{size[0]}, {size[1]}]", f"(rows, columns): the most common slice size of {sampled} sampled cases;")
    t.more("others are centre-cropped / padded, never resampled; the depth is kept")
    codec_lines(t, saving)
    if series:
        t(2, "series: largest", "case folders hold several series (see the notes): keep the one with")
        t.more("the most slices | or a SeriesDescription regular expression")
    if fourth_axis == "time":
        t(2, "fourth_axis: time", "functional runs (see the notes): a sample per time point,")
        t.more("<case>@t0000, ..., in the case's split | or channels (with channels: C)")
    elif fourth_axis is not None:
        t(2, "fourth_axis: channels", "the files are 4-D (see the notes): the fourth axis is kept as")
        t.more("the channels of each slice, stored (D, C, H, W) per case | or time (without channels):")
        t.more("a sample per time point, <case>@t0000, ..., in the case's split")
        t(2, f"channels: {fourth_axis}", "the length of the fourth axis: other lengths are rejected")
    if fractional:
        t(2, "dtype: float32", "rescale slope/intercept are not whole numbers")

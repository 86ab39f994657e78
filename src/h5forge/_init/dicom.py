"""The DICOM layout: case folders ``<case>/*.dcm`` (or files without a suffix that pydicom reads;
also ``cases/<case>/``), each a series of single-frame files or a multi-frame file (its frames
count as slices); a DICOM SEG beside the slices, or ``masks/<case>.dcm``, is the case's mask. Sampled case folders are read header by header, since what decides the
spec is there: the series a folder holds (``series: largest`` when it holds several), the slice
size, the modality, a fractional rescale. Every file of a case folder is read at build time, so
files that are not slices get a note."""

from __future__ import annotations

import fnmatch
import math
import os
import stat
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from h5forge.kinds import Layout
from h5forge.kinds.base import warnings_logged
from h5forge.errors import UsageError
from h5forge._init.folders import named, sample, subdirs, visible
from h5forge._init.text import SpecText
from h5forge._init.volumes import (
    CASE_DIRS,
    CASE_SAMPLE,
    SEG_CLASSES,
    VOLUME_MASK_DIRS,
    VolumeMask,
    lz4_saving,
    seg_classes,
    most_common_size,
    volume_field,
    volume_mask_field,
    volume_masks,
)

CASE_FILES = 2000
_MODALITY_NAMES = {"CT": "ct", "MR": "mr", "PT": "pet"}


def _files_below(d: Path, limit: int) -> list[Path]:
    """Up to ``limit`` files below ``d`` at any depth, sorted, as a case folder is read (every file
    but hidden ones)."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(d):
        dirnames.sort()
        for name in sorted(filenames):
            if not name.startswith("."):
                found.append(Path(dirpath) / name)
                if len(found) >= limit:
                    return found
    return found


def _regular(p: Path) -> bool:
    """A regular file (through symlinks): a FIFO would block its reader forever, a device such as
    /dev/zero never end. Neither is opened here; the build rejects their cases with what they are."""
    try:
        return stat.S_ISREG(os.stat(p).st_mode)
    except OSError:
        return False


def _is_dicom(p: Path) -> bool:
    """A ``.dcm`` file, or any file with the ``DICM`` marker after its 128-byte preamble (scanners
    write files without a suffix, or with UID-like names)."""
    if p.suffix.lower() in (".dcm", ".dicom"):
        return True
    if not _regular(p):
        return False
    try:
        with open(p, "rb") as fh:
            return fh.read(132)[128:] == b"DICM"
    except OSError:
        return False


@dataclass
class _Case:
    """What the headers of one DICOM case folder say."""

    slices: Counter = field(default_factory=Counter)  # SeriesInstanceUID -> files
    described: dict[str, str] = field(default_factory=dict)  # SeriesInstanceUID -> SeriesDescription
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # SeriesInstanceUID -> (rows, columns)
    modalities: dict[str, str] = field(default_factory=dict)  # SeriesInstanceUID -> Modality
    fractional: bool = False  # a rescale slope or intercept that is not a whole number
    strays: list[str] = field(default_factory=list)  # files pydicom does not read, or without a series
    segs: list[list[int]] = field(default_factory=list)  # the segment numbers of each DICOM SEG beside the slices

    @property
    def main(self) -> str | None:
        """The series ``series: largest`` keeps."""
        return max(self.slices, key=lambda uid: self.slices[uid]) if self.slices else None

    @property
    def modality(self) -> str:
        """The modality of the series the case keeps."""
        return self.modalities.get(self.main or "", "")


def _dicom_case(d: Path) -> _Case:
    import pydicom
    from pydicom.errors import InvalidDicomError

    case = _Case()
    for p in _files_below(d, CASE_FILES):
        if not _regular(p):
            case.strays.append(p.relative_to(d).as_posix())
            continue
        try:
            with warnings_logged(str(p)):  # to the log: the build says what is wrong with the file
                ds = pydicom.dcmread(p, stop_before_pixels=True)
        except (InvalidDicomError, ValueError, EOFError, OSError, TypeError, KeyError):
            case.strays.append(p.relative_to(d).as_posix())
            continue
        uid = str(ds.get("SeriesInstanceUID", "") or "")
        if not uid:  # a DICOMDIR, a report: no slice of any series
            case.strays.append(p.relative_to(d).as_posix())
            continue
        if str(ds.get("SOPClassUID", "")) in SEG_CLASSES:  # a mask of the case, no slice
            case.segs.append(sorted(int(s.get("SegmentNumber", 0) or 0) for s in ds.get("SegmentSequence", [])))
            continue
        frames = _number(ds.get("NumberOfFrames"))
        case.slices[uid] += int(frames) if frames and frames >= 1 else 1  # a multi-frame file: a frame a slice
        case.described.setdefault(uid, str(ds.get("SeriesDescription", "") or ""))
        rows, columns = _number(ds.get("Rows")), _number(ds.get("Columns"))
        if rows is not None and columns is not None:
            case.sizes.setdefault(uid, (int(rows), int(columns)))
        case.modalities.setdefault(uid, str(ds.get("Modality", "") or "").strip().upper())
        for key in ("RescaleSlope", "RescaleIntercept"):
            value = _number(ds.get(key))
            if value is not None and not value.is_integer():
                case.fractional = True
    return case


def _number(value) -> float | None:
    """A header value as a finite number; None when missing or not a number (the build rejects
    such a slice with its reason: inference only looks)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _dicom_cases(raw: Path) -> tuple[Path, list[Path]] | None:
    """The folder holding the case folders (``raw`` or e.g. ``raw/cases``) and the case folders:
    its sub-folders with DICOM files at any depth."""
    for base in [raw, *named(raw, CASE_DIRS)]:
        skip = set(VOLUME_MASK_DIRS) | (set(CASE_DIRS) if base == raw else set())
        cases = [
            d for d in subdirs(base) if d.name.lower() not in skip and any(_is_dicom(p) for p in _files_below(d, 8))
        ]
        if cases:
            return base, cases
    return None


def _case_glob(raw: Path, base: Path, cases: list[Path], notes: list[str]) -> str:
    """``cases/*``, or for case folders at the top the common start of their names (``case_*``), so
    masks/ and loose files are not read as cases; a note for whatever else the glob takes."""
    if base != raw:
        glob = f"{base.name}/*"
    else:
        prefix = os.path.commonprefix([d.name for d in cases]).rstrip("0123456789")
        glob = f"{prefix}*" if not re.search(r"[*?\[\]]", prefix) else "*"
    pattern = glob.split("/")[-1]
    others = sorted(
        p.name + ("/" if p.is_dir() else "")
        for p in base.iterdir()
        if visible(p) and fnmatch.fnmatchcase(p.name, pattern) and p not in cases
    )
    if others:
        where = "" if base == raw else f"{base.name}/"
        notes.append(
            f"files: {glob} also takes {', '.join(where + o for o in others[:4])}"
            f"{' ...' if len(others) > 4 else ''}, which are not case folders of DICOM files: they will be "
            "rejected as cases" + ("; move the case folders into cases/" if base == raw else "; move them out")
        )
    dotted = [d.name for d in cases if "." in d.name]
    if dotted:
        notes.append(
            f"case folder names with a dot ({', '.join(dotted[:3])}): a sample id is the name without "
            "what follows its last dot, so such cases may collide; rename the folders without dots"
        )
    return glob


def detect(kind, raw: Path, notes: list[str], todo: list[str]) -> Layout | None:
    """The ``volume`` layout of DICOM case folders, or None if ``raw`` holds none: two cases per
    task, as cases are large."""
    found = _dicom_cases(raw)
    if found is None:
        return None
    base, cases = found
    glob = _case_glob(raw, base, cases, notes)
    picked = sample(cases, CASE_SAMPLE)
    sampled = {d.name: _dicom_case(d) for d in picked}
    read = {n: c for n, c in sampled.items() if c.main is not None}
    if not read:
        raise UsageError(f"no DICOM slice in {base} can be read by pydicom (e.g. {cases[0]})")
    several = {n: c for n, c in read.items() if len(c.slices) > 1}
    if several:
        n, c = next(iter(several.items()))
        listed = ", ".join(f"{c.described[u] or 'no description'!r} {k} slices" for u, k in c.slices.most_common())
        notes.append(
            f"{len(several)} of {len(read)} sampled case folders hold more than one series (e.g. {n}: "
            f"{listed}): series: largest keeps the one with the most slices; set a SeriesDescription "
            "pattern instead to choose by name"
        )
    strays = [(n, s) for n, c in sampled.items() for s in c.strays]
    if strays:
        n, s = strays[0]
        notes.append(
            f"{len(strays)} files in sampled case folders are not DICOM slices pydicom reads (e.g. {n}/{s}): "
            "every file of a case folder is read, so those cases will be rejected; move such files out"
        )
    size = most_common_size(Counter(c.sizes[c.main] for c in read.values() if c.main in c.sizes), "cases", notes)
    modality, name = _field_name(Counter(c.modality for c in read.values() if c.modality), len(read), notes)
    mask = volume_masks(raw, base, {d.name for d in cases}, notes)
    beside = [c.segs[0] for c in read.values() if c.segs]
    if mask is None and beside:
        mask = VolumeMask([glob], "the DICOM SEG beside each case's slices, segment k as class k", seg_classes(beside))
        if len(beside) < len(read):
            notes.append(
                f"{len(read) - len(beside)} of {len(read)} sampled case folders hold no DICOM SEG: "
                "those cases will be rejected, with no SEG to read as their mask"
            )
    where = "case folders" if base == raw else f"case folders in {base.name}/"
    what = f"a DICOM series per case folder ({modality or 'modality unknown'}, {len(cases)} {where})"
    fractional = any(c.fractional for c in read.values())
    rels = [d.relative_to(raw).as_posix() for d in picked if d.name in read]
    saving = lz4_saving(raw, rels, size, "float32" if fractional else "int16", series="largest" if several else None)

    def body(t: SpecText) -> None:
        t(0, "fields:")
        volume_field(t, name, [glob], size, len(read), what, bool(several), fractional, saving=saving)
        if mask is not None:
            volume_mask_field(t, f"{name}_mask", name, mask)

    return Layout("volume", body, batch_size=2)


def _field_name(modalities: Counter, sampled: int, notes: list[str]) -> tuple[str, str]:
    """The modality the sampled cases hold and the field's name for it (``ct``, ``mr``, ``pet``;
    ``volume`` for another, an unknown or a mix of modalities, which a note then names)."""
    if len(modalities) == 1:
        [modality] = modalities
        return modality, _MODALITY_NAMES.get(modality, "volume")
    if modalities:
        found = ", ".join(f"{m} in {n}" for m, n in modalities.most_common())
        notes.append(
            f"the sampled cases hold series of more than one modality ({found} of {sampled}): the field is "
            "named volume, and each case's modality is in its volume_modality column; CT cases are padded "
            "with air (-1024 HU), the others with 0"
        )
        return "mixed: " + "/".join(m for m, _ in modalities.most_common()), "volume"
    return "", "volume"

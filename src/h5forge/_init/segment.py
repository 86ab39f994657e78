"""The ``images/`` (+ ``masks/``) layout: pictures, with segmentation masks paired by file name
when a mask folder is found beside them, and a label offered from the annotation file."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from h5forge.kinds import Layout
from h5forge._init.annotations import annotation_lines, find_annotations, label_field
from h5forge._init.folders import named
from h5forge._init.mask_pairs import MaskPairs, find_mask_pairs
from h5forge._init.masks import mask_classes, mask_field
from h5forge._init.pictures import IMAGE_DIRS, image_field, larger_choice, picture_globs, pictures_in, target_size
from h5forge._init.text import SpecText, files_value

MASK_DIRS = tuple(
    "masks mask labels annotations_masks segmentationclass segmentations groundtruth ground_truth gt".split()
)


def mask_suffix(image_stems: set[str], mask_stems: set[str]) -> str | None:
    """The end most mask stems add to their image's stem (ISIC's ``_segmentation``, CamVid's ``_L``),
    when no mask is named as its image is."""
    if not mask_stems or image_stems & mask_stems:
        return None
    ends = Counter(next((m[k:] for k in range(len(m) - 1, 0, -1) if m[:k] in image_stems), None) for m in mask_stems)
    ends.pop(None, None)
    end, n = ends.most_common(1)[0] if ends else (None, 0)
    return end if 2 * n > len(mask_stems) else None


def named_pairs(raw: Path, images: Path, image_files: list[Path]) -> MaskPairs | None:
    """``images/`` beside a mask folder named as one (``masks/``, ``labels/``, ...), or None."""
    masks = next((d for d in named(raw, MASK_DIRS) if pictures_in(d) and d != images), None)
    if masks is None:
        return None
    mask_files = pictures_in(masks)
    stems_i, stems_m = {p.stem for p in image_files}, {p.stem for p in mask_files}
    if suffix := mask_suffix(stems_i, stems_m):
        stems_m = {m[: -len(suffix)] for m in stems_m if m.endswith(suffix)}
    image_globs = picture_globs(f"{images.name}/", image_files)
    mask_globs = picture_globs(f"{masks.name}/", mask_files)
    return MaskPairs(image_globs, image_files, "", mask_globs, mask_files, suffix or "", None, len(stems_i - stems_m))


def segment_body(raw: Path, pairs: MaskPairs, notes: list[str]) -> Layout:
    size = target_size(pairs.image_files, files_value(pairs.image_globs))
    mc = mask_classes(pairs.mask_files, notes)
    if pairs.unpaired:
        notes.append(
            f"{pairs.unpaired} of {len(pairs.image_files)} pictures ({files_value(pairs.image_globs)}) have no "
            f"mask ({files_value(pairs.mask_globs)}): they are quarantined as incomplete samples"
        )
    cut = len(pairs.image_suffix)
    ids = {p.stem[: len(p.stem) - cut] for p in pairs.image_files}
    ann = find_annotations(raw, ids, "stem", set(), notes)
    level = pairs.split_level
    folders = {"split": level} if level is not None else None

    def body(t: SpecText) -> None:
        t(0, "fields:")
        larger, why = larger_choice(size, "crop")
        image_field(t, "images", pairs.image_globs, size, larger, why)
        if pairs.image_suffix:
            why = f"picture names end in it after the id (<id>{pairs.image_suffix}); the mask's id leaves its own end"
            t(2, f"id_suffix: {json.dumps(pairs.image_suffix)}", why)
        mask_field(t, pairs.mask_globs, mc, pairs.mask_suffix or None)
        if ann is not None and ann.label is not None:
            column, classes = ann.label
            label_field(t, column, classes, f"the class, from {ann.file}", active=False)
        annotation_lines(t, ann, folders=folders, folder_columns={"split": "str"} if folders else None)

    return Layout("segment", body, split_column="split" if folders else None)


def images_body(raw: Path, images: Path, image_files: list[Path], notes: list[str]) -> Layout:
    size = target_size(image_files, str(images))
    ann = find_annotations(raw, {p.stem for p in image_files}, "stem", set(), notes)

    def body(t: SpecText) -> None:
        t(0, "fields:")
        larger, why = larger_choice(size, "crop")
        image_field(t, "images", picture_globs(f"{images.name}/", image_files), size, larger, why)
        if ann is not None and ann.label is not None:
            column, classes = ann.label
            label_field(t, column, classes, f"the class, from {ann.file}")
        annotation_lines(t, ann)

    return Layout("images", body)


def detect(kind, raw: Path, notes: list[str], todo: list[str]) -> Layout | None:
    """The ``segment`` layout (pictures and masks: ``images/`` + ``masks/``, or folders of any name
    whose files pair), or the ``images`` layout, when ``raw`` has a picture folder."""
    images = next((d for d in named(raw, IMAGE_DIRS) if pictures_in(d)), None)
    image_files = pictures_in(images) if images else []
    pairs = (named_pairs(raw, images, image_files) if images else None) or find_mask_pairs(raw, notes)
    if pairs is not None:
        return segment_body(raw, pairs, notes)
    return None if images is None else images_body(raw, images, image_files, notes)

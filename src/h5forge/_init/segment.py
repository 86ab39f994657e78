"""The ``images/`` (+ ``masks/``) layout: pictures, with segmentation masks paired by file name
when a mask folder is found beside them, and a label offered from the annotation file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from h5forge.kinds import Layout
from h5forge._init.annotations import annotation_lines, find_annotations, label_field
from h5forge._init.folders import named
from h5forge._init.masks import mask_classes, mask_field
from h5forge._init.pictures import IMAGE_DIRS, image_field, larger_choice, picture_globs, pictures_in, target_size
from h5forge._init.text import SpecText

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


def segment_body(raw: Path, images: Path, notes: list[str]) -> Layout:
    image_files = pictures_in(images)
    masks = next((d for d in named(raw, MASK_DIRS) if pictures_in(d) and d != images), None)
    mask_files = pictures_in(masks) if masks else []
    size = target_size(image_files, str(images))
    mc = mask_classes(mask_files, notes) if masks else None
    suffix = None
    if masks:
        stems_i, stems_m = {p.stem for p in image_files}, {p.stem for p in mask_files}
        if suffix := mask_suffix(stems_i, stems_m):
            stems_m = {m[: -len(suffix)] for m in stems_m if m.endswith(suffix)}
        if stems_i - stems_m:
            notes.append(
                f"{len(stems_i - stems_m)} of {len(stems_i)} pictures in {images.name}/ have no mask in "
                f"{masks.name}/: they are quarantined as incomplete samples"
            )
    ids = {p.stem for p in image_files}
    ann = find_annotations(raw, ids, "stem", set(), notes)

    def body(t: SpecText) -> None:
        t(0, "fields:")
        larger, why = larger_choice(size, "crop")
        image_field(t, "images", picture_globs(f"{images.name}/", image_files), size, larger, why)
        if masks and mc is not None:
            mask_field(t, picture_globs(f"{masks.name}/", mask_files), mc, suffix)
        if ann is not None and ann.label is not None:
            column, classes = ann.label
            label_field(t, column, classes, f"the class, from {ann.file}", active=not masks)
        annotation_lines(t, ann)

    return Layout("segment" if masks else "images", body)


def detect(kind, raw: Path, notes: list[str], todo: list[str]) -> Layout | None:
    """The ``segment`` (``images/`` + ``masks/``) or ``images`` layout, when ``raw`` has a picture folder."""
    images = next((d for d in named(raw, IMAGE_DIRS) if pictures_in(d)), None)
    return None if images is None else segment_body(raw, images, notes)

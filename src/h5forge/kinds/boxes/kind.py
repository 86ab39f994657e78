"""``kind: boxes``: the objects of a picture as boxes and classes (object detection).

    fields:
      images: {kind: image, files: images/*.jpg, size: [256, 256], larger: shrink}
      boxes:  {kind: boxes, like: images, coco: annotations/instances_train.json, classes: [cat, dog]}
      boxes:  {kind: boxes, like: images, files: labels/*.txt, classes: [cat, dog]}      # YOLO
      boxes:  {kind: boxes, like: images, files: labels/*.txt, classes: [person], kpt_shape: [17, 3]}  # pose
      boxes:  {kind: boxes, like: images, files: labels/*.txt, classes: [cat, dog], missing: empty}  # backgrounds

The boxes follow their picture's geometry (``like``; the frame rules: ``geometry``), and each
picture records how many were clipped and dropped. Sources: ``sources``. Stored ragged, rows
``x0, y0, x1, y1, class`` in pixels of the stored image, any number per picture; statistics:
boxes per class and the pictures holding each class. Readers return a picture's (n, 5) rows,
batched as ``Padded``. ``masks: true`` also stores each kept box's instance mask (``instances``).
``missing: empty`` makes a picture without its YOLO label file a background picture, no boxes
(``h5forge.kinds.optional``).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import numpy as np
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from h5forge._format.arrays import Ragged, Stored
from h5forge.kinds.base import (
    DEFAULT_MAX_BYTES,
    Companion,
    Decoded,
    FieldKind,
    FieldModel,
    Follows,
    Globs,
    field_of,
    read_source,
)
from h5forge.kinds.boxes import classfile
from h5forge.kinds.boxes.datayaml import DATA_YAML, KEYPOINT_NUMBERS, declared_kpt_shape, split_folder_names
from h5forge.kinds.boxes.geometry import place
from h5forge.kinds.boxes.inbox import coco_files_in, coco_subset
from h5forge.kinds.boxes.instances import instance_masks
from h5forge.kinds.boxes.sources import (
    CocoIndex,
    Limits,
    Objects,
    coco_boxes,
    coco_digest,
    coco_entry,
    coco_index,
    yolo_boxes,
)
from h5forge.kinds.image import ImageField
from h5forge.kinds.index import RowIndex
from h5forge.kinds.mask import OVERLAY
from h5forge.kinds.optional import OptionalFile
from h5forge.kinds.plugins import Demo, Detector, Plugins
from h5forge.kinds.preview import Preview
from h5forge.kinds.shared import SharedInputs
from h5forge.kinds.statistics import ClassCounts
from h5forge._samples import Reject, SampleRef

COLUMNS = ("x0", "y0", "x1", "y1", "class")
DEFAULT_MAX_OBJECTS = 1_000  # ten times what the busiest COCO pictures hold
DEFAULT_MAX_VERTICES = 10_000  # COCO polygons hold tens to hundreds
DEFAULT_MAX_OUTLINE = 4_000_000  # pixels of polygon outline: about 160 MB while rasterising
YOLO_CLASS_FILES = (classfile.CLASSES_TXT, DATA_YAML)  # where YOLO folders name their classes
_WILD = re.compile(r"[*?\[]")  # a glob part that matches several names


class BoxesField(FieldModel):
    """Boxes and classes per picture, from a COCO instances file or YOLO label files."""

    kind: Literal["boxes"] = "boxes"
    like: str = Field(description="the image field whose pictures the boxes are drawn on")
    classes: tuple[str, ...] = Field(description="class names, in index order (COCO categories by name)")
    coco: str | tuple[str, ...] | None = Field(None, description="COCO instances JSON file(s), relative to source.root")
    files: Globs | None = Field(None, description="YOLO label files, one <stem>.txt per picture")
    outside: Literal["clip", "drop"] = Field("clip", description="a box that leaves the frame: clipped, or dropped")
    min_size: float = Field(1.0, ge=0, description="a box narrower or lower than this (pixels) is dropped")
    kpt_shape: tuple[int, int] | None = Field(
        None,
        description="YOLO pose labels: [K, D], each line's box followed by K keypoints of D numbers (x y, or "
        "x y visibility), as Ultralytics' data.yaml declares it; the box is the line's first four numbers",
    )
    masks: bool = Field(False, description="also store each box's instance mask (COCO or YOLO segmentation)")
    missing: Literal["refuse", "empty"] = Field(
        "refuse",
        description="YOLO: a picture without its label file is refused as incomplete, or (empty) a background "
        "picture with no boxes, as Ultralytics reads it",
    )
    max_bytes: int = Field(DEFAULT_MAX_BYTES, gt=0, description="a larger COCO or YOLO label file is refused unread")
    max_objects: int = Field(
        DEFAULT_MAX_OBJECTS, gt=0, description="a picture with more annotations (YOLO: label lines) is rejected"
    )
    max_vertices: int = Field(DEFAULT_MAX_VERTICES, ge=3, description="a polygon of more vertices is rejected")
    max_outline: int = Field(
        DEFAULT_MAX_OUTLINE, gt=0, description="masks: polygons with more pixels of outline are rejected"
    )

    @model_validator(mode="after")
    def _one_source(self) -> "BoxesField":
        if (self.coco is None) == (self.files is None):
            raise ValueError("give either coco (COCO instances files) or files (YOLO labels)")
        if not self.classes or len(set(self.classes)) != len(self.classes):
            raise ValueError("classes must be a non-empty list of distinct names")
        if self.kpt_shape is not None:
            if self.coco is not None:
                raise ValueError("kpt_shape is for YOLO pose labels (files), not COCO files")
            k, d = self.kpt_shape
            if k < 1 or d not in KEYPOINT_NUMBERS:
                raise ValueError(f"kpt_shape [{k}, {d}]: K keypoints (K >= 1) of 2 (x y) or 3 (x y visibility) numbers")
        if self.missing != "refuse" and self.coco is not None:
            raise ValueError(
                "missing is for YOLO label files (files): a picture a COCO file lists without annotations has "
                "no boxes already, and one it does not list is no picture of the dataset"
            )
        return self

    @model_serializer(mode="wrap")
    def _without_the_default_missing(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # the spec a version stores, and the rules hash made of it, stay those of a spec written
        # before the key existed: a dataset that does not use it is not cleaned again for it
        data = handler(self)
        if data.get("missing") == "refuse":
            del data["missing"]
        return data


class BoxesKind(Plugins, Follows, SharedInputs, OptionalFile, ClassCounts, RowIndex, Preview, FieldKind[BoxesField]):
    kind = "boxes"
    Spec = BoxesField
    follows = "image"
    detectors = (
        Detector(
            "h5forge.kinds.boxes.detect:detect", 15, "pictures with COCO instances_*.json or YOLO labels/*.txt boxes"
        ),
    )
    demos = (
        Demo("boxes", "h5forge.kinds.boxes.demo:generate", 60, "pictures + COCO instances boxes", noun="boxes samples"),
    )
    layout_doc = (
        "ragged: (total boxes, 5) float32 rows x0, y0, x1, y1 (pixels of the stored image), class, plus "
        "<field>_lengths (N,) boxes per picture; companions <field>_clipped, <field>_dropped (N,); "
        "dataset attr classes; split attr <field>_class_boxes (K,); /index/<split>/<field>: pictures by "
        "class present; with masks: true, <field>_masks ragged (total boxes, H, W) uint8 instance masks"
    )

    @property
    def is_coco(self) -> bool:
        """Boxes from COCO files (an inbox may hold none of them yet), not YOLO labels."""
        return self.spec.coco is not None

    @property
    def file_optional(self) -> bool:
        """``missing: empty``: a picture without its label file is a background picture."""
        return self.spec.missing == "empty"

    @property
    def coco_files(self) -> tuple[str, ...]:
        c = self.spec.coco
        return () if c is None else (c,) if isinstance(c, str) else tuple(c)

    def shared_files(self) -> tuple[str, ...]:
        """The COCO files; for YOLO labels, the files YOLO folders name their classes in
        (``classes.txt``, ``data.yaml``) at the top of the source and beside the labels: ``init``
        takes the classes from them, so they are the dataset's. In Ultralytics' split layout
        (``labels/*/*.txt``) they are beside the labels of each split folder."""
        if self.coco_files:
            return self.coco_files
        folders = {f for g in self.files for f in _label_folders(PurePosixPath(g).parent)}
        return tuple(sorted((PurePosixPath(d) / name).as_posix() for d in {"", *folders} for name in YOLO_CLASS_FILES))

    @property
    def limits(self) -> Limits:
        f = self.spec
        return Limits(f.max_bytes, f.max_objects, f.max_vertices, f.max_outline)

    def shared_files_in(self, folder: Path) -> tuple[str, ...]:
        return coco_files_in(folder, self.coco_files, self.spec.max_bytes) if self.is_coco else ()

    def reading(self, shared: tuple[str, ...]) -> dict[str, Any]:
        return {"coco": shared} if self.is_coco else {}

    def shared_files_of(self, root: Path, ref: SampleRef) -> tuple[str, ...] | None:
        if not self.is_coco:
            return None
        picture = ref.files[self.spec.like]
        listing = []
        for rel in self.coco_files:
            try:
                coco_entry(self._index(root, rel), picture)
            except Reject:
                continue
            listing.append(rel)
        return tuple(listing)

    def shared_subset(
        self, root: Path, shared: tuple[str, ...], files: set[str], complement: bool = False
    ) -> str | None:
        if not self.is_coco:
            return None  # YOLO's class files are the dataset's, not split by picture
        return coco_subset(root, shared, {PurePosixPath(f).name for f in files}, complement, self.spec.max_bytes)

    def stored(self) -> Stored:
        return Stored((len(COLUMNS),), np.float32, bulk=True, ragged=True)

    def dataset_attrs(self) -> dict[str, Any]:
        return {"classes": list(self.spec.classes), "columns": list(COLUMNS)}

    def companions(self) -> dict[str, FieldKind]:
        out: dict[str, FieldKind] = {
            f"{self.name}_{what}": BoxCount(self, what, None) for what in ("clipped", "dropped")
        }
        if self.spec.masks:
            out[f"{self.name}_masks"] = BoxMasks(self)
        return out

    # ---- decoding
    def _index(self, root: Path, rel: str, within: Path | None = None) -> CocoIndex:
        """The index of the COCO file ``root/rel``, read bounded by the field's ``max_bytes`` and the
        source's symlink rule (out of ``within``, the source folder it belongs to: ``root`` unless said)."""
        return coco_index(root, rel, self.spec.max_bytes, self.dataset.source.allow_symlinks_outside, within)

    def _coco(self, root: Path, picture: str) -> CocoIndex:
        """The index of the COCO file that lists ``picture``: the one of ``coco`` that does, beside
        the picture's own source folder first (an append's folder with its own COCO file), then under
        the root; an unreadable file beside the picture is the reason when none lists it."""
        unreadable: Reject | None = None
        near: dict[str, CocoIndex] = {}
        for rel in self.coco_files:
            found = _nearest_listing(root, rel, picture, self._index)
            if isinstance(found, CocoIndex):
                near[rel] = found
            unreadable = unreadable or (found if isinstance(found, Reject) else None)
        if near:
            return _only_listing(picture, near)
        last, listing = None, {}
        for rel in self.coco_files:
            index = self._index(root, rel)
            try:
                coco_entry(index, picture)
                listing[rel] = index
            except Reject as err:
                last = err
        if listing:
            return _only_listing(picture, listing)
        raise unreadable or last or Reject(picture, "no COCO file to look it up in")

    def _coco_of(self, root: Path, ref: SampleRef) -> CocoIndex:
        """The part of the COCO file that discovery took for ``ref``, else the whole file's index."""
        part = ref.shared.get(self.name)
        if isinstance(part, CocoIndex):
            return part
        if isinstance(part, tuple):  # (path, reason): discovery found what cleaning rejects
            raise Reject(*part)
        return self._coco(root, ref.files[self.spec.like])

    def shared_entry(self, root: Path, ref: SampleRef) -> CocoIndex | tuple[str, str] | None:
        if not self.coco_files:
            return None
        picture = ref.files[self.spec.like]
        try:
            part = self._coco(root, picture).part(picture, self.spec.max_objects)
        except Reject as err:
            return (err.path, err.reason)
        return (part.path, part.reason) if isinstance(part, Reject) else part

    @property
    def _outside(self) -> bool:
        """Whether a class file may be read through a symlink out of its source folder."""
        return self.dataset.source.allow_symlinks_outside

    def _declared_kpt_shape(self, root: Path) -> Any:
        """The kpt_shape a data.yaml at the top or beside the labels declares when the spec gives
        none (then the label lines are read by the spec alone), else None."""
        if self.spec.kpt_shape is not None:
            return None
        folders = dict.fromkeys(["", *(PurePosixPath(g).parent.as_posix() for g in self.files)])
        data_yamls = tuple((PurePosixPath(d) / DATA_YAML).as_posix() for d in folders)
        return declared_kpt_shape(root, data_yamls, self.dataset.source.allow_symlinks_outside)

    def input_digest(self, root: Path, ref: SampleRef) -> str | None:
        if not self.is_coco:
            # YOLO: the label file is hashed as the field's file; a data.yaml's kpt_shape decides
            # whether its lines are taken, and the classes.txt above it what its numbers name
            declared = self._declared_kpt_shape(root)
            said = [] if declared is None else [f"data.yaml kpt_shape {declared!r}"]
            if (label := ref.files.get(self.name)) is not None and (
                found := classfile.nearest(root, label, self.files)
            ):
                try:
                    said.append(f"{found[0]} {classfile.read(root, *found, self._outside)[1]}")
                except Reject as err:
                    said.append(f"rejected: {err}")
            elif label is None and (folder := self._missing_label_folder(root, ref.files[self.spec.like])):
                said.append(f"no label folder {folder}")  # made, it makes the picture a background
            return "; ".join(said) or None
        try:
            return coco_digest(self._coco_of(root, ref), ref.files[self.spec.like])
        except Reject as err:
            return f"rejected: {err}"  # cleaning rejects the sample with the reason

    def decode(self, root: Path, ref: SampleRef, done: dict[str, Decoded]) -> Decoded:
        geometry = done[self.spec.like].context
        picture = ref.files[self.spec.like]
        limits = self.limits
        if self.is_coco:
            index = self._coco_of(root, ref)
            objects = coco_boxes(index, picture, geometry.raw, self.spec.classes, limits.max_objects)
            digest = None
            where = picture
        elif self.name not in ref.files:
            objects, digest, where = self._background(root, picture), "", picture
        else:
            where = ref.files[self.name]
            data, digest = read_source(root, where, limits.max_bytes)
            objects = yolo_boxes(
                data,
                where,
                geometry.raw,
                len(self.spec.classes),
                limits,
                self.spec.kpt_shape,
                self._declared_kpt_shape(root),
            )
            if (found := classfile.nearest(root, where, self.files)) is not None:
                listed, _ = classfile.read(root, *found, self._outside)
                classfile.check(listed, found[0], objects.labels, self.spec.classes, where)
        placed = place(objects.corners, geometry, self.spec.outside, self.spec.min_size)
        rows = np.column_stack([placed.boxes, objects.labels[placed.kept]]).astype(np.float32)
        context = {"clipped": placed.clipped, "dropped": placed.dropped}
        if self.spec.masks:
            size = field_of(self.dataset, self.spec.like, ImageField).size
            context["masks"] = instance_masks(objects, np.flatnonzero(placed.kept), geometry, size, where, limits)
        return Decoded(rows.reshape(-1, len(COLUMNS)), digest, context)

    def _background(self, root: Path, picture: str) -> Objects:
        """No objects: a picture without its label file, under ``missing: empty``. The file has no
        digest (the sample's stored one is empty), so one that appears later changes the input key.
        In split folders, only where its split has a label folder: a split handed out without one
        (a competition's test pictures) is unlabelled, not a split of pictures with no objects."""
        if not self.file_optional:
            raise Reject(picture, f"no label file for {self.name} ({', '.join(self.files)})")
        if (folder := self._missing_label_folder(root, picture)) is not None:
            raise Reject(
                picture,
                f"no label file for {self.name}, and {folder}/ does not exist: a picture of a split without its "
                f"label folder is unlabelled, not a background picture (an empty {folder}/ makes its pictures "
                "backgrounds)",
            )
        return Objects(np.zeros((0, 4), np.float64), np.zeros(0, np.int64), [], [])

    def _missing_label_folder(self, root: Path, picture: str) -> str | None:
        """The folder the label file of ``picture`` would lie in when the label files lie in split
        folders (a ``*`` in their folder: ``labels/*/``, ``*/labels/``) and no such folder is there;
        None when one is, when the globs do not place it, or for a picture of another source folder
        (``../inbox/processed/vNNNN/...``: the append judged it in its inbox, and moved no label
        folder for a background). The ``*`` parts above the picture take the picture's folder
        names, in order."""
        parts = picture.split("/")
        expected = []
        globs = field_of(self.dataset, self.spec.like, ImageField).files
        for image_glob in (globs,) if isinstance(globs, str) else globs:
            pattern = image_glob.split("/")
            if len(pattern) > len(parts) or not all(map(fnmatch.fnmatchcase, parts[-len(pattern) :], pattern)):
                continue
            base, tail = parts[: -len(pattern)], parts[-len(pattern) :]
            if ".." in base:  # an appended picture, judged in its inbox (no label file: no folder moved)
                return None
            names = [name for name, part in zip(tail[:-1], pattern[:-1]) if _WILD.search(part)]
            for label_glob in self.files:
                folder = label_glob.split("/")[:-1]
                wild = [i for i, part in enumerate(folder) if _WILD.search(part)]
                if not names or len(wild) != len(names) or any("**" in part for part in folder):
                    continue
                for i, name in zip(wild, names):
                    folder[i] = name
                expected.append("/".join([*base, *folder]))
        if not expected or any(os.path.isdir(root / f) for f in expected):
            return None
        return expected[0]

    # ---- statistics: boxes per class, and which pictures hold each class
    counted = "class_boxes"

    @property
    def n_classes(self) -> int:
        return len(self.spec.classes)

    def row_counts(self, block: Ragged) -> np.ndarray:
        k = self.n_classes
        rows = [np.bincount(block[i][:, 4].astype(np.int64), minlength=k)[:k] for i in range(len(block))]
        return np.array(rows, np.int64).reshape(len(block), k)

    # ---- preview: each box's outline in its class colour, over its picture
    @property
    def overlay_on(self) -> str:
        return self.spec.like

    def preview(self, value: Any) -> np.ndarray:
        h, w = field_of(self.dataset, self.spec.like, ImageField).size
        canvas = np.zeros((h, w, 3), np.uint8)
        for x0, y0, x1, y1, cls in np.asarray(value, np.float64).reshape(-1, len(COLUMNS)):
            colour = OVERLAY[int(cls) % len(OVERLAY)]
            left, right = int(np.clip(np.floor(x0), 0, w - 1)), int(np.clip(np.ceil(x1) - 1, 0, w - 1))
            top, bottom = int(np.clip(np.floor(y0), 0, h - 1)), int(np.clip(np.ceil(y1) - 1, 0, h - 1))
            canvas[top, left : right + 1] = canvas[bottom, left : right + 1] = colour
            canvas[top : bottom + 1, left] = canvas[top : bottom + 1, right] = colour
        return canvas

    def caption(self, value: Any) -> str:
        labels = np.asarray(value).reshape(-1, len(COLUMNS))[:, 4].astype(int)
        counts = [int(np.count_nonzero(labels == i)) for i in range(len(self.spec.classes))]
        named = ", ".join(f"{n} {c}" for n, c in zip(counts, self.spec.classes) if n)
        return f"{self.name}: {len(labels)}" + (f" ({named})" if named else "")


def _label_folders(parent: PurePosixPath) -> tuple[str, ...]:
    """The folders a label glob's ``parent`` names: itself, or for a ``*`` among its parts
    (``labels/*``, Ultralytics' split layout) the folder of each split name there."""
    wild = [i for i, part in enumerate(parent.parts) if part == "*"]
    if len(wild) != 1:
        return (parent.as_posix(),)
    parts = list(parent.parts)
    return tuple(
        PurePosixPath(*parts[: wild[0]], name, *parts[wild[0] + 1 :]).as_posix() for name in split_folder_names()
    )


def _nearest_listing(
    root: Path, rel: str, picture: str, index_of: Callable[[Path, str, Path], CocoIndex]
) -> CocoIndex | Reject | None:
    """The index of the COCO file at ``rel`` below the nearest folder above ``picture`` that has one
    listing it; else why the nearest such file could not be read, or None. ``index_of`` reads it
    bounded, within the picture's own source folder (``../inbox/processed/vNNNN/...``) or the root."""
    if PurePosixPath(rel).is_absolute():
        return None  # the one file the spec names, wherever the picture is
    unreadable: Reject | None = None
    for folder in list(PurePosixPath(picture).parents)[:-1]:
        near = (folder / rel).as_posix()
        if all(part == ".." for part in folder.parts) or not os.path.lexists(root / near):
            continue
        try:
            index = index_of(root, near, root / folder if ".." in folder.parts else root)
        except Reject as err:  # a FIFO, a file too large, a symlink out of the source: said, not skipped
            unreadable = unreadable or err
            continue
        try:
            coco_entry(index, picture)
        except Reject:
            continue
        return index
    return unreadable


def _only_listing(picture: str, listing: dict[str, CocoIndex]) -> CocoIndex:
    """The index of the COCO files listing ``picture``; files saying other things of it refuse it:
    COCO names a picture by its file name alone, so which file's boxes are its cannot be told (two
    splits exported apart, each numbering its pictures from 1)."""
    if len({coco_digest(index, picture) for index in listing.values()}) > 1:
        raise Reject(
            picture,
            f"{' and '.join(listing)} each list a picture named {PurePosixPath(picture).name!r}, with other "
            "boxes: which are this picture's cannot be told; rename the pictures apart, or list each in one file",
        )
    return next(iter(listing.values()))


class BoxCount(Companion[None]):
    """How many of a picture's boxes the frame clipped or dropped."""

    kind = "box-count"
    checksummed = False

    def stored(self) -> Stored:
        return Stored((), np.int64, bulk=False)


class BoxMasks(Preview, Companion[None]):
    """Each kept box's instance mask, in box order, at the stored picture's size (``masks: true``)."""

    kind = "box-masks"

    def __init__(self, boxes: BoxesKind):
        super().__init__(boxes, "masks", None)
        self.like = boxes.spec.like

    @property
    def image(self) -> ImageField:
        return field_of(self.dataset, self.like, ImageField)

    def stored(self) -> Stored:
        return Stored(self.image.size, np.uint8, bulk=True, ragged=True, chunk_elements=1)

    def dataset_attrs(self) -> dict[str, Any]:
        return {"boxes": self.owner}

    @property
    def overlay_on(self) -> str:
        return self.like

    def preview(self, value: Any) -> np.ndarray:
        """Each instance filled in its own colour over the picture (later boxes on top)."""
        masks = np.asarray(value)
        canvas = np.zeros((*self.image.size, 3), np.uint8)
        for i, m in enumerate(masks):
            canvas[m.astype(bool)] = OVERLAY[i % len(OVERLAY)]
        return canvas

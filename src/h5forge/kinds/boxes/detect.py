"""``h5forge init`` for object detection folders: the ``boxes`` layout.

COCO: an ``instances_*.json`` whose images are pictures of a sub-folder, giving an image field
there (the most common size, ``larger: shrink`` so no object is cropped away) and a boxes field
with its categories as classes. YOLO: ``labels/*.txt`` beside ``images/`` (or ``labels/<split>/``
beside ``images/<split>/``, or ``<split>/labels/`` beside ``<split>/images/``, the split from the
folders), the classes from
``classes.txt`` or ``data.yaml``, else ``class_0`` ... (noted); a ``kpt_shape`` in ``data.yaml`` (pose
labels) goes into the spec. Nothing here imports ``init``: the
``SpecText`` it writes into is passed in.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from h5forge._format.names import split_named
from h5forge.kinds.base import DEFAULT_MAX_BYTES, read_bounded
from h5forge.kinds.boxes import classfile, datayaml
from h5forge.kinds.boxes.datayaml import DATA_YAML
from h5forge.kinds.plugins import Layout

PICTURES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
SAMPLED = 200  # label files read to find the classes of a YOLO folder without a names file
SMALL_FILE = 1 << 20  # a names file or a label file


def _read(path: Path, raw: Path, max_bytes: int = SMALL_FILE) -> str | None:
    """The text of a file of the folder, read as a build reads it (a regular file, within
    ``max_bytes``, not through a symlink out of ``raw``), or None: a FIFO never stops ``init``."""
    try:
        return read_bounded(path, max_bytes, raw, allow_outside=False).decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return None


def _quoted(value: str) -> str:
    return json.dumps(value)


def _flow(values) -> str:
    return "[" + ", ".join(_quoted(v) for v in values) + "]"


def _pictures(folder: Path) -> list[Path]:
    return (
        sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in PICTURES) if folder.is_dir() else []
    )


def _globs(rel: str, pictures: list[Path]) -> list[str]:
    suffixes = Counter(p.suffix for p in pictures)
    return [f"{rel}/*{s}" for s, _ in suffixes.most_common()]


def _coco_files(raw: Path, notes: list[str]) -> list[tuple[Path, dict]]:
    found: list[tuple[Path, dict]] = []
    for folder in (raw, raw / "annotations"):
        for p in sorted(folder.glob("instances_*.json")) if folder.is_dir() else []:
            text = _read(p, raw, DEFAULT_MAX_BYTES)
            try:
                data = json.loads(text) if text is not None else None
            except (ValueError, RecursionError):
                data = None
            if isinstance(data, dict) and _is_coco(data):
                found.append((p, data))
            else:
                notes.append(f"{p.relative_to(raw).as_posix()} is not a COCO instances file init can read: left out")
    return found


def _is_coco(data) -> bool:
    """An instances file whose entries ``init`` reads: images with a file name (and integer sizes),
    categories with an integer id and a name, annotations as objects."""

    def ints(d: dict, *keys: str) -> bool:
        return all(isinstance(d.get(k), int) for k in keys if k in d)

    return (
        isinstance(data, dict)
        and all(isinstance(data.get(k), list) for k in ("images", "annotations", "categories"))
        and all(isinstance(im, dict) and "file_name" in im and ints(im, "height", "width") for im in data["images"])
        and all(isinstance(c, dict) and isinstance(c.get("id"), int) and "name" in c for c in data["categories"])
        and all(isinstance(a, dict) for a in data["annotations"])
    )


def _image_folders(raw: Path, names: set[str]) -> list[Path]:
    """The folders of the pictures the COCO files list: the split folders of a download with an
    instances file per split (``train2017/``, ``val2017/``, also below ``images/``) that hold any,
    else the one folder holding the most of them (none when no folder holds one)."""
    hits: Counter[Path] = Counter()
    for parent in (raw, raw / "images"):
        for folder in [parent, *sorted(d for d in parent.iterdir() if d.is_dir())] if parent.is_dir() else []:
            hits[folder] = len(names & {p.name for p in _pictures(folder)})
    for parent in (raw, raw / "images"):
        splits = [f for f in hits if hits[f] and f.parent == parent and split_named(f.name)]
        if len(splits) > 1:
            return splits
    best = max(hits, key=lambda f: hits[f], default=None)
    return [best] if best is not None and hits[best] else []


def _image_lines(t, globs: list[str], size: tuple[int, int], what: str) -> None:
    t(0, "fields:")
    t(1, "images:")
    t(2, "kind: image", what)
    t(2, f"files: {_quoted(globs[0]) if len(globs) == 1 else _flow(globs)}")
    t(2, f"size: [{size[0]}, {size[1]}]", "(height, width): the most common picture size")
    t(2, "larger: shrink", "a larger picture is shrunk (keeping its aspect), so no box is cropped away")


def _coco_layout(raw: Path, notes: list[str]) -> Layout | None:
    found = _coco_files(raw, notes)
    if not found:
        return None
    names = {PurePosixPath(str(im.get("file_name", ""))).name for _, d in found for im in d["images"]}
    folders = _image_folders(raw, names)
    if not folders:
        return None
    split = len(folders) > 1  # each picture's split is its folder's
    sizes = Counter(
        (int(im["height"]), int(im["width"]))
        for _, d in found
        for im in d["images"]
        if "height" in im and "width" in im
    )
    size = sizes.most_common(1)[0][0] if sizes else (256, 256)
    categories: dict[int, str] = {}
    for _, d in found:
        for c in d["categories"]:
            categories.setdefault(int(c["id"]), str(c["name"]))
    classes = list(dict.fromkeys(categories[k] for k in sorted(categories)))
    pictures, globs = [], []
    for folder in folders:
        inside = _pictures(folder)
        pictures += inside
        globs += _globs(folder.relative_to(raw).as_posix() if folder != raw else ".", inside)
        listed = len(names & {p.name for p in inside})
        if listed < len(inside):
            notes.append(
                f"{len(inside) - listed} of {len(inside)} pictures in {folder.name}/ have no entry in the "
                "COCO file(s): they are rejected"
            )
    coco = [p.relative_to(raw).as_posix() for p, _ in found]
    segmented = any(a.get("segmentation") for _, d in found for a in d["annotations"])

    def body(t) -> None:
        _image_lines(t, globs, size, f"{len(pictures)} pictures, boxes in {', '.join(coco)}")
        t(1, "boxes:")
        t(2, "kind: boxes", "COCO boxes per picture, by its file_name; crowd regions left out")
        t(2, "like: images", "shrunk, cropped and padded with the picture")
        t(2, f"coco: {_quoted(coco[0]) if len(coco) == 1 else _flow(coco)}")
        t(2, f"classes: {_flow(classes)}", "the COCO categories, in id order")
        t(2, "outside: clip", "a box that leaves the frame is clipped to it (drop: dropped); both counted")
        if segmented:
            t(2, "masks: false", "the COCO file has segmentations: true also stores each box's instance mask")
        if split:
            _split_from_folders(t, -1, "the split folder a picture lies in")

    return Layout("boxes", body, split_column="split" if split else None)


def _split_from_folders(t, level: int, why: str) -> None:
    t(0, "annotations:")
    t(1, "columns: {split: str}")
    t(1, f"folders: {{split: {level}}}", why)
    t(1, "required: false", "no annotation file: the folders say the split")


def _by_index(names: dict[int, str], where: str, notes: list[str]) -> list[str]:
    """The class names in index order, an index the file leaves out named ``class_<i>``: a label's
    class number is its position in the list, so no name may move to another index."""
    listed = [names.get(i, f"class_{i}") for i in range(max(names, default=-1) + 1)]
    gaps = [i for i in range(len(listed)) if i not in names]
    if gaps:
        notes.append(f"{where} names no class {', '.join(map(str, gaps))}: named class_<i> here; rename them")
    return listed


def _names_file(raw: Path, folders: list[str], notes: list[str]) -> tuple[str, str] | None:
    """The first classes.txt at the top, in ``labels/`` or in a split folder's labels (``folders``),
    as (its path, its text); a split folder's that names other classes is noted."""
    found = []
    for p in (
        raw / "classes.txt",
        raw / "labels" / "classes.txt",
        *(raw / f / "classes.txt" for f in folders),
    ):
        if p.is_file() and (text := _read(p, raw)) is not None:
            found.append((p.relative_to(raw).as_posix(), text))
    for where, text in found[1:]:
        if text.split() != found[0][1].split():
            notes.append(
                f"{where} names other classes than {found[0][0]}: the classes are {found[0][0]}'s, and a build "
                f"refuses each picture whose label file uses a class number {where} names otherwise"
            )
    return found[0] if found else None


def _yolo_classes(raw: Path, labels: list[Path], folders: list[str], notes: list[str]) -> list[str]:
    if (names_file := _names_file(raw, folders, notes)) is not None:
        where, text = names_file
        return _by_index(classfile.names(text), where, notes)
    names = _data_yaml(raw).get("names")
    if isinstance(names, dict) and all(str(k).isdigit() for k in names):  # {0: person} or {"0": person}
        return _by_index({int(k): str(v) for k, v in names.items()}, "data.yaml", notes)
    if isinstance(names, list):
        return [str(n) for n in names]
    top = -1
    for p in labels[:SAMPLED]:
        for line in (_read(p, raw) or "").splitlines():
            head = line.split()[:1]
            if head and head[0].isdigit():
                top = max(top, int(head[0]))
    notes.append("no classes.txt or data.yaml names: the classes are named class_0 ... by index; rename them")
    return [f"class_{i}" for i in range(max(top + 1, 1))]


def _data_yaml(raw: Path) -> dict:
    """What the folder's data.yaml says (Ultralytics' names, kpt_shape, ...), or nothing."""
    path = raw / DATA_YAML
    return datayaml.parse(_read(path, raw)) if path.is_file() else {}


def _label_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.txt") if p.name != "classes.txt") if folder.is_dir() else []


@dataclass(frozen=True)
class _Arrangement:
    """Where a YOLO folder keeps its pictures and label files: ``images/`` beside ``labels/``, or
    the same in split folders, one folder down (``images/train/``, Ultralytics') or up
    (``train/images/``, Roboflow's export). ``{split}`` marks the split folder in each path."""

    images: str
    labels: str
    splits: tuple[str, ...] = ()

    def folders(self, pattern: str) -> list[str]:
        return [pattern.format(split=s) for s in self.splits] if self.splits else [pattern]

    def glob(self, pattern: str) -> str:
        return pattern.replace("{split}", "*")

    @property
    def split_level(self) -> int:
        """The split folder's place above a picture (``annotations.folders``)."""
        return -1 - self.images.split("/")[::-1].index("{split}")

    @property
    def ids(self) -> str | None:
        # below images/, a path id pairs images/train/x with labels/train/x and lets x recur in each
        # split; above it the paths differ by images/ and labels/, so the stem pairs them
        return "path" if self.images.startswith("images/") else None


def _arrangement(raw: Path) -> _Arrangement:
    """Flat ``images/`` and ``labels/`` when ``labels/`` holds label files, else the split folders
    of ``images/`` that ``labels/`` has too, else top-level split folders holding both."""
    if _label_files(raw / "labels"):
        return _Arrangement("images", "labels")

    def splits(folder: Path, has) -> tuple[str, ...]:
        found = sorted(d for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else []
        return tuple(d.name for d in found if split_named(d.name) and has(d.name))

    below = splits(raw / "images", lambda name: (raw / "labels" / name).is_dir())
    if below:
        return _Arrangement("images/{split}", "labels/{split}", below)
    above = splits(raw, lambda name: (raw / name / "images").is_dir() and (raw / name / "labels").is_dir())
    return _Arrangement("{split}/images", "{split}/labels", above)


def _note_unlabelled_splits(raw: Path, at: _Arrangement, notes: list[str]) -> None:
    """Note the folders the picture glob takes that have no label folder (a test split handed out
    unlabelled): a build refuses their pictures, which are no background pictures."""
    pattern = at.glob(at.images)
    for folder in sorted(raw.glob(pattern)):
        rel = folder.relative_to(raw)
        split = rel.parts[at.split_level]
        if split in at.splits or not _pictures(folder):
            continue
        notes.append(
            f"{rel.as_posix()}/ holds {len(_pictures(folder))} pictures and has no "
            f"{at.labels.format(split=split)}/: a build refuses them as unlabelled (an empty "
            f"{at.labels.format(split=split)}/ makes them background pictures)"
        )


def _yolo_layout(raw: Path, notes: list[str]) -> Layout | None:
    """``labels/*.txt`` beside ``images/``, or the same in split folders (``_Arrangement``), the split
    then taken from the folder."""
    at = _arrangement(raw)
    labels = [p for f in at.folders(at.labels) for p in _label_files(raw / f)]
    pictures = [p for f in at.folders(at.images) for p in _pictures(raw / f)]
    split = bool(at.splits)

    def keys(files: list[Path]) -> set[tuple[str, str]]:  # (split folder or "", stem)
        return {(p.relative_to(raw).parts[at.split_level - 1] if split else "", p.stem) for p in files}

    if not labels or not pictures or not keys(labels) & keys(pictures):
        return None
    classes = _yolo_classes(raw, labels, at.folders(at.labels) if split else [], notes)
    if split:
        _note_unlabelled_splits(raw, at, notes)
    described = _data_yaml(raw)
    declared, kpt_shape = described.get("kpt_shape"), datayaml.kpt_shape_of(described)
    if declared is not None and kpt_shape is None:
        notes.append(
            f"data.yaml declares kpt_shape {declared!r}, which is no [K, D] of K >= 1 keypoints of 2 or 3 "
            "numbers: the spec gives none, and a build refuses the lines that are no plain box"
        )
    # Ultralytics reads a picture without a label file as a background picture (no objects)
    backgrounds = len(keys(pictures) - keys(labels))
    from PIL import Image

    sizes: Counter[tuple[int, int]] = Counter()
    for p in pictures[:SAMPLED]:
        try:
            with Image.open(p) as img:
                sizes[(img.height, img.width)] += 1
        except OSError:
            continue
    size = sizes.most_common(1)[0][0] if sizes else (256, 256)

    def body(t) -> None:
        _image_lines(t, _globs(at.glob(at.images), pictures), size, f"{len(pictures)} pictures, YOLO boxes in labels/")
        t(1, "boxes:")
        t(2, "kind: boxes", "YOLO labels: class cx cy w h relative to the picture, one file per picture")
        t(2, "like: images", "shrunk, cropped and padded with the picture")
        t(2, f'files: "{at.glob(at.labels)}/*.txt"')
        t(2, f"classes: {_flow(classes)}")
        if kpt_shape is not None:
            k, d = kpt_shape
            t(2, f"kpt_shape: [{k}, {d}]", f"data.yaml: pose lines, the box then {k} keypoints (not stored)")
        t(2, "outside: clip", "a box that leaves the frame is clipped to it (drop: dropped); both counted")
        if backgrounds:
            t(
                2,
                "missing: empty",
                f"a picture without a label file ({backgrounds} of {len(pictures)}) is a background picture, "
                "no boxes (refuse: quarantined as incomplete)",
            )
        if split:
            _split_from_folders(t, at.split_level, "the split folder a picture and its label file lie in")

    return Layout("boxes", body, ids=at.ids if split else None, split_column="split" if split else None)


def detect(kind, raw: Path, notes: list[str], todo: list[str]) -> Layout | None:
    """The ``boxes`` layout of a COCO or YOLO folder, or None."""
    return _coco_layout(raw, notes) or _yolo_layout(raw, notes)

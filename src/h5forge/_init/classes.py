"""The class-folder layout: ``<class>/*.jpg`` or ``<split>/<class>/*.jpg`` (also below
``images/``). Sample ids are paths (``cat/0001``), since one file name often appears in every
class; the label, and the split, come from the folder names."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from h5forge._format.names import SPLIT_FOLDER_NAMES as SPLIT_NAMES, split_named
from h5forge.kinds import Layout
from h5forge._ingest.discover import sample_id
from h5forge._init.annotations import annotation_lines, find_annotations
from h5forge._init.folders import named, subdirs
from h5forge._init.pictures import IMAGE_DIRS, image_field, larger_choice, picture_globs, pictures_in, target_size
from h5forge._init.text import SpecText, flow


@dataclass
class ClassTree:
    base: str  # "" or the folder holding the class (or split) folders
    split: bool
    files: list[Path]
    classes: list[str]
    per_class: Counter
    top: list[Path] | None = None  # with split folders: pictures of class folders beside them (<class>/*.jpg)


def class_tree(raw: Path, notes: list[str]) -> ClassTree | None:
    bases = [raw, *named(raw, IMAGE_DIRS)]
    for base in bases:
        prefix = "" if base == raw else base.name + "/"
        dirs = subdirs(base)
        splits = [d for d in dirs if split_named(d.name)]  # as discovery reads a split column
        if splits:
            files: list[Path] = []
            per_class: Counter[str] = Counter()
            found_in: dict[str, set[str]] = {}
            any_loose = False
            for s in splits:
                loose = pictures_in(s)
                any_loose = any_loose or bool(loose)
                if loose:
                    notes.append(
                        f"{len(loose)} pictures lie directly in {prefix}{s.name}/, outside any class folder "
                        "(unlabelled?): not included"
                    )
                for c in subdirs(s):
                    pics = pictures_in(c)
                    if pics:
                        files += pics
                        per_class[c.name] += len(pics)
                        found_in.setdefault(c.name, set()).add(s.name)
            if files:
                for d in dirs:
                    if d not in splits and any(pictures_in(c) for c in subdirs(d)):
                        notes.append(
                            f"{prefix}{d.name}/ is not a split folder ({', '.join(SPLIT_NAMES)}): its "
                            "samples will be rejected (split column)"
                        )
                names = {s.name for s in splits if any(pictures_in(c) for c in subdirs(s))}
                for name, where in sorted(found_in.items()):
                    if where != names and len(names) > 1:
                        notes.append(f"class {name!r} has pictures in {', '.join(sorted(where))} only")
                top_dirs = [d for d in dirs if d not in splits and pictures_in(d)]
                top: list[Path] = []
                if top_dirs and any_loose:
                    notes.append(
                        f"the pictures of the class folders beside the split folders "
                        f"({', '.join(prefix + d.name + '/' for d in top_dirs)}) are not included: a glob "
                        "for them would also take the pictures lying directly in the split folders"
                    )
                elif top_dirs:
                    for d in top_dirs:  # outside any split folder: the ratios give their split
                        top += pictures_in(d)
                        per_class[d.name] += len(pictures_in(d))
                    notes.append(
                        f"class folders beside the split folders ({', '.join(prefix + d.name + '/' for d in top_dirs)}) "
                        "are taken too; their pictures get the split the ratios give"
                    )
                return ClassTree(prefix, True, files, sorted(per_class), per_class, top)
        # a split folder names no class, nor one named with its year (COCO's images/train2017/)
        class_dirs = [d for d in dirs if pictures_in(d) and not split_named(d.name)]
        if len(class_dirs) >= 2:
            loose = pictures_in(base)
            if loose:
                notes.append(
                    f"{len(loose)} pictures lie directly in {prefix or './'}, outside any class folder: not included"
                )
            for d in dirs:
                if d not in class_dirs:
                    notes.append(f"{prefix}{d.name}/ holds no pictures directly: not a class")
            per_class = Counter({d.name: len(pictures_in(d)) for d in class_dirs})
            files = [p for d in class_dirs for p in pictures_in(d)]
            return ClassTree(prefix, False, files, sorted(per_class), per_class)
    return None


def classify_body(raw: Path, tree: ClassTree, notes: list[str]):
    top = tree.top or []
    size = target_size(tree.files + top, str(raw / tree.base))
    depth = "*/*/" if tree.split else "*/"
    globs = picture_globs(tree.base + depth, tree.files) + picture_globs(tree.base + "*/", top)
    pattern = globs[0]  # every glob has the same fixed folders (tree.base), so any gives the ids
    ids = {sample_id(p.relative_to(raw).as_posix(), pattern, "path") for p in tree.files + top}
    folder_columns = {"label": "str", **({"split": "str"} if tree.split else {})}
    folders = {"label": -1, **({"split": -2} if tree.split else {})}
    ann = find_annotations(raw, ids, "path", set(folder_columns), notes)
    counts = ", ".join(f"{c} {tree.per_class[c]}" for c in tree.classes)
    small = [c for c in tree.classes if tree.per_class[c] < 0.2 * max(tree.per_class.values())]
    if small:
        notes.append(
            f"unbalanced classes: {', '.join(small)} have under a fifth of the largest class's pictures "
            "(the label's class counts per split give loss weights)"
        )

    def body(t: SpecText) -> None:
        t(0, "fields:")
        larger, why = larger_choice(size, "shrink")
        image_field(t, "images", globs, size, larger, why)
        t(1, "label:")
        t(2, "kind: label")
        t(2, "column: label", "the class folder's name (annotations.folders)")
        t(2, f"classes: {flow(tree.classes)}", f"sorted folder names; pictures: {counts}")
        index_by = ["label"] if len(tree.classes) <= 50 else []
        annotation_lines(t, ann, folders=folders, folder_columns=folder_columns, index_by=index_by)

    return body


def detect(kind, raw: Path, notes: list[str], todo: list[str]) -> Layout | None:
    """The ``classify`` layout: class folders, named by path, the split from the folders when they say it."""
    tree = class_tree(raw, notes)
    if tree is None:
        return None
    return Layout("classify", classify_body(raw, tree, notes), ids="path", split_column="split" if tree.split else None)

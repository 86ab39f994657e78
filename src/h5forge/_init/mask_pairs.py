"""Pictures and their segmentation masks in folders of any name and depth, as the public sets lay
them out: ISIC's ``*_Input/`` beside ``*_GroundTruth/``, Oxford-IIIT Pet's ``annotations/trimaps/``,
ADE20K's ``images/training/`` beside ``annotations/training/``, Cityscapes' ``leftImg8bit/<split>/
<city>/`` beside ``gtFine/<split>/<city>/``, DRIVE's ``training/images/`` beside ``1st_manual/``.

Two picture folders pair when the names of one are the names of the other, each with its own end
(``_leftImg8bit`` and ``_gtFine_labelIds``), and only when the files say which side is the mask:
a class folder of photographs never pairs with another by its names alone. Folder pairs related
alike (the same folder names at the same place) become one pair of globs. When several kinds of
mask pair with the pictures, the one that labels them is chosen by what the files hold, and when
that cannot tell, ``init`` refuses and names them."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from h5forge.errors import UsageError
from h5forge._format.names import split_named
from h5forge._init.folders import files_in, sample, subdirs
from h5forge._init.masks import _mask_values
from h5forge._init.pictures import PICTURES

MASK_PICTURES = (*PICTURES, ".gif")  # DRIVE's masks are GIFs
DEPTH = 4  # folder levels below the raw folder searched
MAX_FOLDERS = 4000
ID_SAMPLE = 200  # ids of a folder looked up among the other folders' names
MAX_PARTNERS = 8  # more folders sharing a folder's names: class folders, not masks
KIND_SAMPLE = 4  # files read to tell a mask folder from a picture folder
MASK_VALUES = 64  # a mask holds at most this many values; a photograph thousands
SAME_REGION = 0.98  # masks agreeing on this share of pixels in every sample mark one region (a field of view)
_SEP = "_-. "
# words of a mask's end or folder that name the label, best first
_LABEL_WORDS = ("trainids", "labeltrainids", "labelids", "label", "labels", "segmentation", "manual", "trimaps", "gt")


@dataclass(frozen=True)
class _Folder:
    path: Path
    rel: tuple[str, ...]
    files: tuple[Path, ...]


@dataclass
class MaskPairs:
    """What ``init`` writes for pictures and masks found in any folders: one glob for each side,
    the ends that are no part of the id, the folder level that names the split (``-2``: the
    picture's parent's parent), and the files each glob takes."""

    image_globs: list[str]
    image_files: list[Path]
    image_suffix: str
    mask_globs: list[str]
    mask_files: list[Path]
    mask_suffix: str
    split_level: int | None
    unpaired: int


def picture_folders(raw: Path, suffixes: tuple[str, ...] = MASK_PICTURES) -> list[_Folder]:
    """The folders up to ``DEPTH`` below ``raw`` holding pictures directly, by their path."""
    found, level = [], [raw]
    for _ in range(DEPTH):
        level = [d for parent in level for d in subdirs(parent)][:MAX_FOLDERS]
        for d in level:
            if files := files_in(d, suffixes):
                found.append(_Folder(d, d.relative_to(raw).parts, tuple(files)))
    return found


def _tokens(stem: str) -> list[str]:
    return [t for t in re.split(r"[_\-. ]", stem) if t]


def common_end(stems: list[str]) -> str:
    """The end of words (each holding a letter) every stem shares and no stem is all of: Cityscapes'
    ``_leftImg8bit``, DRIVE's ``_training``; ``""`` for ISIC's ``ISIC_0000000``."""
    end = ""
    for k in range(1, 8):
        tails = {_tail(s, k) for s in stems}
        if len(tails) != 1:
            break
        tail = tails.pop()
        if any(s == tail for s in stems) or not re.search(r"[A-Za-z]", _tokens(tail)[0]):
            break
        end = tail
    return end


def _tail(stem: str, k: int) -> str:
    """The last ``k`` words of ``stem`` with the separator before them (the stem when it has fewer)."""
    cut = len(stem)
    for _ in range(k):
        seps = [i for i, c in enumerate(stem[:cut]) if c in _SEP]
        if not seps:
            return stem
        cut = seps[-1]
    return stem[cut:]


def _end_after_id(stem: str, ids: set[str]) -> str | None:
    """What follows the longest id that starts ``stem`` at a word boundary, or None."""
    for k in range(len(stem), 0, -1):
        if stem[:k] in ids and (k == len(stem) or stem[k] in _SEP):
            return stem[k:]
    return None


@dataclass
class _Relation:
    """Folder pairs related alike: the picture folders, the mask folders, the ends."""

    image_suffix: str
    mask_suffix: str
    images: list[_Folder]
    masks: list[_Folder]
    paired: int = 0


def _relation_key(a: _Folder, b: _Folder) -> tuple:
    """How two folders are placed: where their paths first differ, the names there, and the rest
    of each path when the rests differ (``annotations/trimaps`` beside ``images``)."""
    i = next((k for k, (x, y) in enumerate(zip(a.rel, b.rel)) if x != y), min(len(a.rel), len(b.rel)))
    rest_a, rest_b = a.rel[i + 1 :], b.rel[i + 1 :]
    same_rest = rest_a == rest_b
    return (i, a.rel[i : i + 1], b.rel[i : i + 1], len(a.rel), len(b.rel), None if same_rest else (rest_a, rest_b))


def _ids(folder: _Folder) -> tuple[str, set[str]]:
    """The end every picture name of the folder shares, and the ids the names give without it."""
    stems = [p.stem for p in folder.files]
    suffix = common_end(stems)
    return suffix, {s[: len(s) - len(suffix)] for s in stems}


def _pair_ends(a: _Folder, b: _Folder) -> list[tuple[str, str, int]]:
    """(picture end, mask end, pairs) for each end of ``b``'s names after ``a``'s ids that pairs
    half of ``a``'s pictures or more."""
    suffix, ids = _ids(a)
    ends = Counter(end for p in b.files if (end := _end_after_id(p.stem, ids)) is not None)
    return [(suffix, end, n) for end, n in ends.items() if 2 * n >= len(ids) and n <= len(ids)]


def _partners(folders: list[_Folder]) -> list[list[_Folder]]:
    """For each folder, the other folders holding a file named by one of its ids (the id, or the
    id and an end), found through an index of every name's word prefixes rather than pair by pair."""
    by_prefix: dict[str, set[int]] = defaultdict(set)
    for j, f in enumerate(folders):
        for p in f.files:
            stem = p.stem
            by_prefix[stem].add(j)
            for k, c in enumerate(stem):
                if c in _SEP:
                    by_prefix[stem[:k]].add(j)
    found = []
    for i, f in enumerate(folders):
        hits = set().union(*(by_prefix.get(x, set()) for x in sample(sorted(_ids(f)[1]), ID_SAMPLE))) - {i}
        found.append([folders[j] for j in sorted(hits)])
    return found


def _relations(folders: list[_Folder], kind: Callable[[_Folder], str]) -> list[_Relation]:
    """The folder pairs whose names pair, a picture folder with a mask folder, grouped by how the
    two are placed. A folder whose names recur in many others is one of class folders sharing file
    names (``cat/0001.jpg``, ``dog/0001.jpg``), not pictures beside their masks."""
    grouped: dict[tuple, _Relation] = {}
    for a, partners in zip(folders, _partners(folders)):
        if not partners or len(partners) > MAX_PARTNERS or kind(a) != "picture":
            continue
        for b in partners:
            if kind(b) not in ("mask", "colour", "wide"):
                continue
            for suffix, end, n in _pair_ends(a, b):
                key = (_relation_key(a, b), suffix, end)
                rel = grouped.setdefault(key, _Relation(suffix, end, [], []))
                rel.images.append(a)
                rel.masks.append(b)
                rel.paired += n
    return list(grouped.values())


def folder_kind(folder: _Folder) -> str:
    """``mask`` (few values), ``colour`` (an RGB mask: few colours), ``wide`` (values beyond 8 bits:
    instance ids), ``picture``, or ``unknown`` (unreadable), from a few of its files."""
    kinds = Counter(_file_kind(p) for p in sample(list(folder.files), KIND_SAMPLE))
    kinds.pop("unknown", None)
    return kinds.most_common(1)[0][0] if kinds else "unknown"


def _file_kind(path: Path) -> str:
    values, mode = _mask_values(path)
    if values is not None:
        if max(values, default=0) > 255:
            return "wide"
        return "mask" if len(values) <= MASK_VALUES else "picture"
    if mode == "colour":
        return "colour" if _colours(path) <= MASK_VALUES else "picture"
    if mode == "lossy":
        return "mask" if _near_binary(path) else "picture"
    return "unknown"


def _colours(path: Path) -> int:
    try:
        with Image.open(path) as im:
            found = im.convert("RGB").getcolors(MASK_VALUES + 1)
    except (OSError, ValueError):
        return MASK_VALUES + 1
    return MASK_VALUES + 1 if found is None else len(found)


def _near_binary(path: Path) -> bool:
    """A JPEG mask (Kvasir-SEG's): nearly every pixel near black or white, some of each."""
    try:
        with Image.open(path) as im:
            grey = np.asarray(im.convert("L"))
    except (OSError, ValueError):
        return False
    dark, light = (grey < 32).mean(), (grey > 223).mean()
    return dark + light >= 0.97 and min(dark, light) > 0


def same_region(files: list[Path]) -> bool:
    """Whether sampled binary masks mark one region in every sample (a field-of-view mask, which
    says where the picture is, not what it shows)."""
    masks = []
    for p in sample(files, 8):
        try:
            with Image.open(p) as im:
                masks.append(np.asarray(im.convert("L")) > 0)
        except (OSError, ValueError):
            continue
    if len(masks) < 3 or len({m.shape for m in masks}) > 1:
        return False
    return all((m == masks[0]).mean() >= SAME_REGION for m in masks[1:])


def _glob_dirs(folders: list[_Folder]) -> str:
    """One folder pattern for folders of one depth: a name they all share, else ``*``."""
    parts = zip(*(f.rel for f in folders))
    return "/".join(names.pop() if len(names := set(p)) == 1 else "*" for p in parts)


def _split_level(folders: list[_Folder]) -> int | None:
    """The folder level (``-1``: the files' folder) whose names are split names, when the pictures
    lie in two splits or more (a lone ``training/`` would put every sample in train)."""
    depth = len(folders[0].rel)
    for k in range(depth):
        names = {f.rel[k] for f in folders}
        if len(names) > 1 and all(map(split_named, names)):  # as discovery reads a split column
            return k - depth
    return None


def _label_rank(rel: _Relation) -> int:
    words = [w.lower() for w in _tokens(rel.mask_suffix) + list(rel.masks[0].rel)]
    ranks = [_LABEL_WORDS.index(w) for w in words if w in _LABEL_WORDS]
    return min(ranks, default=len(_LABEL_WORDS))


def _describe(rel: _Relation) -> str:
    where = _glob_dirs(rel.masks)
    return f"{where}/*{rel.mask_suffix}" + ("" if rel.mask_suffix else " (same names)")


def _choose(relations: list[_Relation], kind: Callable[[_Folder], str], notes: list[str]) -> _Relation:
    """The relation whose masks label the pictures: 8-bit masks over colour or instance ones, a
    region that changes with the picture over one that is the same in every sample (DRIVE's
    field-of-view masks), then the label words of the mask names; refused when still a tie."""
    best = max(r.paired for r in relations)
    left = [r for r in relations if r.paired * 2 >= best]
    for wanted in ("mask", "colour"):
        of_kind = [r for r in left if kind(r.masks[0]) == wanted]
        if of_kind:
            dropped = [r for r in left if r not in of_kind]
            if dropped:
                notes.append(
                    f"also paired with the pictures: {', '.join(_describe(r) for r in dropped)} "
                    "(colour or instance-id pictures, not class masks): not read"
                )
            left = of_kind
            break
    if len(left) > 1:
        fov = [r for r in left if same_region([p for f in r.masks for p in f.files])]
        if fov and len(fov) < len(left):
            notes.append(
                f"{', '.join(_describe(r) for r in fov)} mark the same region in every sampled picture (a "
                "field-of-view mask?): not taken as the label; add it as a second mask field to keep it"
            )
            left = [r for r in left if r not in fov]
    if len(left) > 1:
        ranks = sorted(left, key=_label_rank)
        if _label_rank(ranks[0]) < _label_rank(ranks[1]):
            others = ", ".join(_describe(r) for r in ranks[1:])
            notes.append(
                f"also paired with the pictures: {others}: not read (the masks read are {_describe(ranks[0])})"
            )
            return ranks[0]
        names = "; ".join(_describe(r) for r in left)
        raise UsageError(
            f"several kinds of mask pair with the pictures and their files do not say which labels them: "
            f"{names}. Write the spec by hand: an image field and a mask field whose files and id_suffix "
            "name the one to train on (docs/layouts.md)"
        )
    return left[0]


def find_mask_pairs(raw: Path, notes: list[str]) -> MaskPairs | None:
    """Pictures and the masks that label them, in folders of any name below ``raw``, or None."""
    folders = picture_folders(raw)
    kinds: dict[Path, str] = {}

    def kind(f: _Folder) -> str:
        if f.path not in kinds:
            kinds[f.path] = folder_kind(f)
        return kinds[f.path]

    relations = [r for r in _relations(folders, kind) if len({len(f.rel) for f in r.images}) == 1]
    if not relations:
        return None
    rel = _choose(relations, kind, notes)
    images = sorted(set(rel.images), key=lambda f: f.rel)
    masks = sorted(set(rel.masks), key=lambda f: f.rel)
    image_dirs, mask_dirs = _glob_dirs(images), _glob_dirs(masks)
    image_files = _matching(folders, image_dirs, rel.image_suffix)
    mask_files = _matching(folders, mask_dirs, rel.mask_suffix)
    image_ids = {p.stem[: len(p.stem) - len(rel.image_suffix)] for p in image_files}
    mask_ids = {p.stem[: len(p.stem) - len(rel.mask_suffix)] for p in mask_files}
    return MaskPairs(
        _globs(image_dirs, rel.image_suffix, image_files),
        image_files,
        rel.image_suffix,
        _globs(mask_dirs, rel.mask_suffix, mask_files),
        mask_files,
        rel.mask_suffix,
        _split_level(images),
        len(image_ids - mask_ids),
    )


def _matching(folders: list[_Folder], pattern: str, end: str) -> list[Path]:
    """The pictures of the folders ``pattern`` matches whose stems end in ``end``."""
    parts = pattern.split("/")
    matched = [
        p
        for f in folders
        if len(f.rel) == len(parts) and all(x == "*" or x == y for x, y in zip(parts, f.rel))
        for p in f.files
    ]
    return [p for p in matched if p.stem.endswith(end) and p.stem != end]


def _globs(dirs: str, end: str, files: list[Path]) -> list[str]:
    suffixes = Counter(p.suffix for p in files)
    order = sorted(suffixes, key=lambda s: (-suffixes[s], s))
    return [f"{dirs}/*{end}{s}" for s in order]

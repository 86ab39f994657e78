"""``h5forge init``: a commented spec inferred from a raw folder.

Layouts recognised, first match wins:

- super-resolution pairs: ``lr/`` + ``hr/``, ``low_res/`` + ``high_res/``, ``<name>_LR_x4/`` +
  ``<name>_HR/`` (also ``<name>_LR_bicubic/X4/``): an image field and its ``paired`` partner, the
  scale measured on sampled pairs (an integer, the same in both sides, or no guess and a note);
- ``images/`` (+ ``masks/``): pictures, segmentation masks (binary, or ``classes``/``ignore_value``
  read from sampled masks, palette PNGs by their index);
- class folders: ``<class>/*.jpg`` or ``<split>/<class>/*.jpg`` (``ids: path``, the label and the
  split taken from the folders).

Every picture format found is listed in the field's ``files`` (one glob per suffix, case as found).
An annotation file beside the pictures (``*.json``, ``*.jsonl``, ``*.csv``) is joined by the column
that names the samples, with the column types inferred (from the text, for CSV). What cannot be
inferred safely is not guessed: it becomes a note, written in the spec as ``# note: ...`` and
returned for the CLI to print.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import yaml
from PIL import Image

from h5forge.errors import UsageError
from h5forge.ingest.discover import _IMAGE_SUFFIXES, TEXT_FORMAT, read_annotation_file, sample_id
from h5forge.ingest.splits import assign_split
from h5forge.spec import Splits, parse_spec

PICTURES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp")
SPLIT_NAMES = ("train", "val", "test", "training", "validation", "valid", "testing")
IMAGE_DIRS = ("images", "imgs", "image", "img", "jpegimages")
MASK_DIRS = ("masks", "mask", "labels", "annotations_masks", "segmentationclass", "segmentations",
             "groundtruth", "ground_truth", "gt")
ANNOTATION_SUFFIXES = (".json", ".jsonl", ".csv")
_ID_KEYS = ("id", "sample_id", "name", "file", "filename", "file_name", "image", "image_id", "path")
_LABEL_KEYS = ("label", "labels", "class", "class_name", "classname", "category", "target")
MAX_SIDE = 1024  # a larger inferred size is scaled down to this (and pictures shrunk to fit)
SIZE_SAMPLE, MASK_SAMPLE, PAIR_SAMPLE = 200, 50, 50
_COMMENT_AT = 27
_HEADER_LIMIT = 64_000_000  # like image max_pixels: a bigger header is a bomb and says nothing


@dataclass(frozen=True)
class Inferred:
    """What ``init`` writes: the spec's YAML text, the notes (also in the text as ``# note:``
    lines) and the layout recognised (``sr``, ``segment``, ``images`` or ``classify``)."""

    text: str
    notes: tuple[str, ...]
    layout: str


# ---- small helpers ----------------------------------------------------------------------------

def _scalar(value: Any) -> str:
    """A YAML scalar that reads back as ``value`` (quoted when it would not, e.g. ``*/*.jpg``)."""
    text = str(value)
    try:
        if text and yaml.safe_load(f"[{text}]") == [value] and yaml.safe_load(f"{{{text}: 0}}") == {value: 0}:
            return text
    except yaml.YAMLError:
        pass
    return json.dumps(text)


def _flow(values: Iterable[Any]) -> str:
    return "[" + ", ".join(_scalar(v) for v in values) + "]"


def _mapping(items: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{_scalar(k)}: {v}" for k, v in items.items()) + "}"


def _files_value(globs: list[str]) -> str:
    return _scalar(globs[0]) if len(globs) == 1 else _flow(globs)


def _visible(p: Path) -> bool:
    return not p.name.startswith(".") and p.name != "__MACOSX"


def _subdirs(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if p.is_dir() and _visible(p))
    except OSError:
        return []


def _pictures_in(d: Path) -> list[Path]:
    """The picture files directly in ``d`` (any case of a known suffix), sorted."""
    try:
        return sorted(p for p in d.iterdir() if p.suffix.lower() in PICTURES and _visible(p) and p.is_file())
    except OSError:
        return []


def _named(raw: Path, names: tuple[str, ...]) -> list[Path]:
    """The sub-folders of ``raw`` named one of ``names`` (any case), in ``names`` order."""
    by_lower = {d.name.lower(): d for d in _subdirs(raw)}
    return [by_lower[n] for n in names if n in by_lower]


def _suffixes(files: Iterable[Path]) -> list[str]:
    """The picture suffixes found, exactly as spelled (glob is case-sensitive), most common first."""
    counts = Counter(p.suffix for p in files if p.suffix.lower() in PICTURES)
    return sorted(counts, key=lambda s: (-counts[s], PICTURES.index(s.lower()), s))


def _globs(prefix: str, files: Iterable[Path]) -> list[str]:
    return [f"{prefix}*{s}" for s in _suffixes(files)]


def _sample(items: list, n: int) -> list:
    """Up to ``n`` items spread evenly over the (sorted) list: deterministic, not just the first."""
    if len(items) <= n:
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def _upright_size(path: Path) -> tuple[tuple[int, int], str] | None:
    """(width, height) as shown (EXIF orientation applied, like the cleaning does) and the mode,
    from the header only; None for what cannot be read."""
    try:
        with Image.open(path) as im:
            w, h = im.size
            if w * h > _HEADER_LIMIT:
                return None
            orientation = im.getexif().get(0x0112, 1)
            return ((h, w) if orientation in (5, 6, 7, 8) else (w, h)), im.mode
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return None


def _round_up(v: int, to: int = 32) -> int:
    return -(-v // to) * to


@dataclass
class _Size:
    height: int
    width: int
    sampled: int
    modes: Counter
    capped: bool = False
    largest: tuple[int, int] = (0, 0)

    @property
    def grey(self) -> bool:
        return all(m in ("L", "I;16", "I", "1") for m in self.modes)


def _target_size(paths: list[Path], what: str) -> _Size:
    sizes, modes = [], Counter()
    for p in _sample(paths, SIZE_SAMPLE):
        got = _upright_size(p)
        if got is not None:
            sizes.append(got[0])
            modes[got[1]] += 1
    if not sizes:
        raise UsageError(f"no readable picture in {what}")
    # the 95th percentile, so a few outsized pictures are cropped rather than padding everything
    hs, ws = sorted(h for _, h in sizes), sorted(w for w, _ in sizes)
    k = int(0.95 * (len(sizes) - 1))
    height, width = _round_up(hs[k]), _round_up(ws[k])
    size = _Size(height, width, len(sizes), modes, largest=(hs[-1], ws[-1]))
    if max(height, width) > MAX_SIDE:
        factor = MAX_SIDE / max(height, width)
        size.height, size.width = max(32, _round_up(int(height * factor))), max(32, _round_up(int(width * factor)))
        size.height, size.width = min(size.height, MAX_SIDE), min(size.width, MAX_SIDE)
        size.capped = True
    return size


class _Text:
    """Spec lines with their comments aligned."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, indent: int, text: str, comment: str | None = None) -> None:
        line = "  " * indent + text
        if comment:
            line = (line.ljust(_COMMENT_AT) if len(line) < _COMMENT_AT else line + " ") + "# " + comment
        self.lines.append(line)

    def comment(self, indent: int, text: str) -> None:
        self.lines.append("  " * indent + "# " + text)

    def more(self, text: str) -> None:
        """A comment continued on the next line, in the comment column."""
        self.lines.append(" " * _COMMENT_AT + "# " + text)


def _image_field(t: _Text, name: str, globs: list[str], size: _Size, larger: str, why: str) -> None:
    t(1, f"{name}:")
    t(2, "kind: image")
    t(2, f"files: {_files_value(globs)}", "one glob per picture format found" if len(globs) > 1 else None)
    if size.capped:
        t(2, f"size: [{size.height}, {size.width}]",
          f"(height, width): pictures reach {size.largest[0]}x{size.largest[1]}; the 95th percentile of "
          f"{size.sampled} sampled is scaled down to at most {MAX_SIDE} a side")
    else:
        t(2, f"size: [{size.height}, {size.width}]",
          f"(height, width): 95th percentile of {size.sampled} sampled, rounded up to 32;")
        t.more("smaller pictures are padded evenly, never stretched")
    t(2, f"channels: {1 if size.grey else 3}", f"sampled modes: {dict(size.modes)}")
    t(2, f"larger: {larger}", why)
    t(2, "fill: 0", "padding value")


# ---- annotation files -------------------------------------------------------------------------

@dataclass
class _Annotations:
    file: str
    id_key: str
    columns: dict[str, str]
    index_by: list[str]
    matched: int
    label: tuple[str, tuple[str, ...] | None] | None = None  # a label-like column and its classes


def _record_id(value: Any, ids: str) -> str:
    """A record's sample id as discovery makes it (``load_records``)."""
    raw_id = str(value)
    suffix = Path(raw_id).suffix
    if suffix.lower() in _IMAGE_SUFFIXES:
        raw_id = Path(raw_id).stem if ids == "stem" else raw_id[: -len(suffix)]
    return raw_id


def _text_type(values: list[str]) -> str:
    """The column type of CSV text values (all non-empty); leading zeros (00123) make codes, not numbers."""
    if any(re.fullmatch(r"[+-]?0\d+", v) for v in values):
        return "str"
    if all(re.fullmatch(r"[+-]?\d+", v) for v in values):
        return "int"
    try:
        for v in values:
            float(v)
        return "float"
    except ValueError:
        pass
    if all(v.lower() in ("true", "false", "yes", "no") for v in values):
        return "bool"
    return "str"


def _json_type(values: list[Any]) -> str | None:
    if any(isinstance(v, (list, dict)) for v in values):
        return None
    if all(isinstance(v, bool) for v in values):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "float"
    return "str"


def _columns(records: list[dict], id_key: str, text: bool, name: str, skip: set[str],
             notes: list[str]) -> tuple[dict[str, str], dict[str, set]]:
    kinds: dict[str, str] = {}
    distinct: dict[str, set] = {}
    keys = sorted({k for r in records for k in r} - {id_key, TEXT_FORMAT})
    for key in keys:
        if key in skip:
            notes.append(f"{name}: column {key!r} is not declared (the folders give it); "
                         "a record's value still takes precedence over the folder")
            continue
        if "/" in key or not key.strip():
            notes.append(f"{name}: column {key!r} is not declared (a column name cannot hold '/' or be blank)")
            continue
        absent = sum(1 for r in records if r.get(key) is None)  # no value at all: rejected whatever the type
        present = [r[key] for r in records if r.get(key) is not None and not (text and str(r[key]).strip() == "")]
        if not present:
            continue
        if text:
            kind = _text_type([str(v).strip() for v in present])
            values = {str(v) if kind == "str" else str(v).strip() for v in present}  # str values stay as written
        else:
            kind = _json_type(present)
            if kind is None:
                notes.append(f"{name}: column {key!r} holds lists or objects and is not declared "
                             "(only str, int, float and bool columns are stored)")
                continue
            values = set(present)
        missing = len(records) - len(present) if kind != "str" else absent  # an empty text is a str
        if missing:
            notes.append(f"{name}: column {key!r} is missing in {missing} of {len(records)} records; "
                         "those samples will be rejected (drop the column from columns if it is optional)")
        kinds[key] = kind
        distinct[key] = values
    return kinds, distinct


def _looks_annotation(p: Path) -> bool:
    return p.is_file() and _visible(p) and p.suffix.lower() in ANNOTATION_SUFFIXES


def _annotations(raw: Path, ids: set[str], id_mode: str, skip: set[str],
                 notes: list[str]) -> _Annotations | None:
    """The annotation file beside the pictures that names most samples; notes for the others."""
    usable: list[tuple[tuple, _Annotations, list[str]]] = []
    example = ", ".join(sorted(ids)[:3])
    for path in sorted(p for p in raw.iterdir() if _looks_annotation(p)):
        name = path.name
        try:
            records = read_annotation_file(path)
        except (ValueError, UnicodeDecodeError, RecursionError, csv.Error, OSError) as err:
            reason = str(err)
            if path.suffix.lower() == ".json":
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                    if isinstance(data, dict):
                        keys = ", ".join(list(map(str, data))[:6])
                        reason = f"it holds a JSON object (keys: {keys}), not a list of records"
                except (ValueError, UnicodeDecodeError, RecursionError):
                    pass
            notes.append(f"{name} is not used: {reason}")
            continue
        dicts = [r for r in records if isinstance(r, dict)]
        if not dicts:
            notes.append(f"{name} is not used: it holds no records (a list of objects, JSON Lines or a CSV "
                         "with a header row is needed)")
            continue
        text = path.suffix.lower() == ".csv"
        if text:
            header = [k for k in dicts[0] if k != TEXT_FORMAT]
            if any(_record_id(h, id_mode) in ids for h in header if h is not None):
                notes.append(f"{name} is not used: its first line names a sample ({', '.join(map(str, header))}); "
                             "a CSV needs a header row (e.g. id,label)")
                continue
        keys = {k for r in dicts[:2000] for k, v in r.items() if k != TEXT_FORMAT and isinstance(v, (str, int))}
        scores = {}
        for key in keys:
            found = {_record_id(r[key], id_mode) for r in dicts if key in r and isinstance(r[key], (str, int))}
            scores[key] = len(found & ids)
        if not scores or max(scores.values()) == 0:
            notes.append(f"{name} is not used: no column names the samples (tried {', '.join(sorted(keys)) or 'none'}; "
                         f"sample ids look like {example})")
            continue

        def preference(k: str) -> tuple:
            return scores[k], -(_ID_KEYS.index(k.lower()) if k.lower() in _ID_KEYS else len(_ID_KEYS)), k

        id_key = max(scores, key=preference)
        file_notes: list[str] = []
        columns, distinct = _columns(dicts, id_key, text, name, skip, file_notes)
        index_by = [c for c, kind in columns.items() if kind in ("str", "bool", "int") and 1 < len(distinct[c]) <= 50]
        label = None
        for c, kind in columns.items():
            if c.lower() in _LABEL_KEYS and kind in ("str", "int") and 1 < len(distinct[c]) <= 1000:
                label = (c, tuple(sorted(map(str, distinct[c]))) if kind == "str" else None)
                break
        ann = _Annotations(name, id_key, columns, index_by, scores[id_key], label)
        record_ids = Counter(_record_id(r[id_key], id_mode) for r in dicts if id_key in r)
        twice = sum(1 for n in record_ids.values() if n > 1)
        if len(dicts) < len(records):
            file_notes.append(f"{name}: {len(records) - len(dicts)} entries are not records and will be rejected")
        if twice:
            file_notes.append(f"{name}: {twice} sample ids have several records; those samples will be rejected")
        rank = (scores[id_key], "annot" in name.lower(), -ANNOTATION_SUFFIXES.index(path.suffix.lower()))
        usable.append((rank, ann, file_notes))
    if not usable:
        return None
    usable.sort(key=lambda u: u[0], reverse=True)
    _, chosen, file_notes = usable[0]
    notes.extend(file_notes)
    for _, other, _ in usable[1:]:
        notes.append(f"{other.file} also names {other.matched} samples but only one annotation file is read "
                     f"({chosen.file}); merge its columns into it to use them")
    if chosen.matched < len(ids):
        notes.append(f"{chosen.file} has records for {chosen.matched} of {len(ids)} samples; the others are "
                     "quarantined (no annotation record)")
    return chosen


def _annotation_lines(t: _Text, ann: _Annotations | None, folders: dict[str, int] | None = None,
                      folder_columns: dict[str, str] | None = None, index_by: list[str] | None = None) -> None:
    columns = {**(folder_columns or {}), **(ann.columns if ann else {})}
    index = [*(index_by or []), *(c for c in (ann.index_by if ann else []) if c not in (index_by or []))]
    if ann is None and not folders:
        return
    t(0, "annotations:")
    if ann is not None:
        t(1, f"file: {_scalar(ann.file)}")
        t(1, f"id_key: {_scalar(ann.id_key)}", "record key naming the sample (an id or a file name)")
    t(1, f"columns: {_mapping(columns)}", "types inferred from the values" if ann else None)
    if folders:
        t(1, f"folders: {_mapping(folders)}", "-1: the picture's folder, -2: the one above")
    t(1, f"index_by: {_flow(index)}", "columns to precompute row-index arrays for")
    if ann is not None:
        t(1, "required: true", "a sample without a record is quarantined")
    else:
        t(1, "required: false", "no annotation file: the folders say everything")


# ---- masks ------------------------------------------------------------------------------------

@dataclass
class _MaskClasses:
    classes: int | None = None  # None: binary
    ignore_value: int | None = None
    sampled: int = 0
    palette: int = 0  # palette-mode masks among the sampled
    found: list[int] = field(default_factory=list)


def _mask_values(path: Path) -> tuple[set[int] | None, str]:
    """The values of one mask (palette index for a palette PNG), or None with what it is."""
    try:
        with Image.open(path) as im:
            if im.size[0] * im.size[1] > _HEADER_LIMIT:
                return None, "too large"
            im.load()
            mode = im.mode
            if mode in ("RGB", "RGBA", "LA", "La", "RGBa"):
                arr = np.asarray(im)
                colour = arr[..., :3] if arr.shape[2] >= 3 else arr[..., :1]
                if not (colour == colour[..., :1]).all():
                    return None, "colour"
                arr = colour[..., 0]
            else:
                arr = np.asarray(im)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return None, "unreadable"
    if arr.dtype == np.uint8 or arr.dtype == bool:
        values = np.flatnonzero(np.bincount(arr.astype(np.uint8).ravel(), minlength=256))
    else:
        values = np.unique(arr)
    return {int(v) for v in values}, mode


def _mask_classes(paths: list[Path], notes: list[str]) -> _MaskClasses:
    per_file: list[tuple[Path, set[int]]] = []
    info = _MaskClasses()
    colour = 0
    for p in _sample(paths, MASK_SAMPLE):
        values, mode = _mask_values(p)
        if values is None:
            colour += mode == "colour"
            continue
        info.palette += mode == "P"
        per_file.append((p, values))
    info.sampled = len(per_file)
    if colour:
        notes.append(f"{colour} sampled masks are RGB colour pictures: declare the mask's palette "
                     "({class: [r, g, b]}) and classes, or they are rejected")
    if not per_file:
        return info
    freq = Counter(v for _, vals in per_file for v in vals)
    rare = {v for v, n in freq.items() if n == 1 and len(per_file) >= 5}  # in one sampled mask only

    def note_strays(strays: set[int]) -> None:
        if strays:
            where = [f"{p.name}: {sorted(vals & strays)}" for p, vals in per_file if vals & strays]
            notes.append(f"mask values {sorted(strays)} appear in one sampled mask each ({'; '.join(where[:4])}); "
                         "they are not declared, so those masks will be rejected (raise classes if they are real "
                         "classes)")

    binary_strays = rare - {0, 1, 255}
    if all((vals - binary_strays) <= {0, 1} or (vals - binary_strays) <= {0, 255} for _, vals in per_file):
        note_strays(binary_strays)
        return info  # binary: {0,1} or {0,255} per mask
    real = set(freq) - rare
    for v in sorted(rare):  # a rare value is a rare class when it is within (or continues) 0..K-1
        if v != 255 and v <= max(real - {255}, default=-1) + 1:
            real.add(v)
    note_strays(set(freq) - real)
    top = max(real - {255}, default=0)
    if max(real, default=0) > 255:
        notes.append(f"masks hold values up to {max(real)} (16-bit, instance ids?): only 8-bit class indices "
                     "are supported; the mask is declared binary and such masks will be rejected")
        return info
    info.classes = max(top + 1, 2)
    info.ignore_value = 255 if 255 in real else None
    info.found = sorted(real)
    if info.classes > 8 and len(real - {255}) < info.classes / 2:
        notes.append(f"mask values {sorted(real - {255})} are sparse for classes: {info.classes}; if they are "
                     "grey levels rather than class indices, remap them to 0..K-1")
    return info


def _mask_field(t: _Text, globs: list[str], mc: _MaskClasses) -> None:
    t(1, "masks:")
    if mc.classes is None:
        t(2, "kind: mask", "single channel, values {0,1} or {0,255}; stored as {0,1}")
    else:
        t(2, "kind: mask", "class index per pixel" + (" (palette PNGs: the palette index)" if mc.palette else ""))
    t(2, f"files: {_files_value(globs)}")
    t(2, "like: images", "must have its image's size; padded/cropped the same way")
    if mc.classes is not None:
        t(2, f"classes: {mc.classes}", f"values 0..{mc.classes - 1}: found {mc.found} in {mc.sampled} sampled masks")
        if mc.ignore_value is not None:
            t(2, f"ignore_value: {mc.ignore_value}", "pixels to ignore in the loss (VOC convention); padding uses it")


# ---- super-resolution folders -----------------------------------------------------------------

_LR, _HR = {"lr", "lowres", "lq"}, {"hr", "highres", "hq", "gt"}
_DEGRADATIONS = {"bicubic", "unknown", "mild", "difficult", "wild", "realistic", "res", "resolution"}


def _sr_key(name: str) -> tuple[tuple[str, ...], str | None, int | None]:
    """A folder name as (its other words, role lr/hr/None, the scale of an ``x4`` word)."""
    words = [w for w in re.split(r"[_\-\s./]+", name.lower()) if w]
    role, scale, rest = None, None, []
    for i, w in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if re.fullmatch(r"x\d+", w):
            scale = int(w[1:])
        elif w in _LR or (w == "low" and nxt in ("res", "resolution")):
            role = role or "lr"
        elif w in _HR or (w == "high" and nxt in ("res", "resolution")):
            role = role or "hr"
        elif w not in _DEGRADATIONS:
            rest.append(w)
    return tuple(rest), role, scale


def _sr_folders(raw: Path) -> list[tuple[str, Path]]:
    """Folders with pictures (and ``<dir>/X4``-style sub-folders), by their path below ``raw``."""
    found = []
    for d in _subdirs(raw):
        if _pictures_in(d):
            found.append((d.name, d))
        for sub in _subdirs(d):
            if re.fullmatch(r"x\d+", sub.name.lower()) and _pictures_in(sub):
                found.append((f"{d.name}/{sub.name}", sub))
    return found


def _sr_pairs(raw: Path) -> list[tuple[tuple[str, Path], tuple[str, Path], int | None]]:
    folders = [(rel, d, *_sr_key(rel)) for rel, d in _sr_folders(raw)]
    pairs = []
    for rel, d, rest, role, scale in folders:
        if not (role == "lr" or (role is None and scale)):
            continue
        for rel2, d2, rest2, role2, scale2 in folders:
            if d2 == d or scale2 is not None or rest2 != rest:
                continue
            if (role == "lr" and role2 == "hr") or (role is None and role2 is None):
                pairs.append(((rel, d), (rel2, d2), scale))
    return sorted(pairs, key=lambda p: ("train" not in p[0][0].lower(), p[0][0]))


def _scale(lr: dict[str, Path], hr: dict[str, Path], notes: list[str]) -> tuple[int | None, int]:
    ratios: Counter = Counter()
    odd: list[str] = []
    common = sorted(set(lr) & set(hr))
    for stem in _sample(common, PAIR_SAMPLE):
        a, b = _upright_size(lr[stem]), _upright_size(hr[stem])
        if a is None or b is None:
            continue
        (lw, lh), (hw, hh) = a[0], b[0]
        k = hh // lh if hh % lh == 0 and hw % lw == 0 and hh // lh == hw // lw else None
        ratios[k] += 1
        if k is None:
            odd.append(f"{lr[stem].name} {lh}x{lw} vs {hr[stem].name} {hh}x{hw}")
    measured = sum(ratios.values())
    if not measured:
        return None, 0
    k, n = max(ratios.items(), key=lambda kv: (kv[1], kv[0] is not None))
    if k is None or k < 2 or k > 16 or n < 0.75 * measured:
        seen = ", ".join(f"x{r}: {c}" if r else f"not an integer scale: {c}" for r, c in ratios.most_common())
        notes.append(f"the HR/LR size ratio could not be inferred from {measured} sampled pairs ({seen}"
                     f"{'; e.g. ' + odd[0] if odd else ''}): it must be an integer from 2 to 16, the same in both "
                     "sides; high_res is declared as a plain image, change it to kind: paired with the scale")
        return None, measured
    wrong = measured - n
    if wrong:
        other = [f"x{r}" if r else "not an integer scale" for r in ratios if r != k]
        notes.append(f"{wrong} of {measured} sampled pairs are not x{k} ({', '.join(other)}"
                     f"{'; e.g. ' + odd[0] if odd else ''}): they will be rejected")
    return k, measured


# ---- the layouts ------------------------------------------------------------------------------

def _header(t: _Text, raw: Path, spec_path: Path, name: str, notes: list[str], ids: str | None = None) -> None:
    t.comment(0, f"h5forge spec inferred by `h5forge init` from {raw}")
    t.comment(0, "Relative paths are resolved against this file's folder. Review, then `h5forge build` it.")
    for note in notes:
        t.comment(0, f"note: {note}")
    t(0, f"name: {name}")
    t(0, "description: ''")
    t(0, "source:")
    t(1, f"root: {_scalar(os.path.relpath(raw, spec_path.parent.resolve()))}")
    if ids == "path":
        t(1, "ids: path", "a sample's id is its path below the class folders, without suffix")
        t.more("(cat/0001), so one file name in two classes does not collide")


def _footer(t: _Text, spec_path: Path, name: str, split_column: str | None = None) -> None:
    t(0, "splits:")
    if split_column:
        t(1, f"column: {split_column}", "from the split folders (training, validation, valid, testing understood)")
    else:
        t(1, "ratios: {train: 0.8, val: 0.1, test: 0.1}", "stable: a sample's split depends on its id only")
    out_dir = os.path.relpath(Path.cwd() / "data" / name, spec_path.parent.resolve())
    t(0, "storage:")
    t(1, "codec: lz4", "lz4 (fast) | zstd-1 (smaller) | gzip-1 (portable) | none ... (README: codec choice)")
    t(1, "chunk_rows: 1", "samples per HDF5 chunk")
    t(0, "output:")
    t(1, f"dir: {_scalar(out_dir)}")
    t(1, "keep: 5", "published versions kept")
    t(0, "compute:")
    t(1, "workers: 2", "LocalCluster processes; or dask_address: tcp://host:8786")


def _label_field(t: _Text, column: str, classes: tuple[str, ...] | None, comment: str,
                 active: bool = True) -> None:
    if not active:
        listed = f", classes: {_flow(classes)}" if classes else ""
        t.comment(1, f"label: {{kind: label, column: {_scalar(column)}{listed}}}   # uncomment to store "
                     f"{column!r} as a class index")
        return
    t(1, "label:")
    t(2, "kind: label")
    t(2, f"column: {_scalar(column)}", comment)
    if classes:
        t(2, f"classes: {_flow(classes)}", "sorted; a class's index is its position")


def _larger(size: _Size, default: str) -> tuple[str, str]:
    if size.capped:
        return "shrink", "bigger pictures are shrunk (aspect kept), then padded | crop | reject"
    if default == "shrink":
        return "shrink", "bigger pictures are shrunk (aspect kept, the whole object stays) | crop | reject"
    return "crop", "for bigger pictures: crop (centre) | shrink (keep aspect, pad) | reject"


def infer_spec(raw: Path, spec_path: Path) -> Inferred:
    """A commented spec for ``raw`` (paths relative to ``spec_path``'s folder), checked with
    ``parse_spec``, and the notes on what could not be inferred safely."""
    raw = Path(raw).resolve()
    spec_path = Path(spec_path)
    if not raw.is_dir():
        raise UsageError(f"{raw} is not a folder")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", raw.name).strip("-.") or "dataset"
    notes: list[str] = []
    pairs = _sr_pairs(raw)
    images = next((d for d in _named(raw, IMAGE_DIRS) if _pictures_in(d)), None)
    ids, split_column = None, None
    if pairs:
        layout, body = "sr", _sr_body(raw, pairs, notes)
    elif images is not None:
        layout, body = _segment_body(raw, images, notes)
    else:
        tree = _class_tree(raw, notes)
        if tree is None:
            raise UsageError(f"no pictures found in {raw}: expected images/ (+ masks/), class folders "
                             "(<class>/*.jpg, <split>/<class>/*.jpg) or lr/ + hr/ super-resolution pairs")
        layout, body, ids = "classify", _classify_body(raw, tree, notes), "path"
        split_column = "split" if tree.split else None
    t = _Text()
    _header(t, raw, spec_path, name, notes, ids)
    body(t)
    _footer(t, spec_path, name, split_column)
    text = "\n".join(t.lines) + "\n"
    parse_spec(yaml.safe_load(text), spec_path.parent.resolve(), str(spec_path))  # must be valid
    return Inferred(text, tuple(notes), layout)


def _strip_scale(stem: str) -> str:
    return re.sub(r"[xX]\d+$", "", stem).rstrip("_-")


def _sr_body(raw: Path, pairs, notes: list[str]):
    (lr_rel, lr_dir), (hr_rel, hr_dir), named_scale = pairs[0]
    for (other_lr, _), (other_hr, _), _ in pairs[1:]:
        notes.append(f"also found {other_lr}/ + {other_hr}/; this spec reads {lr_rel}/ + {hr_rel}/ only "
                     "(add their globs to files to include them)")
    lr_files, hr_files = _pictures_in(lr_dir), _pictures_in(hr_dir)
    lr = {p.stem: p for p in lr_files}
    hr = {p.stem: p for p in hr_files}
    if not set(lr) & set(hr):
        stripped = {_strip_scale(s): p for s, p in lr.items()}
        if set(stripped) & set(hr):
            stem = next(s for s in sorted(stripped) if s in hr)
            notes.append(f"the LR files carry the scale in their name ({stripped[stem].name} vs {hr[stem].name}): "
                         "pairs are matched by file name, so rename the LR files without it")
            lr = stripped
        else:
            notes.append(f"{lr_rel}/ and {hr_rel}/ share no file name: pairs are matched by name, so nothing pairs")
    elif set(lr) ^ set(hr):
        notes.append(f"{len(set(lr) ^ set(hr))} pictures of {lr_rel}/ and {hr_rel}/ have no partner: they are "
                     "quarantined as incomplete samples")
    scale, measured = _scale(lr, hr, notes)
    if scale and named_scale and scale != named_scale:
        notes.append(f"{lr_rel}/ is named x{named_scale} but the sampled pairs are x{scale}")
    size = _target_size(lr_files, str(raw / lr_rel))
    hr_size = None if scale else _target_size(hr_files, str(raw / hr_rel))
    ann = _annotations(raw, {p.stem for p in lr_files}, "stem", set(), notes)

    def body(t: _Text) -> None:
        t(0, "fields:")
        _image_field(t, "low_res", _globs(f"{lr_rel}/", lr_files), size, "crop",
                     "bigger LR pictures are centre-cropped, their HR partner with them")
        t(1, "high_res:")
        if scale:
            t(2, "kind: paired", "the HR partner: exactly scale x its LR picture, checked per pair")
            t(2, f"files: {_files_value(_globs(f'{hr_rel}/', hr_files))}")
            t(2, "like: low_res", "cropped and padded with the LR plan times scale: pairs stay aligned")
            t(2, f"scale: {scale}", f"HR/LR size ratio of {measured} sampled pairs")
        else:
            t(2, "kind: image", "the scale is unknown (see the notes); once known: kind: paired, like: low_res, "
                                "scale: k")
            t(2, f"files: {_files_value(_globs(f'{hr_rel}/', hr_files))}")
            t(2, f"size: [{hr_size.height}, {hr_size.width}]")
        _annotation_lines(t, ann)

    return body


def _segment_body(raw: Path, images: Path, notes: list[str]):
    image_files = _pictures_in(images)
    masks = next((d for d in _named(raw, MASK_DIRS) if _pictures_in(d) and d != images), None)
    mask_files = _pictures_in(masks) if masks else []
    size = _target_size(image_files, str(images))
    mc = _mask_classes(mask_files, notes) if masks else None
    if masks:
        stems_i, stems_m = {p.stem for p in image_files}, {p.stem for p in mask_files}
        if stems_i - stems_m:
            notes.append(f"{len(stems_i - stems_m)} of {len(stems_i)} pictures in {images.name}/ have no mask in "
                         f"{masks.name}/: they are quarantined as incomplete samples")
    ids = {p.stem for p in image_files}
    ann = _annotations(raw, ids, "stem", set(), notes)
    layout = "segment" if masks else "images"

    def body(t: _Text) -> None:
        t(0, "fields:")
        larger, why = _larger(size, "crop")
        _image_field(t, "images", _globs(f"{images.name}/", image_files), size, larger, why)
        if masks:
            _mask_field(t, _globs(f"{masks.name}/", mask_files), mc)
        if ann is not None and ann.label is not None:
            column, classes = ann.label
            _label_field(t, column, classes, f"the class, from {ann.file}", active=not masks)
        _annotation_lines(t, ann)

    return layout, body


@dataclass
class _Tree:
    base: str  # "" or the folder holding the class (or split) folders
    split: bool
    files: list[Path]
    classes: list[str]
    per_class: Counter


def _split_understood(name: str) -> bool:
    """Whether discovery takes this folder name as a split (asked, not assumed)."""
    try:
        assign_split("x", Splits(column="split"), {"split": name})
        return True
    except ValueError:
        return False


def _class_tree(raw: Path, notes: list[str]) -> _Tree | None:
    bases = [raw, *_named(raw, IMAGE_DIRS)]
    for base in bases:
        prefix = "" if base == raw else base.name + "/"
        subdirs = _subdirs(base)
        splits = [d for d in subdirs if d.name.lower() in SPLIT_NAMES]
        if splits:
            files, per_class, found_in = [], Counter(), {}
            for s in splits:
                loose = _pictures_in(s)
                if loose:
                    notes.append(f"{len(loose)} pictures lie directly in {prefix}{s.name}/, outside any class folder "
                                 "(unlabelled?): not included")
                for c in _subdirs(s):
                    pics = _pictures_in(c)
                    if pics:
                        files += pics
                        per_class[c.name] += len(pics)
                        found_in.setdefault(c.name, set()).add(s.name)
            if files:
                for d in subdirs:
                    if d not in splits and any(_pictures_in(c) for c in _subdirs(d)):
                        notes.append(f"{prefix}{d.name}/ is not a split folder ({', '.join(SPLIT_NAMES)}): its "
                                     "samples will be rejected (split column)")
                for s in splits:
                    if not _split_understood(s.name):
                        notes.append(f"split folder {prefix}{s.name}/ is not understood as a split name (lower "
                                     f"case is), so its samples will be rejected; rename it {s.name.lower()}/")
                names = {s.name for s in splits if any(_pictures_in(c) for c in _subdirs(s))}
                for c, where in sorted(found_in.items()):
                    if where != names and len(names) > 1:
                        notes.append(f"class {c!r} has pictures in {', '.join(sorted(where))} only")
                return _Tree(prefix, True, files, sorted(per_class), per_class)
        class_dirs = [d for d in subdirs if _pictures_in(d)]
        if len(class_dirs) >= 2:
            loose = _pictures_in(base)
            if loose:
                notes.append(f"{len(loose)} pictures lie directly in {prefix or './'}, outside any class folder: "
                             "not included")
            for d in subdirs:
                if d not in class_dirs:
                    notes.append(f"{prefix}{d.name}/ holds no pictures directly: not a class")
            per_class = Counter({d.name: len(_pictures_in(d)) for d in class_dirs})
            files = [p for d in class_dirs for p in _pictures_in(d)]
            return _Tree(prefix, False, files, sorted(per_class), per_class)
    return None


def _classify_body(raw: Path, tree: _Tree, notes: list[str]):
    size = _target_size(tree.files, str(raw / tree.base))
    depth = "*/*/" if tree.split else "*/"
    globs = _globs(tree.base + depth, tree.files)
    pattern = globs[0]
    ids = {sample_id(p.relative_to(raw).as_posix(), pattern, "path") for p in tree.files}
    folder_columns = {"label": "str", **({"split": "str"} if tree.split else {})}
    folders = {"label": -1, **({"split": -2} if tree.split else {})}
    ann = _annotations(raw, ids, "path", set(folder_columns), notes)
    counts = ", ".join(f"{c} {tree.per_class[c]}" for c in tree.classes)
    small = [c for c in tree.classes if tree.per_class[c] < 0.2 * max(tree.per_class.values())]
    if small:
        notes.append(f"unbalanced classes: {', '.join(small)} have under a fifth of the largest class's pictures "
                     "(the label's class counts per split give loss weights)")

    def body(t: _Text) -> None:
        t(0, "fields:")
        larger, why = _larger(size, "shrink")
        _image_field(t, "images", globs, size, larger, why)
        t(1, "label:")
        t(2, "kind: label")
        t(2, "column: label", "the class folder's name (annotations.folders)")
        t(2, f"classes: {_flow(tree.classes)}", f"sorted folder names; pictures: {counts}")
        _annotation_lines(t, ann, folders=folders, folder_columns=folder_columns,
                          index_by=["label"] if len(tree.classes) <= 50 else [])

    return body

"""``h5forge init``: a commented spec inferred from a raw folder.

Layouts recognised, first match wins:

- super-resolution pairs: ``lr/`` + ``hr/``, ``low_res/`` + ``high_res/``, ``<name>_LR_x4/`` +
  ``<name>_HR/`` (also ``<name>_LR_bicubic/X4/``): an image field and its ``paired`` partner, the
  scale measured on sampled pairs (an integer, the same in both sides, or no guess and a note);
- ``images/`` (+ ``masks/``): pictures, segmentation masks (binary, or ``classes``/``ignore_value``
  read from sampled masks, palette PNGs by their index);
- class folders: ``<class>/*.jpg`` or ``<split>/<class>/*.jpg`` (``ids: path``, the label and the
  split taken from the folders);
- volumes: DICOM case folders ``<case>/*.dcm`` (or files without a suffix that pydicom reads; also
  ``cases/<case>/``), or NIfTI files ``*.nii.gz`` (also ``images/``): a ``volume`` field, the slice
  size the most common of the sampled cases, ``series: largest`` when a sampled case folder holds
  several series; masks from ``masks/<case>/`` per-slice pictures or ``masks/`` (``labels/``) NIfTI
  label volumes as a ``volume_mask`` (``classes`` read from the values). The case id is the folder
  name (the file name without ``.nii.gz``); ``compute.batch_size`` is 2, as cases are large;
- signals: EDF/BDF recordings ``*.edf`` (one ``signal`` field per channel label, at the rate its
  header gives), CSV recordings with a time column (one field per column, the rate measured from the
  time column), or per-channel folders of ``.npy`` (``acc/<recording>.npy``: one field per folder,
  the rate from ``<stem>.json`` sidecars). A recording's id is its file stem.

Every picture format found is listed in the field's ``files`` (one glob per suffix, case as found).
An annotation file beside the pictures (``*.json``, ``*.jsonl``, ``*.csv``) is joined by the column
that names the samples, with the column types inferred (from the text, for CSV). What cannot be
inferred safely is not guessed: it becomes a note, written in the spec as ``# note: ...`` and
returned for the CLI to print. A value that must be known and cannot be inferred (the rate of .npy
channels without a sidecar) is written as a ``# rate: TODO`` line and returned in ``todo``: such a
spec is incomplete on purpose, and ``init`` exits 2 after writing it.
"""

from __future__ import annotations

import csv
import fnmatch
import itertools
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
from h5forge.format.arrays import LENGTHS
from h5forge.format.names import RESERVED
from h5forge.ingest.discover import _IMAGE_SUFFIXES, TEXT_FORMAT, read_annotation_file, sample_id
from h5forge.ingest.splits import assign_split
from h5forge.kinds.signal import RATE_TOLERANCE, TIME_COLUMNS
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
    lines), the layout recognised (``sr``, ``segment``, ``images``, ``classify``, ``volume`` or
    ``signals``) and the keys the user must fill in before the spec is valid (``# key: TODO``
    lines; the notes say why)."""

    text: str
    notes: tuple[str, ...]
    layout: str
    todo: tuple[str, ...] = ()


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
        self.placeholders: dict[int, str] = {}  # line -> what stands in for a TODO when validating

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

    def todo(self, indent: int, key: str, placeholder: str, why: str) -> None:
        """A value the user must fill in, written as a ``# key: TODO`` comment (so the spec is
        incomplete, never silently wrong); ``placeholder`` stands in for it when the rest is checked."""
        self.placeholders[len(self.lines)] = "  " * indent + f"{key}: {placeholder}"
        self.comment(indent, f"{key}: TODO  <- {why}")

    def checked(self) -> str:
        """The text with the TODO lines filled by their placeholders, to validate the rest."""
        return "\n".join(self.placeholders.get(i, line) for i, line in enumerate(self.lines)) + "\n"


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


# ---- volumes: DICOM case folders, NIfTI files -------------------------------------------------

CASE_DIRS = ("cases", "volumes", "scans", "series", "studies", "patients", "subjects", "dicom", "images",
             "imagestr", "ct", "mr")
VOLUME_MASK_DIRS = ("masks", "mask", "labels", "labelstr", "segmentations", "segmentation", "seg", "gt",
                    "ground_truth", "groundtruth")
CASE_SAMPLE, CASE_FILES, LABEL_SAMPLE = 20, 2000, 5
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


def _is_dicom(p: Path) -> bool:
    """A ``.dcm`` file, or any file with the ``DICM`` marker after its 128-byte preamble (scanners
    write files without a suffix, or with UID-like names)."""
    if p.suffix.lower() in (".dcm", ".dicom"):
        return True
    try:
        with open(p, "rb") as fh:
            return fh.read(132)[128:] == b"DICM"
    except OSError:
        return False


def _is_nifti(p: Path) -> bool:
    return _visible(p) and p.name.lower().endswith((".nii.gz", ".nii")) and p.is_file()


def _nifti_id(p: Path) -> str:
    return p.name[:-7] if p.name.lower().endswith(".nii.gz") else p.name[:-4]


def _nifti_globs(prefix: str, files: Iterable[Path]) -> list[str]:
    """One glob per NIfTI ending found, spelled as found (``*.nii.gz``, ``*.nii``)."""
    endings = Counter(p.name[-7:] if p.name.lower().endswith(".nii.gz") else p.name[-4:] for p in files)
    return [f"{prefix}*{e}" for e, _ in endings.most_common()]


@dataclass
class _Case:
    """What the headers of one DICOM case folder say."""

    slices: Counter = field(default_factory=Counter)  # SeriesInstanceUID -> files
    described: dict[str, str] = field(default_factory=dict)  # SeriesInstanceUID -> SeriesDescription
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # SeriesInstanceUID -> (rows, columns)
    modality: str = ""
    fractional: bool = False  # a rescale slope or intercept that is not a whole number
    strays: list[str] = field(default_factory=list)  # files pydicom does not read, or without a series

    @property
    def main(self) -> str | None:
        """The series ``series: largest`` keeps."""
        return max(self.slices, key=lambda uid: self.slices[uid]) if self.slices else None


def _dicom_case(d: Path) -> _Case:
    import pydicom
    from pydicom.errors import InvalidDicomError

    case = _Case()
    for p in _files_below(d, CASE_FILES):
        try:
            ds = pydicom.dcmread(p, stop_before_pixels=True)
        except (InvalidDicomError, ValueError, EOFError, OSError, TypeError, KeyError):
            case.strays.append(p.relative_to(d).as_posix())
            continue
        uid = str(ds.get("SeriesInstanceUID", "") or "")
        if not uid:  # a DICOMDIR, a report: no slice of any series
            case.strays.append(p.relative_to(d).as_posix())
            continue
        case.slices[uid] += 1
        case.described.setdefault(uid, str(ds.get("SeriesDescription", "") or ""))
        if "Rows" in ds and "Columns" in ds:
            case.sizes.setdefault(uid, (int(ds.Rows), int(ds.Columns)))
        case.modality = case.modality or str(ds.get("Modality", "") or "")
        for key in ("RescaleSlope", "RescaleIntercept"):
            value = ds.get(key)
            if value not in (None, "") and not float(value).is_integer():
                case.fractional = True
    return case


def _dicom_cases(raw: Path) -> tuple[Path, list[Path]] | None:
    """The folder holding the case folders (``raw`` or e.g. ``raw/cases``) and the case folders:
    its sub-folders with DICOM files at any depth."""
    for base in [raw, *_named(raw, CASE_DIRS)]:
        skip = set(VOLUME_MASK_DIRS) | (set(CASE_DIRS) if base == raw else set())
        cases = [d for d in _subdirs(base) if d.name.lower() not in skip
                 and any(_is_dicom(p) for p in _files_below(d, 8))]
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
    others = sorted(p.name + ("/" if p.is_dir() else "") for p in base.iterdir()
                    if _visible(p) and fnmatch.fnmatchcase(p.name, pattern) and p not in cases)
    if others:
        where = "" if base == raw else f"{base.name}/"
        notes.append(f"files: {glob} also takes {', '.join(where + o for o in others[:4])}"
                     f"{' ...' if len(others) > 4 else ''}, which are not case folders of DICOM files: they will be "
                     "rejected as cases" + ("; move the case folders into cases/" if base == raw else "; move them out"))
    dotted = [d.name for d in cases if "." in d.name]
    if dotted:
        notes.append(f"case folder names with a dot ({', '.join(dotted[:3])}): a sample id is the name without "
                     "what follows its last dot, so such cases may collide; rename the folders without dots")
    return glob


@dataclass
class _VolumeMask:
    globs: list[str]
    what: str
    classes: _MaskClasses


def _label_volume_classes(files: list[Path], notes: list[str]) -> _MaskClasses:
    """Binary or ``classes``/``ignore_value`` from the values of a few NIfTI label volumes."""
    import nibabel
    from nibabel.filebasedimages import ImageFileError

    info, values = _MaskClasses(), set()
    for p in _sample(files, LABEL_SAMPLE):
        try:
            data = np.asanyarray(nibabel.load(p).dataobj)
        except (ImageFileError, OSError, ValueError, EOFError):
            continue
        found = np.unique(data)
        if not np.array_equal(found, np.round(found)):
            notes.append(f"{p.name} holds values that are not whole numbers: label volumes must hold class "
                         "indices, so such masks will be rejected")
            return info
        values |= {int(v) for v in found}
        info.sampled += 1
    if values <= {0, 1} or values <= {0, 255}:
        return info
    if min(values) < 0 or max(values) > 255:
        notes.append(f"label volumes hold values {min(values)}..{max(values)}: only class indices 0..255 are "
                     "supported; the mask is declared binary and such masks will be rejected")
        return info
    info.classes = max(max(values - {255}, default=0) + 1, 2)
    info.ignore_value = 255 if 255 in values else None
    info.found = sorted(values)
    return info


def _volume_masks(raw: Path, base: Path, ids: set[str], notes: list[str]) -> _VolumeMask | None:
    """masks/<case>/ folders of per-slice pictures, or masks/<case>.nii.gz label volumes."""
    for d in _named(raw, VOLUME_MASK_DIRS):
        if d == base:
            continue
        nifti = sorted(p for p in d.iterdir() if _is_nifti(p))
        folders = [c for c in _subdirs(d) if _pictures_in(c)]
        if nifti:
            mask_ids = {_nifti_id(p) for p in nifti}
            mask = _VolumeMask(_nifti_globs(f"{d.name}/", nifti), "label volumes (NIfTI)",
                               _label_volume_classes(nifti, notes))
        elif folders:
            mask_ids = {c.name for c in folders}
            slices = [p for c in _sample(folders, CASE_SAMPLE) for p in _pictures_in(c)]
            mask = _VolumeMask([f"{d.name}/*"], "a folder of per-slice pictures per case, numbered in slice "
                               "order", _mask_classes(slices, notes))
        else:
            continue
        if ids - mask_ids:
            notes.append(f"{len(ids - mask_ids)} of {len(ids)} cases have no mask in {d.name}/ "
                         f"(e.g. {sorted(ids - mask_ids)[0]}): they are quarantined as incomplete samples")
        if mask_ids - ids:
            notes.append(f"{len(mask_ids - ids)} masks in {d.name}/ have no case (e.g. {sorted(mask_ids - ids)[0]}): "
                         "they are quarantined as incomplete samples")
        return mask
    return None


def _volume_mask_field(t: _Text, name: str, like: str, mask: _VolumeMask) -> None:
    mc = mask.classes
    t(1, f"{name}:")
    t(2, "kind: volume_mask", mask.what)
    t(2, f"files: {_files_value(mask.globs)}")
    t(2, f"like: {like}", "must have its volume's depth and slice size; cropped/padded with it")
    if mc.classes is not None:
        t(2, f"classes: {mc.classes}", f"values 0..{mc.classes - 1}: found {mc.found} in {mc.sampled} sampled masks")
        if mc.ignore_value is not None:
            t(2, f"ignore_value: {mc.ignore_value}", "voxels to ignore in the loss; padding uses it")


def _most_common_size(sizes: Counter, what: str, notes: list[str]) -> tuple[int, int]:
    (rows, cols), n = sizes.most_common(1)[0]
    if len(sizes) > 1:
        seen = ", ".join(f"{r}x{c} in {k}" for (r, c), k in sizes.most_common(4))
        notes.append(f"slice sizes differ among the sampled {what} ({seen}): others are centre-cropped or padded "
                     f"to {rows}x{cols}, never resampled")
    return rows, cols


def _volume_field(t: _Text, name: str, globs: list[str], size: tuple[int, int], sampled: int, what: str,
                  series: bool, fractional: bool) -> None:
    t(1, f"{name}:")
    t(2, "kind: volume", what)
    t(2, f"files: {_files_value(globs)}", "one case each; the sample id is its name")
    t(2, f"size: [{size[0]}, {size[1]}]", f"(rows, columns): the most common slice size of {sampled} sampled cases;")
    t.more("others are centre-cropped / padded, never resampled; the depth is kept")
    if series:
        t(2, "series: largest", "case folders hold several series (see the notes): keep the one with")
        t.more("the most slices | or a SeriesDescription regular expression")
    if fractional:
        t(2, "dtype: float32", "rescale slope/intercept are not whole numbers")


def _volume_body(raw: Path, notes: list[str]):
    """The body of a spec for DICOM case folders or NIfTI volumes, or None if ``raw`` holds neither."""
    dicom = _dicom_cases(raw)
    if dicom is not None:
        return _dicom_body(raw, *dicom, notes)
    for base in [raw, *_named(raw, CASE_DIRS)]:
        if base.name.lower() in VOLUME_MASK_DIRS and base != raw:
            continue
        files = sorted(p for p in base.iterdir() if _is_nifti(p))
        if files:
            return _nifti_body(raw, base, files, notes)
    return None


def _dicom_body(raw: Path, base: Path, cases: list[Path], notes: list[str]):
    glob = _case_glob(raw, base, cases, notes)
    sampled = {d.name: _dicom_case(d) for d in _sample(cases, CASE_SAMPLE)}
    read = {n: c for n, c in sampled.items() if c.main is not None}
    if not read:
        raise UsageError(f"no DICOM slice in {base} can be read by pydicom (e.g. {cases[0]})")
    several = {n: c for n, c in read.items() if len(c.slices) > 1}
    if several:
        n, c = next(iter(several.items()))
        listed = ", ".join(f"{c.described[u] or 'no description'!r} {k} slices" for u, k in c.slices.most_common())
        notes.append(f"{len(several)} of {len(read)} sampled case folders hold more than one series (e.g. {n}: "
                     f"{listed}): series: largest keeps the one with the most slices; set a SeriesDescription "
                     "pattern instead to choose by name")
    strays = [(n, s) for n, c in sampled.items() for s in c.strays]
    if strays:
        n, s = strays[0]
        notes.append(f"{len(strays)} files in sampled case folders are not DICOM slices pydicom reads (e.g. {n}/{s}): "
                     "every file of a case folder is read, so those cases will be rejected; move such files out")
    size = _most_common_size(Counter(c.sizes[c.main] for c in read.values() if c.main in c.sizes), "cases", notes)
    modality = Counter(c.modality for c in read.values() if c.modality).most_common(1)
    modality = modality[0][0] if modality else ""
    name = _MODALITY_NAMES.get(modality, "volume")
    mask = _volume_masks(raw, base, {d.name for d in cases}, notes)
    where = "case folders" if base == raw else f"case folders in {base.name}/"
    what = f"a DICOM series per case folder ({modality or 'modality unknown'}, {len(cases)} {where})"

    def body(t: _Text) -> None:
        t(0, "fields:")
        _volume_field(t, name, [glob], size, len(read), what, bool(several),
                      any(c.fractional for c in read.values()))
        if mask is not None:
            _volume_mask_field(t, f"{name}_mask", name, mask)

    return "volume", body


def _nifti_body(raw: Path, base: Path, files: list[Path], notes: list[str]):
    import nibabel
    from nibabel.filebasedimages import ImageFileError

    sizes, odd, unreadable, fractional = Counter(), [], [], False
    sampled = _sample(files, SIZE_SAMPLE)
    for p in sampled:
        try:
            img = nibabel.load(p)
        except (ImageFileError, OSError, ValueError, EOFError):
            unreadable.append(p.name)
            continue
        if len(img.shape) != 3:
            odd.append(f"{p.name} {tuple(img.shape)}")
            continue
        sizes[(int(img.shape[1]), int(img.shape[0]))] += 1  # stored (z, y, x): a slice is y rows of x
        slope, inter = img.header.get_slope_inter()
        fractional |= img.get_data_dtype().kind == "f" or any(
            v is not None and np.isfinite(v) and not float(v).is_integer() for v in (slope, inter))
    if unreadable:
        notes.append(f"{len(unreadable)} of {len(sampled)} sampled NIfTI files cannot be read by nibabel "
                     f"(e.g. {unreadable[0]}): they will be rejected")
    if odd:
        notes.append(f"{len(odd)} sampled NIfTI files are not 3-D volumes (e.g. {odd[0]}): they will be rejected")
    if not sizes:
        raise UsageError(f"no 3-D NIfTI volume in {base} can be read by nibabel")
    size = _most_common_size(sizes, "volumes", notes)
    prefix = "" if base == raw else f"{base.name}/"
    labelled = [p.name for p in files if re.search(r"[_-](seg|mask|label|labels|gt)$", _nifti_id(p), re.I)]
    if labelled:
        notes.append(f"{', '.join(labelled[:3])} look like label volumes but are read as volumes: move them into "
                     "labels/, named like their volume")
    mask = _volume_masks(raw, base, {_nifti_id(p) for p in files}, notes)
    what = f"NIfTI volumes ({len(files)} in {prefix or './'}), slices along the third axis"

    def body(t: _Text) -> None:
        t(0, "fields:")
        _volume_field(t, "volume", _nifti_globs(prefix, files), size, sum(sizes.values()), what, False, fractional)
        if mask is not None:
            _volume_mask_field(t, "volume_mask", "volume", mask)

    return "volume", body


# ---- signals: EDF/BDF recordings, CSV with a time column, one .npy per channel ----------------

SIGNAL_SAMPLE, CSV_ROWS = 50, 20_000
EDF_SUFFIXES = (".edf", ".bdf")


def _files_in(d: Path, suffixes: tuple[str, ...]) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if p.suffix.lower() in suffixes and _visible(p) and p.is_file())
    except OSError:
        return []


def _suffix_globs(prefix: str, files: Iterable[Path]) -> list[str]:
    counts = Counter(p.suffix for p in files)
    return [f"{prefix}*{s}" for s, _ in counts.most_common()]


def _signal_name(label: str, taken: set[str]) -> str:
    """A field name from a channel label: lower case, runs of other characters as ``_``, unique."""
    name = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_") or "signal"
    if name[0].isdigit():
        name = f"ch_{name}"
    base, k = name, 2
    while name in taken or name in RESERVED or name.endswith(LENGTHS):
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def _rate_value(rate: float) -> int | float:
    return int(round(rate)) if abs(rate - round(rate)) <= 1e-6 * max(rate, 1.0) else float(f"{rate:.6g}")


@dataclass
class _Channel:
    """One channel as the sampled recordings show it."""

    label: str
    rates: dict[float, list[str]] = field(default_factory=dict)  # rate -> files

    def add(self, rate: float, name: str) -> None:
        self.rates.setdefault(_rate_value(rate), []).append(name)

    @property
    def files(self) -> int:
        return sum(len(v) for v in self.rates.values())

    def rate(self) -> int | float:
        return max(self.rates, key=lambda r: (len(self.rates[r]), r))

    def off_rate(self) -> list[tuple[float, list[str]]]:
        """The rates other than the chosen one, beyond the kind's tolerance, with their files."""
        chosen = self.rate()
        return [(r, names) for r, names in self.rates.items() if abs(r - chosen) > RATE_TOLERANCE * chosen]


def _channel_notes(channels: dict[str, _Channel], readable: list[str], unit: str, notes: list[str]) -> None:
    for ch in channels.values():
        for rate, names in ch.off_rate():
            notes.append(f"{unit} {ch.label!r} is at {rate:g} Hz in {len(names)} of {ch.files} sampled files "
                         f"({', '.join(names[:3])}), not {ch.rate():g} Hz: those recordings will be rejected")
        having = {n for names in ch.rates.values() for n in names}
        missing = [n for n in readable if n not in having]
        if missing:
            notes.append(f"{unit} {ch.label!r} is missing in {len(missing)} of {len(readable)} sampled files "
                         f"({', '.join(missing[:3])}): those recordings will be rejected (every field must be in "
                         "a sample; drop the field to keep them)")


def _signal_field(t: _Text, name: str, globs: list[str], channel: str | None, rate: int | float | None,
                  why: str) -> None:
    t(1, f"{name}:")
    t(2, "kind: signal")
    t(2, f"files: {_files_value(globs)}")
    if channel is not None:
        t(2, f"channel: {_scalar(channel)}", "the label in the recording, exactly")
    if rate is None:
        t.todo(2, "rate", "1", f"samples per second: {why}")
    else:
        t(2, f"rate: {rate}", why)


def _edf_size_problem(path: Path) -> str | None:
    """Why an EDF/BDF file's size does not match what its header declares (a truncated or padded
    file), checked before pyedflib opens it (its C library prints the mismatch on stdout)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
            ns = int(head[252:256])
            fh.seek(256 + ns * 216)
            per_record = sum(int(fh.read(8)) for _ in range(ns))
        header, records = int(head[184:192]), int(head[236:244])
        size = path.stat().st_size
    except (OSError, ValueError):
        return None  # pyedflib says what is wrong
    expected = header + records * per_record * (3 if head[:8] == b"\xffBIOSEMI" else 2)
    if records >= 0 and size != expected:
        return f"{size:,} bytes where its header declares {expected:,} (truncated?)"
    return None


def _edf_channels(path: Path) -> list[tuple[str, float]] | str:
    """(label, rate) per channel of an EDF/BDF header, or why pyedflib cannot read it."""
    import pyedflib

    problem = _edf_size_problem(path)
    if problem:
        return problem
    try:
        reader = pyedflib.EdfReader(str(path), annotations_mode=pyedflib.DO_NOT_READ_ANNOTATIONS)
    except OSError as err:
        return str(err).replace(str(path) + ": ", "")
    try:
        return [(label.strip(), float(reader.getSampleFrequency(i))) for i, label in
                enumerate(reader.getSignalLabels())]
    finally:
        reader.close()


def _signal_body(raw: Path, notes: list[str], todo: list[str]):
    """The body of a spec for EDF/BDF recordings, CSV recordings with a time column or per-channel
    folders of .npy files, or None if ``raw`` holds none of them."""
    bases = [raw, *_subdirs(raw)]
    edf = [(b, _files_in(b, EDF_SUFFIXES)) for b in bases]
    edf = [(b, files) for b, files in edf if files]
    if edf:
        for other, _ in edf[1:]:
            notes.append(f"{other.relative_to(raw).as_posix()}/ also holds recordings; this spec reads "
                         f"{edf[0][0].relative_to(raw).as_posix() or '.'}/ only (add its glob to files to include it)")
        return _edf_body(raw, *edf[0], notes)
    for b in bases:
        files = _files_in(b, (".csv",))
        if files and _csv_recording(files[0]).time is not None:
            return _csv_body(raw, b, files, notes)
    folders = [(b, _files_in(b, (".npy",))) for b in bases]
    folders = [(b, files) for b, files in folders if files]
    if folders:
        return _npy_body(raw, folders, notes, todo)
    return None


def _edf_body(raw: Path, base: Path, files: list[Path], notes: list[str]):
    prefix = "" if base == raw else f"{base.name}/"
    channels: dict[str, _Channel] = {}
    unreadable, twice = [], []
    sampled = _sample(files, SIGNAL_SAMPLE)
    for p in sampled:
        got = _edf_channels(p)
        if isinstance(got, str):
            unreadable.append(f"{p.name}: {got}")
            continue
        labels = [label for label, _ in got]
        for i, (label, rate) in enumerate(got):
            if label in labels[:i]:
                twice.append(f"{p.name}: {label}")
                continue
            channels.setdefault(label, _Channel(label)).add(rate, p.name)
    readable = [p.name for p in sampled if not any(u.startswith(f"{p.name}: ") for u in unreadable)]
    if not channels:
        raise UsageError(f"no EDF/BDF recording in {base} can be read by pyedflib "
                         f"({unreadable[0] if unreadable else 'no channels'})")
    if unreadable:
        notes.append(f"{len(unreadable)} of {len(sampled)} sampled recordings cannot be read by pyedflib "
                     f"({'; '.join(unreadable[:3])}): they will be rejected")
    if twice:
        notes.append(f"a label appears twice in a recording ({', '.join(twice[:3])}): its field reads the first")
    _channel_notes(channels, readable, "channel", notes)
    globs = _suffix_globs(prefix, files)
    taken: set[str] = set()
    names = {label: _signal_name(label, taken) for label in channels}

    def body(t: _Text) -> None:
        t(0, "fields:")
        t.comment(1, f"one field per channel of the {len(files)} recordings in {prefix or './'}; they pair by file "
                     "name, each at its own rate")
        for label, ch in channels.items():
            _signal_field(t, names[label], globs, label, ch.rate(), f"Hz, from the headers of {ch.files} sampled files")

    return "signals", body


@dataclass
class _CsvRecording:
    time: str | None = None
    columns: list[str] = field(default_factory=list)  # numeric columns other than time
    other: list[str] = field(default_factory=list)  # columns holding text
    rate: float | None = None
    problem: str | None = None


def _csv_recording(path: Path) -> _CsvRecording:
    """The time column, the numeric columns and the rate (from the first rows) of a CSV recording."""
    rec = _CsvRecording()
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            reader = csv.reader(fh)
            header = [h.strip() for h in next(reader, [])]
            rows = [r for r in itertools.islice(reader, CSV_ROWS) if r]
    except (OSError, csv.Error) as err:
        rec.problem = str(err)
        return rec
    time_col = next((i for i, h in enumerate(header) if h.lower() in TIME_COLUMNS), None)
    if time_col is None:
        return rec
    rec.time = header[time_col]
    try:
        times = np.array([float(r[time_col]) for r in rows], np.float64)
    except (ValueError, IndexError):
        rec.problem = f"its {rec.time} column holds a value that is not a number"
        return rec
    steps = np.diff(times)
    if not steps.size or (steps <= 0).any():
        rec.problem = "fewer than two samples" if not steps.size else f"its {rec.time} column does not increase"
        return rec
    rec.rate = 1.0 / float(np.median(steps))
    for i, h in enumerate(header):
        if i == time_col or not h:
            continue
        try:
            [float(r[i]) for r in rows[:50]]
            rec.columns.append(h)
        except (ValueError, IndexError):
            rec.other.append(h)
    return rec


def _csv_body(raw: Path, base: Path, files: list[Path], notes: list[str]):
    prefix = "" if base == raw else f"{base.name}/"
    channels: dict[str, _Channel] = {}
    problems, text_columns = [], Counter()
    sampled = _sample(files, SIGNAL_SAMPLE)
    for p in sampled:
        rec = _csv_recording(p)
        if rec.time is None or rec.rate is None:
            problems.append(f"{p.name}: {rec.problem or 'no time column (' + ', '.join(TIME_COLUMNS) + ')'}")
            continue
        for column in rec.columns:
            channels.setdefault(column, _Channel(column)).add(rec.rate, p.name)
        text_columns.update(rec.other)
    readable = [p.name for p in sampled if not any(u.startswith(f"{p.name}: ") for u in problems)]
    if not channels:
        raise UsageError(f"no CSV recording in {base} has a numeric column beside its time column "
                         f"({problems[0] if problems else 'no columns'})")
    if problems:
        notes.append(f"{len(problems)} of {len(sampled)} sampled CSV recordings cannot be used "
                     f"({'; '.join(problems[:3])}): they will be rejected")
    if text_columns:
        notes.append(f"columns holding text are not declared: {', '.join(sorted(text_columns))}")
    _channel_notes(channels, readable, "column", notes)
    globs = _suffix_globs(prefix, files)
    taken: set[str] = set()
    names = {label: _signal_name(label, taken) for label in channels}

    def body(t: _Text) -> None:
        t(0, "fields:")
        t.comment(1, f"one field per column of the {len(files)} CSV recordings in {prefix or './'} "
                     "(the time column gives the rate)")
        for label, ch in channels.items():
            _signal_field(t, names[label], globs, label, ch.rate(),
                          f"Hz, measured from the time column of {ch.files} sampled files")

    return "signals", body


def _npy_body(raw: Path, folders: list[tuple[Path, list[Path]]], notes: list[str], todo: list[str]):
    taken: set[str] = set()
    fields = []  # (name, globs, rate or None, why)
    stems = {}
    for d, files in folders:
        prefix = "" if d == raw else f"{d.name}/"
        name = _signal_name(d.name if d != raw else "signal", taken)
        ch, odd = _Channel(name), []
        sampled = _sample(files, SIGNAL_SAMPLE)
        for p in sampled:
            try:
                shape = np.load(p, mmap_mode="r", allow_pickle=False).shape
            except (ValueError, OSError):
                odd.append(f"{p.name} (unreadable)")
                continue
            if len(shape) != 1:
                odd.append(f"{p.name} {shape}")
            sidecar = p.with_suffix(".json")
            try:
                rate = json.loads(sidecar.read_text()).get("rate") if sidecar.is_file() else None
            except (ValueError, UnicodeDecodeError, AttributeError):
                rate = None
            if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0:
                ch.add(float(rate), p.name)
        if odd:
            notes.append(f"{prefix}: {len(odd)} of {len(sampled)} sampled arrays are not one channel of numbers "
                         f"({', '.join(odd[:3])}): a .npy must hold one 1-D channel; they will be rejected")
        stems[prefix or "./"] = {p.stem for p in files}
        if ch.rates:
            for rate, names in ch.off_rate():
                notes.append(f"{prefix}: {len(names)} sidecars give {rate:g} Hz ({', '.join(names[:3])}), not "
                             f"{ch.rate():g} Hz: those recordings will be rejected")
            fields.append((name, [f"{prefix}*.npy"], ch.rate(), f"Hz, from the <stem>.json sidecars of "
                                                                  f"{ch.files} sampled files"))
        else:
            message = (f"fields.{name}.rate: no {prefix}<stem>.json sidecar gives the rate of {prefix}*.npy; "
                       "fill in rate: (samples per second) in the spec")
            notes.append(message)
            todo.append(f"fields.{name}.rate")
            fields.append((name, [f"{prefix}*.npy"], None, f"no {prefix}<stem>.json sidecar gives it; fill it in"))
    every = set.intersection(*stems.values())
    for where, have in stems.items():
        if have - every:
            notes.append(f"{len(have - every)} recordings in {where} are missing in another channel folder "
                         f"(e.g. {sorted(have - every)[0]}): they are quarantined as incomplete samples")

    def body(t: _Text) -> None:
        t(0, "fields:")
        t.comment(1, "one field per channel folder; a recording's channels pair by file name")
        for name, globs, rate, why in fields:
            _signal_field(t, name, globs, None, rate, why)

    return "signals", body


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


def _footer(t: _Text, spec_path: Path, name: str, split_column: str | None = None,
            batch_size: int | None = None) -> None:
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
    if batch_size:
        t(1, f"batch_size: {batch_size}", "samples per dask task: a case is large, so a few at a time")


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
    ``parse_spec`` (a TODO value by a placeholder), the notes on what could not be inferred safely
    and what must be filled in."""
    raw = Path(raw).resolve()
    spec_path = Path(spec_path)
    if not raw.is_dir():
        raise UsageError(f"{raw} is not a folder")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", raw.name).strip("-.") or "dataset"
    notes: list[str] = []
    todo: list[str] = []
    pairs = _sr_pairs(raw)
    images = next((d for d in _named(raw, IMAGE_DIRS) if _pictures_in(d)), None)
    ids, split_column, batch_size = None, None, None
    if pairs:
        layout, body = "sr", _sr_body(raw, pairs, notes)
    elif images is not None:
        layout, body = _segment_body(raw, images, notes)
    elif (tree := _class_tree(raw, notes)) is not None:
        layout, body, ids = "classify", _classify_body(raw, tree, notes), "path"
        split_column = "split" if tree.split else None
    elif (found := _volume_body(raw, notes) or _signal_body(raw, notes, todo)) is not None:
        layout, body = found
        batch_size = 2 if layout == "volume" else None
    else:
        raise UsageError(f"no pictures found in {raw}, nor volumes or recordings: expected images/ (+ masks/), "
                         "class folders (<class>/*.jpg, <split>/<class>/*.jpg), lr/ + hr/ super-resolution pairs, "
                         "DICOM case folders (<case>/*.dcm), NIfTI volumes (*.nii.gz), or recordings (*.edf, "
                         "*.csv with a time column, <channel>/*.npy)")
    t = _Text()
    _header(t, raw, spec_path, name, notes, ids)
    body(t)
    _footer(t, spec_path, name, split_column, batch_size)
    text = "\n".join(t.lines) + "\n"
    parse_spec(yaml.safe_load(t.checked()), spec_path.parent.resolve(), str(spec_path))  # must be valid
    return Inferred(text, tuple(notes), layout, tuple(todo))


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

"""Discover: walk the source folder, pair field files by stem, join annotation records, assign splits.

Raw-file hashes are computed by the cleaning workers from the very bytes they decode (in parallel,
and with no window in which a file could change between hashing and decoding).
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
import math
import os
import re
import stat
import time
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

from h5forge._format.names import INBOX_PROCESSED, INBOX_TEMPORARY
from h5forge._ingest.incremental.hash_cache import State
from h5forge._ingest.splits import assign_split, ratio_split
from h5forge.kinds import FieldKind, field_kinds
from h5forge.kinds.optional import may_lack_file
from h5forge.kinds.parts import SampleParts
from h5forge.kinds.shared import sharing
from h5forge.kinds.base import DEFAULT_MAX_BYTES, Outside, read_bounded
from h5forge._samples import Reject, Rejection, SampleRef, encodable, rejected_count
from h5forge.spec import DatasetSpec


@dataclass
class Inventory:
    root: Path
    samples: list[SampleRef] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    unclaimed: int = 0  # files under the source root that no glob of the spec takes
    unclaimed_examples: list[str] = field(default_factory=list)  # the first few of them
    duplicate_of: dict[str, str] = field(default_factory=dict)  # a rejected duplicate's id -> the id kept
    # each sample file's state (``hash_cache.State``) from the stat that found it, and when the
    # walk began: the hash cache and the duplicate check use it instead of a stat of their own
    states: dict[str, State] = field(default_factory=dict)
    stated_at_ns: int = 0
    # the sha256 of sample files known without reading them again (``hash_cache.known_digests``)
    # or read once already (the duplicate check), for the input hashes; None: not looked up
    digests: dict[str, str] | None = None

    @property
    def rejected(self) -> int:
        """Rejected inputs (an entry may summarise several)."""
        return rejected_count(self.rejections)

    def split_counts(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for s in self.samples:
            counts[s.split] += 1
        return dict(counts)


_COERCE = {"str": str, "int": int, "float": float, "bool": bool}


_TRUE, _FALSE = {"true", "yes", "1"}, {"false", "no", "0"}


def _from_text(value: str, kind: str) -> Any:
    """A value of a text format (CSV): parsed to the column's type, or ValueError saying why."""
    text = value.strip()
    if text == "":
        raise ValueError("missing")
    if kind == "bool":
        if text.lower() not in _TRUE | _FALSE:
            raise ValueError(f"{value!r} is not true/false")
        return text.lower() in _TRUE
    try:
        parsed = _in_range(_COERCE[kind](text), kind)
    except ValueError as err:
        if "int64" in str(err):
            raise
        raise ValueError(f"{value!r} is not {'an integer' if kind == 'int' else 'a number'}") from None
    if kind == "float" and math.isinf(parsed) and text.lower().lstrip("+-") not in ("inf", "infinity"):
        raise _overflowed(repr(text))  # "1e400": written finite, beyond float64
    return parsed


INT64 = (-(2**63), 2**63 - 1)


class _Overflowed(float):
    """A JSON number written finite that float64 cannot hold (``1e400``): ``json`` reads it as
    inf, and a float column refuses it rather than store inf for it."""

    literal: str


def _json_number(text: str) -> float:
    value = float(text)
    if math.isfinite(value):
        return value
    out = _Overflowed(value)
    out.literal = text
    return out


def load_json(text: str) -> Any:
    """A JSON document of records, its out-of-range number literals marked (``_Overflowed``)."""
    return json.loads(text, parse_float=_json_number)


def _overflowed(shown: str) -> ValueError:
    return ValueError(f"{shown} is beyond the float64 range a float column stores")


def _in_range(value: Any, kind: str) -> Any:
    """An int column is stored as int64: a value beyond it is refused, never wrapped or raised later."""
    if kind == "int" and not INT64[0] <= value <= INT64[1]:
        raise ValueError(f"{_shown(value)} is beyond the int64 range an int column stores ({INT64[0]} to {INT64[1]})")
    return value


def _json_kind(value: Any) -> str:
    """What a JSON value is, in the words of a rejection."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return "a string"


def _coerce(value: Any, kind: str, text: bool = False) -> Any:
    """A record's value as the column's type. A JSON value of another type is refused, never
    converted (``true`` is no float, ``5`` no string): the file says what its values are."""
    if not text and type(value) is _COERCE.get(kind):  # a value of the column's own type (most, quickly)
        if kind == "int":
            return _in_range(value, kind)
        if not isinstance(value, str) or ("\x00" not in value and surrogate(value) is None):
            return value
    if value is None:
        raise ValueError("missing")
    if kind == "float" and isinstance(value, _Overflowed):
        raise _overflowed(value.literal)
    if kind == "str" and "\x00" in str(value):
        raise ValueError("contains a NUL character, which HDF5 strings cannot store")
    if kind == "str" and isinstance(value, str) and (bad := surrogate(value)) is not None:
        raise ValueError(f"holds a lone surrogate (U+{ord(bad):04X}), which HDF5's UTF-8 strings cannot store")
    if text and kind != "str":
        return _from_text(str(value), kind)
    if kind == "str" and not isinstance(value, str):
        raise ValueError(f"{value!r} is {_json_kind(value)}, expected str")
    if kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float, str))):
        raise ValueError(f"{value!r} is {_json_kind(value)}, expected float")
    if kind == "int" and (isinstance(value, bool) or (isinstance(value, float) and not value.is_integer())):
        raise ValueError(f"{value!r} is not an integer")
    if kind == "int" and not isinstance(value, (int, float, str)):
        raise ValueError(f"{value!r} is {_json_kind(value)}, expected int")
    if kind == "bool" and not isinstance(value, bool):
        raise ValueError(f"{value!r} is not true/false")
    if kind in ("int", "float") and isinstance(value, str):
        raise ValueError(f"{value!r} is a string, expected {kind}")
    if kind == "float" and isinstance(value, int):
        try:
            return float(value)
        except OverflowError:  # a JSON integer literal of hundreds of digits
            raise ValueError(f"{_shown(value)} is beyond the float64 range a float column stores") from None
    return _in_range(_COERCE[kind](value), kind)


def _shown(value: Any) -> str:
    """A number for a reason, a long integer cut short: a JSON literal may have thousands of digits."""
    text = repr(value)
    if len(text) <= 24 or not isinstance(value, int):
        return text
    return f"{text[:10]}…{text[-4:]} ({len(text.lstrip('-'))} digits)"


def surrogate(text: str) -> str | None:
    """The first lone surrogate of ``text``, if any (a JSON ``"\\ud800"``, a file name's
    undecodable byte): UTF-8, and so HDF5, cannot store it."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as err:
        return text[err.start]


_WILDCARD = re.compile(r"[*?\[]")


def _stem(name: str) -> str:
    """``PurePath(name).stem`` without building a path (discovery calls it once a file)."""
    i = name.rfind(".")
    return name[:i] if 0 < i < len(name) - 1 else name


def _stem_id(name: str) -> str:
    """The id a file name gives with ``ids: stem``."""
    return name[: -len(".nii.gz")] if name.lower().endswith(".nii.gz") else _stem(name)


def sample_id(rel: str, pattern: str, ids: str, folder: bool = False) -> str:
    """The id a file gives its sample: its stem, or (``ids: path``) its path below the pattern's
    fixed folders, without the suffix (``images/*/*.png`` makes ``images/cat/x.png`` ``cat/x``)."""
    if ids == "stem":
        name = rel.rsplit("/", 1)[-1]
        return name if folder else _stem_id(name)  # a case folder's name is its id, dots and all (DICOM UIDs)
    fixed = 0
    for part in pattern.split("/")[:-1]:
        if _WILDCARD.search(part):
            break
        fixed += 1
    below = Path(*Path(rel).parts[fixed:]).as_posix()
    return below[: -len(".nii.gz")] if below.lower().endswith(".nii.gz") else str(Path(below).with_suffix(""))


def control_character(sid: str) -> str | None:
    """The first control or line-separator character of an id, or a lone surrogate, if any: such
    an id would break every line-oriented report, log and terminal it is shown in, and a surrogate
    every file it is written to."""
    if sid.isprintable():  # no control or separator character but the space (most ids, quickly)
        return None
    return next((c for c in sid if unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cs")), None)


def match_key(sid: str) -> str:
    """What ids are matched by: NFC, so a name typed on macOS (NFD) pairs with the same name typed
    elsewhere (NFC). Ids are stored as spelled; only the matching is normalised."""
    return sid if sid.isascii() else unicodedata.normalize("NFC", sid)


def _files_below(folder: str):
    """Every file and link below ``folder``, links to folders not followed."""
    for top, dirs, files in os.walk(folder):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            yield os.path.join(top, name)


def _matches(root: str, pattern: str, unlistable: list[str] | None = None) -> Iterator[tuple[str, os.DirEntry | None]]:
    """The paths ``pattern`` matches below ``root``, as ``Path.glob`` finds them, each with the
    directory entry that listed it when one did (its type and whether it is a symlink known without
    a system call); a folder it may not list into ``unlistable``. ``**`` and relative components
    are left to ``Path.glob``."""
    parts = pattern.split("/")
    if any(p in ("", ".", "..") or "**" in p for p in parts):
        yield from ((str(p), None) for p in Path(root).glob(pattern))
    else:
        yield from _below(root, parts, [] if unlistable is None else unlistable)


def _below(folder: str, parts: list[str], unlistable: list[str]) -> Iterator[tuple[str, os.DirEntry | None]]:
    part, rest = parts[0], parts[1:]
    if not _WILDCARD.search(part):  # a literal name, taken when it exists (a folder, when more follows)
        path = f"{folder}/{part}"
        if os.path.isdir(path) if rest else os.path.exists(path):
            yield from _below(path, rest, unlistable) if rest else [(path, None)]
        return
    match = re.compile(fnmatch.translate(part)).fullmatch
    try:
        with os.scandir(folder) as listing:
            entries = [e for e in listing if match(e.name)]
    except PermissionError:  # its files are not seen: the caller says so, never takes them as absent
        unlistable.append(folder)
        return
    for entry in entries:
        if not rest:
            yield entry.path, entry
        elif _is_dir(entry):
            yield from _below(entry.path, rest, unlistable)


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _stat(path: str, entry: os.DirEntry | None) -> os.stat_result | None:
    """The path's status, symlinks followed; None when it has none (a broken symlink)."""
    try:
        return entry.stat() if entry is not None else os.stat(path)
    except OSError:
        return None


# why a folder below the source the process may not list is rejected: its files are not seen, and a
# sample whose files lie there must not pass for one without them
UNLISTABLE = "cannot list this folder (permission denied): the files in it are not seen"
INCOMPLETE = "incomplete sample"  # a sample without a file of a field it needs (in an inbox: it may still come)


def _not_a_file(path: str, pattern: str) -> str | None:
    """What a path a field's glob matched is, when a field cannot read it: a FIFO, socket or
    device (or a symlink to one), a broken symlink, or a folder named as the pattern names files
    (``*.png``); None for a folder a pattern such as ``cases/*`` matches on its way."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a broken symlink" if os.path.islink(path) else None
    if stat.S_ISDIR(mode):
        return "a folder" if "." in pattern.rsplit("/", 1)[-1].lstrip("*") else None
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return None


def _glob_field(
    root: Path,
    patterns: tuple[str, ...],
    ids: str,
    folders: bool = False,
    allow_outside: bool = False,
    skip: tuple[str, ...] = (),
    id_suffix: str | None = None,
    states: dict[str, State] | None = None,
) -> tuple[dict[str, tuple[str, str]], list[Rejection]]:
    """{match key: (file, id as spelled)} of one field, and the files that cannot be told apart or
    that a symlink takes out of the source folder (unless ``allow_outside``). Nothing under the
    top-level folders named in ``skip`` is taken. ``id_suffix`` ends every stem of the field and
    is no part of the id; a file without it is rejected. ``states`` gets each taken regular file's
    state (``hash_cache.State``) from the one stat that found it a file."""
    by_stem: dict[str, list[tuple[str, str]]] = defaultdict(list)
    seen: set[str] = set()
    outside: list[Rejection] = []
    leaves = None if allow_outside else Outside(root)
    start = len(str(root).rstrip("/")) + 1
    stems = ids == "stem"
    unlistable: list[str] = []
    for pattern in patterns:
        # paths in Path's own order, by parts: a string with "/" made the lowest character sorts as
        # its parts do, and keeps pathlib and a list per file out of the sort
        for path, entry in sorted(_matches(str(root), pattern, unlistable), key=lambda m: m[0].replace("/", "\0")):
            name = entry.name if entry is not None else path.rsplit("/", 1)[-1]
            if name.startswith(".") or path in seen or (skip and name.endswith(INBOX_TEMPORARY)):
                continue  # in an inbox, a name being copied under a temporary name waits for its rename
            if (bad := _not_utf8(path[start:])) is not None:
                seen.add(path)
                rel = path[start:]
                if not (skip and rel.split("/", 1)[0] in skip):
                    outside.append(Rejection(sample_id(rel, pattern, ids, False), (rel,), bad))
                continue
            st = _stat(path, entry)
            is_dir = folders and st is not None and stat.S_ISDIR(st.st_mode)
            if not (is_dir or (st is not None and stat.S_ISREG(st.st_mode))):
                rel = path[start:]
                what = _not_a_file(path, pattern)
                if what is not None and not (skip and rel.split("/", 1)[0] in skip):
                    seen.add(path)
                    sid = sample_id(rel, pattern, ids, False)
                    target = None if leaves is None or not os.path.islink(path) else leaves(path, True)
                    why = f"not a regular file: {what}" if target is None else _leads_outside(target)
                    outside.append(Rejection(sid, (rel,), why))
                continue
            seen.add(path)
            rel = path[start:]
            if skip and rel.split("/", 1)[0] in skip:
                continue
            sid = _stem_id(name) if stems and not is_dir else sample_id(rel, pattern, ids, is_dir)
            if id_suffix:
                if not sid.endswith(id_suffix) or sid == id_suffix:
                    why = f"the file name does not end in {id_suffix!r} (the field's id_suffix)"
                    outside.append(Rejection(sid, (rel,), why))
                    continue
                sid = sid[: -len(id_suffix)]
            if leaves is None:
                target = None
            elif entry is not None and not is_dir and not entry.is_symlink():  # its folder says where it is
                target = leaves.in_folder(path[: len(path) - len(name) - 1], name)
            else:
                target = leaves(path, entry.is_symlink() if entry is not None else None)
            if target is None and is_dir and leaves is not None:  # every file of a case folder, too
                target = next(filter(None, map(leaves, _files_below(path))), None)
            if target is not None:
                outside.append(Rejection(sid, (rel,), _leads_outside(target)))
                continue
            by_stem[match_key(sid)].append((rel, sid))
            if not is_dir and st is not None and states is not None:
                states[rel] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    for folder in dict.fromkeys(unlistable):
        rel = folder[start:] or "."
        if not (skip and rel.split("/", 1)[0] in skip):
            outside.append(Rejection("", (rel,), UNLISTABLE))
    found, problems = {}, outside
    for entries in by_stem.values():
        paths = tuple(rel for rel, _ in entries)
        if len({sid for _, sid in entries}) > 1:
            why = f"ambiguous: {len(paths)} file names differ only by Unicode normalisation (NFC/NFD)"
            problems.append(Rejection(entries[0][1], paths, why))
        elif len(paths) > 1:
            problems.append(Rejection(entries[0][1], paths, f"ambiguous: {len(paths)} files share the stem"))
        else:
            found[match_key(entries[0][1])] = entries[0]
    return found, problems


def _not_utf8(rel: str) -> str | None:
    """Why a path below the source folder cannot be taken when its name is not UTF-8 (its
    undecodable bytes are surrogates, which no id, column or report can store); None when it is."""
    if surrogate(rel) is None:
        return None
    what = "file" if surrogate(rel.rsplit("/", 1)[-1]) is not None else "folder"
    return f"the {what} name is not valid UTF-8 ({encodable(rel)}); rename it"


def _leads_outside(target: str) -> str:
    return f"symlink leads outside the source folder (to {target}); set source.allow_symlinks_outside: true to take it"


TEXT_FORMAT = "_text"  # marks a record whose values are all text (CSV): parsed per column type


SIDECAR_MAX_BYTES = 1 << 20  # one sample's record


def read_annotation_file(
    path: Path, max_bytes: int = DEFAULT_MAX_BYTES, root: Path | None = None, allow_outside: bool = True
) -> list:
    """The records of a JSON list, JSON Lines or CSV file (by its suffix), read by ``read_bounded``;
    ValueError says what is wrong."""
    suffix = path.suffix.lower()
    text = read_bounded(path, max_bytes, root, allow_outside).decode("utf-8-sig")
    if suffix == ".csv":
        # the csv module splits records itself: a quoted value keeps its line breaks (\n, \r, \u2028);
        # utf-8-sig drops the byte-order mark spreadsheet programs write before the header
        return [{**row, TEXT_FORMAT: True} for row in csv.DictReader(io.StringIO(text, newline=""))]
    if suffix == ".jsonl":
        records = []
        # JSON Lines ends records at \n only; str.splitlines would also cut at \u2028 inside a string
        for n, line in enumerate(text.split("\n"), 1):
            if line.strip():
                try:
                    records.append(load_json(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"line {n} is not valid JSON: {err}") from None
        return records
    data = load_json(text)
    if isinstance(data, dict) and isinstance(data.get("samples"), list):
        data = data["samples"]
    if not isinstance(data, list):
        raise ValueError("the annotation file must hold a JSON list of records")
    return data


def load_records(
    path: Path,
    id_key: str,
    missing_ok: bool = False,
    ids: str = "stem",
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    root: Path | None = None,
    allow_outside: bool = True,
) -> tuple[dict[str, dict], list[Rejection]]:
    """Annotation records keyed by sample id (a file-name value loses its suffix, and with
    ``ids: stem`` its folders)."""
    rel = path.name
    try:
        data = read_annotation_file(path, max_bytes, root, allow_outside)
    except FileNotFoundError:
        return {}, [] if missing_ok else [Rejection("", (rel,), "annotation file not found")]
    except (ValueError, UnicodeDecodeError, RecursionError, csv.Error) as err:
        return {}, [Rejection("", (rel,), f"annotation file cannot be read: {err}")]
    except OSError as err:
        return {}, [Rejection("", (rel,), f"annotation file cannot be read: {err.strerror or err}")]
    records: dict[str, dict] = {}
    problems: list[Rejection] = []
    seen_twice: set[str] = set()
    for i, rec in enumerate(data):
        if not isinstance(rec, dict) or id_key not in rec:
            problems.append(Rejection("", (f"{rel}[{i}]",), f"record has no {id_key!r} key"))
            continue
        sid = record_key(rec, id_key, ids)
        if sid in records:
            seen_twice.add(sid)
        records[sid] = rec
    for sid in sorted(seen_twice):
        problems.append(Rejection(sid, (rel,), "several annotation records for this sample"))
        del records[sid]
    return records, problems


def record_key(rec: dict, id_key: str, ids: str = "stem") -> str:
    """The match key of the sample a record names: its ``id_key`` value, which may be a file name
    (the suffix goes, and with ``ids: stem`` the folders)."""
    raw_id = str(rec[id_key])
    name = raw_id.rsplit("/", 1)[-1]
    stem = _stem(name)  # PurePath's stem and suffix, without building a path per record
    if name[len(stem) :].lower() in _IMAGE_SUFFIXES:
        raw_id = stem if ids == "stem" else raw_id[: len(raw_id) - len(name) + len(stem)]
    return match_key(raw_id)


_IMAGE_SUFFIXES = set(".png .jpg .jpeg .tif .tiff .bmp .gif .webp .dcm .npy .csv .nii .gz .edf .bdf".split())


def load_sidecars(
    root: Path, id_key: str, skip: set[str], allow_outside: bool = False
) -> tuple[dict[str, dict], list[Rejection]]:
    """One ``<id>.json`` record per sample at the top of ``root`` (the inbox style); each read by
    ``read_bounded`` (at most SIDECAR_MAX_BYTES)."""
    records, problems = {}, []
    for p in sorted(root.glob("*.json")):
        if p.name in skip or p.name.startswith("."):
            continue
        try:
            rec = load_json(read_bounded(p, SIDECAR_MAX_BYTES, root, allow_outside).decode("utf-8-sig"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            problems.append(Rejection(p.stem, (p.name,), f"annotation sidecar is not valid JSON: {err}"))
            continue
        except RecursionError:
            problems.append(Rejection(p.stem, (p.name,), "annotation sidecar is nested too deep to read"))
            continue
        except (ValueError, OSError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else err
            problems.append(Rejection(p.stem, (p.name,), f"annotation sidecar cannot be read: {reason}"))
            continue
        if not isinstance(rec, dict):
            problems.append(Rejection(p.stem, (p.name,), "annotation sidecar must hold one JSON object"))
            continue
        records[match_key(str(rec.get(id_key, p.stem)))] = {**rec, "_sidecar": p.name}
    return records, problems


def processed_roots(spec: DatasetSpec) -> list[Path]:
    """Inbox folders already appended (``<inbox>/processed/vNNNN``): part of the dataset's sources."""
    if spec.source.inbox is None:
        return []
    base = spec.source.inbox / INBOX_PROCESSED
    return sorted(p for p in base.glob("v[0-9]*") if p.is_dir()) if base.is_dir() else []


def at_least(spec: DatasetSpec, n: int) -> bool:
    """Whether the source folder holds at least ``n`` files of the spec's first field read from
    files: a look ahead of discovery that stops at ``n`` (a run decides from it whether to start
    its dask cluster while discovery runs). Not a count of samples: incomplete or rejected inputs
    are among them, and an input holding several samples is one."""
    root = Path(spec.source.root)
    patterns = next((kind.files for kind in field_kinds(spec).values() if kind.files), ())
    found = 0
    for pattern in patterns:
        for _ in root.glob(pattern):
            found += 1
            if found >= n:
                return True
    return found >= n


def discover(
    spec: DatasetSpec,
    root: Path | None = None,
    *,
    extra_roots: list[Path] | None = None,
    sidecars: bool = False,
    skip: tuple[str, ...] = (),
) -> Inventory:
    """Pair the files of every field by stem and join annotations; order is sorted by id.

    ``root`` defaults to the spec's source root plus the inbox folders already appended, so a full
    rebuild holds every sample the dataset ever took in. File paths are relative to ``root``.
    Files under the top-level folders of ``root`` named in ``skip`` are not looked at (an inbox's
    processed/ and quarantine/).
    """
    whole_source = root is None
    if root is None:
        root = Path(spec.source.root)
        extra_roots = processed_roots(spec) if extra_roots is None else extra_roots
    root = Path(root)
    inv = Inventory(root=root, stated_at_ns=time.time_ns())
    if not root.is_dir():
        inv.rejections.append(Rejection("", (str(root),), "source folder does not exist"))
        return inv
    found, kinds = _Found(), field_kinds(spec)
    for r in [root, *(extra_roots or [])]:
        _gather(spec, kinds, inv, found, r, "" if r == root else os.path.relpath(r, root) + "/", sidecars, skip)
    if spec.source.ids == "path":
        found.records, found.record_file, problems = by_bare_name(found.records, found.record_file, found.per_field)
        inv.rejections.extend(problems)
    _join(spec, kinds, inv, found)
    if whole_source:
        inv.unclaimed, inv.unclaimed_examples = unclaimed_files(spec, inv)
    return inv


@dataclass
class _Found:
    """What discovery found in the source folders, by match key, before samples are made of it."""

    per_field: dict[str, dict[str, str]] = field(default_factory=dict)  # field -> key -> file
    unlisted: set[str] = field(default_factory=set)  # fields some of whose folders could not be listed
    spelled: dict[str, str] = field(default_factory=dict)  # key -> the id as its first file spells it
    records: dict[str, dict] = field(default_factory=dict)
    record_file: dict[str, str] = field(default_factory=dict)


def _gather(
    spec: DatasetSpec,
    kinds: dict[str, FieldKind],
    inv: Inventory,
    found: _Found,
    r: Path,
    prefix: str,
    sidecars: bool,
    skip: tuple[str, ...],
) -> None:
    """Each field's files and the annotation records of one source folder ``r`` (``prefix``: its
    path below the inventory's root) into ``found``; what cannot be taken into the rejections."""
    ann = spec.annotations
    # the files a field reads for every sample (a COCO file) are no sample's, nor sidecars
    shared = {name: set(kind.shared_files()) for name, kind in sharing(kinds).items()}
    for name, kind in kinds.items():
        if not kind.files:
            continue
        states: dict[str, State] = {}
        args = (kind.reads_folders, spec.source.allow_symlinks_outside, () if prefix else skip, kind.id_suffix, states)
        taken, problems = _glob_field(r, kind.files, spec.source.ids, *args)
        inv.rejections.extend(problems)
        if any(p.reason == UNLISTABLE for p in problems):
            found.unlisted.add(name)
        inv.states.update((prefix + rel, st) for rel, st in states.items() if not kind.files_beside(r, rel))
        files = found.per_field.setdefault(name, {})
        for stem, (rel, sid) in taken.items():
            if rel in shared.get(name, ()):
                continue
            if stem in files:
                both = (files[stem], prefix + rel)
                inv.rejections.append(Rejection(sid, both, "ambiguous: the same sample id in two source folders"))
            files[stem] = prefix + rel
            found.spelled.setdefault(stem, sid)
    records: dict[str, dict] = {}
    if ann.file:
        records, problems = load_records(
            r / ann.file,
            ann.id_key,
            missing_ok=bool(prefix) or sidecars,
            ids=spec.source.ids,
            max_bytes=ann.max_bytes,
            root=r,
            allow_outside=spec.source.allow_symlinks_outside,
        )
        inv.rejections.extend(problems)
    if sidecars:
        claimed = {f for files in shared.values() for f in files}
        side, problems = load_sidecars(r, ann.id_key, {*claimed, ann.file or ""}, spec.source.allow_symlinks_outside)
        inv.rejections.extend(problems)
        records.update(side)
    for sid, rec in records.items():
        if sid in found.records:
            inv.rejections.append(
                Rejection(sid, (prefix + (ann.file or ""),), "several annotation records for this sample")
            )
        found.records[sid] = rec
        found.record_file[sid] = prefix + rec.get("_sidecar", ann.file or "")


def _join(spec: DatasetSpec, kinds: dict[str, FieldKind], inv: Inventory, found: _Found) -> None:
    """The samples of ``found``, sorted by id: each input whose every field has a file (but a field
    whose file may be missing: ``may_lack_file``) and whose record gives its columns and split; the
    rest, and the records without files, as rejections."""
    # a file that may be missing is not missing where a folder could not be listed: it may lie there
    globs = {
        name: kind.files
        for name, kind in kinds.items()
        if kind.files and (not may_lack_file(kind) or name in found.unlisted)
    }
    per_field, records, record_file = found.per_field, found.records, found.record_file
    already = {match_key(r.sample_id) for r in inv.rejections if r.sample_id}  # reported once is enough
    for key in sorted(set().union(*per_field.values()) - already):
        sid = found.spelled[key]
        files = {name: taken[key] for name, taken in per_field.items() if key in taken}
        if (bad := control_character(sid)) is not None:
            why = f"the sample id {sid!r} holds a control character (U+{ord(bad):04X}); rename its files"
            inv.rejections.append(Rejection(sid, tuple(files.values()), why))
            continue
        missing = [name for name in globs if name not in files]
        if missing:
            where = ", ".join(f"{m} ({', '.join(globs[m])})" for m in missing)
            inv.rejections.append(
                Rejection(sid, tuple(files.values()), f"{INCOMPLETE}: no file for {where}", waitable=True)
            )
            continue
        rejection, columns = _columns_for(spec, sid, records.get(key), files, record_file.get(key, ""))
        if rejection:
            inv.rejections.append(rejection)
            continue
        try:
            split = assign_split(sid, spec.splits, columns)
        except ValueError as err:
            inv.rejections.append(Rejection(sid, (files[next(iter(files))],), str(err)))
            continue
        extra = (record_file[key],) if key in record_file and "_sidecar" in records[key] else ()
        try:
            parts = samples_in(kinds, inv.root, files)
        except Reject as rej:
            inv.rejections.append(Rejection(sid, (rej.path,), rej.reason))
            continue
        inv.samples.extend(SampleRef(sid + part, split, files, columns, extra, part) for part in parts)
    if any(s.part for s in inv.samples):  # "case2" sorts after "case", "case2@t0000" before "case@t0000"
        inv.samples.sort(key=lambda s: match_key(s.id))
    inv.samples = with_shared_entries(kinds, inv.root, inv.samples)
    paired = set().union(*per_field.values())
    inv.rejections = [_with_other_files(r, per_field, records, record_file) for r in inv.rejections]
    inv.rejections.extend(_orphans(sorted(set(records) - paired - already), record_file))


def with_shared_entries(kinds: dict[str, FieldKind], root: Path, samples: list[SampleRef]) -> list[SampleRef]:
    """Each sample with its entries of the files its fields share (``SharedInputs.shared_entry``):
    a shared file is parsed here, once, and each worker is handed only its samples' parts."""
    readers = [kind for kind in sharing(kinds).values() if kind.shared_files()]
    if not readers:
        return samples
    out = []
    for ref in samples:
        entries = {kind.name: e for kind in readers if (e := kind.shared_entry(root, ref)) is not None}
        out.append(replace(ref, shared=entries) if entries else ref)
    return out


def _with_other_files(
    r: Rejection, per_field: dict[str, dict[str, str]], records: dict[str, dict], record_file: dict[str, str]
) -> Rejection:
    """``r`` with the files of its sample it does not name (another field's, its sidecar) as its
    ``others``: a refused sample is refused whole, none of its files is left behind in an inbox."""
    if not r.sample_id:
        return r
    key = match_key(r.sample_id)
    files = [found[key] for found in per_field.values() if key in found]
    if key in record_file and "_sidecar" in records.get(key, {}):
        files.append(record_file[key])
    others = tuple(f for f in dict.fromkeys(files) if f not in r.paths)
    return replace(r, others=others) if others else r


def samples_in(kinds: dict[str, FieldKind], root: Path, files: dict[str, str]) -> tuple[str, ...]:
    """The ends of the ids of the samples one input's files hold (``SampleParts.samples_in``):
    ``("",)`` when they are one sample. Fields that both split their files must agree on the parts."""
    found = {
        name: parts
        for name, rel in files.items()
        if isinstance(kind := kinds[name], SampleParts) and (parts := kind.samples_in(root, rel)) is not None
    }
    if not found:
        return ("",)
    first, *others = found.items()
    for name, parts in others:
        if parts != first[1]:
            raise Reject(
                files[name],
                f"{len(parts)} samples in {files[name]} ({name}) but {len(first[1])} in {files[first[0]]} ({first[0]})",
            )
    return first[1]


def bare_name_index(keys) -> dict[str, list[str]]:
    """Sample keys by their last path component (``cat/x`` under ``x``)."""
    index: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        if "/" in key:
            index[key.rsplit("/", 1)[1]].append(key)
    return index


def by_bare_name(
    records: dict[str, dict], record_file: dict[str, str], per_field: dict[str, dict[str, str]]
) -> tuple[dict[str, dict], dict[str, str], list[Rejection]]:
    """With ``ids: path``, a record keyed by a bare file name (``x.jpg`` for ``cat/x.jpg``) joins
    the one sample whose path ends in that name; a name found in several folders is refused with
    the clashing paths, since joining any one of them would be a guess."""
    keys = set().union(*per_field.values())
    stray = [k for k in records if "/" not in k and k not in keys]
    if not stray:
        return records, record_file, []
    index = bare_name_index(keys)
    records, record_file, problems = dict(records), dict(record_file), []
    for bare in stray:
        found = index.get(bare, [])
        if len(found) == 1 and found[0] not in records:
            records[found[0]] = records.pop(bare)
            record_file[found[0]] = record_file.pop(bare)
        elif len(found) > 1:
            paths = sorted(next(f[k] for f in per_field.values() if k in f) for k in found)
            where = record_file.pop(bare)
            del records[bare]
            why = f"the annotation record names a file found in {len(paths)} folders ({', '.join(paths)})"
            problems.append(Rejection(bare, (f"{where}#{bare}", *paths), f"{why}; name it by its path below the root"))
    return records, record_file, problems


UNCLAIMED_LISTED = 5


def unclaimed_files(spec: DatasetSpec, inv: Inventory) -> tuple[int, list[str]]:
    """How many visible files under the source root are neither a sample's file (or inside a case
    folder that is one), nor a rejected input's, nor the annotation file, nor a file a field reads
    for many samples (``SharedInputs.shared_files``), nor a ``<stem>.json``
    sidecar beside a sample's file; and the first few of them, sorted. The inbox, when it lies
    under the root, is append's business and is not counted."""
    root = inv.root
    claimed: set[str] = set()
    for s in inv.samples:
        claimed.update(s.files.values())
        claimed.update(s.extra_files)
    for r in inv.rejections:
        claimed.update(r.paths, r.others)
    if spec.annotations.file:
        claimed.add(Path(spec.annotations.file).as_posix())
    for kind in sharing(field_kinds(spec)).values():
        claimed.update(Path(f).as_posix() for f in kind.shared_files())
    sidecars = {_stem(p) + ".json" for p in claimed}
    skip = {os.path.realpath(p) for p in (spec.source.inbox, spec.output.dir) if p is not None}
    count = 0
    examples: list[str] = []
    for folder, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(folder, root)
        prefix = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d != "__MACOSX"
            and prefix + d not in claimed
            and os.path.realpath(os.path.join(folder, d)) not in skip
        )
        for name in sorted(files):
            rel = prefix + name
            if name.startswith(".") or rel in claimed or rel in sidecars:
                continue
            count += 1
            if len(examples) < UNCLAIMED_LISTED:
                examples.append(encodable(rel))  # shown only: in logs, a spec's comments, a terminal
    return count, sorted(examples)


ORPHANS_LISTED = 20


def _orphans(keys: list[str], record_file: dict[str, str]) -> list[Rejection]:
    """Annotation records without files: the first ``ORPHANS_LISTED`` one by one, the rest as one
    counted entry (a million of them must not make a million report rows)."""
    reason = "annotation record without files"
    listed = [Rejection(k, (f"{record_file[k]}#{k}",), reason, waitable=True) for k in keys[:ORPHANS_LISTED]]
    rest = keys[ORPHANS_LISTED:]
    if rest:
        files = tuple(dict.fromkeys(record_file[k] for k in rest))[:5]  # one file, or the first few sidecars
        listed.append(Rejection("", files, reason, waitable=True, count=len(rest)))
    return listed


def _columns_for(
    spec: DatasetSpec, sid: str, rec: dict | None, files: dict[str, str], where: str
) -> tuple[Rejection | None, dict]:
    ann = spec.annotations
    first = next(iter(files.values()))
    if rec is None:
        if ann.file and ann.required:
            return Rejection(sid, (first,), f"no annotation record in {ann.file}", waitable=True), {}
        if not ann.columns:
            return None, {}
    rec = {**folder_columns(first, ann.folders), **(rec or {})}
    text = bool(rec.get(TEXT_FORMAT))
    columns = {}
    split_col = spec.splits.column
    if split_col in ann.folders and rec.get(split_col) is None:
        # a file outside the split folders (class folders at the top beside train/<class>/): the
        # ratios give its split, and the column records the split it got
        rec[split_col] = ratio_split(sid, spec.splits)
    for col, kind in ann.columns.items():
        try:
            columns[col] = _coerce(rec.get(col), kind, text or col in ann.folders)
        except (ValueError, TypeError) as err:
            return Rejection(sid, (f"{where}#{sid}" if where else first,), f"annotation column {col!r}: {err}"), {}
    return None, columns


def folder_columns(rel: str, folders: dict[str, int]) -> dict[str, str]:
    """Column values taken from the folders of a sample's file (-1: its folder, -2: the one above)."""
    if not folders:
        return {}
    parents = Path(rel).parts[:-1]
    return {col: parents[k] for col, k in folders.items() if -len(parents) <= k < 0}

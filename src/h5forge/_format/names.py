"""Every name of the format in one place: files of an output folder, groups, datasets and
attributes of a version file. ``LAYOUT`` describes them for users; docs/format.md embeds
``render_layout()`` and a test keeps the two equal.
"""

from __future__ import annotations

import re

FORMAT = "h5forge"
# 3: rows are checksummed with BLAKE3; 2: checksums cover every value a reader returns (with
# sha256); 1: the field bytes only
FORMAT_VERSION = 3
CHECKSUMS_COVER_ALL = 2  # the first format whose checksums and digests cover everything
BLAKE3_CHECKSUMS = 3  # the first format whose row checksums are BLAKE3 (sha256 before)
SPLITS = ("train", "val", "test")
# how folders name the splits (images/train/, training/, valid/...): one list for init and the kinds' detectors
SPLIT_FOLDER_NAMES = ("train", "val", "test", "training", "validation", "valid", "testing")
# a split named with its year, as COCO's train2017/ and val2014/, or VOC's 2012_train
_DATED_SPLIT = re.compile(r"(?:(?:19|20)\d\d[_-]?)?([a-z]+)(?:[_-]?(?:19|20)\d\d)?")


def split_named(name: str) -> str | None:
    """The split a folder name or a split column's value says (``train``, ``Validation``,
    ``val2017``), or None."""
    found = _DATED_SPLIT.fullmatch(name.lower())
    if found is None or found.group(1) not in SPLIT_FOLDER_NAMES:
        return None
    return {"training": "train", "validation": "val", "valid": "val", "testing": "test"}.get(found[1], found[1])


# ---- files of an output folder ----------------------------------------------------------------
LATEST = "dataset_latest.h5"
LOCK = ".h5forge.lock"
JOURNAL = ".append-journal.json"
RESUMABLE = ".build-resumable.h5"  # what a killed build wrote, kept for the next build to take over
RESUME_SUFFIX = ".resume"  # beside a partial version file: how far it is durable (rows, statistics)
HASH_CACHE = ".h5forge-hashes.npz"  # raw-file states and hashes the last build saw (_ingest/incremental/hash_cache.py)
HASH_LOG = ".h5forge-hashes.log"  # the hashes a build learnt since the cache was last written whole
QUARANTINE_DIR = "quarantine"
REPORTS_DIR = "reports"

# ---- folders of an inbox that append manages (never read as new samples) ------------------------
INBOX_PROCESSED = "processed"  # processed/vNNNN/: what each version took, part of the dataset's sources
INBOX_QUARANTINE = "quarantine"  # rejected inbox inputs and their reasons
INBOX_MANAGED = (INBOX_PROCESSED, INBOX_QUARANTINE)
# a file or folder being copied into an inbox under such a name is not read until renamed
INBOX_TEMPORARY = (".tmp", ".partial")
VERSION_RE = re.compile(r"^dataset_v(\d{4,})\.h5$")
CHUNKS_DIR = ".chunks"  # in the output folder: the cleaning workers' chunk files of the running build
CHUNKS_DIR_BEFORE = ".segments"  # that folder as older h5forge names it (a killed run's: removed alike)
DELTA_RE = re.compile(r"^dataset_v(\d{4,})\.delta\.h5$")
# the rows folder of a mapped version (storage.assemble: mapped): the workers' row files it maps
# (``.segments``: as older h5forge names it; still read)
ROWS_FOLDER_RE = re.compile(r"^dataset_v(\d{4,})\.(rows|segments)$")
PARTIAL_RE = re.compile(r"^\.dataset_v\d{4,}(\.delta)?\.h5\.partial$")


def version_tag(number: int) -> str:
    """``dataset_v0007``: the stem every file of a version is named after."""
    return f"dataset_v{number:04d}"


def version_name(number: int) -> str:
    return f"{version_tag(number)}.h5"


def delta_name(number: int) -> str:
    return f"{version_tag(number)}.delta.h5"


def rows_folder_name(number: int) -> str:
    """The rows folder beside a mapped version: the row files its workers wrote, which it maps."""
    return f"{version_tag(number)}.rows"


def partial_name(final_name: str) -> str:
    """Where a file is written before it is complete (a leading dot: no tool lists it)."""
    return f".{final_name}.partial"


def parse_version(text: str | int) -> int | None:
    """3, '3', 'v3', 'v0003', 'dataset_v0003.h5' -> 3; None if it is not a version."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"(?:dataset_)?v?(\d+)(?:\.h5)?", str(text).strip())
    return int(m.group(1)) if m else None


# ---- inside a version file --------------------------------------------------------------------
IDS = "ids"
SOURCE_FILES = "source_files"
SOURCE_SHA256 = "source_sha256"
CHECKSUM = "checksum"
PER_SAMPLE = (IDS, SOURCE_FILES, SOURCE_SHA256, CHECKSUM)
SAMPLE_DIM = "sample"  # the dimension scale naming the sample axis (_format.dims)
SOURCE_FIELD_DIM = "source_field"  # axis 1 of source_files and source_sha256
META = "meta"
SPEC = "meta/spec"
INDEX = "index"
DIAGNOSTICS = "diagnostics"
REJECTIONS = "diagnostics/rejections"
REJECTION_COLUMNS = ("sample_id", "path", "reason", "stage")
RESERVED = (*PER_SAMPLE, META, SAMPLE_DIM, SOURCE_FIELD_DIM)  # field names a spec may not use


def column_path(column: str) -> str:
    """Where an annotation column lives inside a split group."""
    return f"{META}/{column}"


class Attr:
    """Attribute names."""

    FORMAT = "format"
    FORMAT_VERSION = "format_version"
    NAME = "name"
    DESCRIPTION = "description"
    VERSION = "version"
    PARENT = "parent_version"
    CREATED = "created_at"
    CREATOR = "creator"
    CODEC = "codec"
    CODEC_NEEDS = "codec_needs"
    FIELDS = "fields"
    ROW_FILES = "row_files"
    ROW_FILES_BEFORE = "segments"  # that list as older h5forge names it: still read
    SELF_CONTAINED = "self_contained"
    EXPORTED_FROM = "exported_from"
    COUNT = "count"
    KIND = "kind"
    SUMMARY = "summary"
    COLUMNS = "columns"
    DIGEST = "digest"
    DIGEST_RULE = "digest_rule"
    FILE_DIGEST = "file_digest"
    FILE_DIGEST_RULE = "file_digest_rule"


# what a split's digest covers of the stored spec: 1 (files without the attribute) the whole spec;
# 2 what defines the data, not where or how it was built (``checksums.data_definition``)
DIGEST_RULE = 2

# what the file digest covers: 1 (files without the attribute) the root attributes, /diagnostics
# and /inputs; 2 also the whole of /meta/spec as stored (the split digests leave out where and how
# a version was built)
FILE_DIGEST_RULE = 2


# rows written, verified and copied per block: whole chunks, and at least this many rows
BLOCK_ROWS = 64


def block_rows(chunk_rows: int) -> int:
    """The smallest whole number of chunks holding at least BLOCK_ROWS rows."""
    return chunk_rows * max(1, -(-BLOCK_ROWS // chunk_rows))


LAYOUT: tuple[tuple[str, str], ...] = (
    (
        "/",
        f'attrs: {Attr.FORMAT}="{FORMAT}", {Attr.FORMAT_VERSION}={FORMAT_VERSION}, {Attr.NAME}, '
        f"{Attr.DESCRIPTION}, {Attr.VERSION}, {Attr.PARENT} (-1 for none), {Attr.CREATED} (UTC ISO-8601), "
        f"{Attr.CREATOR}, h5forge_version, h5py_version, hdf5_version, python_version, {Attr.CODEC}, "
        f"{Attr.CODEC_NEEDS} (what a reader must have), {Attr.FIELDS}; thin and mapped versions "
        f"(rows folder dataset_vNNNN.rows/) also {Attr.ROW_FILES} (JSON; {Attr.ROW_FILES_BEFORE} and "
        f"dataset_vNNNN.segments/ in older files) and {Attr.SELF_CONTAINED}=False; exports {Attr.EXPORTED_FROM}; "
        f"{Attr.FILE_DIGEST}: hex sha256 of the other root attributes, of /{DIAGNOSTICS} and /inputs "
        f"and of /{SPEC} as stored; {Attr.FILE_DIGEST_RULE}={FILE_DIGEST_RULE} (absent: /{SPEC} is not covered)",
    ),
    (
        "/<split>/",
        f"{', '.join(SPLITS)}; attrs: {Attr.COUNT}, {Attr.FIELDS}, each field kind's statistics "
        f"(below), and {Attr.DIGEST}: hex sha256 of the split's other attributes, its datasets' "
        f"attributes, its row indexes under /{INDEX}/<split> and what defines the data in /{SPEC} "
        f"(not output, compute, verify, append, source.root or source.inbox); {Attr.DIGEST_RULE}=2 "
        f"(absent: the whole of /{SPEC} is covered)",
    ),
    (
        "/<split>/<field>",
        f"one dataset per field, sample axis first and resizable; attr {Attr.KIND}. "
        "Its shape, dtype and statistics are the field kind's (below)",
    ),
    (f"/<split>/{IDS}", "(N,) UTF-8 strings: sample ids exactly as given (data, never path names)"),
    (
        f"/<split>/{SOURCE_FILES}",
        "(N, F) raw file paths relative to the spec's source root "
        f"(F = the fields read from files, listed in its attr {Attr.FIELDS})",
    ),
    (f"/<split>/{SOURCE_SHA256}", "(N, F) hex sha256 of each raw file"),
    (
        f"/<split>/{SAMPLE_DIM}",
        "(N,) HDF5 dimension scale (no values stored) on axis 0 of every per-sample dataset, "
        "so netCDF readers (xarray via h5netcdf) call that axis "
        f"`{SAMPLE_DIM}`; the other axes have scales too: `{SOURCE_FIELD_DIM}`, "
        "`<field>_axis<k>`, `<field>_element` (a ragged field's values)",
    ),
    (
        f"/<split>/{CHECKSUM}",
        "(N,) hex BLAKE3 (format 2: sha256) covering every value a reader can return for the row: "
        "the hash of its fields and annotation columns in spec order, then its "
        f"{IDS}, {SOURCE_FILES}, {SOURCE_SHA256} (encoding in the section below; format 1 "
        "files: sha256 of the stored bytes of the image-like fields only)",
    ),
    (
        f"/{INDEX}/<split>/<col>/",
        "values (K,), offsets (K+1,), rows (N,): rows[offsets[k]:offsets[k+1]] "
        "are the rows whose <col> equals values[k]",
    ),
    (f"/{SPEC}", "the spec that built the file, as JSON"),
    (
        "/inputs",
        "attrs: key (the build's input key: sha256 of the field rules, every sample key and every "
        "discovery-time rejection; empty for an append), rules (sha256 of the spec's field rules)",
    ),
    (
        "/inputs/<split>/sample",
        "(N,) 32-byte sample keys in row order: sha256 of the sample's id, split, raw files, "
        "their sha256 and annotation values (what a rebuild matches to copy a row)",
    ),
    (
        "/inputs/content, content_at, ids",
        "(M,) sorted sha256 of each sample's raw-file hashes, its split and row "
        "(split index << 40 | row), and the sorted 16-byte sha256 of each id in NFC: "
        "what an append checks exactly-once against",
    ),
    (f"/{DIAGNOSTICS}", f"attrs: {Attr.SUMMARY} (JSON: counts, timings, sizes, compression ratio, codec)"),
    (f"/{REJECTIONS}", f"(R, {len(REJECTION_COLUMNS)}) strings: {', '.join(REJECTION_COLUMNS)}"),
)


def render_layout() -> str:
    """The layout as a Markdown table (with each field kind's rows appended by the caller)."""
    rows = ["| path | content |", "|---|---|"]
    rows += [f"| `{path}` | {text} |" for path, text in LAYOUT]
    return "\n".join(rows)

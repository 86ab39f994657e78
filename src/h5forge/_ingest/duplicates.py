"""Duplicates: samples whose raw content is identical, under other names.

One rule for a full build and an append (``duplicates`` in the spec): ``keep_first`` (the
default) keeps the first in the dataset's order (samples sorted by id; for an append, what latest
holds comes first) and rejects the others with a reason naming the one kept; ``keep_all`` keeps
every one. Content is what the exactly-once check compares: the raw digests of a sample's files.

A build finds them before cleaning without reading every file twice: only samples whose files
have the sizes of another sample's are read, first their ends, then, while still alike, whole.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections import Counter, defaultdict
from pathlib import Path

from h5forge._format.catalog import content_digest
from h5forge._ingest.discover import Inventory
from h5forge._ingest.incremental.hash_cache import State
from h5forge._ingest.incremental.inputs import raw_digest
from h5forge.kinds import FieldKind, field_kinds
from h5forge.kinds.parts import sample_digest
from h5forge._samples import Rejection, SampleRef
from h5forge.spec import DatasetSpec

DUPLICATE = "duplicate: "  # how every duplicate's reason starts
ENDS = 1 << 16  # bytes read at each end of a file to tell files of one size apart


def duplicate_reason(kept: str, where: str, note: str = "") -> str:
    """The reason a duplicate is rejected, the same in a build and an append."""
    return f"{DUPLICATE}identical content is {where} as {kept!r}{note} (the spec's duplicates: keep_all keeps both)"


def drop_duplicates(spec: DatasetSpec, inventory: Inventory) -> int:
    """Move every sample whose raw content is that of an earlier one from ``inventory.samples``
    to its rejections (``duplicates: keep_first``). Returns how many were moved.

    Only samples whose files share their sizes with another's are compared: by the digests the
    inventory knows (the hash cache's), else first by their ends; the digests read here join the
    inventory's, so the input hashes do not read the files again."""
    if spec.duplicates == "keep_all" or len(inventory.samples) < 2:
        return 0
    kinds = {n: k for n, k in field_kinds(spec).items() if k.files}
    if not kinds:
        return 0
    root = inventory.root
    top = str(root)  # a path joined per file as a string: pathlib would cost more than the stat
    stated = inventory.states  # a file's size as discovery found it, else a stat
    known = inventory.digests if inventory.digests is not None else {}  # the digests read here join it
    sizes: dict[int, tuple] = {}
    for i, ref in enumerate(inventory.samples):
        try:
            # a field whose file the sample lacks (``h5forge.kinds.optional``) is no file of any size
            sizes[i] = tuple(
                _size(os.path.join(top, ref.files[n]), k, stated.get(ref.files[n])) if n in ref.files else ()
                for n, k in kinds.items()
            )
        except OSError:
            continue  # unreadable: cleaning rejects it with its own reason
    shared = Counter(sizes.values())
    same_size = {i: size for i, size in sizes.items() if shared[size] > 1}
    # a sample whose digests are all known is compared by them; so is every sample of a size one of
    # those shares (nothing else tells it from them); the rest are first told apart by their ends
    refs = inventory.samples
    settled = {size for i, size in same_size.items() if all(rel in known for rel in refs[i].files.values())}
    unsettled = [refs[i] for i, size in same_size.items() if size not in settled]
    by_ends = _alike(unsettled, kinds, lambda rel, kind: _ends(Path(top, rel), kind))
    compared = {id(ref) for ref in by_ends} | {id(refs[i]) for i, size in same_size.items() if size in settled}
    alike = [ref for ref in refs if id(ref) in compared]  # in the inventory's order
    digests: dict[tuple[str, str], str] = {}

    def digest(ref: SampleRef) -> bytes | None:
        hexes = []
        for name, kind in kinds.items():
            rel = ref.file_of(name)
            if not rel:  # no file, as cleaning hashes it: an empty digest
                hexes.append("")
                continue
            if (rel, name) not in digests:
                digests[rel, name] = known.get(rel) or raw_digest(root, rel, kind)
                if digests[rel, name] and rel in stated:
                    known[rel] = digests[rel, name]
            if not digests[rel, name]:
                return None  # unreadable: cleaning rejects it with its own reason
            hexes.append(sample_digest(kind, digests[rel, name], ref))
        return content_digest(hexes)

    first: dict[bytes, SampleRef] = {}
    dropped: set[str] = set()
    for ref in alike:  # in the inventory's order: the first of each content is kept
        d = digest(ref)
        if d is None:
            continue
        if d in first:
            kept = first[d]
            why = duplicate_reason(kept.id, "earlier in this build", _other_annotations(kept, ref))
            inventory.rejections.append(Rejection(ref.id, tuple(ref.files.values()), why))
            dropped.add(ref.id)
            inventory.duplicate_of[ref.id] = kept.id
        else:
            first[d] = ref
    if dropped:
        inventory.samples = [s for s in inventory.samples if s.id not in dropped]
    return len(dropped)


def _other_annotations(kept: SampleRef, copy: SampleRef) -> str:
    """What a reason adds when a copy's annotation values are not the kept sample's (the same picture
    in two class folders): the first that differs, since keeping one drops the other's label."""
    differ = next(
        (k for k in sorted({*kept.columns, *copy.columns}) if kept.columns.get(k) != copy.columns.get(k)), None
    )
    if differ is None:
        return ""
    return f", annotated otherwise: {differ} {kept.columns.get(differ)!r} there, {copy.columns.get(differ)!r} here"


def _alike(refs: list[SampleRef], kinds: dict[str, FieldKind], key) -> list[SampleRef]:
    """The samples that share ``key`` (of every file) with another, in their order."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, ref in enumerate(refs):
        try:
            groups[tuple(key(ref.files[n], k) if n in ref.files else "" for n, k in kinds.items())].append(i)
        except OSError:
            continue  # unreadable: cleaning rejects it with its own reason
    keep = sorted(i for members in groups.values() if len(members) > 1 for i in members)
    return [refs[i] for i in keep]


def _size(path: str, kind: FieldKind, state: State | None = None) -> tuple:
    """A file's size (from its ``state`` when known); a case folder's file sizes, sorted."""
    if state is not None:
        sizes: tuple = (state[0],)
    elif kind.reads_folders and os.path.isdir(path):
        sizes = tuple(sorted(os.stat(os.path.join(top, f)).st_size for top, _, files in os.walk(path) for f in files))
    else:
        sizes = (os.stat(path).st_size,)
    if not any(sizes):
        raise OSError(f"{path} is empty")  # nothing to keep a first of: cleaning rejects each with its reason
    return sizes


def _ends(path: Path, kind: FieldKind) -> str:
    """A hash of a file's first and last ``ENDS`` bytes (a folder: nothing, it is hashed whole)."""
    if kind.reads_folders and path.is_dir():
        return ""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a file swapped for a FIFO never blocks the build
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    with os.fdopen(fd, "rb") as fh:
        h.update(fh.read(ENDS))
        size = os.fstat(fh.fileno()).st_size
        if size > 2 * ENDS:
            fh.seek(size - ENDS)
            h.update(fh.read(ENDS))
    return h.hexdigest()

"""What a build is made from, as hashes: the field rules, each sample's inputs, the whole input set.

A rebuild compares these with the latest version's (``h5forge._format.catalog``):
- the same input key: nothing changed, nothing is published;
- the same rules: each sample whose key is unchanged is copied from the stored version, the rest
  are cleaned.

When there is something to compare with (``h5forge._ingest.incremental.rebuild.inputs_of``), raw files are
hashed here, in the calling process, before any cleaning: it is the only way to know what changed
without decoding everything. When there is nothing (no version, or one made under other rules),
the cleaning workers' hashes of the files they decode serve instead (``Inputs.deferred``): a full
build reads and hashes each raw file once.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, cast

import numpy as np

from h5forge._format.checksums import drop_how_built
from h5forge._format.names import FORMAT_VERSION
from h5forge._ingest.discover import Inventory
from h5forge._ingest.incremental.hash_cache import HashCache, State, state_of
from h5forge.kinds import FieldKind, field_kinds
from h5forge.kinds.parts import SampleParts, sample_digest
from h5forge.kinds.shared import SharedInputs, sharing
from h5forge._samples import SampleRef
from h5forge.spec import DatasetSpec


# What h5forge's kinds accept and the values they decode to, beyond the spec: raised whenever a
# release makes a kind store other values for an input or refuse one it took, so that the next
# build of every dataset cleans all its samples again (nothing "unchanged", no row reused).
CLEANING_RULES = 3


def rules_hash(spec: DatasetSpec, format_version: int = FORMAT_VERSION) -> str:
    """A hash of everything in the spec that decides the stored values of a sample, of the format
    they are stored in (rows of another format are not taken: their checksums differ) and of the
    kinds' own rules (``CLEANING_RULES``)."""
    data = drop_how_built(spec.model_dump(mode="json"))
    data.pop("duplicates", None)  # which samples a build takes, not what a sample's values are
    data["format_version"] = format_version
    data["cleaning_rules"] = CLEANING_RULES
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _plain(value: Any) -> Any:
    """An annotation value as discovery made it, whether it comes from a record or a stored array."""
    if isinstance(value, np.generic):
        value = value.item()
    return value.decode() if isinstance(value, bytes) else value


def sample_key(sample_id: str, split: str, files: list[str], hexes: list[str], columns: dict[str, Any]) -> bytes:
    """32 bytes naming one sample's inputs: id, split, raw files and their hashes, annotation values."""
    text = _ENCODE([sample_id, split, list(files), list(hexes), {k: _plain(v) for k, v in columns.items()}])
    return hashlib.sha256(text.encode()).digest()


_ENCODE = json.JSONEncoder(sort_keys=True).encode  # json.dumps(..., sort_keys=True), one encoder for all


def raw_digest(root: Path, rel: str, kind: FieldKind) -> str:
    """sha256 of a raw input as its field's kind hashes what it decodes. An unreadable input gets
    an empty digest: cleaning will reject it with the reason."""
    try:
        return kind.source_digest(root, rel)
    except Exception:  # the same input fails in cleaning, where it becomes a rejection
        return ""


@dataclass
class Inputs:
    """The hashes of one build's inputs."""

    rules: str
    key: str  # of the rules, every sample's key and every discovery-time rejection
    samples: dict[str, bytes] = field(default_factory=dict)  # sample id -> sample key
    hash_seconds: float = 0.0
    # the sample keys are learnt from the cleaning workers' hashes (``learn``), the key made at the
    # end (``seal``); a deferred build has nothing to reuse, so nothing needs them before
    deferred: bool = False
    # each raw file's state when the build started and its sha256, for the next build's hash cache
    states: dict[str, State] = field(default_factory=dict)
    hexes: dict[str, str] = field(default_factory=dict)
    stated_at_ns: int = 0
    hashed_files: int = 0  # files read and hashed up front (the others' hashes came from the cache)
    learnt: list[str] = field(default_factory=list)  # the files of ``hexes`` the hash cache lacked, in order

    def learn(
        self, spec: DatasetSpec, root: Path, refs: list[SampleRef], ids: list[str], hashes: list[list[str]]
    ) -> None:
        """The sample keys of a cleaned batch: ``refs`` its inputs, ``ids``/``hashes`` the samples
        it kept and their raw-file hashes made by the worker. The inputs it rejected are hashed
        here, as ``fingerprint`` would have."""
        names, kinds = _file_fields(spec)
        shared = sharing(field_kinds(spec)).values()
        made = dict(zip(ids, hashes))
        for ref in refs:
            hexes = made.get(ref.id)
            if hexes is None:
                hexes = [_field_digest(kinds[n], ref, lambda rel, kind: raw_digest(root, rel, kind)) for n in names]
            self.samples[ref.id] = _key(ref, names, hexes, _shared_inputs(shared, root, ref))
            # the hash cache keeps files' digests: a sample's own digest of a part of its file is none
            for n, h in zip(names, hexes):
                if n in ref.files and _whole_files(kinds[n]) and self.hexes.get(rel := ref.files[n]) != h:
                    self.hexes[rel] = h
                    self.learnt.append(rel)

    def seal(self, spec: DatasetSpec, inventory: Inventory) -> None:
        """The input key of a deferred build, once every sample's key is known."""
        missing = [ref for ref in inventory.samples if ref.id not in self.samples]
        if missing:  # inputs no batch reported (none in a build that ran to its end)
            self.learn(spec, inventory.root, missing, [], [])
        self.key = total_key(self.rules, self.samples, inventory)
        self.deferred = False


def _file_fields(spec: DatasetSpec) -> tuple[list[str], dict[str, FieldKind]]:
    """The fields read from raw files, in spec order, and their kinds."""
    kinds = field_kinds(spec)
    names = [n for n, k in kinds.items() if k.files]
    return names, {n: kinds[n] for n in names}


def _field_digest(kind: FieldKind, ref: SampleRef, file_digest: Callable[[str, FieldKind], str]) -> str:
    """The raw digest of ``kind``'s field of ``ref`` from its file's (``file_digest`` of its path);
    empty when the sample has no file for it (``h5forge.kinds.optional``), as cleaning leaves it."""
    rel = ref.files.get(kind.name)
    return "" if rel is None else sample_digest(kind, file_digest(rel, kind), ref)


def _whole_files(kind: FieldKind) -> bool:
    """Whether the kind's samples' raw digests are their files' (not ``SampleParts``)."""
    return not isinstance(kind, SampleParts)


def _shared_inputs(kinds: Iterable[SharedInputs], root: Path, ref: SampleRef) -> list[str]:
    """The digests of what decides the sample's fields besides its files (``SharedInputs.input_digest``)."""
    return [d for k in kinds if (d := k.input_digest(root, ref)) is not None]


def _key(ref: SampleRef, names: list[str], hexes: list[str], shared: Sequence[str] = ()) -> bytes:
    # a sample with shared inputs has them after its files' digests; one without keeps its key
    return sample_key(ref.id, ref.split, [ref.file_of(n) for n in names], [*hexes, *shared], ref.columns)


def total_key(rules: str, samples: dict[str, bytes], inventory: Inventory) -> str:
    """The input key: the rules, every sample's key and every discovery-time rejection."""
    total = hashlib.sha256(rules.encode())
    for sid in sorted(samples):
        total.update(sid.encode() + b"\0" + samples[sid])
    for r in sorted(inventory.rejections, key=lambda r: (r.sample_id, r.paths, r.reason)):
        total.update(json.dumps([r.sample_id, list(r.paths), r.reason]).encode())
    return total.hexdigest()


def fingerprint(
    spec: DatasetSpec,
    inventory: Inventory,
    threads: int | None = None,
    hash_files: bool = True,
    cache: HashCache | None = None,
) -> Inputs:
    """Hash every raw file of the inventory (threads: hashlib releases the GIL) into sample keys,
    taking a file's hash from the inventory's ``digests``, or from ``cache`` when its state is the
    one recorded there.
    ``hash_files=False``: leave the hashing to the cleaning workers (``Inputs.deferred``); the
    files' states are taken all the same, for the hash cache the build leaves."""
    import time

    # states discovery took are as old as its walk: the cache trusts files settled before it began
    t0, stated_at = time.perf_counter(), inventory.stated_at_ns or time.time_ns()
    names, kinds = _file_fields(spec)
    root = inventory.root
    cache = cache or HashCache()
    # a file that holds several samples (the time points of a 4-D volume) is hashed once
    jobs = list(dict.fromkeys((ref.files[n], kinds[n]) for ref in inventory.samples for n in names if n in ref.files))

    # each file's state before its bytes are read (see hash_cache): discovery's, or a stat here (a
    # few microseconds, less than handing it to a pool); only the files to read go to the threads
    stated = inventory.states
    states = {
        rel: st
        for rel, kind in jobs
        if not kind.reads_folders
        and not kind.files_beside(root, rel)  # a file beside it changes the digest, not the state
        and (st := stated.get(rel) or state_of(os.path.join(root, rel)))
    }
    rules = rules_hash(spec)
    if not hash_files:
        return Inputs(rules, "", deferred=True, states=states, stated_at_ns=stated_at)
    known = inventory.digests if inventory.digests is not None else cache.known(states)
    digests = [known.get(rel) for rel, _ in jobs]
    to_read = [i for i, hexed in enumerate(digests) if hexed is None]
    with ThreadPoolExecutor(threads or min(4, os.cpu_count() or 1)) as pool:
        for i, hexed in zip(to_read, pool.map(lambda i: raw_digest(root, *jobs[i]), to_read, chunksize=16)):
            digests[i] = hexed
    hexes = cast(list[str], digests)  # every file the cache did not know was read just above
    of_job = dict(zip(jobs, hexes))
    shared = sharing(field_kinds(spec)).values()

    def digests_of(ref: SampleRef) -> list[str]:
        return [_field_digest(kinds[n], ref, lambda rel, kind: of_job[rel, kind]) for n in names]

    samples = {
        ref.id: _key(ref, names, digests_of(ref), _shared_inputs(shared, root, ref)) for ref in inventory.samples
    }
    return Inputs(
        rules,
        total_key(rules, samples, inventory),
        samples,
        round(time.perf_counter() - t0, 3),
        states=states,
        hexes={rel: h for (rel, _), h in zip(jobs, hexes)},
        stated_at_ns=stated_at,
        hashed_files=len(to_read),
        learnt=[jobs[i][0] for i in to_read],
    )

"""What a build is made from, as hashes: the field rules, each sample's inputs, the whole input set.

A rebuild compares these with the latest version's (``h5forge.format.catalog``):
- the same input key: nothing changed, nothing is published;
- the same rules: each sample whose key is unchanged is copied from the stored version, the rest
  are cleaned.

Raw files are hashed here, in the calling process, before any cleaning: reading and hashing a
file costs a small part of decoding it (benchmarks/nightly.py measures it), and it is the only way
to know what changed without decoding everything.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from h5forge.format.names import FORMAT_VERSION
from h5forge.ingest.discover import Inventory
from h5forge.kinds import field_kinds
from h5forge.samples import SampleRef
from h5forge.spec import DatasetSpec

# parts of a spec that do not change what a version holds: where it goes, how it is computed, checked
# and appended to, and where the raw folder sits (files are named relative to it)
NOT_RULES = ("output", "compute", "verify", "append")


def rules_hash(spec: DatasetSpec) -> str:
    """A hash of everything in the spec that decides the stored values of a sample."""
    data = spec.model_dump(mode="json", exclude=set(NOT_RULES))
    data["source"] = {k: v for k, v in data["source"].items() if k not in ("root", "inbox")}
    data["format_version"] = FORMAT_VERSION
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _plain(value: Any) -> Any:
    """An annotation value as discovery made it, whether it comes from a record or a stored array."""
    if isinstance(value, np.generic):
        value = value.item()
    return value.decode() if isinstance(value, bytes) else value


def sample_key(sample_id: str, split: str, files: list[str], hexes: list[str], columns: dict[str, Any]) -> bytes:
    """32 bytes naming one sample's inputs: id, split, raw files and their hashes, annotation values."""
    text = json.dumps([sample_id, split, list(files), list(hexes), {k: _plain(v) for k, v in columns.items()}],
                      sort_keys=True)
    return hashlib.sha256(text.encode()).digest()


def raw_digest(root: Path, rel: str, folder: bool) -> str:
    """sha256 of a raw file (as the field kinds hash what they decode); a case folder's digest
    covers its files' names and bytes. An unreadable input gets an empty digest: cleaning will
    reject it with the reason."""
    path = root / rel
    try:
        if folder:  # as the case kinds hash what they decode, a folder or a single file
            from h5forge.kinds.volume import read_case

            return read_case(root, rel)[1]
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()
    except Exception:  # the same input fails in cleaning, where it becomes a rejection
        return ""


@dataclass
class Inputs:
    """The hashes of one build's inputs."""

    rules: str
    key: str  # of the rules, every sample's key and every discovery-time rejection
    samples: dict[str, bytes] = field(default_factory=dict)  # sample id -> sample key
    hash_seconds: float = 0.0

    def key_of(self, ref: SampleRef) -> bytes:
        return self.samples[ref.id]


def fingerprint(spec: DatasetSpec, inventory: Inventory, threads: int | None = None) -> Inputs:
    """Hash every raw file of the inventory (threads: hashlib releases the GIL) into sample keys."""
    import time

    t0 = time.perf_counter()
    kinds = field_kinds(spec)
    names = [n for n, k in kinds.items() if k.files]
    folders = {n: kinds[n].reads_folders for n in names}
    root = inventory.root
    jobs = [(ref.files[n], folders[n]) for ref in inventory.samples for n in names]
    with ThreadPoolExecutor(threads or min(4, os.cpu_count() or 1)) as pool:
        digests = list(pool.map(lambda job: raw_digest(root, *job), jobs, chunksize=64))
    samples: dict[str, bytes] = {}
    for i, ref in enumerate(inventory.samples):
        hexes = digests[i * len(names):(i + 1) * len(names)]
        samples[ref.id] = sample_key(ref.id, ref.split, [ref.files[n] for n in names], hexes, ref.columns)
    total = hashlib.sha256(rules_hash(spec).encode())
    for sid in sorted(samples):
        total.update(sid.encode() + b"\0" + samples[sid])
    for r in sorted(inventory.rejections, key=lambda r: (r.sample_id, r.paths, r.reason)):
        total.update(json.dumps([r.sample_id, list(r.paths), r.reason]).encode())
    return Inputs(rules_hash(spec), total.hexdigest(), samples, round(time.perf_counter() - t0, 3))

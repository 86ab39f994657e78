"""Small real version files for the tests (built with the real writer, no Prefect), and reading them back."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import h5py
import numpy as np

from tests.helpers.data import REPO, demo_spec


def spec_for(raw: Path, out: Path, size=(64, 64), **storage):
    from h5forge.spec import load_spec, override

    spec = load_spec(REPO / "config" / "demo.yaml")
    spec = spec.model_copy(update={"source": spec.source.model_copy(update={"root": Path(raw).resolve()})})
    fields = dict(spec.fields)
    fields["images"] = fields["images"].model_copy(update={"size": tuple(size)})
    spec = spec.model_copy(update={"fields": fields})
    if storage:
        spec = spec.model_copy(update={"storage": spec.storage.model_copy(update=storage)})
    return override(spec, output=out)


def make_raw(root: Path, n: int = 200, seed: int = 0, prefix: str = "cell_") -> Path:
    from h5forge._demo import generate

    generate(root, n=n, seed=seed, bad=False, size_range=(64, 96), workers=1, prefix=prefix)
    return root


@lru_cache(maxsize=8)
def _cleaned(raw: str, size: tuple[int, int]):
    from h5forge._ingest.clean import clean_batch
    from h5forge._ingest.discover import discover

    spec = spec_for(Path(raw), Path(raw).parent / "unused", size)
    inv = discover(spec)
    return [clean_batch(spec, inv.root, inv.samples[i:i + 64]) for i in range(0, len(inv.samples), 64)]


def build_file(path: Path, raw: Path, *, version: int = 1, size=(64, 64), chunk_rows: int = 1,
               codec: str = "zstd") -> Path:
    """Write one version file at ``path`` from the raw folder (cleaning is cached per raw folder)."""
    from h5forge._ingest.writer import DatasetWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    spec = spec_for(raw, path.parent, size, chunk_rows=chunk_rows, codec=codec)
    w = DatasetWriter(path, spec, version=version)
    for batch in _cleaned(str(raw), tuple(size)):
        w.add(batch)
    w.finish()
    return path


def make_version(out: Path, inv, raw) -> int:
    """Stage, write and publish one version of ``inv`` in ``out`` with the demo spec; its number."""
    from h5forge._ingest.clean import clean_batch
    from h5forge._ingest.writer import DatasetWriter
    from h5forge._store.versions import publish, stage

    spec = demo_spec(raw, out)
    candidate = stage(out)
    w = DatasetWriter(candidate.partial, spec, candidate.number, candidate.parent)
    w.add(clean_batch(spec, inv.root, inv.samples))
    w.finish()
    publish(candidate)
    return candidate.number


def truth(path: Path, split: str = "train") -> dict[str, np.ndarray]:
    """Everything the file holds for ``split``, read plainly (the ground truth)."""
    from h5forge._format.codecs import ensure_filters

    ensure_filters()
    with h5py.File(os.path.realpath(path), "r") as f:
        g = f[split]
        return {"images": g["images"][()], "masks": g["masks"][()],
                "ids": np.array([v.decode() for v in g["ids"][()]])}


def all_ids(path):
    """The sample ids of each split of the version file (or link) at ``path``."""
    from h5forge._format.layout import decode_str

    with h5py.File(os.path.realpath(path), "r") as f:
        return {s: decode_str(f[s]["ids"][()]) for s in ("train", "val", "test")}


def n_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def strays(out: Path) -> list[str]:
    """Hidden files a run left in an output folder besides the lock, the raw-file hash cache and its log
    (a killed or failed run must leave none: no partial file, no journal, no resumable rows)."""
    from h5forge._format.names import HASH_CACHE, HASH_LOG, LOCK

    return sorted(p.name for p in Path(out).iterdir() if p.name.startswith(".") and p.name not in (LOCK, HASH_CACHE, HASH_LOG))

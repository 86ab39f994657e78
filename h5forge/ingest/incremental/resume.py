"""Resumable builds: a build makes its rows durable at checkpoints; the next build takes them over.

While it writes, a build flushes its partial file every few seconds and then records, beside it
(``.dataset_vNNNN.h5.partial.resume``), how many rows of each split are durable, their statistics
and index values, and the build's input key. The writer never reuses freed file space, so a
SIGKILL after a checkpoint leaves those rows where the flushed metadata points.

The next run, under the output lock, moves such a partial aside (``.build-resumable.h5``, see
``store.versions``). The next build written under the same field rules takes it over in place
(``take_over``) when its durable rows are, in each split, the first rows that build would write:
the file becomes the new build's, cut back to those rows, and the build appends the rest after
them. Otherwise it copies every durable row whose sample key it still wants
(``h5forge.ingest.incremental.reuse``) instead of cleaning it again, and removes the leftover when
its own rows are written. Anything else is discarded.

What a taken-over row needs checking: its bytes were flushed to the operating system before the
checkpoint recorded it, so a SIGKILL cannot have lost or torn them (the kernel writes them out);
the file's chunk index must still list every kept row inside the file (checked here, before the
file is changed). A machine that restarted since the checkpoint may have lost pages the kernel had
not yet written: the checkpoint records the boot, and rows taken over across a restart are verified
in full (``rebuild.copies_verified_rows``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from dataclasses import dataclass

import h5py
import numpy as np

from h5forge.format import arrays
from h5forge.format.catalog import KEY, sample_keys, sample_keys_path
from h5forge.format.names import IDS, PER_SAMPLE, RESUMABLE, RESUME_SUFFIX, SPLITS
from h5forge.ingest.incremental import hash_cache
from h5forge.ingest.incremental.inputs import Inputs
from h5forge.ingest.incremental.reuse import Source, count_rows
from h5forge.ingest.writer import DatasetWriter, Durable
from h5forge.kinds import FieldKind
from h5forge.samples import Rejection, SampleRef
from h5forge.crash_points import checkpoint as fault_point
from h5forge.store.whole_files import replace_file

CHECKPOINT_SECONDS = 3.0  # how much cleaning a SIGKILL can cost at most (plus the batches in flight)


def sidecar(partial: Path) -> Path:
    return partial.with_name(partial.name + RESUME_SUFFIX)


CHECKPOINT_SHARE = 0.05  # and after each 5 % of the inputs: a short build loses little more than a long one


class Checkpoints:
    """Call ``tick(samples done)`` after each batch: every CHECKPOINT_SECONDS, and after each
    CHECKPOINT_SHARE of the inputs, the writer's durable state is recorded beside its file. The
    raw-file hashes learnt so far go to the output folder's hash cache at the second kind only
    (at most 20 times a build, and once when the hashes were all made up front: the cache grows
    with the inputs), so the next build, resuming, does not read again the files it takes over."""

    def __init__(
        self,
        writer: DatasetWriter,
        inputs: Inputs,
        total: int,
        every: float | None = None,
        exact_stats: bool = True,
        raw_root: Path | None = None,
    ):
        self.writer, self.inputs, self.total, self.exact_stats = writer, inputs, total, exact_stats
        self.every = float(os.environ.get("H5FORGE_CHECKPOINT_SECONDS", CHECKPOINT_SECONDS)) if every is None else every
        self.path = sidecar(writer.path)
        self.raw_root = raw_root
        self.last = time.monotonic()
        self.done = self.saved = 0
        self.cached = False  # the hash cache was saved by this build

    def tick(self, n: int) -> None:
        self.done += n
        share = self.total and self.done - self.saved >= CHECKPOINT_SHARE * self.total
        if share or time.monotonic() - self.last >= self.every:
            self.save()
            if share and self.raw_root is not None and (self.inputs.deferred or not self.cached):
                # a deferred build's hashes grow as it cleans; a build that hashed up front has them all
                hash_cache.save(
                    self.path.parent, self.raw_root, self.inputs.states, self.inputs.hexes, self.inputs.stated_at_ns
                )
                self.cached = True
        if self.total and self.done >= 0.8 * self.total:
            fault_point("build:at-80%")  # the fault tests kill a real build here

    def save(self) -> None:
        self.saved = self.done
        state = self.writer.checkpoint()
        state.update(key=self.inputs.key, rules=self.inputs.rules, boot=boot_id(), rejected=self._rejected())
        if not self.exact_stats:  # rows copied from other files carry their statistics only at the end
            state["stats"] = None
        replace_file(self.path, json.dumps(state), tmp=self.path.with_name(self.path.name + ".tmp"))
        self.last = time.monotonic()

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)

    def _rejected(self) -> list[list]:
        """The samples cleaning rejected so far, with their keys: a build taking the file over
        reports them again instead of cleaning them again (the same inputs give the same outcome)."""
        known = self.inputs.samples
        return [
            [r.sample_id, known[r.sample_id].hex(), list(r.paths), r.reason]
            for r in self.writer.rejections
            if r.stage == "clean" and known.get(r.sample_id)
        ]


def boot_id() -> str | None:
    """This boot of the machine (Linux); None where it cannot be told."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


@dataclass
class TakenOver:
    """A killed build's file taken over in place: the rows kept (``durable``), the samples they and
    the carried rejections stand for (``ids``), and whether the machine ran without a restart since
    the checkpoint (``same_boot``)."""

    durable: Durable
    ids: set[str]
    rejections: list[Rejection]
    same_boot: bool

    @property
    def rows(self) -> int:
        return sum(self.durable.counts.values())


def take_over(
    out: Path, inputs: Inputs, samples: list[SampleRef], kinds: dict[str, FieldKind], partial: Path
) -> TakenOver | None:
    """Make what a killed build left in ``out`` the file at ``partial``, cut back to the durable
    rows this build would write first in each split; None (the file left as it is) when its rows
    are not such a prefix, or its chunk index does not list every one of them."""
    data, state = out / RESUMABLE, out / (RESUMABLE + RESUME_SUFFIX)
    if not data.exists() or not state.exists():
        return None
    try:
        saved = json.loads(state.read_text())
        if saved.get("rules") != inputs.rules:
            return None
        with h5py.File(data, "r") as f:
            keep, ids, rejections = _prefix(f, saved, inputs, samples)
            if not any(keep.values()) or not all(_listed(f, split, m, kinds) for split, m in keep.items()):
                return None
    except (OSError, ValueError, KeyError, TypeError, RuntimeError):
        return None  # the copying path reads what it can of it, or discards it
    try:  # from here the file changes: if this fails, it is discarded and the build starts afresh
        with h5py.File(data, "r+") as f:
            stats = _kept_stats(f, saved, keep, kinds)
            for split, m in keep.items():
                _cut(f, split, m, kinds)
        os.replace(data, partial)
        state.unlink()
    except (OSError, ValueError, KeyError, TypeError, RuntimeError):
        discard_resumable(out)
        partial.unlink(missing_ok=True)
        return None
    listed = {s: {p: list(v[: keep[s]]) for p, v in per.items()} for s, per in saved["listed"].items()}
    boot = boot_id()
    return TakenOver(Durable(keep, stats, listed), ids, rejections, boot is not None and saved.get("boot") == boot)


def _prefix(f: h5py.File, saved: dict, inputs: Inputs, samples: list[SampleRef]):
    """Per split, how many of the durable rows are the first rows this build writes; the samples
    they stand for and those the killed build rejected before them (taken as rejected again).
    Raises ValueError when a durable row this build wants lies beyond them (it would be lost)."""
    rejected = {(sid, bytes.fromhex(key)): (paths, reason) for sid, key, paths, reason in saved.get("rejected", [])}
    keep: dict[str, int] = {}
    ids: set[str] = set()
    rejections: list[Rejection] = []
    for split in SPLITS:
        n = int(saved["counts"].get(split, 0))
        stored = sample_keys(f, split, n)
        if len(stored) != n or f[split][IDS].shape[0] < n:
            raise ValueError(f"{split}: fewer rows than its checkpoint says")
        refs = [ref for ref in samples if ref.split == split]
        wanted = np.array([inputs.samples.get(ref.id) or b"" for ref in refs], KEY)
        j = 0
        for ref, key in zip(refs, wanted):
            # (numpy drops trailing NUL bytes of fixed-length byte strings: padded back for the lookup)
            carried = rejected.get((ref.id, bytes(key).ljust(KEY.itemsize, b"\0")))
            if j < n and key == stored[j]:
                j += 1
            elif carried is not None:
                rejections.append(Rejection(ref.id, tuple(carried[0]), carried[1], stage="clean"))
            else:
                break
            ids.add(ref.id)
        if np.isin(stored[j:], wanted).any():
            raise ValueError(f"{split}: a durable row is wanted after one that is not")
        keep[split] = j
    return keep, ids, rejections


def _listed(f: h5py.File, split: str, n: int, kinds: dict[str, FieldKind]) -> bool:
    """Whether every chunk holding the first ``n`` rows of the split's datasets is listed in its
    chunk index, inside the file."""
    g, size = f[split], os.path.getsize(f.filename)
    datasets = [(g[name], n) for name in PER_SAMPLE] + [(f[sample_keys_path(split)], n)]
    for path, kind in kinds.items():
        st = kind.stored()
        elements = int(g[path + arrays.LENGTHS][:n].sum()) if st.ragged else n
        datasets += [(g[path], elements)] + ([(g[path + arrays.LENGTHS], n)] if st.ragged else [])
    for ds, rows in datasets:
        if ds.shape[0] < rows:
            return False
        if rows == 0:
            continue
        step = ds.chunks[0]
        seen = np.zeros(-(-rows // step), bool)
        inside = [True]

        def visit(info, seen=seen, inside=inside, step=step) -> None:
            k = info.chunk_offset[0] // step
            if k < len(seen):
                seen[k] = True
                inside[0] = inside[0] and info.size > 0 and info.byte_offset + info.size <= size

        ds.id.chunk_iter(visit)
        if not (inside[0] and seen.all()):
            return False
    return True


def _kept_stats(f: h5py.File, saved: dict, keep: dict[str, int], kinds: dict[str, FieldKind]) -> dict:
    """The statistics of the kept rows: the checkpoint's when it recorded exact ones for exactly
    these rows, else counted from the rows (read back before the file is cut)."""
    exact = saved.get("stats")
    if exact is not None and all(keep[s] == int(saved["counts"].get(s, 0)) for s in SPLITS):
        return {p: {s: np.asarray(c) for s, c in per.items()} for p, per in exact.items()}
    stats: dict[str, dict[str, np.ndarray]] = {}
    for split, m in keep.items():
        for path, kind in kinds.items():
            total = count_rows(f[split], path, kind, np.arange(m)) if m else None
            if total is not None:
                stats.setdefault(path, {})[split] = total
    return stats


def _cut(f: h5py.File, split: str, n: int, kinds: dict[str, FieldKind]) -> None:
    """Every dataset of the split back to its first ``n`` rows."""
    g = f[split]
    for path, kind in kinds.items():
        arrays.cut(g, path, kind.stored(), n)
    for name in PER_SAMPLE:
        g[name].resize(n, axis=0)
    f[sample_keys_path(split)].resize(n, axis=0)


def resumable_source(out: Path, inputs: Inputs) -> Source | None:
    """What a killed build left in ``out``, when it was written under the same field rules."""
    data, state = out / RESUMABLE, out / (RESUMABLE + RESUME_SUFFIX)
    if not data.exists() or not state.exists():
        return None
    try:
        saved = json.loads(state.read_text())
        if saved.get("rules") != inputs.rules:
            raise ValueError("other field rules")
        with h5py.File(data, "r") as f:  # everything the plan reads must be readable, or nothing is taken
            for split, n in saved["counts"].items():
                if len(sample_keys(f, split, n)) != n or f[split][IDS].shape[0] < n:
                    raise ValueError(f"{split}: fewer rows than its checkpoint says")
        stats = saved["stats"]
        return Source(data, limit=saved["counts"], stats=stats or {}, listed=saved["listed"], recount=stats is None)
    except (OSError, ValueError, KeyError, TypeError):
        discard_resumable(out)
        return None


def discard_resumable(out: Path) -> None:
    for p in (out / RESUMABLE, out / (RESUMABLE + RESUME_SUFFIX)):
        p.unlink(missing_ok=True)

"""Resumable builds: a build makes its rows durable at checkpoints; the next build takes them over.

While it writes, a build flushes its partial file every few seconds and then records, beside it
(``.dataset_vNNNN.h5.partial.resume``), how many rows of each split are durable, their statistics
and index values, and the build's input key. The writer never reuses freed file space, so a
SIGKILL after a checkpoint leaves those rows where the flushed metadata points.

The next run, under the output lock, moves such a partial aside (``.build-resumable.h5``, see
``_store.versions``). The next build written under the same field rules takes it over in place
(``h5forge._ingest.incremental.take_over``) when its durable rows are, in each split, the first
rows that build would write: the file becomes the new build's, cut back to those rows, and the
build appends the rest after them. Otherwise it copies every durable row whose sample key it still wants
(``h5forge._ingest.incremental.reuse``) instead of cleaning it again, and removes the leftover when
its own rows are written. Anything else is discarded.

Whichever way they are taken, rows from a killed build's file are checked in full before they are
published: kept in place, against their checksums as the take-over begins (``take_over`` says
why); copied, by ``verify``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import h5py

from h5forge._format import heap
from h5forge._format.catalog import sample_keys
from h5forge._format.names import IDS, RESUMABLE, RESUME_SUFFIX
from h5forge._ingest.incremental import hash_cache
from h5forge._ingest.incremental.inputs import Inputs
from h5forge._ingest.incremental.reuse import Source
from h5forge._ingest.writer import DatasetWriter
from h5forge._crash_points import checkpoint as fault_point
from h5forge._store.whole_files import replace_file

CHECKPOINT_SECONDS = 3.0  # how much cleaning a SIGKILL can cost at most (plus the batches in flight)


def sidecar(partial: Path) -> Path:
    return partial.with_name(partial.name + RESUME_SUFFIX)


# and after each 5 % of the inputs to clean: a short build loses little more than a long one (rows
# taken from other files count for nothing: copying them again costs little)
CHECKPOINT_SHARE = 0.05


class Checkpoints:
    """Call ``tick(samples done)`` after each batch: every CHECKPOINT_SECONDS, and after each
    CHECKPOINT_SHARE of the inputs to clean, the writer's durable state is recorded beside its file,
    and the raw-file hashes learnt since the last checkpoint are appended to the output folder's
    hash cache log (``hash_cache.append``): the next build, resuming, reads again only the files
    read after it."""

    def __init__(
        self,
        writer: DatasetWriter,
        inputs: Inputs,
        total: int,
        to_clean: int,
        every: float | None = None,
        exact_stats: bool = True,
        raw_root: Path | None = None,
    ):
        self.writer, self.inputs, self.exact_stats = writer, inputs, exact_stats
        self.total, self.to_clean = total, to_clean
        self.every = float(os.environ.get("H5FORGE_CHECKPOINT_SECONDS", CHECKPOINT_SECONDS)) if every is None else every
        self.path = sidecar(writer.path)
        self.raw_root = raw_root
        self.last = time.monotonic()
        self.done = self.cleaned = self.saved = 0  # samples done, of them cleaned, cleaned at the last save
        self.logged = 0  # how many of the inputs' learnt hashes are in the hash cache's log

    def tick(self, n: int, cleaned: bool = True) -> None:
        """``n`` more samples done: cleaned, or taken from another file."""
        self.done += n
        self.cleaned += n if cleaned else 0
        share = self.to_clean and self.cleaned - self.saved >= CHECKPOINT_SHARE * self.to_clean
        if share or time.monotonic() - self.last >= self.every:
            self.save()
            learnt = self.inputs.learnt
            if self.raw_root is not None and self.logged < len(learnt):
                i = self.inputs
                hash_cache.append(
                    self.path.parent, self.raw_root, i.states, i.hexes, i.stated_at_ns, learnt[self.logged :]
                )
                self.logged = len(learnt)
        if self.total and self.done >= 0.8 * self.total:
            fault_point("build:at-80%")  # the fault tests kill a real build here

    def save(self) -> None:
        self.saved = self.cleaned
        state = self.writer.checkpoint()
        state.update(key=self.inputs.key, rules=self.inputs.rules, rejected=self._rejected())
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


def checkpoint_of(out: Path) -> tuple[Path, Path, dict] | None:
    """A killed build's file in ``out``, its state file and the state saved at its last
    checkpoint; None when either file is missing. ``OSError`` or ``ValueError`` for a state
    file that cannot be read as JSON."""
    data, state = out / RESUMABLE, out / (RESUMABLE + RESUME_SUFFIX)
    if not data.exists() or not state.exists():
        return None
    return data, state, json.loads(state.read_text())


def resumable_source(out: Path, inputs: Inputs) -> Source | None:
    """What a killed build left in ``out``, when it was written under the same field rules."""
    try:
        found = checkpoint_of(out)
        if found is None:
            return None
        data, _, saved = found
        if saved.get("rules") != inputs.rules:
            raise ValueError("other field rules")
        if heap.damage(data):
            raise ValueError("a damaged global heap")
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

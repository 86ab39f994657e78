"""The removals gate: a build never drops a sample that latest holds without saying so.

A sample leaves latest when its raw files are gone or when this build rejected it (a record that
no longer pairs, a file that no longer decodes). Either way the run names the samples; it
publishes only when the spec allows removals (``output.allow_removals``, for a user who deleted
raw files on purpose), and otherwise fails with nothing published.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py

from h5forge.errors import SamplesRemoved
from h5forge._format import heap
from h5forge._format.layout import decode_str
from h5forge._format.mapped import read_all
from h5forge._format.names import IDS, SPLITS, version_name
from h5forge._ingest.discover import match_key
from h5forge.spec import DatasetSpec
from h5forge._store.versions import Candidate

NAMED = 20  # ids a message names one by one


def stored_ids(path: Path) -> list[str]:
    """Every id a version holds, over its splits (a thin version's read through its row files)."""
    with h5py.File(os.path.realpath(path), "r") as f:
        return [sid for split in SPLITS if split in f for sid in decode_str(read_all(f[split][IDS]))]


def leaving_latest(candidate: Candidate) -> list[str]:
    """The ids latest (the candidate's parent) holds that the candidate does not, sorted; ids are
    matched in NFC, as discovery matches them."""
    if candidate.parent is None:
        return []
    kept = {match_key(sid) for sid in stored_ids(candidate.partial)}
    return sorted(
        sid for sid in stored_ids(candidate.out / version_name(candidate.parent)) if match_key(sid) not in kept
    )


def named(ids: list[str]) -> str:
    shown = ", ".join(ids[:NAMED])
    return shown if len(ids) <= NAMED else f"{shown} and {len(ids) - NAMED} more"


def check_removals(spec: DatasetSpec, candidate: Candidate) -> list[str]:
    """The samples that leave latest with this build. Raises ``SamplesRemoved`` (after discarding
    the candidate) when there are any and the spec does not allow removals, or when latest is too
    damaged to tell (its global heap, where the ids are)."""
    damaged = candidate.parent is not None and heap.version_damage(candidate.out / version_name(candidate.parent))
    if damaged:
        assert candidate.parent is not None
        if spec.output.allow_removals:
            return []
        candidate.discard()
        raise SamplesRemoved(
            f"cannot tell which samples would leave latest, {version_name(candidate.parent)}: {damaged}; nothing "
            "published. Set output.allow_removals: true in the spec to publish this build without that check"
        )
    leaving = leaving_latest(candidate)
    if leaving and not spec.output.allow_removals:
        assert candidate.parent is not None  # samples leave only a parent version
        candidate.discard()
        raise SamplesRemoved(
            f"{len(leaving)} sample(s) of {version_name(candidate.parent)} would leave latest: {named(leaving)}; "
            "nothing published. Their raw files are gone or were rejected (see the quarantine report): "
            "restore them, or set output.allow_removals: true in the spec to publish without them"
        )
    return leaving

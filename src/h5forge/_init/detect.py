"""Which layout a raw folder holds, asked of the kinds' detectors in their priority order (first
match wins), and the spec assembled from it, checked with ``parse_spec`` before it is returned."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from h5forge.errors import UsageError
from h5forge._ingest.discover import discover
from h5forge._ingest.rejected import common_reasons, inputs_seen
from h5forge._init.sections import footer, header
from h5forge.kinds import sample_bytes
from h5forge._init.text import SpecText
from h5forge.kinds import Layout, detectors
from h5forge.spec import DatasetSpec, parse_spec


@dataclass(frozen=True)
class Inferred:
    """What ``init`` writes: the spec's YAML text, the notes (also in the text as ``# note:``
    lines), the layout recognised (its detector's name for it: ``sr``, ``segment``, ``images``,
    ``classify``, ``volume``, ``signals``, ...) and the keys the user must fill in before the spec
    is valid (``# key: TODO`` lines; the notes say why)."""

    text: str
    notes: tuple[str, ...]
    layout: str
    todo: tuple[str, ...] = ()
    unbuildable: str | None = None  # why a build of the folder with this spec publishes nothing


def expected() -> str:
    """What ``init`` recognises, in the detectors' order (the CLI's help and the no-match error)."""
    return "; ".join(d.expects for _, d in detectors())


def find_layout(raw: Path, notes: list[str], todo: list[str]) -> Layout:
    for kind, detector in detectors():
        found = detector.load()(kind, raw, notes, todo)
        if found is not None:
            return found
    raise UsageError(f"no layout h5forge knows found in {raw}: expected {expected()}")


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
    found = find_layout(raw, notes, todo)

    def write(notes: list[str], nbytes: int = 0) -> SpecText:
        t = SpecText()
        header(t, raw, spec_path, name, notes, found.ids)
        found.body(t)
        footer(t, spec_path, name, found.split_column, found.batch_size, nbytes)
        return t

    t = write(notes)
    spec = parse_spec(yaml.safe_load(t.checked()), spec_path.parent.resolve(), str(spec_path))  # must be valid
    more, unbuildable = accounted(spec)
    nbytes = sample_bytes(spec)  # the fields' stored shapes, from the sizes the layout measured
    if more or nbytes:
        notes = [*notes, *more]
        t = write(notes, nbytes)
    text = "\n".join(t.lines) + "\n"
    return Inferred(text, tuple(notes), found.name, tuple(todo), None if todo else unbuildable)


def accounted(spec: DatasetSpec) -> tuple[list[str], str | None]:
    """Notes from discovering the folder with the spec just inferred: the files no glob takes, and
    what a build of the folder as it is rejects at discovery, against ``max_rejected``; and why
    such a build publishes nothing, if it does not."""
    inv = discover(spec)
    notes, unbuildable = [], None
    if inv.unclaimed:
        more = "" if inv.unclaimed <= len(inv.unclaimed_examples) else ", ..."
        notes.append(
            f"{inv.unclaimed} file{'s' if inv.unclaimed > 1 else ''} under the folder "
            f"{'are' if inv.unclaimed > 1 else 'is'} taken by no glob: "
            f"{', '.join(inv.unclaimed_examples)}{more} (not pictures, volumes or recordings of the "
            "layout found; add a glob to take them)"
        )
    if inv.rejected:
        seen = inputs_seen(inv)
        reasons = "; ".join(f"{n} x {reason}" for reason, n in common_reasons(inv.rejections))
        limit = spec.rejected_limit(seen)
        verdict = (
            f"max_rejected {spec.max_rejected:g} allows {limit}"
            if inv.rejected <= limit
            else f"max_rejected {spec.max_rejected:g} allows only {limit}: the build publishes nothing until "
            f"they are fixed or max_rejected is raised to {inv.rejected}"
        )
        notes.append(
            f"a build of the folder as it is rejects {inv.rejected} of {seen} inputs at discovery "
            f"({reasons}); {verdict}"
        )
        if not inv.samples:
            unbuildable = f"every one of the {seen} inputs is rejected at discovery ({reasons})"
        elif inv.rejected > limit:
            unbuildable = (
                f"{inv.rejected} of {seen} inputs are rejected at discovery ({reasons}), more than "
                f"max_rejected {spec.max_rejected:g} allows ({limit})"
            )
    elif not inv.samples:
        unbuildable = "no input of the folder becomes a sample"
    return notes, unbuildable

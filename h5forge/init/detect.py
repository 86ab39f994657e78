"""Which layout a raw folder holds, first match wins (pairs, ``images/``, class folders, volumes,
recordings), and the spec assembled from it, checked with ``parse_spec`` before it is returned."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from h5forge.errors import UsageError
from h5forge.ingest.discover import discover
from h5forge.ingest.rejected import common_reasons, inputs_seen
from h5forge.init.classes import class_tree, classify_body
from h5forge.init.csv_recordings import csv_body
from h5forge.init.dicom import dicom_body
from h5forge.init.edf import edf_body
from h5forge.init.folders import named
from h5forge.init.nifti import nifti_body
from h5forge.init.npy_channels import npy_body
from h5forge.init.pairs import sr_body, sr_pairs
from h5forge.init.pictures import IMAGE_DIRS, pictures_in
from h5forge.init.sections import footer, header
from h5forge.init.segment import segment_body
from h5forge.init.text import SpecText
from h5forge.spec import DatasetSpec, parse_spec


@dataclass(frozen=True)
class Inferred:
    """What ``init`` writes: the spec's YAML text, the notes (also in the text as ``# note:``
    lines), the layout recognised (``sr``, ``segment``, ``images``, ``classify``, ``volume`` or
    ``signals``) and the keys the user must fill in before the spec is valid (``# key: TODO``
    lines; the notes say why)."""

    text: str
    notes: tuple[str, ...]
    layout: str
    todo: tuple[str, ...] = ()


def _volumes_or_signals(raw: Path, notes: list[str], todo: list[str]):
    """The first of: DICOM case folders, NIfTI volumes, EDF/BDF, CSV with a time column, ``.npy``
    channel folders (None: none of them)."""
    return (dicom_body(raw, notes) or nifti_body(raw, notes) or edf_body(raw, notes) or csv_body(raw, notes)
            or npy_body(raw, notes, todo))


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
    pairs = sr_pairs(raw)
    images = next((d for d in named(raw, IMAGE_DIRS) if pictures_in(d)), None)
    ids, split_column, batch_size = None, None, None
    if pairs:
        layout, body = "sr", sr_body(raw, pairs, notes)
    elif images is not None:
        layout, body = segment_body(raw, images, notes)
    elif (tree := class_tree(raw, notes)) is not None:
        layout, body, ids = "classify", classify_body(raw, tree, notes), "path"
        split_column = "split" if tree.split else None
    elif (found := _volumes_or_signals(raw, notes, todo)) is not None:
        layout, body = found
        batch_size = 2 if layout == "volume" else None
    else:
        raise UsageError(f"no pictures found in {raw}, nor volumes or recordings: expected images/ (+ masks/), "
                         "class folders (<class>/*.jpg, <split>/<class>/*.jpg), lr/ + hr/ super-resolution pairs, "
                         "DICOM case folders (<case>/*.dcm), NIfTI volumes (*.nii.gz), or recordings (*.edf, "
                         "*.csv with a time column, <channel>/*.npy)")
    def write(notes: list[str]) -> SpecText:
        t = SpecText()
        header(t, raw, spec_path, name, notes, ids)
        body(t)
        footer(t, spec_path, name, split_column, batch_size)
        return t

    t = write(notes)
    spec = parse_spec(yaml.safe_load(t.checked()), spec_path.parent.resolve(), str(spec_path))  # must be valid
    found = accounted(spec)
    if found:
        notes = [*notes, *found]
        t = write(notes)
    text = "\n".join(t.lines) + "\n"
    return Inferred(text, tuple(notes), layout, tuple(todo))


def accounted(spec: DatasetSpec) -> list[str]:
    """Notes from discovering the folder with the spec just inferred: the files no glob takes, and
    what a build of the folder as it is rejects at discovery, against ``max_rejected``."""
    inv = discover(spec)
    notes = []
    if inv.unclaimed:
        more = "" if inv.unclaimed <= len(inv.unclaimed_examples) else ", ..."
        notes.append(f"{inv.unclaimed} file{'s' if inv.unclaimed > 1 else ''} under the folder "
                     f"{'are' if inv.unclaimed > 1 else 'is'} taken by no glob: "
                     f"{', '.join(inv.unclaimed_examples)}{more} (not pictures, volumes or recordings of the "
                     "layout found; add a glob to take them)")
    if inv.rejected:
        seen = inputs_seen(inv)
        reasons = "; ".join(f"{n} x {reason}" for reason, n in common_reasons(inv.rejections))
        limit = spec.rejected_limit(seen)
        verdict = (f"max_rejected {spec.max_rejected:g} allows {limit}" if inv.rejected <= limit else
                   f"max_rejected {spec.max_rejected:g} allows only {limit}: the build publishes nothing until "
                   f"they are fixed or max_rejected is raised to {inv.rejected}")
        notes.append(f"a build of the folder as it is rejects {inv.rejected} of {seen} inputs at discovery "
                     f"({reasons}); {verdict}")
    return notes

"""The field-kind registry: a kind is one module, registered here by its ``kind`` name.

Adding a kind is adding its module (spec model + ``FieldKind`` subclass, with its ``init``
detectors, demo folders and reader options), its import and its class in the tuple registered
below; nothing else in h5forge names a kind. The layers above ask this registry: ``init`` for the
detectors (``detectors()``), ``demo-data`` for the demo folders (``demos()``), the readers for
their options (``read_options``). docs/extending.md says how, and tests/kinds/conformance checks
every kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from h5forge.format.arrays import Stored
from h5forge.kinds.base import Decoded, FieldKind, warnings_logged
from h5forge.kinds.boxes import BoxesKind
from h5forge.kinds.column import ColumnKind
from h5forge.kinds.image import ImageKind
from h5forge.kinds.label import LabelKind
from h5forge.kinds.mask import MaskKind
from h5forge.kinds.paired import PairedKind
from h5forge.kinds.plugins import Demo, Detector, Layout, load_ref
from h5forge.kinds.reading import Conversion, ReadOption, ReadOptions
from h5forge.kinds.signal import SignalKind
from h5forge.kinds.volume import VolumeKind
from h5forge.kinds.volume_mask import VolumeMaskKind
from h5forge.samples import SampleRef

if TYPE_CHECKING:
    from h5forge.spec import DatasetSpec

__all__ = [
    "REGISTRY",
    "Conversion",
    "Decoded",
    "Demo",
    "Detector",
    "FieldKind",
    "Layout",
    "ReadOption",
    "ReadOptions",
    "Stored",
    "decode_sample",
    "demos",
    "detectors",
    "field_kinds",
    "file_fields",
    "load_ref",
    "read_options",
    "reader_options",
    "stored_kinds",
]

REGISTRY: dict[str, type[FieldKind]] = {}


def register(kind: type[FieldKind]) -> type[FieldKind]:
    """Add a kind to the registry (its ``kind`` name must be new and its class complete)."""
    if kind.kind in REGISTRY:
        raise ValueError(f"kind {kind.kind!r} is registered twice ({REGISTRY[kind.kind].__name__}, {kind.__name__})")
    if getattr(kind, "__abstractmethods__", None):
        raise TypeError(f"{kind.__name__} lacks {sorted(kind.__abstractmethods__)}")
    REGISTRY[kind.kind] = kind
    return kind


for _kind in (ImageKind, MaskKind, LabelKind, PairedKind, SignalKind, VolumeKind, VolumeMaskKind, BoxesKind):
    register(_kind)


def detectors() -> list[tuple[type[FieldKind], Detector]]:
    """Every registered kind's ``init`` detectors, in priority order. Only those a class declares
    itself count (a subclass does not inherit its parent's layouts)."""
    found = [(k, d) for k in REGISTRY.values() for d in vars(k).get("detectors", ())]
    return sorted(found, key=lambda kd: kd[1].priority)


def demos() -> dict[str, Demo]:
    """Every registered kind's demo folders by name, in registry order (declared by the class itself)."""
    return {d.name: d for k in REGISTRY.values() for d in vars(k).get("demos", ())}


def reader_options(reader: str = "numpy") -> dict[str, ReadOption]:
    """The options the registered kinds take from a reader, by name (shared by kinds that inherit them)."""
    out: dict[str, ReadOption] = {}
    for kind in REGISTRY.values():
        for opt in kind.read_options:
            if out.setdefault(opt.name, opt) != opt:
                raise ValueError(f"reader option {opt.name!r} is declared twice, differently")
    return out


def read_options(reader: str, given: dict) -> ReadOptions:
    """The options a reader was given, checked against what the kinds take: an unknown keyword is
    a TypeError naming the ones there are, as for any Python call."""
    known = reader_options(reader)
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise TypeError(f"unknown reader option(s) {unknown}; the field kinds take {sorted(known)}")
    return ReadOptions(reader, **given)


def format_table() -> str:
    """The file layout as a Markdown table: the format's names, then one row per field kind.
    docs/format.md embeds it (``make docs`` rewrites it; a test keeps them equal)."""
    from h5forge.format.names import render_layout

    kinds: tuple[type[FieldKind], ...] = (*REGISTRY.values(), ColumnKind)
    rows = [f"| `<field>` of kind `{k.kind}` | {k.layout_doc} |" for k in kinds if k.layout_doc]
    return "\n".join([render_layout(), *rows])


def field_kinds(spec: "DatasetSpec") -> dict[str, FieldKind]:
    """The declared fields, in spec order, each bound to its kind."""
    return {name: REGISTRY[f.kind](name, f, spec) for name, f in spec.fields.items()}


def stored_kinds(spec: "DatasetSpec") -> dict[str, FieldKind]:
    """Everything stored per sample besides the provenance columns, by dataset path: the fields,
    then the annotation columns."""
    out: dict[str, FieldKind] = {}
    for kind in field_kinds(spec).values():
        out[kind.path] = kind
        out.update(kind.companions())
    for col, ctype in spec.annotations.columns.items():
        kind = ColumnKind(col, ctype, spec)
        out[kind.path] = kind
    return out


def file_fields(kinds: dict[str, FieldKind]) -> list[str]:
    """The fields read from raw files, in order: the columns of source_files / source_sha256."""
    return [k.name for k in kinds.values() if k.files]


def decode_order(kinds: dict[str, FieldKind]) -> list[FieldKind]:
    """Every kind after the fields it follows (e.g. a mask after its image)."""
    ordered: list[FieldKind] = []
    placed: set[str] = set()

    def place(kind: FieldKind) -> None:
        if kind.path in placed:
            return
        for dep in kind.after:
            place(kinds[dep])
        placed.add(kind.path)
        ordered.append(kind)

    for kind in kinds.values():
        place(kind)
    return ordered


def decode_sample(
    kinds: dict[str, FieldKind], root: Path, ref: SampleRef, order: list[FieldKind] | None = None
) -> dict[str, Decoded]:
    """Every stored value of one sample, by dataset path, in ``kinds`` order; raises Reject.
    ``order`` is ``decode_order(kinds)``, when the caller decodes many samples."""
    done: dict[str, Decoded] = {}
    with warnings_logged(ref.id):  # a library's warning goes to the log, never to the terminal
        for kind in order or decode_order(kinds):
            done[kind.path] = kind.decode(root, ref, done)
    return {path: done[path] for path in kinds}

"""The field-kind registry: a kind is one module, registered by its ``kind`` name.

``REGISTRY`` holds every installed kind, h5forge's own and those of other packages alike: each is
an entry point of the group ``h5forge.kinds`` (``kinds._registry``), loaded when the registry is
first asked, so a kind from another package needs no edit here and nothing else in h5forge names a
kind. The layers above ask this registry: ``init`` for the detectors (``detectors()``),
``demo-data`` for the demo folders (``demos()``), the readers for their options
(``read_options``). docs/extending.md says how, and tests/kinds/conformance checks every kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from h5forge.errors import KindRegistryError
from h5forge._format.arrays import Stored
from h5forge.kinds.base import Decoded, FieldKind, warnings_logged
from h5forge.kinds._column import ColumnKind
from h5forge.kinds.plugins import Demo, Detector, Layout, load_ref
from h5forge.kinds.reading import Conversion, ReadOption, ReadOptions
from h5forge.kinds._registry import KindNotLoaded, Registry
from h5forge._samples import SampleRef

if TYPE_CHECKING:
    from h5forge.spec import DatasetSpec

__all__ = [
    "REGISTRY",
    "Conversion",
    "Decoded",
    "Demo",
    "Detector",
    "FieldKind",
    "KindNotLoaded",
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

REGISTRY = Registry()


def detectors() -> list[tuple[type[FieldKind], Detector]]:
    """Every registered kind's ``init`` detectors, in priority order. Only those a class declares
    itself count (a subclass does not inherit its parent's layouts)."""
    found = [(k, d) for k in REGISTRY.values() for d in vars(k).get("detectors", ())]
    return sorted(found, key=lambda kd: kd[1].priority)


def demos() -> dict[str, Demo]:
    """Every registered kind's demo folders by name, in registry order (declared by the class itself);
    two kinds may not declare one name."""
    found: dict[str, tuple[type[FieldKind], Demo]] = {}
    for kind in REGISTRY.values():
        for demo in vars(kind).get("demos", ()):
            if found.setdefault(demo.name, (kind, demo))[0] is not kind:
                raise KindRegistryError(
                    f"demo {demo.name!r} is declared by kinds {found[demo.name][0].kind!r} and {kind.kind!r}"
                )
    return {name: demo for name, (_, demo) in found.items()}


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
    """The file layout as a Markdown table: the format's names, then one row per field kind of
    h5forge's own (another package documents its kinds). docs/format.md embeds it (``make docs``
    rewrites it; a test keeps them equal)."""
    from h5forge._format.names import render_layout

    own = [k for k in REGISTRY.values() if k.__module__.startswith("h5forge.")]
    kinds: tuple[type[FieldKind], ...] = (*own, ColumnKind)
    rows = [f"| `<field>` of kind `{k.kind}` | {k.layout_doc} |" for k in kinds if k.layout_doc]
    return "\n".join([render_layout(), *rows])


def field_kinds(spec: "DatasetSpec") -> dict[str, FieldKind]:
    """The declared fields, in spec order, each bound to its kind."""
    return {name: REGISTRY[f.kind](name, f, spec) for name, f in spec.fields.items()}


def sample_bytes(spec: "DatasetSpec") -> int:
    """The stored bytes of one sample's fixed-size arrays (a ragged field chunks its elements)."""
    stored = [kind.stored() for kind in stored_kinds(spec).values()]
    return sum(int(np.prod(st.shape)) * np.dtype(st.dtype).itemsize for st in stored if st.bulk and not st.ragged)


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

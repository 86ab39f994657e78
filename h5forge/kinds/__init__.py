"""The field-kind registry: a kind is one module, registered here by its ``kind`` name.

Adding a kind is adding its module (spec model + ``FieldKind`` subclass) and one line below;
nothing else in h5forge names a kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from h5forge.format.arrays import Stored
from h5forge.kinds.base import Decoded, FieldKind, ReadOptions
from h5forge.kinds.column import ColumnKind
from h5forge.kinds.image import ImageKind
from h5forge.kinds.label import LabelKind
from h5forge.kinds.mask import MaskKind
from h5forge.kinds.paired import PairedKind
from h5forge.kinds.signal import SignalKind
from h5forge.kinds.volume import VolumeKind
from h5forge.kinds.volume_mask import VolumeMaskKind
from h5forge.samples import SampleRef

if TYPE_CHECKING:
    from h5forge.spec import DatasetSpec

__all__ = ["REGISTRY", "Decoded", "FieldKind", "ReadOptions", "Stored", "field_kinds", "stored_kinds",
           "file_fields", "decode_sample"]

REGISTRY: dict[str, type[FieldKind]] = {k.kind: k for k in (ImageKind, MaskKind, LabelKind, PairedKind, SignalKind,
                                                           VolumeKind, VolumeMaskKind)}


def format_table() -> str:
    """The file layout as a Markdown table: the format's names, then one row per field kind.
    docs/format.md embeds it (``make docs`` rewrites it; a test keeps them equal)."""
    from h5forge.format.names import render_layout

    rows = [f"| `<field>` of kind `{k.kind}` | {k.layout_doc} |" for k in (*REGISTRY.values(), ColumnKind)
            if k.layout_doc]
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


def decode_sample(kinds: dict[str, FieldKind], root: Path, ref: SampleRef,
                  order: list[FieldKind] | None = None) -> dict[str, Decoded]:
    """Every stored value of one sample, by dataset path, in ``kinds`` order; raises Reject.
    ``order`` is ``decode_order(kinds)``, when the caller decodes many samples."""
    done: dict[str, Decoded] = {}
    for kind in order or decode_order(kinds):
        done[kind.path] = kind.decode(root, ref, done)
    return {path: done[path] for path in kinds}

"""``kind: label``: a class label taken from an annotation column, stored as an int64 class index.

    fields:
      label: {kind: label, column: diagnosis, classes: [healthy, infected, dividing]}

A ``str`` column is mapped to its value's index in ``classes`` (another value rejects the
sample); an ``int`` column is the index itself. Each split counts its samples per class
(``<field>_class_counts``). Readers return int64.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from h5forge.kinds.base import Decoded, FieldKind, FieldModel, Stored
from h5forge.kinds.plugins import Demo, Detector, Plugins
from h5forge.kinds.preview import Preview
from h5forge.kinds.statistics import ClassCounts
from h5forge._samples import Reject, SampleRef


class LabelField(FieldModel):
    """A class label from an annotation column."""

    kind: Literal["label"] = "label"
    column: str = Field(description="the annotation column holding each sample's class")
    classes: tuple[str, ...] | None = Field(None, description="class names, in index order")

    @field_validator("classes")
    @classmethod
    def _distinct(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is not None and (not v or len({unicodedata.normalize("NFC", c) for c in v}) != len(v)):
            raise ValueError("classes must be a non-empty list of distinct names (in NFC)")
        return v


class LabelKind(Plugins, ClassCounts, Preview, FieldKind[LabelField]):
    kind = "label"
    Spec = LabelField
    detectors = (Detector("h5forge._init.classes:detect", 30, "class folders <class>/*.jpg or <split>/<class>/*.jpg"),)
    demos = (
        Demo(
            "classify",
            "h5forge._demo.classify:generate_classify",
            240,
            "class folders, mixed formats",
            noun="classify samples",
        ),
    )
    layout_doc = (
        "(N,) int64 class index; dataset attr classes (names, in index order); split attr "
        "<field>_class_counts (K,) samples per class"
    )

    @classmethod
    def check_spec(cls, name: str, spec: LabelField, dataset: Any) -> None:
        ctype = dataset.annotations.columns.get(spec.column)
        if ctype is None:
            raise ValueError(f"fields.{name}.column: {spec.column!r} is not declared in annotations.columns")
        if ctype not in ("str", "int"):
            raise ValueError(f"fields.{name}.column: {spec.column!r} is a {ctype} column; a label needs str or int")
        if ctype == "str" and spec.classes is None:
            raise ValueError(f"fields.{name}.classes: needed to map the str column {spec.column!r} to class indices")

    def stored(self) -> Stored:
        return Stored((), np.int64, bulk=False)

    def dataset_attrs(self) -> dict[str, Any]:
        return {"classes": list(self.spec.classes)} if self.spec.classes else {}

    def decode(self, root: Path, ref: SampleRef, done: dict[str, Decoded]) -> Decoded:
        value, classes = ref.columns[self.spec.column], self.spec.classes or ()
        where = f"{ref.extra_files[0] if ref.extra_files else self.dataset.annotations.file or ''}#{ref.id}"
        if isinstance(value, str):
            # matched in NFC: a class folder named on macOS (NFD) is the class typed in the spec (NFC)
            index = {unicodedata.normalize("NFC", c): i for i, c in enumerate(classes)}
            i = index.get(unicodedata.normalize("NFC", value))
            if i is None:
                raise Reject(
                    where, f"label {value!r} (column {self.spec.column!r}) is not one of the classes {list(classes)}"
                )
            return Decoded(i)
        if value < 0 or (classes and value >= len(classes)):
            bound = f"0..{len(classes) - 1}" if classes else ">= 0"
            raise Reject(where, f"label {value} (column {self.spec.column!r}) is not a class index {bound}")
        return Decoded(int(value))

    # ---- statistics: samples per class (none without class names)
    counted = "class_counts"

    @property
    def n_classes(self) -> int:
        return len(self.spec.classes or ())

    def counts(self, block: np.ndarray) -> np.ndarray | None:
        return np.bincount(block, minlength=self.n_classes) if self.n_classes else None

    def caption(self, value: Any) -> str:
        i = int(value)
        return self.spec.classes[i] if self.spec.classes else str(i)

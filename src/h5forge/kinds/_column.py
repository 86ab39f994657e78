"""Annotation columns (``annotations.columns``): one value per sample from its record, stored at
``/<split>/meta/<column>``. Every declared column is a field of this kind, so readers return it
by its path (``meta/<column>``) like any other field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from h5forge._format.layout import STR
from h5forge._format.names import column_path
from h5forge.kinds.base import Decoded, FieldKind, Stored
from h5forge.kinds.preview import Preview
from h5forge.kinds.reading import ReadOptions
from h5forge._samples import SampleRef

STORED_DTYPES = {"str": STR, "int": np.int64, "float": np.float64, "bool": np.bool_}
READ_DTYPES = {"str": None, "int": np.int64, "float": np.float32, "bool": np.bool_}


class ColumnKind(Preview, FieldKind[str]):
    """Not declared under ``fields``: made for each annotation column (``spec`` is its type name)."""

    kind = "column"
    checksummed = False
    layout_doc = "(N,) at /<split>/meta/<col>: UTF-8 string, int64, float64 or bool, as the column is declared"

    @property
    def path(self) -> str:
        return column_path(self.name)

    @property
    def annotation_column(self) -> str:
        return self.name

    def stored(self) -> Stored:
        return Stored((), STORED_DTYPES[self.spec], bulk=False)

    def decode(self, root: Path, ref: SampleRef, done: dict[str, Decoded]) -> Decoded:
        return Decoded(ref.columns[self.name])  # discovery has checked and coerced it

    def output_dtype(self, opts: ReadOptions) -> np.dtype | None:
        dtype = READ_DTYPES[self.spec]
        return None if dtype is None else np.dtype(dtype)

    def caption(self, value: Any) -> str:
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, (float, np.floating)):
            value = f"{value:.4g}"  # a caption line is narrow
        return f"{self.name}={value}"

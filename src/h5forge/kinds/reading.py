"""How stored rows become model values: the reader options a kind takes and its conversion.

Every field is read, so every kind reads: ``FieldKind`` has ``Reading``'s plain conversion (a cast
to the stored dtype; strings as Python values) and a kind overrides what differs (an image's
float32/255, a mask's integer dtype, a signal's window). The readers call these methods on every
field they return.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Protocol

import h5py
import numpy as np

from h5forge._format.arrays import Stored


@dataclass(frozen=True)
class ReadOption:
    """A keyword a reader takes for a kind (``H5Dataset(..., image_dtype="uint8")``)."""

    name: str
    default: Any
    about: str
    # readers whose default differs, by reader name (JAX computes in 32 bits by default)
    reader_defaults: Mapping[str, Any] = field(default_factory=dict)

    def default_for(self, reader: str) -> Any:
        return self.reader_defaults.get(reader, self.default)


class ReadOptions:
    """What a reader asked for: option values by name, for the reader ``reader``. A kind takes the
    options it declares (``Reading.option``); one not given is the option's default."""

    def __init__(self, reader: str = "numpy", **values: Any):
        self.reader = reader
        self.values = dict(values)

    def __repr__(self) -> str:
        return f"ReadOptions({self.reader!r}, {self.values!r})"


@dataclass(frozen=True)
class Conversion:
    """How stored rows become model values, as steps every reader's kernels compute alike: a cast to
    the output dtype, then (floating outputs) a division by ``scale``, then the subtraction of
    ``mean`` and the division by ``std`` along the channel axis."""

    scale: float | None = None
    mean: np.ndarray | None = None
    std: np.ndarray | None = None


class _Stores(Protocol):
    """What the plain conversion needs of a kind: its stored form."""

    def stored(self) -> Stored: ...


class Reading:
    """The reader options a kind declares and how its stored rows become model values."""

    read_options: ClassVar[tuple[ReadOption, ...]] = ()

    @classmethod
    def option(cls, opts: ReadOptions, name: str) -> Any:
        """The value of the reader option ``name`` this kind declares, as given or its default."""
        declared = next(o for o in cls.read_options if o.name == name)
        return opts.values.get(name, declared.default_for(opts.reader))

    def output_dtype(self: _Stores, opts: ReadOptions) -> np.dtype | None:
        """The dtype a reader returns, or None for Python values (strings come back as lists)."""
        dtype = np.dtype(self.stored().dtype)
        return None if h5py.check_string_dtype(dtype) else dtype

    def windowed(self, row: np.ndarray, opts: ReadOptions) -> np.ndarray:
        """A ragged row brought to a fixed size when the reader asks for one (time series)."""
        return row

    def conversion(self, opts: ReadOptions, stats: dict[str, np.ndarray]) -> Conversion | None:
        """The conversion ``convert`` makes, as steps a reader may compute with its own kernels (the
        torch reader does, on the GPU); None when a kind's ``convert`` is its own code."""
        return Conversion() if type(self).convert is Reading.convert else None

    def convert(
        self, raw: np.ndarray, out: np.ndarray, opts: ReadOptions, stats: dict[str, np.ndarray], axis: int = 1
    ) -> None:
        """Model values of the stored rows ``raw`` into ``out`` (``axis``: the channel axis): the
        kind's ``conversion``. Each step is one IEEE operation per value in float32, so every
        reader that follows the steps returns the same bits."""
        c = self.conversion(opts, stats) or Conversion()
        # widen, then divide float32 by float32 in place: the same values as dividing the raw array
        # (exact IEEE division either way) without numpy's slower mixed-type loop
        np.copyto(out, raw, casting="unsafe")
        if out.dtype.kind != "f":
            return
        if c.scale is not None:
            np.divide(out, out.dtype.type(c.scale), out=out)
        if c.mean is not None and c.std is not None:
            shape = [1] * out.ndim
            shape[axis] = -1
            out -= c.mean.astype(out.dtype).reshape(shape)
            out /= np.where(c.std > 0, c.std, 1).astype(out.dtype).reshape(shape)

"""The core of a field kind: everything kind-specific about one field lives in its kind.

The writer, verify, export, the readers and preview go through a kind's methods and never name a
kind. A kind module defines its spec model (a strict pydantic ``FieldModel`` with a ``kind``
literal) and a ``FieldKind`` subclass; heavy decoders (Pillow, ...) are imported inside ``decode``
only, so the read side never loads them.

``FieldKind`` is the core every kind implements: spec, raw files, decode, stored layout, stacking,
and reading as ``Reading`` says. What only some kinds do is a capability class a kind inherits and
the generic code asks for with ``isinstance``: ``Statistics``/``ClassCounts`` (statistics),
``RowIndex`` (index), ``Preview`` (preview), ``SharedInputs`` (shared), ``SampleParts`` (parts),
``Plugins`` (plugins: ``init`` detectors and demo folders).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import struct
import types
import warnings
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    BinaryIO,
    ClassVar,
    Generic,
    Iterator,
    TypeVar,
    Union,
    get_args,
    get_origin,
)

import h5py
import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from h5forge._format.arrays import Ragged, Stored
from h5forge.kinds.reading import Reading
from h5forge._samples import Reject, SampleRef

if TYPE_CHECKING:
    from h5forge.spec import DatasetSpec


log = logging.getLogger("h5forge.kinds")


@contextmanager
def warnings_logged(where: str) -> Iterator[list[warnings.WarningMessage]]:
    """The warnings a decoding library raises inside the block, logged with the input they concern
    instead of printed; the block may read them (the list it is given) for a rejection's reason."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    for w in caught:
        log.info("%s: %s: %s", where, w.category.__name__, w.message)


STORED = "stored"  # validation context of a spec read from a dataset file (spec_from_json)


BOOL_FOR_NUMBER = "bool_for_number"  # the error type of a number given as true/false


def _members(annotation: Any) -> list[Any]:
    """The types a value of ``annotation`` may be: a union's members, ``Annotated`` unwrapped."""
    if get_origin(annotation) is Annotated:
        return _members(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for arg in get_args(annotation) for m in _members(arg)]
    return [annotation]


def bool_for_number(value: Any, annotation: Any) -> str | None:
    """Where ``value`` holds a bool that ``annotation`` would take as a number (pydantic's lax mode
    reads true as 1 and false as 0): ``""`` for the value itself, ``"[k]"`` for an item of a
    mapping or a sequence; None when it holds none."""
    members = _members(annotation)
    if isinstance(value, bool):
        return "" if bool not in members and (int in members or float in members) else None
    for member in members:
        origin, args = get_origin(member), get_args(member)
        if isinstance(value, dict) and origin is dict and len(args) == 2:
            items: list[tuple[Any, Any, Any]] = [(k, v, args[1]) for k, v in value.items()]
        elif isinstance(value, (list, tuple)) and origin in (list, tuple, set, frozenset) and args:
            if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
                items = [(i, v, t) for i, (v, t) in enumerate(zip(value, args))]
            else:
                items = [(i, v, args[0]) for i, v in enumerate(value)]
        else:
            continue
        for key, item, wanted in items:
            where = bool_for_number(item, wanted)
            if where is not None:
                return f"[{key}]{where}"
    return None


class StrictModel(BaseModel):
    """The base of every spec model (the dataset spec's sections and each kind's field model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        """A number given as true/false is refused, never read as 1 or 0 (``keep: true``). The
        error's type is ``BOOL_FOR_NUMBER`` and its ``key`` the field's name, which the spec's
        error message adds to the location (h5forge.spec)."""
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                if name in data and (where := bool_for_number(data[name], field.annotation)) is not None:
                    raise PydanticCustomError(
                        BOOL_FOR_NUMBER,
                        "expected a number, got true/false{where}",
                        {"key": name, "where": f" at {where}" if where else ""},
                    )
        return data


class FieldModel(StrictModel):
    """A field's spec model: each kind's narrows ``kind`` to its name (a Literal), which picks the
    model in the spec's union of the registered kinds' models."""

    kind: str


M = TypeVar("M", bound=FieldModel)
S = TypeVar("S")  # a kind's spec: its FieldModel, or what a column a kind writes beside itself needs


def field_of(dataset: "DatasetSpec", name: str, model: type[M]) -> M:
    """The spec of the field ``name``, which the asking kind's ``check_spec`` made sure is a ``model``
    (a mask's image field)."""
    spec = dataset.fields[name]
    assert isinstance(spec, model), f"fields.{name} is a {spec.kind}"
    return spec


# a field's raw files: one glob, or several (e.g. one per picture format), relative to source.root
Globs = str | tuple[str, ...]


@dataclass(frozen=True)
class Decoded:
    """One field of one sample, cleaned."""

    value: Any  # the stored value: an array of ``Stored.shape`` or a scalar
    sha256: str | None = None  # of the raw file it came from
    context: Any = None  # what later fields of the same sample need (an image's geometry, ...)


def stored_as(values: np.ndarray, dtype: str, path: str, unit: str = "value") -> np.ndarray:
    """``values`` in ``dtype``, which must hold each of them: an integer dtype whole numbers in its
    range and no NaN/inf (``astype`` would wrap 40000 to -25536 and cut 1.7 to 1), a float dtype
    every finite value finite (float32 would store 1e39 as inf). Anything else rejects the sample;
    NaN/inf the values already hold are the caller's rule (a field's ``nonfinite``)."""
    target = np.dtype(dtype)
    if target.kind in "iu":
        if values.dtype.kind == "f":
            if bad := int(np.count_nonzero(~np.isfinite(values))):
                raise Reject(path, f"{bad} NaN/inf {unit}(s), which {target} cannot hold; set dtype: float32")
            whole = np.array_equal(values, np.round(values))
        else:
            whole = True
        limits = np.iinfo(target)
        if values.size and (not whole or values.min() < limits.min or values.max() > limits.max):
            raise Reject(
                path, f"values {values.min():g}..{values.max():g} are not {target} integers; set dtype: float32"
            )
        return values.astype(target, copy=False)
    stored = values.astype(target, copy=False)
    if values.dtype.kind == "f" and target.itemsize < values.dtype.itemsize and np.isinf(stored).any():
        if over := int(np.count_nonzero(np.isinf(stored) & np.isfinite(values))):
            raise Reject(
                path,
                f"{over} {unit}(s) beyond {target}'s range (±{np.finfo(target).max:.4g}), "
                f"which {target} would store as inf",
            )
    return stored


DEFAULT_MAX_BYTES = 256 << 20  # a raw file larger than this is rejected before it is read


def read_source(root: Path, rel: str, max_bytes: int = DEFAULT_MAX_BYTES, head: int | None = None) -> tuple[bytes, str]:
    """The bytes of a raw file and their sha256; a file that cannot be read, is not a regular file,
    or holds more than ``max_bytes`` rejects the sample, without reading more than that.
    ``head``: only the first ``head`` bytes (where a header is), and no hash."""
    try:
        # O_NONBLOCK: opening a FIFO waits for a writer that may never come; a regular file ignores it
        with os.fdopen(os.open(os.path.join(root, rel), os.O_RDONLY | os.O_NONBLOCK), "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise Reject(rel, "not a regular file (a device, pipe or socket)")
            if st.st_size > max_bytes:
                raise Reject(
                    rel, f"file is {st.st_size:,} bytes, larger than the field's limit of {max_bytes:,} (max_bytes)"
                )
            data = read_at_most(fh, st.st_size, max_bytes) if head is None else fh.read(head)
    except OSError as err:
        raise Reject(rel, f"cannot read file: {err.strerror or err}") from None
    if head is not None:
        return data, ""
    if len(data) > max_bytes:
        raise Reject(rel, f"file grew past the field's limit of {max_bytes:,} bytes (max_bytes) while being read")
    return data, hashlib.sha256(data).hexdigest()


def read_at_most(fh: BinaryIO, size: int, max_bytes: int) -> bytes:
    """At most ``max_bytes + 1`` bytes of ``fh``, whose ``fstat`` gave ``size``, even if it grows or
    reports no size (procfs). The first request is ``size + 1`` bytes: a buffered read allocates
    what it is asked for."""
    data = fh.read(min(size, max_bytes) + 1)
    if len(data) > size:
        data += fh.read(max_bytes + 1 - len(data))
    return data


class Outside:
    """Where a path really is, when a symlink (of the file or a folder above it) leads out of
    ``root``; each folder is resolved once, so a file costs at most one lstat."""

    def __init__(self, root: Path):
        self.base = os.path.realpath(root)
        self.inside = self.base.rstrip("/") + "/"
        self.folders: dict[str, str | None] = {}  # folder -> its real path, None when inside root

    def __call__(self, path: str, is_link: bool | None = None) -> str | None:
        if is_link if is_link is not None else os.path.islink(path):
            real = os.path.realpath(path)
            return None if real == self.base or real.startswith(self.inside) else real
        return self.in_folder(*os.path.split(path))

    def in_folder(self, folder: str, name: str) -> str | None:
        """Where ``name``, no symlink itself, really is when ``folder`` leads out of ``root``."""
        if folder not in self.folders:
            real = os.path.realpath(folder)
            self.folders[folder] = None if real == self.base or real.startswith(self.inside) else real
        real_folder = self.folders[folder]
        return None if real_folder is None else os.path.join(real_folder, name)


def read_bounded(path: Path, max_bytes: int, root: Path | None = None, allow_outside: bool = True) -> bytes:
    """The bytes of an annotation file or sidecar, read as ``read_source`` reads pictures (a regular
    file, at most ``max_bytes``) and, with ``root`` unless ``allow_outside``, not through a symlink
    out of the source folder. FileNotFoundError when missing; ValueError saying why it is refused."""
    if root is not None and not allow_outside and (target := Outside(root)(str(path))) is not None:
        raise ValueError(
            f"symlink leads outside the source folder (to {target}); set source.allow_symlinks_outside: true to take it"
        )
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: a FIFO never waits for a writer
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ValueError("not a regular file (a folder, device, pipe or socket)")
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > max_bytes:
            raise ValueError(f"{st.st_size:,} bytes, larger than the limit of {max_bytes:,}")
        data = read_at_most(fh, st.st_size, max_bytes)
    if len(data) > max_bytes:
        raise ValueError(f"grew past the limit of {max_bytes:,} bytes while being read")
    return data


class FieldKind(Reading, ABC, Generic[S]):
    """One field of a dataset, bound to its spec. A kind must say how it is stored (``stored``) and
    how one sample is cleaned (``decode``); the other methods have defaults it overrides as needed.
    A kind registered in ``h5forge.kinds.REGISTRY`` also has ``kind`` and ``Spec``, and the
    conformance suite (tests/kinds/conformance) runs against it."""

    kind: ClassVar[str]
    Spec: ClassVar[type[FieldModel]]
    # a sample array: verify compares it with its re-cleaned source and times its reads (a row's
    # checksum covers every stored value; format-1 checksums cover only these fields)
    checksummed: ClassVar[bool] = True
    reads_folders: ClassVar[bool] = False  # a "file" may also be a folder (e.g. a DICOM series per case)
    layout_doc: ClassVar[str] = ""  # its stored form, for docs/format.md

    def __init__(self, name: str, spec: S, dataset: "DatasetSpec"):
        self.name = name
        self.spec = spec
        self.dataset = dataset

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # ---- spec ------------------------------------------------------------------------------
    @classmethod
    def check_spec(cls, name: str, spec: S, dataset: "DatasetSpec") -> None:
        """Raise ValueError naming the key when the field cannot work with the rest of the spec."""

    @property
    def path(self) -> str:
        """The dataset's name inside a split group."""
        return self.name

    @property
    def files(self) -> tuple[str, ...]:
        """The globs of its raw files (relative to the source root); empty when it has none."""
        files = getattr(self.spec, "files", None)
        return () if files is None else (files,) if isinstance(files, str) else tuple(files)

    @property
    def id_suffix(self) -> str | None:
        """An end of its file stems that is not part of the sample id (``0001x4.png``: ``x4``)."""
        return getattr(self.spec, "id_suffix", None)

    def companions(self) -> dict[str, "FieldKind"]:
        """Columns the field writes beside itself, by dataset path (e.g. a CT case's voxel spacing)."""
        return {}

    @property
    def annotation_column(self) -> str | None:
        """The annotation column this dataset stores as is (discovery's ``SampleRef.columns``)."""
        return None

    @property
    def after(self) -> tuple[str, ...]:
        """Fields of the same sample decoded before this one (their ``Decoded.context`` is needed)."""
        return ()

    # ---- storage ---------------------------------------------------------------------------
    @abstractmethod
    def stored(self) -> Stored:
        """The stored form of one sample: shape, dtype, fixed or ragged, codec."""

    def dataset_attrs(self) -> dict[str, Any]:
        """Attributes of the field's dataset besides its kind."""
        return {}

    def stack(self, values: list[Any]) -> Any:
        """One block of stored rows from per-sample values (a Ragged for a ragged field)."""
        st = self.stored()
        if st.ragged:
            return Ragged.of(values, st.shape, st.dtype)
        if h5py.check_string_dtype(np.dtype(st.dtype)):
            return np.asarray(values, dtype=object)
        if not values:
            return np.zeros((0, *st.shape), dtype=st.dtype)
        return np.stack(values).astype(st.dtype, copy=False) if st.shape else np.asarray(values, dtype=st.dtype)

    # ---- ingest ----------------------------------------------------------------------------
    @abstractmethod
    def decode(self, root: Path, ref: SampleRef, done: dict[str, Decoded]) -> Decoded:
        """Clean this field of one sample, or raise Reject with the path and the reason."""

    def files_beside(self, root: Path, rel: str) -> tuple[str, ...]:
        """Files beside the raw file ``rel`` that its decoding reads too (a .npy channel's rate
        sidecar), relative to ``root``: an append moves them with it, and its digest covers them, so
        the raw file's own state (size, times, inode) no longer tells when that changes and the hash
        cache does not answer for it."""
        return ()

    def source_digest(self, root: Path, rel: str) -> str:
        """sha256 of one raw input as ``decode`` hashes it (a kind whose input is a folder overrides
        it); read in blocks, as incremental builds hash every input up front."""
        h = hashlib.sha256()
        with open(root / rel, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()


class Follows:
    """A field that follows the field its spec's ``like`` names, of the kind ``follows`` (a mask
    its image): ``check_spec`` makes sure of that kind, and it is decoded after that field."""

    follows: ClassVar[str]
    spec: Any

    @classmethod
    def check_spec(cls, name: str, spec: Any, dataset: "DatasetSpec") -> None:
        if getattr(dataset.fields.get(spec.like), "kind", None) != cls.follows:
            article = "an" if cls.follows[0] in "aeiou" else "a"
            raise ValueError(f"fields.{name}.like: {spec.like!r} is not {article} {cls.follows} field")

    @property
    def after(self) -> tuple[str, ...]:
        return (self.spec.like,)


class Companion(FieldKind[S]):
    """A column a field writes beside itself (not declared by users): ``<field>_<key>``, the value
    its ``decode`` left in ``Decoded.context[key]``."""

    def __init__(self, owner: FieldKind, key: str, spec: S):
        super().__init__(f"{owner.name}_{key}", spec, owner.dataset)
        self.owner, self.key = owner.name, key

    @property
    def after(self) -> tuple[str, ...]:
        return (self.owner,)

    def decode(self, root: Path, ref: SampleRef, done: dict[str, Decoded]) -> Decoded:
        return Decoded(done[self.owner].context[self.key])


def lossy_format(data: bytes) -> str | None:
    """The name of a lossy picture format a file is in, else None: JPEG, WebP of a VP8 stream, a TIFF
    whose pixels are JPEG or WebP compressed, a JPEG 2000 of the irreversible (9-7) wavelet, AVIF."""
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        at = 12
        while at + 8 <= len(data):  # the chunks: VP8 is lossy, VP8L lossless, VP8X an extended header
            kind, size = data[at : at + 4], int.from_bytes(data[at + 4 : at + 8], "little")
            if kind == b"VP8 ":
                return "lossy WebP"
            at += 8 + size + size % 2
    if data[4:8] == b"ftyp" and data[8:12] in (b"avif", b"avis"):
        return "AVIF"
    if (scheme := _tiff_compression(data)) in _LOSSY_TIFF:
        return f"TIFF of {_LOSSY_TIFF[scheme]} compressed pixels"
    if _irreversible_jpeg2000(data):
        return "JPEG 2000 of the irreversible wavelet"
    return None


# TIFF Compression tag values whose codecs drop detail: old-style and new JPEG, lossy DNG JPEG, WebP
_LOSSY_TIFF = {6: "JPEG", 7: "JPEG", 34892: "JPEG", 50001: "WebP"}


def _tiff_compression(data: bytes) -> int | None:
    """The Compression tag (259) of a TIFF's first page, the one a picture decodes to, or None."""

    order = {b"II": "<", b"MM": ">"}.get(data[:2])
    if order is None:
        return None
    try:
        (magic,) = struct.unpack_from(order + "H", data, 2)
        if magic == 42:  # classic TIFF: 2-byte counts, 12-byte entries
            (at,) = struct.unpack_from(order + "I", data, 4)
            (n,) = struct.unpack_from(order + "H", data, at)
            entries, size, value = at + 2, 12, 8
        elif magic == 43:  # BigTIFF: 8-byte counts and offsets, 20-byte entries
            (at,) = struct.unpack_from(order + "Q", data, 8)
            (n,) = struct.unpack_from(order + "Q", data, at)
            entries, size, value = at + 8, 20, 12
        else:
            return None
        for i in range(min(n, 4096)):
            tag, kind = struct.unpack_from(order + "HH", data, entries + i * size)
            if tag == 259:
                return struct.unpack_from(order + ("H" if kind == 3 else "I"), data, entries + i * size + value)[0]
    except struct.error:  # cut short: the decoder says what is wrong
        return None
    return None


def _irreversible_jpeg2000(data: bytes) -> bool:
    """Whether a JPEG 2000 codestream (bare, or in a JP2 file) is coded with the 9-7 wavelet, which
    never gives the values back (its COD segment's transform byte is 0)."""
    if not (data.startswith(b"\xff\x4f\xff\x51") or data[4:12] == b"jP  \r\n\x87\n"):
        return False
    at = data.find(b"\xff\x4f\xff\x51")  # SOC then SIZ: the main header's segments follow
    if at < 0:
        return False
    at += 2
    while at + 4 <= len(data) and data[at] == 0xFF:
        marker, length = data[at + 1], int.from_bytes(data[at + 2 : at + 4], "big")
        if marker == 0x52:  # COD: Scod, progression, layers (2), MCT, levels, block w, h, style, transform
            return at + 13 < len(data) and data[at + 13] == 0
        if marker == 0x90 or length < 2:  # a tile's start: the main header had no COD
            return False
        at += 2 + length
    return False

"""The contract of a field kind: everything kind-specific about one field lives in its kind.

The writer, thin versions, verify, export, the readers and preview go through these methods and
never name a kind. A kind module defines its spec model (pydantic, strict, with a ``kind``
literal) and a ``FieldKind`` subclass; ``h5forge.kinds`` registers it. Decoding may import heavy
libraries (Pillow, ...) inside ``decode`` only, so that the read side never loads them.

A kind also declares what the layers above it ask for, without importing them (they sit higher):
the ``init`` layouts that recognise it in a raw folder (``detectors``), the demo folders that
show it (``demos``) and the options a reader takes for it (``read_options``). Detectors and demo
generators are named by ``"module:function"`` and loaded by ``init`` and ``demo-data`` when they
run: the dependency points from those layers to the kind, never back.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import warnings
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Mapping

import h5py
import numpy as np
from pydantic import BaseModel, ConfigDict

from h5forge.format.arrays import Ragged, Stored
from h5forge.samples import Reject, SampleRef

if TYPE_CHECKING:
    from h5forge.spec import DatasetSpec


log = logging.getLogger("h5forge.kinds")


@contextmanager
def warnings_logged(where: str) -> Iterator[list[warnings.WarningMessage]]:
    """The warnings a decoding library raises inside the block (pydicom, nibabel, Pillow ...), sent
    to the log with the input they concern instead of printed on the terminal; the block may read
    them (the list it is given) to say in a rejection what the library found."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    for w in caught:
        log.info("%s: %s: %s", where, w.category.__name__, w.message)


STORED = "stored"  # validation context of a spec read from a dataset file (spec_from_json)


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# a field's raw files: one glob, or several (e.g. one per picture format), relative to source.root
Globs = str | tuple[str, ...]


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
    options it declares (``FieldKind.option``); one not given is the option's default."""

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


@dataclass(frozen=True)
class Detector:
    """An ``init`` layout: ``detect(kind, raw, notes, todo) -> Layout | None`` named as
    ``"module:function"``; lower ``priority`` runs first (the first layout found wins)."""

    ref: str
    priority: int
    expects: str  # what it recognises, for the CLI's help and the error when nothing matches

    def load(self) -> Callable[..., Any]:
        return load_ref(self.ref)


@dataclass(frozen=True)
class Layout:
    """What a detector found: the layout's name and the spec's ``fields:`` body (written into the
    ``SpecText`` ``init`` passes), with what the rest of the spec needs to know of it."""

    name: str
    body: Callable[[Any], None]
    ids: str | None = None  # ``ids: path`` when samples are named by their path (class folders)
    split_column: str | None = None
    batch_size: int | None = None  # samples per task, when they are large (volumes)


@dataclass(frozen=True)
class Demo:
    """A demo raw folder for ``h5forge demo-data --kind NAME``: ``generate(root, n, seed, bad,
    **options) -> {path: defect}`` named as ``"module:function"``."""

    name: str
    ref: str
    default_n: int  # enough good samples that the defects stay under a build's max_rejected
    about: str
    noun: str = "samples"  # what the CLI says it wrote
    marker: str | None = None  # a file whose presence means the folder holds this demo (else: any file)

    def load(self) -> Callable[..., dict]:
        return load_ref(self.ref)


def load_ref(ref: str) -> Any:
    """The object ``"package.module:name"`` names."""
    module, _, name = ref.partition(":")
    return getattr(import_module(module), name)


@dataclass(frozen=True)
class Decoded:
    """One field of one sample, cleaned."""

    value: Any  # the stored value: an array of ``Stored.shape`` or a scalar
    sha256: str | None = None  # of the raw file it came from
    context: Any = None  # what later fields of the same sample need (an image's geometry, ...)


DEFAULT_MAX_BYTES = 256 << 20  # a raw file larger than this is rejected before it is read


def read_source(root: Path, rel: str, max_bytes: int = DEFAULT_MAX_BYTES, head: int | None = None) -> tuple[bytes, str]:
    """The bytes of a raw file and their sha256; a file that cannot be read, is not a regular file,
    or holds more than ``max_bytes`` rejects the sample, without reading more than that.
    ``head``: only the first ``head`` bytes (where a header is), and no hash."""
    try:
        # O_NONBLOCK: opening a FIFO waits for a writer that may never come; a regular file ignores it
        with os.fdopen(os.open(root / rel, os.O_RDONLY | os.O_NONBLOCK), "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise Reject(rel, "not a regular file (a device, pipe or socket)")
            if st.st_size > max_bytes:
                raise Reject(
                    rel, f"file is {st.st_size:,} bytes, larger than the field's limit of {max_bytes:,} (max_bytes)"
                )
            data = fh.read(max_bytes + 1 if head is None else head)  # bounded even if the file grows
    except OSError as err:
        raise Reject(rel, f"cannot read file: {err.strerror or err}") from None
    if head is not None:
        return data, ""
    if len(data) > max_bytes:
        raise Reject(rel, f"file grew past the field's limit of {max_bytes:,} bytes (max_bytes) while being read")
    return data, hashlib.sha256(data).hexdigest()


class Outside:
    """Where a path really is, when a symlink (of the file or a folder above it) leads out of
    ``root``. Each folder is resolved once: a file costs one lstat, not one per path component."""

    def __init__(self, root: Path):
        self.base = os.path.realpath(root)
        self.inside = self.base.rstrip("/") + "/"
        self.folders: dict[str, str] = {}

    def __call__(self, path: str) -> str | None:
        folder, name = os.path.split(path)
        real_folder = self.folders.get(folder)
        if real_folder is None:
            real_folder = self.folders[folder] = os.path.realpath(folder)
        real = os.path.realpath(path) if os.path.islink(path) else os.path.join(real_folder, name)
        return None if real == self.base or real.startswith(self.inside) else real


def read_bounded(path: Path, max_bytes: int, root: Path | None = None, allow_outside: bool = True) -> bytes:
    """The bytes of an annotation file or sidecar, read the way pictures are: a regular file only
    (a folder, FIFO or device is refused without waiting or reading), at most ``max_bytes``, and
    (``root``, unless ``allow_outside``) not through a symlink out of the source folder.
    FileNotFoundError when it is missing; ValueError saying why it is refused."""
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
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"grew past the limit of {max_bytes:,} bytes while being read")
    return data


class FieldKind(ABC):
    """One field of a dataset, bound to its spec. A kind must say how it is stored (``stored``) and
    how one sample is cleaned (``decode``); the other methods have defaults it overrides as needed.
    A kind registered in ``h5forge.kinds.REGISTRY`` also has ``kind`` and ``Spec``, and the
    conformance suite (tests/kinds/conformance) runs against it."""

    kind: ClassVar[str]
    Spec: ClassVar[type[BaseModel]]
    detectors: ClassVar[tuple[Detector, ...]] = ()
    demos: ClassVar[tuple[Demo, ...]] = ()
    read_options: ClassVar[tuple[ReadOption, ...]] = ()
    # a sample array: verify compares it with its re-cleaned source and times its reads (a row's
    # checksum covers every stored value; format-1 checksums cover only these fields)
    checksummed: ClassVar[bool] = True
    reads_folders: ClassVar[bool] = False  # a "file" may also be a folder (e.g. a DICOM series per case)
    layout_doc: ClassVar[str] = ""  # its stored form, for docs/format.md

    def __init__(self, name: str, spec: Any, dataset: "DatasetSpec"):
        self.name = name
        self.spec = spec
        self.dataset = dataset

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # ---- spec ------------------------------------------------------------------------------
    @classmethod
    def check_spec(cls, name: str, spec: Any, dataset: "DatasetSpec") -> None:
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

    def input_digest(self, root: Path, ref: SampleRef) -> str | None:
        """sha256 of what decides this field's value besides its own files and the sample's
        annotation record (its entry in a file that all samples share, such as a COCO JSON), or
        None. It is part of the sample's input key, so an incremental build cleans the sample again
        when that entry changes."""
        return None

    def samples_in(self, root: Path, rel: str) -> tuple[str, ...] | None:
        """The samples one raw input of the field holds, as the ends of their ids (a 4-D volume's
        time points: ``@t0000``, ``@t0001``, ...), or None: the input is one sample. Discovery asks
        it of every input, so it reads no more than it takes to count them (a header), and raises
        Reject for an input it cannot count. The samples of one input take the split of the
        input's own id: the parts of a case never straddle train and test."""
        return None

    def sample_digest(self, file_digest: str, ref: SampleRef) -> str:
        """The raw digest of this field of ``ref`` (``Decoded.sha256``) from its input's
        ``source_digest``: the input's own, unless the input holds several samples
        (``samples_in``); each of those then has its own, so that the exactly-once check and the
        input keys tell them apart."""
        return file_digest

    def shared_files(self) -> tuple[str, ...]:
        """Files (relative to the source root) the field reads for many samples, such as a COCO
        annotation file: they belong to the dataset, though to no one sample."""
        return ()

    def shared_entry(self, root: Path, ref: SampleRef) -> Any:
        """What ``decode`` needs of the ``shared_files`` for ``ref`` alone, or None. Discovery puts
        it in ``SampleRef.shared`` (a field that has ``shared_files``), so each cleaning worker gets
        its samples' entries rather than parsing the whole file; ``decode`` reads the files itself
        when the entry is not there (a sample ``verify`` re-derives)."""
        return None

    # ---- shared files in an inbox: found whatever they are called, and split between the
    # samples an append takes (to processed/), refuses (to quarantine/) and leaves waiting
    def shared_files_in(self, folder: Path) -> tuple[str, ...]:
        """The files of ``folder`` (an inbox) that hold this field's records of many samples,
        whatever their names there, relative to it."""
        return ()

    def reading(self, shared: tuple[str, ...]) -> dict[str, Any]:
        """The values of the field's spec that make it read the shared files ``shared``."""
        return {}

    def shared_files_of(self, root: Path, ref: SampleRef) -> tuple[str, ...] | None:
        """The shared files that hold this field's record of ``ref`` (empty: none does yet), or
        None when the field reads no shared file."""
        return None

    def shared_subset(
        self, root: Path, shared: tuple[str, ...], files: set[str], complement: bool = False
    ) -> str | None:
        """One file in the format of ``shared`` holding what they say of the samples whose files
        are ``files`` (``complement``: of every other sample), or None when that is nothing."""
        return None

    def source_digest(self, root: Path, rel: str) -> str:
        """sha256 of one raw input as ``decode`` hashes it (a kind whose input is a folder overrides
        it); read in blocks, as incremental builds hash every input up front."""
        h = hashlib.sha256()
        with open(root / rel, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()

    # ---- statistics (additive, so appends merge them without re-reading rows) ---------------
    def counts(self, block: np.ndarray) -> np.ndarray | None:
        """The additive statistic of a block of stored rows, or None for a kind without one."""
        return None

    def write_stats(self, group: h5py.Group, counts: np.ndarray | None) -> None:
        """Split attributes derived from the split's counts (None: an empty split)."""

    def stored_counts(self, group: h5py.Group) -> np.ndarray | None:
        return None

    def stats_attrs(self) -> tuple[str, ...]:
        """The split-group attributes ``write_stats`` writes (verify checks they exist)."""
        return ()

    def read_stats(self, group: h5py.Group) -> dict[str, np.ndarray]:
        return {}

    def nonfinite(self, group: h5py.Group) -> int:
        """NaN/inf values the split group holds in this field (kept on purpose; the report counts them)."""
        return 0

    # ---- row index (``/index/<split>/<field>``: the rows under each value) -------------------
    indexed: ClassVar[bool] = False

    def row_counts(self, block: Any) -> np.ndarray:
        """(n, ...) the additive statistic of each row of an ``indexed`` kind (its totals are sums)."""
        raise NotImplementedError

    def index_values(self, row_counts: np.ndarray) -> list[list]:
        """For each row, the values it is listed under, from its ``row_counts``."""
        raise NotImplementedError

    # ---- reading ---------------------------------------------------------------------------
    @classmethod
    def option(cls, opts: ReadOptions, name: str) -> Any:
        """The value of the reader option ``name`` this kind declares, as given or its default."""
        declared = next(o for o in cls.read_options if o.name == name)
        return opts.values.get(name, declared.default_for(opts.reader))

    def output_dtype(self, opts: ReadOptions) -> np.dtype | None:
        """The dtype a reader returns, or None for Python values (strings come back as lists)."""
        return np.dtype(self.stored().dtype)

    def windowed(self, row: np.ndarray, opts: ReadOptions) -> np.ndarray:
        """A ragged row brought to a fixed size when the reader asks for one (time series)."""
        return row

    def conversion(self, opts: ReadOptions, stats: dict[str, np.ndarray]) -> Conversion | None:
        """The conversion ``convert`` makes, as steps a reader may compute with its own kernels (the
        torch reader does, on the GPU); None when a kind's ``convert`` is its own code."""
        return Conversion() if type(self).convert is FieldKind.convert else None

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

    # ---- preview ---------------------------------------------------------------------------
    def preview(self, value: Any) -> np.ndarray | None:
        """An (H, W, 3) uint8 picture of one stored value, or None when the kind draws nothing."""
        return None

    @property
    def overlay_on(self) -> str | None:
        """The field whose preview this one is painted over (a mask over its image), or None for a
        picture of its own. An overlay's preview has its target's shape; its black pixels are
        transparent."""
        return None

    def caption(self, value: Any) -> str | None:
        """A short text shown under a preview tile."""
        return None

    def preview_of(self, values: Mapping[str, Any]) -> np.ndarray | None:
        """``preview`` of this field in one sample, given every stored value of that sample by
        dataset path (companion columns included): a kind whose picture needs them (a volume drawn
        at its voxel spacing) reads them here."""
        return self.preview(values[self.path])

    def caption_of(self, values: Mapping[str, Any]) -> str | None:
        """``caption`` of this field in one sample, given every stored value of that sample."""
        return self.caption(values[self.path])

    def preview_parts(self, values: Mapping[str, Any]) -> dict[str, tuple[int, int, int, int]]:
        """Named regions of ``preview_of``'s picture, (left, top, width, height) in its pixels (a
        volume's three planes); the sheet reports where each landed."""
        return {}

    @property
    def preview_tiles(self) -> int:
        """How many tiles wide the box its picture is fitted into on the sheet (one picture of
        three planes side by side needs three to show each plane at a readable size)."""
        return 1

    def legend(self) -> list[tuple[str, tuple[int, int, int]]]:
        """(text, colour) of each colour its preview paints, when the colours need naming (the
        classes of a multi-class mask); the sheet draws them under the samples."""
        return []

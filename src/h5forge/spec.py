"""Dataset spec: the YAML a user writes, validated by pydantic.

Relative paths in a spec are resolved against the folder holding the spec file, so a build gives
the same result whatever the current directory is.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    GetCoreSchemaHandler,
    GetPydanticSchema,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import CoreSchema

from h5forge.errors import SpecError
from h5forge._format.codecs import CodecName
from h5forge._format.names import RESERVED
from h5forge.kinds import REGISTRY
from h5forge.kinds.base import BOOL_FOR_NUMBER, STORED, FieldModel
from h5forge.kinds.base import StrictModel as _Strict


def _registered_models(_: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
    """The registered kinds' spec models, one picked by the field's ``kind``."""
    return handler.generate_schema(Annotated[Union[tuple(k.Spec for k in REGISTRY.values())], Discriminator("kind")])


# a field's spec: the model of the kind its ``kind`` names in the registry, validated as the
# registered models' union, built when ``DatasetSpec`` is first used (``defer_build``) so that
# importing this module loads no kind; to a type checker a FieldModel
FieldSpec = Annotated[FieldModel, GetPydanticSchema(_registered_models)]

ColumnType = Literal["str", "int", "float", "bool"]


class Annotations(_Strict):
    file: str | None = Field(
        None, description="JSON list, JSON Lines (.jsonl) or CSV (.csv) of records, relative to source.root"
    )
    id_key: str = Field("id", description="record key naming the sample (id or file name)")
    columns: dict[str, ColumnType] = Field(default_factory=dict)
    required: bool = Field(True, description="a sample without a record is rejected")
    index_by: list[str] = Field(default_factory=list, description="columns to build index arrays for")
    folders: dict[str, int] = Field(
        default_factory=dict, description="columns from a sample's folders: -1 its own, -2 the one above"
    )
    max_bytes: int = Field(256 << 20, gt=0, description="a larger annotation file is refused unread")

    @model_validator(mode="after")
    def _index_columns_exist(self) -> "Annotations":
        for col in [*self.index_by, *self.folders]:
            if col not in self.columns:
                raise ValueError(f"column {col!r} is not declared in columns")
        for col, k in self.folders.items():
            if k >= 0:
                raise ValueError(f"folders.{col}: {k} must be negative (-1 is the file's own folder)")
        return self


class Source(_Strict):
    root: Path
    inbox: Path | None = Field(None, description="folder new samples are dropped into (append/watch)")
    ids: Literal["stem", "path"] = Field(
        "stem", description="a sample's id: its files' stem, or their path below the glob's fixed folders"
    )
    allow_symlinks_outside: bool = Field(False, description="take files symlinks lead to outside the source folder")


class Append(_Strict):
    settle_seconds: float = Field(2.0, ge=0, description="a file must be this old (mtime) to be taken")
    batch_window_seconds: float = Field(5.0, ge=0, description="watch: changes gathered into one append")
    poll_seconds: float = Field(15.0, gt=0, description="watch: without events, re-check the inbox this often")


DEFAULT_RATIOS: dict[Literal["train", "val", "test"], float] = {"train": 0.8, "val": 0.1, "test": 0.1}


class Splits(_Strict):
    ratios: dict[Literal["train", "val", "test"], float] = Field(default_factory=lambda: dict(DEFAULT_RATIOS))
    seed: str = Field("h5forge", description='changing it reshuffles every split (0 and "0" are one seed)')
    column: str | None = Field(None, description="take the split from this annotation column")

    @field_validator("seed", mode="before")
    @classmethod
    def _whole_number_seed(cls, v: object) -> object:
        # YAML reads ``seed: 0`` as an int; its text is the seed, so both spellings split alike
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("ratios")
    @classmethod
    def _sum_to_one(cls, v: dict[str, float]) -> dict[str, float]:
        if not all(math.isfinite(r) for r in v.values()):  # NaN passes every comparison below
            raise ValueError("split ratios must be finite numbers")
        if any(r < 0 for r in v.values()):
            raise ValueError("split ratios must be >= 0")
        if abs(sum(v.values()) - 1.0) > 1e-6:
            raise ValueError(f"split ratios must sum to 1, got {sum(v.values()):g}")
        return v


class Storage(_Strict):
    codec: CodecName = "lz4"
    chunk_rows: int = Field(1, ge=1, le=4096)
    assemble: Literal["copy", "mapped"] = Field(
        "copy", description="copy into one self-contained file, or map the workers' row files (docs/spec.md)"
    )

    @field_validator("assemble", mode="before")
    @classmethod
    def _assemble_alias(cls, v: Any) -> Any:
        return "mapped" if v == "segments" else v


class Output(_Strict):
    dir: Path
    keep: int = Field(5, ge=1, description="published versions to keep")
    allow_removals: bool = Field(False, description="a build may publish a version without samples latest holds")
    retire_after_seconds: float = Field(
        600, ge=0, description="retention deletes a version only this long after a newer one (docs/reading.md)"
    )


class Compute(_Strict):
    dask_address: str | None = Field(None, description="tcp://host:port of an existing scheduler")
    workers: int = Field(2, ge=1, description="LocalCluster worker processes")
    batch_size: int | None = Field(None, ge=1, description="samples per dask task; unset: 2 MiB of them, 64 to 1024")
    in_flight: int = Field(0, ge=0, description="batches in flight; 0 means 2 per worker")
    inline_below: int = Field(
        256, ge=0, description="fewer samples (or, no field ragged, 4 MiB of them) are cleaned in-process"
    )
    secure: bool = Field(True, description="the LocalCluster talks TLS with temporary credentials (docs/security.md)")

    @field_validator("workers")
    @classmethod
    def _workers_fit_the_machine(cls, workers: int, info: ValidationInfo) -> int:
        if info.data.get("dask_address") is None and workers > (most := workers_this_machine_holds()):
            cpus, memory = machine_size()
            raise ValueError(
                f"{workers} LocalCluster processes are more than this machine can hold (at most {most}: "
                f"{WORKERS_PER_CPU} per CPU of its {cpus}, and {WORKER_MEMORY >> 20} MiB of its "
                f"{memory / 2**30:.1f} GiB of memory each); use a dask cluster (compute.dask_address) for more"
            )
        return workers


WORKERS_PER_CPU = 4  # cleaning is CPU-bound: more processes than this per CPU only queue
WORKER_MEMORY = 256 << 20  # a worker process with a few batches of images in flight


def machine_size() -> tuple[int, int]:
    """CPUs this process may use, and the machine's memory in bytes."""
    import os

    return len(os.sched_getaffinity(0)), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def workers_this_machine_holds() -> int:
    cpus, memory = machine_size()
    return max(1, min(WORKERS_PER_CPU * cpus, memory // WORKER_MEMORY))


class Verification(_Strict):
    resample: int = Field(16, ge=0, description="stored samples re-cleaned from their sources")
    latency_reads: int = Field(200, ge=0)


def rejected_limit_value(v):
    """``max_rejected`` as given: an int is a count, a float in [0, 1] a fraction, 'N%' a percentage
    (true/false never reaches here: ``StrictModel`` refuses a bool for a number)."""
    if isinstance(v, str):
        text = v.strip()
        try:
            number = float(text[:-1]) / 100 if text.endswith("%") else int(text) if text.isdigit() else float(text)
        except ValueError:
            raise ValueError(f"{v!r} is neither a count (12), a fraction (0.1) nor a percentage ('10%')") from None
        if text.endswith("%") and not 0 <= number <= 1:
            raise ValueError("a percentage must be between 0 % and 100 %")
        v = number
    if isinstance(v, int):
        if v < 0:
            raise ValueError("must be a count >= 0, a fraction (0.1) or a percentage ('10%')")
        return v
    if isinstance(v, float):
        if not 0 <= v <= 1:
            raise ValueError(f"a fraction must be between 0 and 1, got {v:g} (a count is written as an integer)")
        return v
    raise ValueError(f"{v!r} is neither a count (12), a fraction (0.1) nor a percentage ('10%')")


class DatasetSpec(_Strict):
    model_config = ConfigDict(defer_build=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    source: Source
    fields: dict[str, FieldSpec]
    annotations: Annotations = Annotations()
    splits: Splits = Splits()
    storage: Storage = Storage()
    output: Output
    compute: Compute = Compute()
    verify: Verification = Verification()
    append: Append = Append()
    duplicates: Literal["keep_first", "keep_all"] = Field(
        "keep_first", description="samples of identical raw content: keep the first (in id order), or all"
    )
    max_rejected: float | int = Field(
        0.1, description="rejected inputs a build may publish with: a fraction (0.1), '10%' or a count (12)"
    )

    @field_validator("max_rejected", mode="before")
    @classmethod
    def _rejected_limit(cls, v):
        return rejected_limit_value(v)

    @model_validator(mode="after")
    def _check_fields(self) -> "DatasetSpec":
        if not self.fields:
            raise ValueError("fields: at least one field is needed")
        for name, f in self.fields.items():
            if name in RESERVED:
                raise ValueError(f"fields.{name}: name is reserved")
            REGISTRY[f.kind].check_spec(name, f, self)
        if not any(getattr(f, "files", None) for f in self.fields.values()):
            raise ValueError("fields: at least one field must be read from files")
        if self.splits.column and self.splits.column not in self.annotations.columns:
            raise ValueError(f"splits.column: {self.splits.column!r} is not an annotation column")
        return self

    def rejected_limit(self, seen: int) -> int:
        """How many of ``seen`` inputs may be rejected: a fraction rounds down, but a fraction above
        0 allows at least one (10 % of 9 inputs must not mean that one bad input fails the build)."""
        if isinstance(self.max_rejected, int):
            return self.max_rejected
        share = int(self.max_rejected * seen + 1e-9)
        return max(share, 1) if self.max_rejected > 0 else 0

    def in_flight(self) -> int:
        return self.compute.in_flight or 2 * self.compute.workers

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


def _format_errors(err: ValidationError, origin: str) -> str:
    lines = [f"invalid spec {origin}:"]
    for e in err.errors():
        loc = [*e["loc"], e["ctx"]["key"]] if e["type"] == BOOL_FOR_NUMBER else e["loc"]
        key = ".".join(str(p) for p in loc if not str(p).startswith("function-after"))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "union_tag_invalid" and e["ctx"]["tag"] in REGISTRY.broken:
            msg = f"kind {e['ctx']['tag']!r}: {REGISTRY.broken[e['ctx']['tag']]}"
        lines.append(f"  {key or '<root>'}: {msg}")
    return "\n".join(lines)


def parse_spec(data: dict, base: Path, origin: str = "<dict>") -> DatasetSpec:
    """Validate a spec dict; relative paths are taken against ``base``."""
    if not isinstance(data, dict):
        raise SpecError(f"invalid spec {origin}: the top level must be a mapping")
    try:
        spec = DatasetSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(_format_errors(err, origin)) from None

    def absolute(p: Path | None) -> Path | None:
        return None if p is None else (base / _in_home(p)).resolve()

    return spec.model_copy(
        update={
            "source": spec.source.model_copy(
                update={"root": absolute(spec.source.root), "inbox": absolute(spec.source.inbox)}
            ),
            "output": spec.output.model_copy(update={"dir": absolute(spec.output.dir)}),
        }
    )


class _KeyTwice(yaml.YAMLError):
    pass


class _SpecLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (the plain loader keeps the last
    one without a word: two ``output:`` sections, two fields of one name). Keys a merge (``<<: *a``)
    brings in may still be overridden by the mapping's own."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: the plain loader says so
                continue
            if first is not key_node:
                lines = sorted({first.start_mark.line + 1, key_node.start_mark.line + 1})
                where = f"lines {lines[0]} and {lines[1]}" if len(lines) == 2 else f"line {lines[0]}"
                raise _KeyTwice(f"key {key!r} is given twice ({where})")
        return super().construct_mapping(node, deep)


def _in_home(p: Path) -> Path:
    """``~/data`` is in the home folder, as a shell reads it, never a folder named ``~``."""
    return p.expanduser() if str(p).startswith("~") else p


def load_spec(
    path: str | Path,
    output: str | Path | None = None,
    dask_address: str | None = None,
    inbox: str | Path | None = None,
) -> DatasetSpec:
    """Read a YAML spec; ``output`` and ``dask_address`` override the file (CLI flags)."""
    path = _in_home(Path(path))
    if not path.is_file():
        raise SpecError(f"spec file not found: {path}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_SpecLoader)
    except UnicodeDecodeError as err:
        raise SpecError(f"spec {path} is not UTF-8 text: {err}") from None
    except yaml.YAMLError as err:
        raise SpecError(f"spec {path} is not valid YAML: {err}") from None
    spec = parse_spec(data, path.parent.resolve(), str(path))
    return override(spec, output=output, dask_address=dask_address, inbox=inbox)


def override(
    spec: DatasetSpec,
    output: str | Path | None = None,
    dask_address: str | None = None,
    inbox: str | Path | None = None,
) -> DatasetSpec:
    update: dict = {}
    if inbox is not None:
        update["source"] = spec.source.model_copy(update={"inbox": _in_home(Path(inbox)).resolve()})
    if output is not None:
        update["output"] = spec.output.model_copy(update={"dir": _in_home(Path(output)).resolve()})
    if dask_address is not None:
        update["compute"] = spec.compute.model_copy(update={"dask_address": dask_address})
    return spec.model_copy(update=update) if update else spec


def spec_from_json(text: str) -> DatasetSpec:
    """Rebuild a spec stored in a dataset file (paths there are already absolute); the context tells
    the fields' models it was stored by a build (which may hold what a new spec may not ask for)."""
    try:
        return DatasetSpec.model_validate(json.loads(text), context={STORED: True})
    except ValidationError as err:  # a kind not installed here, or one that did not load
        raise SpecError(_format_errors(err, "stored in the dataset")) from None

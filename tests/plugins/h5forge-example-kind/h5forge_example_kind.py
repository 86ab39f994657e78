"""``kind: vector``: a fixed-length numeric vector per sample (a precomputed embedding, a row of
features), read from a ``.npy`` file holding one 1-D array.

    fields:
      features: {kind: vector, files: "features/*.npy", length: 16}

A field kind that lives outside h5forge: this module defines it whole (spec model, decoding, stored
layout, its ``init`` layout and its demo folder), and the package's ``h5forge.kinds`` entry point
registers it. It imports only h5forge's kind contract (the core in ``h5forge.kinds.base``, the
capabilities it opts into in ``h5forge.kinds.plugins`` and ``h5forge.kinds.preview``,
``h5forge.samples``) and numpy, which the read side has.
"""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from h5forge.kinds.base import Decoded, FieldKind, FieldModel, Stored, read_source
from h5forge.kinds.plugins import Demo, Detector, Layout, Plugins
from h5forge.kinds.preview import Preview
from h5forge.samples import Reject, SampleRef

FOLDER = "features"  # what the init layout and the demo folder call the vectors' folder
SAMPLED = 50  # files init reads to find the length


class VectorField(FieldModel):
    """A vector per sample, from a .npy file."""

    kind: Literal["vector"] = "vector"
    files: str = Field(description="glob of the .npy files, one 1-D array per sample")
    length: int = Field(gt=0, le=1 << 20, description="values in each vector; another length rejects the sample")
    dtype: Literal["float32", "float64", "int32", "int64"] = "float32"


class VectorKind(Plugins, Preview, FieldKind[VectorField]):
    kind = "vector"
    Spec = VectorField
    detectors = (Detector(f"{__name__}:detect", 45, f"{FOLDER}/*.npy vectors of one length"),)
    demos = (Demo("vectors", f"{__name__}:generate", 40, f"{FOLDER}/*.npy vectors", noun="vectors", marker=FOLDER),)
    layout_doc = "(N, length) of the spec's dtype, one vector per sample"

    def stored(self) -> Stored:
        return Stored((self.spec.length,), np.dtype(self.spec.dtype), bulk=True)

    def decode(self, root: Path, ref: SampleRef, done: dict[str, Decoded]) -> Decoded:
        rel = ref.files[self.name]
        data, sha256 = read_source(root, rel, max_bytes=4096 + 8 * self.spec.length)  # a header, the values
        try:
            values = np.load(io.BytesIO(data), allow_pickle=False)
            if values.shape != (self.spec.length,):
                raise ValueError(f"its shape is {values.shape}")
            return Decoded(values.astype(self.spec.dtype, casting="same_kind"), sha256)
        except (ValueError, TypeError) as err:  # not a .npy, another shape, values of another kind
            raise Reject(rel, f"not a .npy vector of {self.spec.length} {self.spec.dtype} values: {err}") from None

    def caption(self, value: Any) -> str | None:
        return f"|v| {float(np.linalg.norm(value)):.3g}"


def detect(kind: type[VectorKind], raw: Path, notes: list[str], todo: list[str]) -> Layout | None:
    """``init``'s layout for a ``features/`` folder of .npy vectors: the length most of them have."""
    lengths: Counter[int] = Counter()
    for p in sorted((raw / FOLDER).glob("*.npy"))[:SAMPLED]:
        try:
            shape = np.load(p, mmap_mode="r", allow_pickle=False).shape
        except (ValueError, OSError):
            continue
        if len(shape) == 1:
            lengths[shape[0]] += 1
    if not lengths:
        return None  # no vectors: another layout may take the folder
    ((length, count),) = lengths.most_common(1)
    if count < lengths.total():
        notes.append(
            f"{lengths.total() - count} sampled {FOLDER}/*.npy vectors are not {length} long: they will be rejected"
        )

    def body(t: Any) -> None:
        t(0, "fields:")
        t(1, f"{FOLDER}:")
        t(2, f"kind: {kind.kind}")
        t(2, f'files: "{FOLDER}/*.npy"')
        t(2, f"length: {length}", f"the length of {count} of the sampled vectors")

    return Layout("vectors", body)


def generate(root: str | Path, n: int = 40, seed: int = 0, bad: bool = True, prefix: str = "v") -> dict[str, str]:
    """A demo folder ``features/<id>.npy`` of ``n`` float32 vectors of 16 values; with ``bad``, two
    defects (a vector of another length, a file that is no .npy). Returns {path: defect}."""
    folder = Path(root) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        np.save(folder / f"{prefix}{i:04d}.npy", rng.standard_normal(16).astype(np.float32))
    if not bad:
        return {}
    np.save(folder / f"{prefix}short.npy", rng.standard_normal(5).astype(np.float32))
    (folder / f"{prefix}text.npy").write_text("not an array")
    return {f"{FOLDER}/{prefix}short.npy": "wrong length", f"{FOLDER}/{prefix}text.npy": "not a .npy file"}

"""What makes two builds of the same inputs the same version, wherever they ran: every value and
attribute of the file, stored chunks byte for byte, except what says where, when and how it was
built (the output folder and compute settings in the stored spec, the creation time, the timings in
/diagnostics, and the file digest, which covers those).

``identity(path)`` keeps the parts a failed comparison should name apart: ids, row checksums and
split digests per split, the data definition of the stored spec, then every other dataset and
attribute as a sha256 of its canonical bytes (h5forge._format.checksums.canonical) and, for a
chunked dataset of fixed-size values, of its stored chunks in order (variable-length strings' chunks
hold addresses in the file's heap, so those compare by value).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import h5py

from h5forge._format.checksums import canonical, data_definition
from h5forge._format.names import CHECKSUM, DIAGNOSTICS, IDS, SPEC, SPLITS, Attr

# where, when and how a version was built: the same inputs built elsewhere differ here only
BUILD_CIRCUMSTANCES = {"/": {Attr.CREATED, Attr.FILE_DIGEST}, f"/{DIAGNOSTICS}": {"summary"}}
# dimension scales' object references: addresses inside each file, as the checksums also leave them out
REFERENCES = {"DIMENSION_LIST", "REFERENCE_LIST"}


def _stored_chunks(ds: h5py.Dataset) -> str:
    """sha256 of the dataset's stored chunks in the file's chunk order, with their offsets and filter masks."""
    h = hashlib.sha256()
    for i in range(ds.id.get_num_chunks()):
        offset = ds.id.get_chunk_info(i).chunk_offset
        mask, data = ds.id.read_direct_chunk(offset)
        h.update(repr((offset, mask, len(data))).encode())
        h.update(data)
    return h.hexdigest()


def identity(path: str | Path) -> dict:
    out: dict = {"ids": {}, "checksums": {}, "digests": {}, "objects": {}}
    with h5py.File(path, "r") as f:
        for split in SPLITS:
            out["ids"][split] = [v.decode() if isinstance(v, bytes) else v for v in f[split][IDS][()].tolist()]
            out["checksums"][split] = [v.decode() if isinstance(v, bytes) else v for v in f[split][CHECKSUM][()].tolist()]
            out["digests"][split] = str(f[split].attrs[Attr.DIGEST])
        out["data_definition"] = data_definition(f[SPEC][()]).decode()

        def attrs(name: str, obj) -> dict:
            skipped = REFERENCES | BUILD_CIRCUMSTANCES.get(name, set())
            return {k: hashlib.sha256(canonical(obj.attrs[k])).hexdigest() for k in sorted(obj.attrs) if k not in skipped}

        out["objects"]["/"] = {"attrs": attrs("/", f)}

        def visit(name: str, obj) -> None:
            key = f"/{name}"
            entry: dict = {"attrs": attrs(key, obj)}
            if isinstance(obj, h5py.Dataset):
                entry["dtype"], entry["shape"] = str(obj.dtype), obj.shape
                if obj.chunks is not None and obj.dtype.kind != "O":  # variable-length: chunks hold heap addresses
                    entry["chunks"] = _stored_chunks(obj)
                if key != f"/{SPEC}":  # compared as its data definition above
                    entry["values"] = hashlib.sha256(canonical(obj[()])).hexdigest()
            out["objects"][key] = entry

        f.visititems(visit)
    return out


def stored_fingerprint(path) -> dict:
    """What must not depend on how the rows reached the writer: per split, the digest, the ids,
    the row checksums and the stored chunk bytes of the images."""
    out = {}
    with h5py.File(path, "r") as f:
        for split in SPLITS:
            g = f[split]
            out[split] = (
                str(g.attrs["digest"]),
                g["ids"][()].tolist(),
                g["checksum"][()].tolist(),
                [g["images"].id.read_direct_chunk((r, 0, 0, 0))[1] for r in range(g["images"].shape[0])],
            )
    return out

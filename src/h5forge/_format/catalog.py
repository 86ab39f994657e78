"""The inputs catalog every version carries (``/inputs``, laid out in ``names.LAYOUT``): what it
was built from, findable without reading its rows. A nightly rebuild or a resumed build takes a
stored row wherever its sample key is unchanged; an append tests its new samples against the sorted
content and id hashes (binary search) instead of reading every id and raw-file hash of the parent.
"""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass

import h5py
import numpy as np

from h5forge._format.mapped import read_all
from h5forge._format.names import IDS, SOURCE_SHA256, SPLITS

INPUTS = "inputs"
KEY_ATTR = "key"
RULES_ATTR = "rules"
DIGEST_ATTR = "digest"
SAMPLE = "sample"
KEY = np.dtype("S32")
ID_KEY = np.dtype("S16")
ROW_BITS = 40


def sample_keys_path(split: str) -> str:
    """Absolute path of a split's per-row sample keys."""
    return f"/{INPUTS}/{split}/{SAMPLE}"


def content_digest(hexes) -> bytes:
    """One sample's raw content: the sha256 of its raw-file hashes, in field order."""
    return hashlib.sha256("".join(h.decode() if isinstance(h, bytes) else h for h in hexes).encode()).digest()


def id_digest(sample_id: str | bytes) -> bytes:
    """The hash of an id in NFC: ids are matched as discovery matches them, so ``café`` typed on
    macOS (NFD) and elsewhere (NFC) is one id to the exactly-once check."""
    text = sample_id.decode() if isinstance(sample_id, bytes) else sample_id
    nfc = text if text.isascii() else unicodedata.normalize("NFC", text)
    return hashlib.sha256(nfc.encode()).digest()[:16]


def location(split: str, row: int) -> int:
    return SPLITS.index(split) << ROW_BITS | row


def split_row(at: int) -> tuple[str, int]:
    return SPLITS[at >> ROW_BITS], at & ((1 << ROW_BITS) - 1)


@dataclass
class Catalog:
    """Sorted content digests (with where each sample is) and sorted id digests."""

    content: np.ndarray  # (M,) S32, sorted
    content_at: np.ndarray  # (M,) int64, aligned with content
    ids: np.ndarray  # (M,) S16, sorted

    @classmethod
    def of(cls, contents: list[bytes], at: list[int] | np.ndarray, ids: list[bytes]) -> "Catalog":
        content = np.array(contents, dtype=KEY)
        order = np.argsort(content, kind="stable")
        return cls(content[order], np.asarray(at, np.int64).reshape(-1)[order], np.sort(np.array(ids, dtype=ID_KEY)))

    def find_content(self, digest: bytes) -> int | None:
        """The location of a sample with this raw content, or None."""
        q = np.array([digest], dtype=KEY)
        i = int(np.searchsorted(self.content, q)[0])
        return int(self.content_at[i]) if i < len(self.content) and self.content[i] == q[0] else None

    def has_id(self, digest: bytes) -> bool:
        q = np.array([digest], dtype=ID_KEY)
        i = int(np.searchsorted(self.ids, q)[0])
        return i < len(self.ids) and self.ids[i] == q[0]

    def merged(self, newer: "Catalog", shift: dict[str, int]) -> "Catalog":
        """This catalog plus ``newer``'s, whose rows come after ``shift[split]`` rows of each split."""
        at = newer.content_at.copy()
        for k, split in enumerate(SPLITS):
            at[(at >> ROW_BITS) == k] += shift.get(split, 0)
        where = np.searchsorted(self.content, newer.content)
        content = np.insert(self.content, where, newer.content)
        content_at = np.insert(self.content_at, where, at)
        ids = np.insert(self.ids, np.searchsorted(self.ids, newer.ids), newer.ids)
        return Catalog(content, content_at, ids)


def catalog_digest(catalog: Catalog) -> str:
    """sha256 of the catalog's arrays (little-endian locations, the hashes as stored)."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(catalog.content, KEY).tobytes())
    h.update(np.ascontiguousarray(catalog.content_at, "<i8").tobytes())
    h.update(np.ascontiguousarray(catalog.ids, ID_KEY).tobytes())
    return h.hexdigest()


def catalog_intact(f: h5py.File, catalog: Catalog) -> bool | None:
    """Whether the catalog read from ``f`` is the one written (None: a file without the digest)."""
    stored = f[INPUTS].attrs.get(DIGEST_ATTR)
    return None if stored is None else str(stored) == catalog_digest(catalog)


def catalog_from_rows(f: h5py.File) -> Catalog:
    """The catalog of a self-contained file, from its stored ids and raw-file hashes."""
    contents: list[bytes] = []
    at, ids = [], []
    for k, split in enumerate(SPLITS):
        g = f[split]
        hashes = np.asarray(read_all(g[SOURCE_SHA256]))
        split_ids = read_all(g[IDS])
        if hashes.size and hashes.dtype == np.dtype("S64") and bool((np.char.str_len(hashes) == 64).all()):
            # every hash whole: a row's hashes joined are its bytes side by side (content_digest's text)
            joined = np.ascontiguousarray(hashes).view(f"S{64 * hashes.shape[1]}").reshape(-1)
            contents += [hashlib.sha256(row).digest() for row in joined.tolist()]
        else:
            contents += [content_digest(row) for row in hashes]
        at.append((k << ROW_BITS) | np.arange(len(split_ids), dtype=np.int64))
        ids += [id_digest(s) for s in split_ids]
    return Catalog.of(contents, np.concatenate(at), ids)


def read_catalog(f: h5py.File) -> Catalog | None:
    """The file's catalog, or None for a file that has none (written by an h5forge without catalogs)."""
    g = f.get(INPUTS)
    if g is None or "content" not in g:
        return None
    return Catalog(g["content"][()], g["content_at"][()], g["ids"][()])


def write_catalog(f: h5py.File, catalog: Catalog, key: str = "", rules: str = "") -> None:
    g = f.require_group(INPUTS)
    for name, data in (("content", catalog.content), ("content_at", catalog.content_at), ("ids", catalog.ids)):
        if name in g:
            del g[name]
        g.create_dataset(name, data=data)
    g.attrs[KEY_ATTR] = key
    g.attrs[RULES_ATTR] = rules
    g.attrs[DIGEST_ATTR] = catalog_digest(catalog)


def create_sample_keys(f: h5py.File, chunk_rows: int = 4096) -> None:
    """Empty, resizable per-split sample-key datasets (the writer extends them as rows are written)."""
    for split in SPLITS:
        f.require_group(f"{INPUTS}/{split}").create_dataset(
            SAMPLE, shape=(0,), maxshape=(None,), dtype=KEY, chunks=(chunk_rows,)
        )


def input_key(f: h5py.File) -> tuple[str, str]:
    """(input key, rules hash) a file was built from; empty strings when unknown."""
    g = f.get(INPUTS)
    if g is None:
        return "", ""
    return str(g.attrs.get(KEY_ATTR, "")), str(g.attrs.get(RULES_ATTR, ""))


def sample_keys(f: h5py.File, split: str, rows: int | None = None) -> np.ndarray:
    """The first ``rows`` (all by default) sample keys of a split; empty when the file has none."""
    path = sample_keys_path(split)
    if path not in f:
        return np.zeros(0, KEY)
    ds = f[path]
    return ds[: ds.shape[0] if rows is None else min(rows, ds.shape[0])]

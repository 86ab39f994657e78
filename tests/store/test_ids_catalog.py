"""Ids are unique and the exactly-once catalog (``/inputs``) is verified: a flipped bit in
``/inputs/ids`` (or its content hashes) makes ``verify`` say BROKEN; an append refuses a new
sample whose id the dataset holds, even when the parent's catalog was damaged; a version with
two rows of one id is BROKEN, naming the id and its rows."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

import h5forge
from h5forge._format.catalog import id_digest
from h5forge._format.layout import decode_str
from h5forge._format.names import SPLITS
from h5forge._store.verify import verify_file
from tests.helpers.data import REPO, age_files, drop_samples
from tests.helpers.files import make_raw
from tests.store.test_verify_trust import resign

QUICK = dict(resample=0, latency_reads=0)


def spec_file(tmp_path: Path, raw: Path) -> Path:
    data = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    data["source"] = {"root": str(raw), "inbox": str(tmp_path / "inbox")}
    data["output"] = {"dir": str(tmp_path / "out")}
    data["fields"]["images"]["size"] = [64, 64]
    data["append"] = {"settle_seconds": 0}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def built(tmp_path):
    raw = make_raw(tmp_path / "raw", n=12, seed=1)
    spare = make_raw(tmp_path / "spare", n=8, seed=8)  # other pictures under the same ids
    spec = spec_file(tmp_path, raw)
    path = Path(h5forge.build(spec).path)
    path.chmod(0o644)  # published read-only; these tests damage it on purpose
    return spec, path, spare


def flip_bit(path: Path, dataset: str, index: int, byte: int = 0) -> None:
    with h5py.File(path, "r+") as f:
        ds = f[dataset]
        value = bytearray(ds[index].tobytes() if hasattr(ds[index], "tobytes") else ds[index])
        value[byte] ^= 0x01
        ds[index] = np.frombuffer(bytes(value), dtype=ds.dtype)[0] if ds.dtype.kind != "S" else bytes(value)


@pytest.mark.parametrize("dataset", ["inputs/ids", "inputs/content", "inputs/content_at"])
def test_a_flipped_bit_in_the_catalog_is_broken(built, dataset):
    _, path, _ = built
    assert verify_file(path, **QUICK).ok
    flip_bit(path, dataset, 3, byte=5 if dataset != "inputs/content_at" else 0)
    report = verify_file(path, **QUICK)
    assert not report.ok
    assert report.checks["inputs catalog"] == "FAILED"
    assert any(f"/{dataset}" in e for e in report.errors), report.errors


def test_append_refuses_an_id_the_dataset_holds_even_over_a_damaged_catalog(built):
    spec, path, spare = built
    with h5py.File(path, "r") as f:
        ids = sorted(i for s in SPLITS for i in decode_str(f[s]["ids"][()]))
        catalog = f["inputs/ids"][()]
    taken = ids[5]
    at = int(np.flatnonzero(catalog == np.array([id_digest(taken)], dtype="S16"))[0])
    flip_bit(path, "inputs/ids", at, byte=5)  # the exactly-once check's record of that id, damaged
    inbox = spec.parent / "inbox"
    drop_samples(spare, inbox, [taken])
    age_files(inbox)
    result = h5forge.append(spec)
    assert result.version is None and result.added == 0
    [rej] = result.rejections
    assert rej.sample_id == taken and "already in the dataset with other content" in rej.reason


def test_two_rows_with_one_id_are_broken(built, tmp_path):
    _, path, _ = built
    with h5py.File(path, "r+") as f:
        g = f["train"]
        ids = decode_str(g["ids"][()])
        g["ids"][1] = ids[0]  # every checksum and digest recomputed below: only uniqueness sees it
    resign(path)
    report = verify_file(path, **QUICK)
    assert not report.ok
    assert f"id {ids[0]!r} is in 2 rows: train[0], train[1]" in report.errors

"""The split digest covers what defines the data (fields, rules, splits), not where or how a
version was built: the same inputs built into another folder, from a copy of the raw folder, on a
dask cluster, with other compute, verify, retention and append settings give the same digests.
Files written before the rule (``digest_rule`` absent: the whole stored spec) still verify."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import h5py
import pytest
from distributed import LocalCluster

import h5forge
from h5forge._format.names import SPLITS
from h5forge.spec import DatasetSpec
from h5forge._store.verify import verify_file
from tests.helpers.files import make_raw

QUICK = dict(resample=0, latency_reads=0)
OLD = Path(__file__).parent / "fixtures" / "digest_rule1.h5.gz"  # written by h5forge before digest_rule existed


def spec_data(raw: Path, out: Path, **parts) -> dict:
    return {"name": "cells", "source": {"root": str(raw)}, "output": {"dir": str(out)},
            "fields": {"images": {"kind": "image", "files": "images/*.png", "size": [64, 64]},
                       "masks": {"kind": "mask", "files": "masks/*.png", "like": "images"}},
            "annotations": {"file": "annotations.json", "columns": {"label": "str"}, "index_by": ["label"]},
            "splits": {"ratios": {"train": 0.6, "val": 0.2, "test": 0.2}}, **parts}


def split_attrs(path: str) -> dict[str, tuple[str, str]]:
    with h5py.File(path, "r") as f:
        return {s: (str(f[s].attrs["digest"]), f[s]["checksum"][()].tobytes().hex()) for s in SPLITS}


def test_the_same_inputs_give_the_same_digest_in_another_folder_and_on_another_cluster(tmp_path):
    raw = make_raw(tmp_path / "raw", n=24, seed=5)
    here = h5forge.build(DatasetSpec.model_validate(spec_data(raw, tmp_path / "out")))
    moved = tmp_path / "elsewhere" / "raw copy"
    shutil.copytree(raw, moved)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        there = h5forge.build(DatasetSpec.model_validate(spec_data(
            moved, tmp_path / "elsewhere" / "out", source={"root": str(moved), "inbox": str(tmp_path / "inbox")},
            compute={"dask_address": cluster.scheduler_address, "batch_size": 5, "workers": 1},
            verify={"resample": 2, "latency_reads": 3}, append={"settle_seconds": 9},
            output={"dir": str(tmp_path / "elsewhere" / "out"), "keep": 2, "retire_after_seconds": 5})))
    assert here.counts == there.counts and sum(here.counts.values()) == 24
    with h5py.File(here.path, "r") as a, h5py.File(there.path, "r") as b:
        assert json.loads(a["meta/spec"][()])["output"] != json.loads(b["meta/spec"][()])["output"]
        assert all(a[s].attrs["digest_rule"] == 2 for s in SPLITS)
    assert split_attrs(here.path) == split_attrs(there.path)


def test_what_defines_the_data_changes_the_digest(tmp_path):
    raw = make_raw(tmp_path / "raw", n=12, seed=5)
    one = h5forge.build(DatasetSpec.model_validate(spec_data(raw, tmp_path / "a")))
    data = spec_data(raw, tmp_path / "b")
    data["fields"]["images"]["fill"] = 9  # a field rule: every padded pixel changes
    other = h5forge.build(DatasetSpec.model_validate(data))
    assert all(split_attrs(one.path)[s][0] != split_attrs(other.path)[s][0] for s in SPLITS)


def old_file(tmp_path: Path) -> Path:
    path = tmp_path / "old.h5"
    path.write_bytes(gzip.decompress(OLD.read_bytes()))
    return path


def rewrite_spec(path: Path, change) -> None:
    with h5py.File(path, "r+") as f:
        spec = json.loads(f["meta/spec"][()])
        change(spec)
        del f["meta/spec"]
        f.create_dataset("meta/spec", data=json.dumps(spec), dtype=h5py.string_dtype())


def test_a_file_written_before_the_rule_still_verifies_under_its_own_rule(tmp_path):
    path = old_file(tmp_path)
    with h5py.File(path, "r") as f:
        assert all("digest_rule" not in f[s].attrs for s in SPLITS)
    report = verify_file(path, **QUICK)
    assert report.ok, report.errors
    assert report.checks["split digests"] == "ok (3 splits)"
    rewrite_spec(path, lambda spec: spec["output"].update(dir="/somewhere/else"))
    report = verify_file(path, **QUICK)  # its digests covered the whole spec, and still do
    assert not report.ok
    assert sum("do not match the split's digest" in e for e in report.errors) == 3


def test_an_unknown_digest_rule_is_reported(tmp_path):
    path = old_file(tmp_path)
    with h5py.File(path, "r+") as f:
        f["val"].attrs["digest_rule"] = 7
    report = verify_file(path, **QUICK)
    assert not report.ok
    assert report.errors == [
        "/val has digest_rule 7, not one this h5forge knows (1 to 2); "
        "a newer h5forge may have written it: verify it with that version"
    ]


def test_an_unknown_file_digest_rule_is_reported_as_such_not_as_damage(tmp_path):
    """An older verify meeting a newer h5forge's file digest names the rule it does not know."""
    path = old_file(tmp_path)
    with h5py.File(path, "r+") as f:  # the fixture predates file digests: give it one of rule 3
        f.attrs["file_digest"] = "0" * 64
        f.attrs["file_digest_rule"] = 3
    report = verify_file(path, **QUICK)
    assert not report.ok
    assert report.checks["file digest"] == "FAILED"
    assert report.errors == [
        "the file has file_digest_rule 3, not one this h5forge knows (1 to 2); "
        "a newer h5forge may have written it: verify it with that version"
    ]


@pytest.mark.parametrize("where", ["output", "compute", "source"])
def test_where_or_how_in_the_stored_spec_is_outside_the_digest_and_the_rest_inside(tmp_path, where):
    raw = make_raw(tmp_path / "raw", n=6, seed=5)
    path = Path(h5forge.build(DatasetSpec.model_validate(spec_data(raw, tmp_path / "out"))).path)
    copy = tmp_path / "copy.h5"
    shutil.copy(path, copy)
    copy.chmod(0o644)
    place = {"output": lambda s: s["output"].update(dir="/elsewhere"),
             "compute": lambda s: s["compute"].update(dask_address="tcp://10.0.0.9:8786"),
             "source": lambda s: s["source"].update(root="/mnt/raw")}[where]
    rewrite_spec(copy, place)
    report = verify_file(copy, **QUICK)  # the split digests leave it out; the file digest covers the spec as stored
    assert report.checks["split digests"] == "ok (3 splits)" and report.checks["file digest"] == "FAILED"
    rewrite_spec(copy, lambda s: s["splits"].update(seed="other"))
    report = verify_file(copy, **QUICK)
    assert not report.ok and sum("do not match the split's digest" in e for e in report.errors) == 3

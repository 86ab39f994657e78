"""The build flow end to end on a real Prefect API, a real dask LocalCluster and real PNGs."""

import json
import os

import h5py
import numpy as np
import pytest
from prefect.artifacts import Artifact

from h5forge._ingest.clean import clean_sample
from h5forge._ingest.discover import SampleRef
from h5forge._format.layout import decode_str
from h5forge.read import index_rows
from h5forge._ingest.splits import assign_split
from h5forge._store.versions import LATEST, latest, output_lock
from tests.helpers.data import demo_spec, write_spec_file

pytestmark = pytest.mark.e2e  # the session's real Prefect server

DEFECTS = {
    "bad_truncated": "corrupt or truncated image",
    "bad_empty": "empty file (0 bytes)",
    "bad_notimage": "not an image",
    "bad_mask128": "mask values [0, 128] not allowed",
    "bad_masksize": "mask is 50x60 (HxW)",
    "bad_bomb": "decompression bomb",
    "bad_nomask": "incomplete sample: no file for masks",
    "bad_noimage": "incomplete sample: no file for images",
    "bad_orphan_record": "annotation record without files",
    "bad_noannotation": "no annotation record",
}


@pytest.fixture(scope="module")
def built(prefect_server, raw_demo, tmp_path_factory):
    from h5forge.flows.build import build_dataset

    tmp = tmp_path_factory.mktemp("flow")
    spec_file = write_spec_file(raw_demo, tmp / "out", tmp / "spec.yaml", inline_below=0)  # clean on dask
    first = build_dataset(str(spec_file))
    second = build_dataset(str(spec_file))
    return tmp / "out", spec_file, first, second


def test_publishes_a_verified_version_with_every_good_sample(built, raw_demo):
    out, _, first, _ = built
    assert first.version == 1 and sum(first.counts.values()) == 40
    assert os.readlink(out / LATEST) == "dataset_v0001.h5"  # the second build found nothing new
    assert first.health["checksums"] == "ok (40 samples)"
    with h5py.File(out / "dataset_v0001.h5", "r") as f:
        assert json.loads(f["diagnostics"].attrs["summary"])["timings"]["cleaned_in"] == "LocalCluster(2)"
    with h5py.File(out / "dataset_v0001.h5", "r") as f:
        assert f.attrs["format"] == "h5forge" and f.attrs["version"] == 1 and f.attrs["codec"] == "lz4"
        assert "hdf5plugin" in f.attrs["codec_needs"]
        spec = demo_spec(raw_demo, out)
        for split in ("train", "val", "test"):
            g = f[split]
            ids = decode_str(g["ids"][()])
            assert ids == sorted(ids)
            assert all(assign_split(i, spec.splits) == split for i in ids)
            assert g["images"].shape == (len(ids), 3, 224, 224) and g["images"].chunks == (1, 3, 224, 224)
            assert g.attrs["count"] == len(ids)
            assert g.attrs["images_mean"].shape == (3,) and 0 < g.attrs["images_mean"][0] < 1
        g = f["train"]
        row = 3
        sid = decode_str(g["ids"][row:row + 1])[0]
        files = decode_str(g["source_files"][row])
        records = {r["id"]: r for r in json.loads((raw_demo / "annotations.json").read_text())}
        columns = {c: records[sid][c] for c in spec.annotations.columns}
        arrays, hashes = clean_sample(spec, raw_demo, SampleRef(sid, "train", dict(zip(spec.fields, files)), columns))
        assert np.array_equal(arrays["images"], g["images"][row])
        assert np.array_equal(arrays["masks"], g["masks"][row])
        assert decode_str(g["source_sha256"][row]) == hashes
        assert decode_str(g["meta/label"][()]) == [records[i]["label"] for i in decode_str(g["ids"][()])]
        assert g["meta/num_cells"][row] == records[sid]["num_cells"]
        infected = index_rows(f, "train", "label", "infected")
        labels = decode_str(g["meta/label"][()])
        assert infected.tolist() == [i for i, lab in enumerate(labels) if lab == "infected"]
        stored = json.loads(f["meta/spec"][()].decode())
        assert stored["storage"]["codec"] == "lz4"


def test_every_defect_is_quarantined_with_its_reason(built):
    out, _, first, _ = built
    assert first.rejected == len(DEFECTS)
    rows = json.loads((out / "quarantine" / "dataset_v0001.rejections.json").read_text())
    reasons = {r["sample_id"]: r["reason"] for r in rows}
    assert set(reasons) == set(DEFECTS)
    for sid, words in DEFECTS.items():
        assert words in reasons[sid], (sid, reasons[sid])
    with h5py.File(out / "dataset_v0001.h5", "r") as f:
        table = f["diagnostics/rejections"][()]
        assert table.shape == (len(DEFECTS), 4)
        summary = json.loads(f["diagnostics"].attrs["summary"])
        assert 0 < summary["compression_ratio"] < 1


def test_same_raw_data_and_spec_publish_nothing_new(built):
    out, _, first, second = built
    assert second.unchanged and second.version == 1 and second.path == first.path
    assert not (out / "dataset_v0002.h5").exists()
    assert sorted(p.name for p in out.glob("dataset_v*.h5")) == ["dataset_v0001.h5"]


def test_health_reports_and_artifacts(built):
    out, _, _, _ = built
    health = json.loads((out / "reports" / "dataset_v0001.health.json").read_text())
    assert health["ok"] is True and health["stats"]["counts"]["train"] > 0
    assert "HEALTHY" in (out / "reports" / "dataset_v0001.health.md").read_text()
    md = Artifact.get("demo-health")
    assert md.type == "markdown" and "HEALTHY" in md.data
    table = Artifact.get("demo-rejections")
    assert {r["sample_id"] for r in json.loads(table.data)} == set(DEFECTS)
    splits = json.loads(Artifact.get("demo-splits").data)
    assert sum(r["samples"] for r in splits) == 40


def test_a_concurrent_build_fails_and_leaves_latest_alone(built):
    from h5forge.flows.build import build_dataset

    out, spec_file, _, _ = built
    with output_lock(out, what="another build"):
        state = build_dataset(str(spec_file), return_state=True)
    assert state.is_failed()
    assert "another h5forge run is writing to" in repr(state.result(raise_on_failure=False))
    assert latest(out) == 1

"""A full build starts its LocalCluster while it discovers, cleans on it, and verifies the
candidate's checksums on its workers: the version is the one a build cleaned in one process makes
(ids, checksums, digests, stored chunks), every row is checked, and a build that will not clean
everything on a cluster starts none ahead."""

from __future__ import annotations

import json


import h5forge
from h5forge._ingest.discover import at_least
from h5forge._pipeline.build import cleans_everything
from h5forge.spec import DatasetSpec
from h5forge._store import verify
from tests.helpers.data import demo_spec
from tests.helpers.version_identity import stored_fingerprint


def _on_cluster(spec: DatasetSpec, out) -> DatasetSpec:
    data = spec.model_dump(mode="json")
    data["output"]["dir"] = str(out)
    data["compute"].update(inline_below=0, workers=2, batch_size=4)
    return DatasetSpec.model_validate(data)



def test_a_build_verifies_on_the_workers_it_started_ahead_and_equals_one_cleaned_in_process(
    tmp_path, raw_demo, monkeypatch
):
    monkeypatch.setattr(verify, "EXECUTOR_ROWS", 1)  # 40 rows: shared among the workers all the same
    base = demo_spec(raw_demo, tmp_path / "here")
    inline = h5forge.build(base)  # 40 samples, under inline_below: no cluster
    assert inline.timings["cleaned_in"] == "calling process"
    assert "cluster_started_ahead_seconds" not in inline.timings
    spread = h5forge.build(_on_cluster(base, tmp_path / "there"))
    assert spread.timings["cleaned_in"] == "LocalCluster(2)" and spread.timings["cluster_started_ahead_seconds"] > 0
    health = json.loads((tmp_path / "there" / "reports" / "dataset_v0001.health.json").read_text())
    assert health["stats"]["checksum_processes"] == 2  # the two dask workers, this process none
    assert health["stats"]["checksums_checked"] == sum(spread.counts.values()) == 40
    assert spread.counts == inline.counts
    assert stored_fingerprint(spread.path) == stored_fingerprint(inline.path)


def test_only_a_build_that_cleans_everything_on_a_cluster_starts_one_ahead(tmp_path, raw_demo):
    base = demo_spec(raw_demo, tmp_path / "out")
    assert at_least(base, 1) and at_least(base, 40) and not at_least(base, 10_000)
    assert not cleans_everything(base)  # fewer inputs than compute.inline_below
    spec = _on_cluster(base, tmp_path / "out")
    assert cleans_everything(spec)
    h5forge.build(spec)
    assert not cleans_everything(spec)  # a rebuild takes the unchanged rows: it may clean a few, in process

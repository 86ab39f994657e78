"""A build that will clean on a LocalCluster (a full build, or one resuming a killed build with
enough inputs left beyond its durable rows) starts the cluster while it discovers, cleans on it,
and verifies the candidate's checksums on its workers: the version is the one a build cleaned in
one process makes (ids, checksums, digests, stored chunks), every row is checked, and a build that
will not clean on a cluster starts none ahead."""

from __future__ import annotations

import json

import pytest

import h5forge
from h5forge._ingest import parallel
from h5forge._ingest.discover import at_least
from h5forge._pipeline.build import cleans_on_a_cluster
from h5forge.spec import DatasetSpec
from h5forge._store import verify
from tests.helpers.data import demo_spec
from tests.helpers.files import make_raw
from tests.helpers.version_identity import stored_fingerprint
from tests.ingest.incremental.test_rebuild import assert_same, build, nightly_spec
from tests.ingest.incremental.test_take_over import killed_build


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


def test_only_a_build_that_cleans_on_a_cluster_starts_one_ahead(tmp_path, raw_demo):
    base = demo_spec(raw_demo, tmp_path / "out")
    assert at_least(base, 1) and at_least(base, 40) and not at_least(base, 10_000)
    assert not cleans_on_a_cluster(base)  # fewer inputs than compute.inline_below
    spec = _on_cluster(base, tmp_path / "out")
    assert cleans_on_a_cluster(spec)
    h5forge.build(spec)
    assert not cleans_on_a_cluster(spec)  # a rebuild takes the unchanged rows: it may clean a few, in process


@pytest.mark.parametrize("inline_below", [10, 30])
def test_a_resume_starts_its_cluster_ahead_when_the_inputs_left_need_one(tmp_path, monkeypatch, inline_below):
    """A killed build made 96 of 120 inputs durable: its successor cleans 24 on a cluster started
    ahead when 24 is at least ``inline_limit`` (10), and in process, with none started, when not (30)."""
    monkeypatch.setattr(parallel, "INLINE_BYTES", 0)  # inline_limit is compute.inline_below itself
    raw = make_raw(tmp_path / "raw", n=120, seed=3)
    killed_build(raw, tmp_path / "out")
    spec = nightly_spec(raw, tmp_path / "out")
    spec = spec.model_copy(update={"compute": spec.compute.model_copy(update={"inline_below": inline_below})})
    path, result = build(spec)
    assert result.timings["resumed_in_place"] == 96 and result.timings["cleaned"] == 24
    if inline_below == 10:
        assert result.timings["cleaned_in"] == "LocalCluster(2)"
        assert result.timings["cluster_started_ahead_seconds"] > 0
    else:
        assert result.timings["cleaned_in"] == "calling process"
        assert "cluster_started_ahead_seconds" not in result.timings
    fresh, _ = build(nightly_spec(raw, tmp_path / "fresh"))
    assert_same(path, fresh)

"""The Prefect artifacts and health report files of build, append and verify runs, read back from
the session's Prefect server: titled with the version as published, rejections whole, sizes in units,
and the rebuild's diff against the version before it; a build's rejections table stays bounded."""

import json
import re

import h5py
import pytest
import yaml
from prefect.artifacts import Artifact

from tests.helpers.data import age_files, drop_samples, write_spec_file

pytestmark = pytest.mark.e2e

NAME = "artifact-check"  # a dataset name of its own: artifact keys are per dataset name
RELABELLED = "cell_000007"
SIZE = re.compile(r"\d+(\.\d)? (bytes|kB|MB|GB)")


@pytest.fixture(scope="module")
def runs(prefect_server, raw_demo, raw_new, tmp_path_factory):
    """v1 built, then the weekly verification, then v2 appended, then one raw sample relabelled and
    v3 rebuilt; the artifacts after each."""
    import shutil

    from h5forge.flows.append import append_samples
    from h5forge.flows.build import build_dataset
    from h5forge.flows.verify import verify_dataset

    tmp = tmp_path_factory.mktemp("artifacts")
    raw = tmp / "raw"
    shutil.copytree(raw_demo, raw)
    spec = write_spec_file(raw, tmp / "out", tmp / "spec.yaml", inbox=tmp / "inbox")
    spec.write_text(yaml.safe_dump({**yaml.safe_load(spec.read_text()), "name": NAME, "max_rejected": 0.25}))
    keys = [f"{NAME}-health", f"{NAME}-rejections", f"{NAME}-splits"]
    build_dataset(str(spec))
    built = {k: Artifact.get(k) for k in keys}
    verify_dataset(str(spec))
    weekly = Artifact.get(f"{NAME}-verify")
    drop_samples(raw_new, tmp / "inbox", [f"cell_{i:06d}" for i in range(3)], rename="new_")
    age_files(tmp / "inbox")
    appended = append_samples(str(spec))
    assert appended.version == 2, appended
    after_append = {k: Artifact.get(k) for k in keys}
    records = json.loads((raw / "annotations.json").read_text())
    record = next(r for r in records if r["id"] == RELABELLED)
    record["label"] = next(c for c in ("healthy", "infected", "dividing") if c != record["label"])
    (raw / "annotations.json").write_text(json.dumps(records))
    assert build_dataset(str(spec)).version == 3
    return tmp / "out", built, weekly, after_append, Artifact.get(f"{NAME}-diff")


def test_health_artifact_and_files_name_the_published_version(runs):
    out, built, _, after_append, _ = runs
    health = built[f"{NAME}-health"]
    assert health.type == "markdown" and health.description == f"health report of dataset_v0001.h5 ({NAME})"
    assert health.data.startswith("# Health report: dataset\\_v0001.h5\n\n**HEALTHY**")
    assert ".partial" not in health.data and "```" not in health.data
    assert re.search(r"^\| file size \| \d+\.\d MB \|$", health.data, re.M)
    assert "| samples | train 30, val 4, test 6 \\(40 in all\\) |" in health.data
    md = (out / "reports" / "dataset_v0001.health.md").read_text()
    assert md.startswith("# Health report: dataset\\_v0001.h5")
    assert json.loads((out / "reports" / "dataset_v0001.health.json").read_text())["path"] == str(
        out / "dataset_v0001.h5")
    appended = after_append[f"{NAME}-health"]
    assert appended.description == f"health report of dataset_v0002.h5 ({NAME})"
    assert appended.data.startswith("# Health report: dataset\\_v0002.h5") and ".partial" not in appended.data


def test_rejections_artifact_keeps_the_stage_and_the_whole_reason(runs):
    out, built, _, _, _ = runs
    table = built[f"{NAME}-rejections"]
    rows = json.loads(table.data)
    assert table.description == f"10 rejected input(s) of dataset_v0001.h5 ({NAME})"
    assert all(list(r) == ["sample_id", "path", "stage", "reason"] for r in rows)
    quarantined = json.loads((out / "quarantine" / "dataset_v0001.rejections.json").read_text())
    assert [(r["sample_id"], r["stage"], r["reason"]) for r in rows] == [
        (q["sample_id"], q["stage"], q["reason"]) for q in quarantined]
    assert {r["stage"] for r in rows} == {"discover", "clean"}
    bomb = next(r for r in rows if r["sample_id"] == "bad_bomb")
    assert bomb["reason"] == ("decompression bomb: header declares 40000x40000 = 1,600,000,000 pixels, "
                              "limit is 64,000,000 (max_pixels)")


def test_splits_artifact_gives_sizes_with_units(runs):
    out, built, _, after_append, _ = runs
    table = built[f"{NAME}-splits"]
    assert table.description == f"samples and stored size per split of dataset_v0001.h5 ({NAME})"
    rows = json.loads(table.data)
    assert [r["split"] for r in rows] == ["train", "val", "test"]
    assert all(list(r) == ["split", "samples", "stored"] and SIZE.fullmatch(r["stored"]) for r in rows)
    with h5py.File(out / "dataset_v0001.h5", "r") as f:
        assert [r["samples"] for r in rows] == [int(f[s].attrs["count"]) for s in ("train", "val", "test")]
    assert sum(r["samples"] for r in json.loads(after_append[f"{NAME}-splits"].data)) == 43


def test_weekly_verification_names_the_version_it_checked(runs):
    out, _, weekly, _, _ = runs
    assert weekly.description == f"full verification of dataset_v0001.h5 ({NAME})"
    assert weekly.data.startswith("# Health report: dataset\\_v0001.h5\n\n**HEALTHY**")
    assert (out / "reports" / "dataset_v0001.weekly.health.md").read_text().startswith(
        "# Health report: dataset\\_v0001.h5")


def test_the_rebuild_publishes_the_diff_against_the_previous_version(runs):
    *_, diff = runs  # the ids and names in it are text, escaped (h5forge._format.markdown)
    assert diff is not None and diff.type == "markdown"  # the rebuild's (v0002 -> v0003); v1 had none
    assert diff.data.startswith("# Changes: v0002 → v0003")
    assert "| labels/columns changed | 1 |" in diff.data and "| cell\\_000007 | meta/label |" in diff.data
    assert "| added | 0 |" in diff.data


def test_the_rejections_artifact_of_a_build_is_bounded(prefect_server, tmp_path):
    """1,500 images without masks and 5 complete samples: the Prefect table lists the first rows
    and counts the rest."""
    from h5forge.flows.build import build_dataset
    from h5forge._format.summary import TABLE_ROWS
    from tests.ingest.test_inputs_trust import make_pairs, spec_data, write_spec

    raw = tmp_path / "raw"
    make_pairs(raw, [f"k{i}" for i in range(5)])
    for i in range(1500):
        (raw / "images" / f"lonely{i:04d}.png").write_bytes(b"")
    spec_path = write_spec(tmp_path / "spec.yaml", spec_data(raw, tmp_path / "out", name="bounded-artifact",
                                                              max_rejected=1.0))
    result = build_dataset(str(spec_path))
    assert result.version == 1 and result.rejected == 1500
    table = Artifact.get("bounded-artifact-rejections")
    rows = json.loads(table.data)
    assert len(rows) == TABLE_ROWS + 1 and rows[-1]["reason"] == f"... and {1500 - TABLE_ROWS} more (see the " \
        "quarantine report)"
    assert table.description.startswith("1500 rejected input(s)")
    assert len(table.data) < 200_000

"""diff and info on a real history built by the pipeline: build v1, append known samples (thin v2),
relabel one raw sample and rebuild (v3). (The build flow's diff artifact: tests/flows/test_artifacts.py.)"""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

import h5forge
from h5forge._ingest.splits import assign_split
from h5forge.spec import load_spec
from h5forge._views.diff import diff_versions
from tests.helpers.data import age_files, drop_samples, write_spec_file
from tests.helpers.files import all_ids


H5FORGE = str(Path(sys.executable).parent / "h5forge")
NEW = ["cell_000003", "cell_000004", "cell_000005"]
RELABELLED = "cell_000007"


def cli(*args):
    r = subprocess.run([H5FORGE, *map(str, args)], capture_output=True, text=True, timeout=900)
    assert "Traceback" not in r.stderr, r.stderr
    return r


@pytest.fixture(scope="module")
def history(raw_demo, raw_new, tmp_path_factory):
    import shutil

    tmp = tmp_path_factory.mktemp("history")
    raw = tmp / "raw"
    shutil.copytree(raw_demo, raw)
    spec_file = write_spec_file(raw, tmp / "out", tmp / "spec.yaml", inbox=tmp / "inbox")
    spec = yaml.safe_load(spec_file.read_text())
    spec_file.write_text(yaml.safe_dump({**spec, "max_rejected": 0.5}))  # the demo's defects are a fifth
    h5forge.build(spec_file)
    new_ids = drop_samples(raw_new, tmp / "inbox", NEW, rename="new_")
    age_files(tmp / "inbox")
    assert h5forge.append(spec_file).version == 2
    records = json.loads((raw / "annotations.json").read_text())
    record = next(r for r in records if r["id"] == RELABELLED)
    old_label = record["label"]
    record["label"] = next(c for c in ("healthy", "infected", "dividing") if c != old_label)
    (raw / "annotations.json").write_text(json.dumps(records))
    result = h5forge.build(spec_file)
    assert result.version == 3
    return {"out": tmp / "out", "spec": spec_file, "raw": raw, "new_ids": sorted(new_ids),
            "label": (old_label, record["label"])}


def test_diff_names_the_added_samples_and_the_relabelled_one(history, new_labels):
    out, old_label, new_label = history["out"], *history["label"]
    d = diff_versions(out / "dataset_v0001.h5", out / "dataset_v0003.h5")
    assert d.added == history["new_ids"] == ["new_cell_000003", "new_cell_000004", "new_cell_000005"]
    assert d.removed == []
    assert d.columns_changed == {RELABELLED: {"meta/label": [old_label, new_label]}}
    assert d.content_changed == [RELABELLED]  # a sample's checksum covers its annotation columns too
    assert d.moved_split == {}
    spec = load_spec(history["spec"])
    added_per_split = Counter(assign_split(i, spec.splits) for i in d.added)
    for split in ("train", "val", "test"):
        assert d.counts[split]["change"] == added_per_split[split]
        assert d.counts[split]["new"] - d.counts[split]["old"] == added_per_split[split]
    assert d.labels["meta/label"][old_label]["change"] == -1 + sum(new_labels[i] == old_label for i in d.added)
    assert d.labels["meta/label"][new_label]["change"] == 1 + sum(new_labels[i] == new_label for i in d.added)
    assert "moved split: none (the stable-split rule holds)" in d.lines()


@pytest.fixture(scope="module")
def new_labels(raw_new) -> dict[str, str]:
    """The labels of the appended samples, by their id in the dataset."""
    return {f"new_{r['id']}": r["label"] for r in json.loads((raw_new / "annotations.json").read_text())}


def test_diff_cli_between_the_thin_append_and_the_rebuild(history):
    out, old_label, new_label = history["out"], *history["label"]
    r = cli("diff", "--dir", out, "previous", "latest", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["old"]["version"], d["new"]["version"]) == (2, 3)
    assert d["added"] == d["removed"] == [] and d["moved_split"] == {}
    assert d["content_changed"] == [RELABELLED]
    assert d["columns_changed"] == {RELABELLED: {"meta/label": [old_label, new_label]}}
    assert d["labels"]["meta/label"][new_label]["change"] == 1
    text = cli("diff", out / "dataset_v0001.h5", out / "dataset_v0002.h5")
    assert text.returncode == 0
    assert "added: 3: new_cell_000003, new_cell_000004, new_cell_000005" in text.stdout
    assert "labels/columns changed: 0" in text.stdout
    assert "moved split: none (the stable-split rule holds)" in text.stdout
    bad = cli("diff", "--dir", out, "1", "9")
    assert bad.returncode == 2 and "v0009 is not a published version (published: v0001, v0002, v0003)" in bad.stderr


def test_info_json_of_the_thin_version_counts_exactly(history, new_labels):
    out = history["out"]
    r = cli("info", out / "dataset_v0002.h5", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    ids = all_ids(out / "dataset_v0002.h5")
    assert info["counts"] == {s: len(v) for s, v in ids.items()} and info["samples"] == 43
    assert info["lineage"]["kind"] == "thin" and info["lineage"]["parent"] == 1
    assert [(s["file"], s["present"]) for s in info["lineage"]["row_files"]] == [
        ("dataset_v0001.h5", True), ("dataset_v0002.delta.h5", True)]
    # labels per split, derived independently from the raw records and the split rule
    labels = {r["id"]: r["label"] for r in json.loads((history["raw"] / "annotations.json").read_text())}
    labels[RELABELLED] = history["label"][0]  # v2 predates the relabelling
    labels.update(new_labels)
    for split, split_ids in ids.items():
        assert info["splits"][split]["samples_by_value"]["label"] == dict(Counter(labels[i] for i in split_ids))
    assert info["rejected"]["total"] == 0  # the append's run turned nothing away
    folder = json.loads(cli("info", out, "--json").stdout)
    assert [(v["version"], v["latest"], v["kind"]) for v in folder["versions"]] == [
        (1, False, "full"), (2, False, "thin over 2 files"), (3, True, "full")]
    assert folder["detail"]["lineage"]["ancestors"] == [
        {"version": 2, "present": True, "kind": "thin"}, {"version": 1, "present": True, "kind": "full"}]


def test_diff_refuses_a_thin_version_whose_base_file_is_gone(history, tmp_path):
    import shutil

    copy = tmp_path / "out"
    shutil.copytree(history["out"], copy, symlinks=True)
    (copy / "dataset_v0001.h5").chmod(0o644)
    (copy / "dataset_v0001.h5").unlink()
    r = cli("diff", copy / "dataset_v0002.h5", copy / "dataset_v0003.h5")
    assert r.returncode == 1
    assert r.stderr.startswith(f"error: {copy / 'dataset_v0002.h5'} reads its rows from dataset_v0001.h5, "
                               "which is missing")

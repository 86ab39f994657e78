"""The label kind end to end: an annotation column becomes an int64 class field that is built,
verified, merged by appends and read back like any other field."""

from __future__ import annotations

import json
from collections import Counter

import h5py
import numpy as np
import pytest
import torch

import h5forge
from h5forge._demo import LABELS
from h5forge._format.names import column_path
from h5forge.kinds.label import LabelField
from h5forge.read.torch import H5Dataset
from tests.helpers.data import age_files, demo_spec, drop_samples


def label_spec(raw, out, inbox=None):
    spec = demo_spec(raw, out)
    fields = {**spec.fields, "label": LabelField(column="label", classes=LABELS)}
    update = {"fields": fields}
    if inbox is not None:
        update["source"] = spec.source.model_copy(update={"inbox": inbox})
    return spec.model_validate({**spec.model_dump(), **{k: v for k, v in update.items()}})


def build(spec):
    """The spec built by the pipeline: (the published version, the build result)."""
    result = h5forge.build(spec)
    return result.path, result


@pytest.fixture
def labelled(raw_copy, tmp_path):
    records = json.loads((raw_copy / "annotations.json").read_text())
    bad = next(r for r in records if r.get("label") in LABELS)
    bad["label"] = "necrotic"  # not one of the classes
    (raw_copy / "annotations.json").write_text(json.dumps(records))
    spec = label_spec(raw_copy, tmp_path / "out", tmp_path / "inbox")
    path, summary = build(spec)
    return spec, path, summary, bad["id"]


def test_label_is_stored_as_class_index_with_counts_and_names(labelled):
    spec, path, summary, bad_id = labelled
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert "'necrotic'" in reasons[bad_id] and "healthy" in reasons[bad_id]
    with h5py.File(path, "r") as f:
        for split in ("train", "val", "test"):
            g = f[split]
            names = [v.decode() for v in g[column_path("label")][()]]
            assert list(g["label"][()]) == [LABELS.index(n) for n in names]
            expected = Counter(LABELS.index(n) for n in names)
            assert list(g.attrs["label_class_counts"]) == [expected[i] for i in range(len(LABELS))]
            assert g["label"].dtype == np.int64 and g["label"].attrs["kind"] == "label"
        assert [c for c in f["train"]["label"].attrs["classes"]] == list(LABELS)


def test_reader_returns_labels_aligned_with_images_through_shuffled_workers(labelled):
    spec, path, *_ = labelled
    ds = H5Dataset(path, split="train", fields=("images", "label", "meta/label"), image_dtype="uint8")
    seen = 0
    for images, labels, names in ds.loader(batch_size=7, num_workers=2, shuffle=True, seed=3):
        assert labels.dtype == torch.int64
        assert [LABELS[i] for i in labels.tolist()] == names
        seen += len(names)
    assert seen == len(ds)
    image, label, name = ds[0]
    assert LABELS[int(label)] == name and image.shape[0] == 3


def test_an_append_merges_class_counts(labelled, raw_demo, tmp_path):
    spec, path, *_ = labelled
    inbox = tmp_path / "inbox"
    records = {r["id"]: r for r in json.loads((raw_demo / "annotations.json").read_text())}
    ids = [sid for sid, r in records.items() if r.get("label") in LABELS][:6]
    drop_samples(raw_demo, inbox, ids, rename="new_")
    age_files(inbox)
    with h5py.File(path, "r") as f:
        before = {s: f[s].attrs["label_class_counts"].copy() for s in ("train", "val", "test")}
    result = h5forge.append(spec)
    # copies of samples v1 holds are duplicates; the one v1 rejected (its unknown label) is new
    dupes = {r.sample_id for r in result.rejections if r.reason.startswith("duplicate")}
    assert result.version == 2 and result.added == len(ids) - len(dupes) >= 1
    with h5py.File(result.path, "r") as f:
        for split in ("train", "val", "test"):
            added = Counter(LABELS.index(n.decode()) for n in f[split][column_path("label")][before[split].sum():])
            want = before[split] + np.array([added[i] for i in range(len(LABELS))])
            assert list(f[split].attrs["label_class_counts"]) == list(want)
            assert result.counts[split] == f[split].attrs["count"] == len(f[split]["label"])
    assert sum(result.counts.values()) == sum(c.sum() for c in before.values()) + result.added


def test_label_spec_errors_name_the_key(raw_demo, tmp_path):
    spec = demo_spec(raw_demo, tmp_path)
    data = spec.model_dump(mode="json")
    data["fields"]["label"] = {"kind": "label", "column": "nope"}
    with pytest.raises(ValueError, match="fields.label.column: 'nope' is not declared"):
        type(spec).model_validate(data)
    data["fields"]["label"] = {"kind": "label", "column": "stain"}
    with pytest.raises(ValueError, match="fields.label.classes: needed"):
        type(spec).model_validate(data)


def test_jax_batches_carry_labels_and_rows(labelled):
    from h5forge.read.jax import Source, batches

    _, path, *_ = labelled
    source = Source(path, split="train", fields=("images", "label", "stain"), return_index=True)
    stains = list(source.reader.meta("stain"))
    with h5py.File(path, "r") as f:
        labels = f["train"]["label"][()]
    seen = []
    for batch in batches(source, batch_size=5, shuffle=True, seed=2, drop_last=False):
        assert batch["label"].dtype == np.int64 and batch["images"].dtype == np.float32
        assert batch["label"].tolist() == labels[batch["index"]].tolist()
        assert batch["stain"] == [stains[i] for i in batch["index"]]
        seen += batch["index"].tolist()
    assert sorted(seen) == list(range(len(source)))
    assert source[3]["label"] == labels[3] and source[3]["index"] == 3

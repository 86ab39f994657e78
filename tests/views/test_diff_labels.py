"""diff and info on a dataset with a label field: class indices shown by class name."""

import json
from collections import Counter

from h5forge._demo import LABELS
from h5forge._ingest.splits import assign_split
from h5forge._views.diff import diff_versions
from h5forge._views.info import version_info
from tests.kinds.test_label import build, label_spec


def test_a_relabelled_sample_shows_its_class_names_and_the_counts_move(raw_copy, tmp_path):
    spec = label_spec(raw_copy, tmp_path / "out")
    v1, _ = build(spec)
    records = json.loads((raw_copy / "annotations.json").read_text())
    target = next(r for r in records if r["id"].startswith("cell_") and r.get("label") == LABELS[0])
    target["label"] = LABELS[1]
    (raw_copy / "annotations.json").write_text(json.dumps(records))
    v2, _ = build(spec)

    d = diff_versions(v1, v2)
    assert d.columns_changed == {target["id"]: {"label": [LABELS[0], LABELS[1]],
                                                "meta/label": [LABELS[0], LABELS[1]]}}
    assert d.content_changed == [target["id"]] and d.added == d.removed == [] and d.moved_split == {}
    assert {v: c["change"] for v, c in d.labels["label"].items()} == {LABELS[0]: -1, LABELS[1]: 1, LABELS[2]: 0}

    info = version_info(v2)
    split = assign_split(target["id"], spec.splits)
    good = [r for r in records if r["id"].startswith("cell_") and assign_split(r["id"], spec.splits) == split]
    expected = Counter(r["label"] for r in good)
    assert info["splits"][split]["stats"]["label_class_counts"] == {c: expected[c] for c in LABELS}

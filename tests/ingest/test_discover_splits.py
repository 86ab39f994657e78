import json
from collections import Counter

import yaml

from h5forge._ingest.discover import discover
from h5forge._ingest.splits import assign_split
from h5forge.spec import Splits, load_spec
from tests.helpers.data import REPO, demo_spec


def test_pairs_by_stem_and_reports_every_unusable_input(raw_demo, tmp_path):
    inv = discover(demo_spec(raw_demo, tmp_path))
    ids = [s.id for s in inv.samples]
    assert ids == sorted(ids)
    assert len([i for i in ids if i.startswith("cell_")]) == 40
    reasons = {r.sample_id: r.reason for r in inv.rejections}
    assert reasons["bad_nomask"] == "incomplete sample: no file for masks (masks/*.png)"
    assert reasons["bad_noimage"] == "incomplete sample: no file for images (images/*.png)"
    assert reasons["bad_orphan_record"] == "annotation record without files"
    assert reasons["bad_noannotation"] == "no annotation record in annotations.json"
    s = next(s for s in inv.samples if s.id == "cell_000003")
    assert s.files == {"images": "images/cell_000003.png", "masks": "masks/cell_000003.png"}
    assert set(s.columns) == {"label", "num_cells", "stain", "focus_score"}


def test_annotation_problems(raw_copy, tmp_path):
    records = json.loads((raw_copy / "annotations.json").read_text())
    records[0]["num_cells"] = "many"
    records.append(dict(records[1]))  # a second record for the same sample
    (raw_copy / "annotations.json").write_text(json.dumps(records))
    (raw_copy / "images" / "cell_000005.jpg").write_bytes(b"x")  # two image files, one stem
    spec = demo_spec(raw_copy, tmp_path)
    images = spec.fields["images"].model_copy(update={"files": "images/*"})
    spec = spec.model_copy(update={"fields": {**spec.fields, "images": images}})
    inv = discover(spec)
    reasons = {r.sample_id: r.reason for r in inv.rejections}
    assert reasons[records[0]["id"]] == "annotation column 'num_cells': 'many' is a string, expected int"
    assert reasons[records[1]["id"]] == "several annotation records for this sample"
    assert reasons["cell_000005"].startswith("ambiguous: 2 files share the stem")
    assert {records[0]["id"], records[1]["id"], "cell_000005"}.isdisjoint(s.id for s in inv.samples)


def test_file_name_ids_in_annotations_match_stems(raw_copy, tmp_path):
    records = json.loads((raw_copy / "annotations.json").read_text())
    for r in records:
        r["id"] = r["id"] + ".png"
    (raw_copy / "annotations.json").write_text(json.dumps(records))
    inv = discover(demo_spec(raw_copy, tmp_path))
    assert len([s for s in inv.samples if s.id.startswith("cell_")]) == 40


def test_split_is_a_function_of_the_id_only():
    splits = Splits()
    ids = [f"s{i}" for i in range(20000)]
    first = {i: assign_split(i, splits) for i in ids[:1000]}
    again = {i: assign_split(i, splits) for i in reversed(ids)}  # more data, other order
    assert all(again[i] == first[i] for i in first)
    counts = Counter(again.values())
    assert abs(counts["train"] / 20000 - 0.8) < 0.015
    assert abs(counts["val"] / 20000 - 0.1) < 0.01
    other_seed = Splits(seed="other")
    assert sum(assign_split(i, other_seed) != first[i] for i in first) > 100


def test_split_from_an_annotation_column():
    splits = Splits(column="fold")
    assert assign_split("a", splits, {"fold": "val"}) == "val"
    try:
        assign_split("a", splits, {"fold": "holdout"})
    except ValueError as err:
        assert "'holdout'" in str(err)
    else:
        raise AssertionError("an unknown split value must be refused")


def test_a_nul_character_in_an_annotation_rejects_that_record_only(raw_copy, tmp_path):
    before = {s.id for s in discover(demo_spec(raw_copy, tmp_path)).samples}
    records = json.loads((raw_copy / "annotations.json").read_text())
    target = next(r for r in records if r["id"] in before)
    target["stain"] = "H&E\x00"
    (raw_copy / "annotations.json").write_text(json.dumps(records))
    inv = discover(demo_spec(raw_copy, tmp_path))
    [bad] = [r for r in inv.rejections if r.sample_id == target["id"]]
    assert "annotation column 'stain': contains a NUL character" in bad.reason
    assert {s.id for s in inv.samples} == before - {target["id"]}


def test_a_whole_number_seed_is_taken_as_its_text(tmp_path):
    data = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    data["source"]["root"] = str(tmp_path)
    spec_path = tmp_path / "seeded.yaml"
    data["splits"]["seed"] = 0
    spec_path.write_text(yaml.safe_dump(data))
    assert "seed: 0\n" in spec_path.read_text()
    splits = load_spec(spec_path).splits
    assert splits.seed == "0"
    ids = [f"s{i}" for i in range(200)]
    assert [assign_split(i, splits) for i in ids] == [assign_split(i, Splits(seed="0")) for i in ids]
    assert [assign_split(i, splits) for i in ids] != [assign_split(i, Splits()) for i in ids]

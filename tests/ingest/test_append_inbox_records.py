"""Every annotation record of an inbox sample stays where a user can find it: in a version, in
processed/ with its sample, in quarantine/ with its refused sample, or still in the inbox. Real
files: scikit-image photos saved by Pillow, COCO files checked by pycocotools, DICOM by pydicom."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import h5forge
from h5forge._ingest import append
from h5forge.spec import DatasetSpec, parse_spec
from tests.helpers.data import age_files

CLASSES = ("person", "cup", "cat")
# picture -> (skimage.data name, objects as (class, x0, y0, x1, y1))
PHOTOS = {
    "astronaut": ("astronaut", [("person", 150, 30, 360, 500)]),
    "coffee": ("coffee", [("cup", 180, 40, 470, 330)]),
    "chelsea": ("chelsea", [("cat", 60, 20, 400, 290)]),
    "rocket": ("rocket", []),
    "flower": ("immunohistochemistry", [("cat", 10, 10, 100, 100)]),
    "hubble_crop": ("hubble_deep_field", [("person", 5, 5, 50, 60), ("cup", 100, 100, 200, 180)]),
}


def _save_photo(folder: Path, name: str) -> tuple[int, int]:
    import skimage.data
    from PIL import Image

    pixels = getattr(skimage.data, PHOTOS[name][0])()
    if name == "hubble_crop":
        pixels = pixels[:300, :400]
    (folder / "images").mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(folder / "images" / f"{name}.jpg", quality=90)
    return pixels.shape[0], pixels.shape[1]


def write_coco(folder: Path, names: list[str], coco_rel: str, first_id: int = 1) -> Path:
    """Pictures of ``names`` under folder/images and their COCO file at folder/coco_rel, read back
    by pycocotools."""
    from pycocotools.coco import COCO

    images, annotations = [], []
    for i, name in enumerate(names, first_id):
        h, w = _save_photo(folder, name)
        images.append({"id": i, "file_name": f"{name}.jpg", "height": h, "width": w})
        for cls, x0, y0, x1, y1 in PHOTOS[name][1]:
            annotations.append(
                {
                    "id": 100 * i + len(annotations),
                    "image_id": i,
                    "category_id": CLASSES.index(cls) + 1,
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "area": float((x1 - x0) * (y1 - y0)),
                    "iscrowd": 0,
                }
            )
    path = folder / coco_rel
    path.parent.mkdir(parents=True, exist_ok=True)
    categories = [{"id": k + 1, "name": c, "supercategory": "thing"} for k, c in enumerate(CLASSES)]
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    assert len(COCO(str(path)).getImgIds()) == len(names)  # the reference reader takes the file
    return path


def coco_spec(tmp_path: Path, boxes: dict | None = None, **extra):
    return parse_spec(
        {
            "name": "photos",
            "source": {"root": "raw", "inbox": "inbox"},
            "output": {"dir": "out"},
            "splits": {"ratios": {"train": 1.0}},
            "fields": {
                "images": {"kind": "image", "files": "images/*.jpg", "size": [64, 64], "larger": "shrink"},
                "boxes": {
                    "kind": "boxes",
                    "like": "images",
                    "classes": list(CLASSES),
                    "coco": "annotations/instances_train.json",
                    **(boxes or {}),
                },
            },
            "verify": {"resample": 2, "latency_reads": 0},
            **extra,
        },
        tmp_path,
    )


def stored(path) -> dict[str, np.ndarray]:
    from h5forge.read._reader import SplitReader

    with SplitReader(path, "train", fields=["boxes"]) as r:
        values = r.read(range(len(r)))
        return {sid: values["boxes"][i] for i, sid in enumerate(r.ids())}


@pytest.mark.parametrize(
    "inbox_name", ["annotations/instances_train.json", "annotations/new_pictures.json", "batch.json"]
)
def test_appended_coco_pictures_take_their_boxes_to_processed_and_a_rebuild_keeps_them(tmp_path, inbox_name):
    from pycocotools.coco import COCO

    write_coco(tmp_path / "raw", ["astronaut", "coffee", "chelsea", "rocket"], "annotations/instances_train.json")
    spec = coco_spec(tmp_path)
    first = h5forge.build(spec)
    assert first.counts["train"] == 4
    inbox = tmp_path / "inbox"
    write_coco(inbox, ["flower", "hubble_crop"], inbox_name, first_id=1)  # the same image ids as the raw file's
    age_files(inbox)
    added = h5forge.append(spec)
    assert added.added == 2 and added.rejections == (), added
    appended = stored(added.path)
    assert len(appended["hubble_crop"]) == 2 and len(appended["flower"]) == 1
    moved = append.processed_dir(inbox, added.version) / "annotations" / "instances_train.json"
    api = COCO(str(moved))  # the source's format and name, readable by the reference reader
    assert sorted(im["file_name"] for im in api.loadImgs(api.getImgIds())) == ["flower.jpg", "hubble_crop.jpg"]
    assert len(api.getAnnIds()) == 3
    assert not (inbox / inbox_name).exists()  # every picture it described was taken
    rebuilt = h5forge.build(spec)
    assert rebuilt.rejected == 0 and rebuilt.counts["train"] == 6, rebuilt
    again = stored(rebuilt.path)
    for sid, rows in appended.items():
        assert np.array_equal(again[sid], rows), sid


def test_a_coco_file_keeps_the_entries_of_pictures_still_waiting(tmp_path):
    write_coco(tmp_path / "raw", ["astronaut", "coffee"], "annotations/instances_train.json")
    spec = coco_spec(tmp_path)
    h5forge.build(spec)
    inbox = tmp_path / "inbox"
    coco = write_coco(inbox, ["flower", "hubble_crop"], "annotations/instances_train.json")
    age_files(inbox)
    (inbox / "images" / "hubble_crop.jpg").unlink()  # not there yet: its entry waits in the inbox file
    added = h5forge.append(spec)
    assert added.added == 1, added
    left = json.loads(coco.read_text())
    assert [im["file_name"] for im in left["images"]] == ["hubble_crop.jpg"]
    assert {a["image_id"] for a in left["annotations"]} == {left["images"][0]["id"]}
    _save_photo(inbox, "hubble_crop")
    age_files(inbox)
    later = h5forge.append(spec)
    assert later.added == 1 and not coco.exists()
    assert h5forge.build(spec).counts["train"] == 4


def test_coco_entries_a_user_adds_while_an_append_runs_stay_in_the_inbox(tmp_path, monkeypatch):
    """A COCO file a user replaces while an append runs (the entries of a picture dropped meanwhile
    added to it) is not overwritten with, or removed for, what the append planned from the file it
    read: the new picture's entry stays, and the next append takes the picture with its boxes."""
    import os

    write_coco(tmp_path / "raw", ["astronaut", "coffee"], "annotations/instances_train.json")
    spec = coco_spec(tmp_path)
    h5forge.build(spec)
    inbox = tmp_path / "inbox"
    coco = write_coco(inbox, ["flower"], "annotations/instances_train.json")
    age_files(inbox)
    real = append.checkpoint

    def meanwhile(name: str) -> None:
        if name == "append:reasons":  # the version is published, the inbox's COCO file not yet rewritten
            mine = write_coco(tmp_path / "user", ["flower", "hubble_crop"], "instances_train.json")
            os.replace(tmp_path / "user" / "images" / "hubble_crop.jpg", inbox / "images" / "hubble_crop.jpg")
            os.replace(mine, coco)  # a new copy renamed over the file
        real(name)

    monkeypatch.setattr(append, "checkpoint", meanwhile)
    added = h5forge.append(spec)
    assert added.added == 1, added
    assert "hubble_crop.jpg" in [im["file_name"] for im in json.loads(coco.read_text())["images"]]
    monkeypatch.setattr(append, "checkpoint", real)
    age_files(inbox)
    later = h5forge.append(spec)
    assert later.added == 1, later
    assert len(stored(later.path)["hubble_crop"]) == 2  # its two boxes, from the entry that stayed
    assert h5forge.build(spec).counts["train"] == 4


def _demo_inbox(raw_demo: Path, inbox: Path, ids: list[str]) -> dict[str, dict]:
    import shutil

    records = {r["id"]: r for r in json.loads((raw_demo / "annotations.json").read_text())}
    for sid in ids:
        for sub in ("images", "masks"):
            (inbox / sub).mkdir(parents=True, exist_ok=True)
            shutil.copy(raw_demo / sub / f"{sid}.png", inbox / sub / f"new_{sid}.png")
    return {f"new_{sid}": {**records[sid], "id": f"new_{sid}"} for sid in ids}


def test_a_sample_refused_while_cleaning_keeps_its_record_in_quarantine(raw_new, dataset):
    import time

    from PIL import Image

    spec_file, out, inbox = dataset
    good = sorted(p.stem for p in (raw_new / "images").glob("cell_*.png"))
    records = _demo_inbox(raw_new, inbox, good[:3])
    ok, cut, fresh = sorted(records)
    half = (inbox / "images" / f"{cut}.png").read_bytes()
    (inbox / "images" / f"{cut}.png").write_bytes(half[: len(half) // 2])  # a half-written PNG
    with pytest.raises(OSError):
        Image.open(inbox / "images" / f"{cut}.png").load()
    (inbox / "annotations.json").write_text(json.dumps(list(records.values())))
    age_files(inbox)
    now = time.time()
    for sub in ("images", "masks"):  # still being written: it waits, with its record
        import os

        os.utime(inbox / sub / f"{fresh}.png", (now + 3600, now + 3600))
    added = h5forge.append(spec_file)
    assert added.added == 1 and added.waiting == 1, added
    assert [r.sample_id for r in added.rejections] == [cut]
    processed = append.processed_dir(inbox, added.version)
    assert json.loads((processed / "annotations.json").read_text()) == [records[ok]]
    quarantined = inbox / "quarantine" / "images" / f"{cut}.png.annotations.json"
    assert json.loads(quarantined.read_text()) == [records[cut]]
    assert cut in (inbox / "quarantine" / "images" / f"{cut}.png.annotations.json.reason").read_text()
    assert (inbox / "quarantine" / "images" / f"{cut}.png").is_file()
    assert json.loads((inbox / "annotations.json").read_text()) == [records[fresh]]  # waiting: stays


def test_records_a_user_adds_while_an_append_runs_stay_in_the_inbox(raw_new, dataset, monkeypatch):
    """The append prunes the records it took from the inbox's annotation list as the file is when it
    writes it: a record a user added meanwhile (a new copy renamed over the file) stays, and the
    user's own copy in progress under the usual temporary name (.annotations.json.tmp) is not touched."""
    import os

    spec_file, out, inbox = dataset
    good = sorted(p.stem for p in (raw_new / "images").glob("cell_*.png"))
    records = _demo_inbox(raw_new, inbox, good[:3])
    first, second, late = sorted(records)
    for sub in ("images", "masks"):  # the late sample's files come later: only its record now
        (inbox / sub / f"{late}.png").unlink()
    (inbox / "annotations.json").write_text(json.dumps([records[first], records[second]]))
    age_files(inbox)
    user_tmp = inbox / ".annotations.json.tmp"
    real = append.checkpoint

    def meanwhile(name: str) -> None:
        if name == "append:reasons":  # the version is published, the inbox's list not yet pruned
            user_tmp.write_text("a copy in progress")
            copy = inbox / ".annotations.json.mine"
            copy.write_text(json.dumps([records[first], records[second], records[late]]))
            os.replace(copy, inbox / "annotations.json")
        real(name)

    monkeypatch.setattr(append, "checkpoint", meanwhile)
    added = h5forge.append(spec_file)
    assert added.added == 2, added
    assert json.loads((inbox / "annotations.json").read_text()) == [records[late]]
    assert user_tmp.read_text() == "a copy in progress"
    processed = append.processed_dir(inbox, added.version)
    assert json.loads((processed / "annotations.json").read_text()) == [records[first], records[second]]


def test_several_records_for_one_sample_quarantine_only_that_sample_s_records_named(raw_demo, tmp_path, build_spec):
    import csv
    import shutil

    records = {r["id"]: r for r in json.loads((raw_demo / "annotations.json").read_text())}
    good = sorted(i for i in records if i.startswith("cell_"))
    root, inbox = tmp_path / "raw", tmp_path / "inbox"
    for folder, ids in ((root, good[:20]), (inbox, good[20:23])):
        for sub in ("images", "masks"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
            for sid in ids:
                shutil.copy(raw_demo / sub / f"{sid}.png", folder / sub / f"{sid}.png")
    twice = good[21]
    rows = [{"id": i, "label": records[i]["label"], "num_cells": records[i]["num_cells"]} for i in good[20:23]]
    rows.insert(2, {**rows[1], "num_cells": 99})
    for folder, table in (
        (root, [{"id": i, "label": records[i]["label"], "num_cells": records[i]["num_cells"]} for i in good[:20]]),
        (inbox, rows),
    ):
        with (folder / "labels.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["id", "label", "num_cells"])
            w.writeheader()
            w.writerows(table)
    age_files(inbox)
    data = {
        "name": "csv",
        "source": {"root": str(root), "inbox": str(inbox)},
        "output": {"dir": str(tmp_path / "out")},
        "fields": {
            "images": {"kind": "image", "files": "images/*.png", "size": [64, 64]},
            "masks": {"kind": "mask", "files": "masks/*.png", "like": "images"},
        },
        "annotations": {"file": "labels.csv", "columns": {"label": "str", "num_cells": "int"}},
    }
    build_spec(data)
    added = h5forge.append(DatasetSpec.model_validate(data))
    assert added.added == 2 and [r.sample_id for r in added.rejections] == [twice], added
    quarantine = inbox / "quarantine"
    assert not (quarantine / "labels.csv").exists()  # the accepted rows are not copied there
    with (quarantine / "images" / f"{twice}.png.labels.csv").open(newline="") as fh:
        assert [r["num_cells"] for r in csv.DictReader(fh)] == [str(records[twice]["num_cells"]), "99"]
    reason = (quarantine / "images" / f"{twice}.png.labels.csv.reason").read_text()
    assert twice in reason and "several annotation records" in reason
    assert twice in (quarantine / "images" / f"{twice}.png.reason").read_text()
    with (append.processed_dir(inbox, added.version) / "labels.csv").open(newline="") as fh:
        assert sorted(r["id"] for r in csv.DictReader(fh)) == [good[20], good[22]]
    assert not (inbox / "labels.csv").exists()


def _age_all(folder: Path, seconds: float = 10) -> None:
    """Backdate files and folders alike (a folder's mtime changes when an entry is added)."""
    import os
    import time

    past = time.time() - seconds
    for p in [*folder.rglob("*"), folder]:
        os.utime(p, (past, past))


def test_a_dicom_case_settles_as_a_whole_and_a_temporary_name_waits_for_its_rename(tmp_path):
    import os

    import h5py

    from tests.kinds.test_volume import write_series

    write_series(tmp_path / "raw" / "cases" / "first", depth=4)
    spec = parse_spec(
        {
            "name": "ct",
            "source": {"root": "raw", "inbox": "inbox"},
            "output": {"dir": "out"},
            "splits": {"ratios": {"train": 1.0}},
            "compute": {"batch_size": 2},
            "append": {"settle_seconds": 2},
            "fields": {"ct": {"kind": "volume", "files": "cases/*", "size": [128, 128]}},
        },
        tmp_path,
    )
    assert h5forge.build(spec).counts["train"] == 1
    inbox = tmp_path / "inbox"
    case = inbox / "cases" / "case_partial"
    write_series(case, depth=5, seed=3)
    write_series(inbox / "cases" / "case_late.tmp", depth=3, seed=4)  # copied, then renamed
    _age_all(inbox)
    slices = sorted(case.iterdir())
    whole = slices[-1].read_bytes()
    slices[-1].write_bytes(whole[: len(whole) // 3])  # one slice is still being written: the folder's mtime is old
    assert os.stat(case).st_mtime < os.stat(slices[-1]).st_mtime - 5
    waiting = h5forge.append(spec)
    assert waiting.version is None and waiting.added == 0 and waiting.waiting == 1, waiting
    assert waiting.rejections == ()  # the .tmp folder is not read at all
    slices[-1].write_bytes(whole)
    os.replace(inbox / "cases" / "case_late.tmp", inbox / "cases" / "case_late")
    _age_all(inbox)
    added = h5forge.append(spec)
    assert added.added == 2 and added.rejections == (), added
    with h5py.File(added.path, "r") as f:
        ids = [i.decode() for i in f["train"]["ids"][()]]
        depths = f["train"]["ct_lengths"][()].tolist()
    assert dict(zip(ids, depths)) == {"first": 4, "case_partial": 5, "case_late": 3}  # every slice


def test_coco_pictures_wait_while_their_coco_file_is_being_written(tmp_path):
    import os
    import time

    write_coco(tmp_path / "raw", ["astronaut", "coffee"], "annotations/instances_train.json")
    spec = coco_spec(tmp_path)
    h5forge.build(spec)
    inbox = tmp_path / "inbox"
    coco = write_coco(inbox, ["flower", "hubble_crop"], "annotations/instances_train.json")
    _age_all(inbox)
    later = time.time() + 3600
    os.utime(coco, (later, later))  # the pictures are old, their COCO file is not
    waiting = h5forge.append(spec)
    assert waiting.version is None and waiting.waiting == 2 and waiting.rejections == (), waiting
    _age_all(inbox)
    assert h5forge.append(spec).added == 2


@pytest.mark.parametrize("hostile", ["fifo", "dev-zero"])
def test_an_inbox_coco_file_that_is_no_regular_file_is_never_read_and_its_pictures_wait(tmp_path, hostile):
    import os

    write_coco(tmp_path / "raw", ["astronaut", "coffee"], "annotations/instances_train.json")
    spec = coco_spec(tmp_path)
    h5forge.build(spec)
    inbox = tmp_path / "inbox"
    _save_photo(inbox, "flower")
    (inbox / "annotations").mkdir()
    named = inbox / "annotations" / "instances_train.json"
    os.mkfifo(named) if hostile == "fifo" else os.symlink("/dev/zero", named)
    age_files(inbox)
    waiting = h5forge.append(spec)  # returns: a FIFO is not opened, /dev/zero not read
    assert waiting.version is None and waiting.waiting == 1 and waiting.rejections == (), waiting
    assert (inbox / "images" / "flower.jpg").is_file() and os.path.lexists(named)


def test_a_refused_coco_picture_takes_its_entry_to_quarantine(tmp_path):
    from pycocotools.coco import COCO

    write_coco(tmp_path / "raw", ["astronaut", "coffee"], "annotations/instances_train.json")
    spec = coco_spec(tmp_path)
    h5forge.build(spec)
    inbox = tmp_path / "inbox"
    coco = write_coco(inbox, ["flower", "hubble_crop"], "annotations/drop.json")
    data = json.loads(coco.read_text())
    data["images"][1]["width"] += 1  # the entry says hubble_crop is a pixel wider than it is
    coco.write_text(json.dumps(data))
    age_files(inbox)
    added = h5forge.append(spec)
    assert added.added == 1 and [r.sample_id for r in added.rejections] == ["hubble_crop"], added
    kept = inbox / "quarantine" / "images" / "hubble_crop.jpg.instances_train.json"
    api = COCO(str(kept))
    assert [im["file_name"] for im in api.loadImgs(api.getImgIds())] == ["hubble_crop.jpg"]
    assert len(api.getAnnIds()) == 2
    assert (
        "hubble_crop" in (inbox / "quarantine" / "images" / "hubble_crop.jpg.instances_train.json.reason").read_text()
    )
    assert (inbox / "quarantine" / "images" / "hubble_crop.jpg").is_file() and not coco.exists()


def test_a_rebuild_gives_each_processed_picture_only_its_part_of_the_coco_file_beside_it(tmp_path):
    """Discovery parses the COCO file of processed/vNNNN once and hands each of its pictures its
    own entry, as it does for the source's file."""
    from h5forge._ingest.discover import discover
    from h5forge.kinds.boxes.sources import CocoIndex

    write_coco(tmp_path / "raw", ["astronaut", "coffee"], "annotations/instances_train.json")
    spec = coco_spec(tmp_path)
    h5forge.build(spec)
    inbox = tmp_path / "inbox"
    write_coco(inbox, ["flower", "hubble_crop"], "annotations/instances_train.json")
    age_files(inbox)
    assert h5forge.append(spec).added == 2
    refs = {ref.id: ref for ref in discover(spec).samples}
    for sid, objects in (("flower", 1), ("hubble_crop", 2), ("astronaut", 1)):
        part = refs[sid].shared["boxes"]
        assert isinstance(part, CocoIndex), (sid, part)
        assert list(part.images) == [f"{sid}.jpg"] and sum(map(len, part.annotations.values())) == objects
    assert "processed/v0002/annotations/instances_train.json" in refs["flower"].shared["boxes"].rel
    assert refs["astronaut"].shared["boxes"].rel == "annotations/instances_train.json"


@pytest.mark.parametrize("hostile", ["symlink-out", "fifo", "too-large"])
def test_a_processed_coco_file_is_read_bounded_and_within_its_folder(tmp_path, hostile):
    """The COCO file beside an appended picture is read as every COCO file is: a regular file of
    at most max_bytes, not through a symlink out of its folder. Its pictures are refused with the
    reason, and a rebuild that would lose them publishes nothing."""
    import os
    import shutil

    from h5forge.errors import SamplesRemoved
    from h5forge._ingest.discover import discover
    from h5forge.kinds.boxes.sources import CocoIndex
    from h5forge._store.versions import latest

    write_coco(tmp_path / "raw", ["astronaut", "coffee", "chelsea", "rocket"], "annotations/instances_train.json")
    spec = coco_spec(tmp_path, boxes={"max_bytes": 4000}, max_rejected=0.5)
    h5forge.build(spec)
    inbox = tmp_path / "inbox"
    write_coco(inbox, ["flower"], "annotations/instances_train.json")
    age_files(inbox)
    added = h5forge.append(spec)
    assert added.added == 1, added
    moved = append.processed_dir(inbox, added.version) / "annotations" / "instances_train.json"
    if hostile == "symlink-out":
        elsewhere = tmp_path / "elsewhere.json"
        shutil.copy(moved, elsewhere)
        moved.unlink()
        moved.symlink_to(elsewhere)
        why = "symlink leads outside the source folder"
    elif hostile == "fifo":
        moved.unlink()
        os.mkfifo(moved)
        why = "not a regular file"
    else:
        data = json.loads(moved.read_text())
        data["padding"] = "x" * 5000
        moved.write_text(json.dumps(data))
        why = "larger than the limit of 4,000"
    refs = {ref.id: ref for ref in discover(spec).samples}  # returns: the FIFO is not opened
    path, reason = refs["flower"].shared["boxes"]
    assert why in reason and "processed/v0002/annotations/instances_train.json" in reason, reason
    assert isinstance(refs["astronaut"].shared["boxes"], CocoIndex)
    with pytest.raises(SamplesRemoved):  # the appended picture would leave latest: nothing published
        h5forge.build(spec)
    assert latest(spec.output.dir) == added.version


def test_limits_apply_to_the_coco_pictures_an_append_takes(tmp_path):
    """max_objects holds for a picture whose entry comes from an inbox COCO file of any name, and
    the refused picture's entry goes to quarantine/ with it."""
    write_coco(tmp_path / "raw", ["astronaut", "coffee"], "annotations/instances_train.json")
    spec = coco_spec(tmp_path, boxes={"max_objects": 1, "masks": True})
    h5forge.build(spec)
    inbox = tmp_path / "inbox"
    write_coco(inbox, ["flower", "hubble_crop"], "batch.json")  # hubble_crop has two objects
    age_files(inbox)
    added = h5forge.append(spec)
    assert added.added == 1, added
    [refused] = added.rejections
    assert refused.sample_id == "hubble_crop" and "max_objects" in refused.reason, refused
    assert set(stored(added.path)) == {"astronaut", "coffee", "flower"}
    entries = [p for p in (inbox / "quarantine").rglob("*.json")]
    assert len(entries) == 1
    assert [im["file_name"] for im in json.loads(entries[0].read_text())["images"]] == ["hubble_crop.jpg"]

"""Background pictures in YOLO folders (``missing: empty``): a picture without its label file is a
sample with no boxes, as Ultralytics reads it. Real pictures (scikit-image's), real label files,
``init`` → build → append from the inbox → a label file appearing → rebuild → rollback; every
stored box is compared with what the label files say, computed here from their text."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from PIL import Image

import h5forge
from h5forge._format.names import SPLITS
from h5forge.read._reader import SplitReader
from tests.kinds.boxes.test_boxes import _ultralytics_folder, CLASSES, PICTURES, SIZE, _from_label, _picture, _spec, _yolo_folder, coco_folder  # noqa: F401

SETTLE = 3.0  # the inbox's settle_seconds in these tests


def _background_folder(coco_folder: Path, tmp_path: Path) -> Path:
    """The YOLO folder with chelsea's label file removed (a background picture, though it shows a
    cat) and rocket's left empty (a background as an empty file says it)."""
    raw = _yolo_folder(coco_folder, tmp_path)
    (raw / "labels" / "chelsea.txt").unlink()
    assert (raw / "labels" / "rocket.txt").read_text() == ""
    return raw


def _stored(path: Path) -> dict[str, np.ndarray]:
    got = {}
    for split in SPLITS:
        with SplitReader(path, split, fields=["boxes"]) as r:
            got.update(zip(r.ids(), r.read(range(len(r)))["boxes"]))
    return got


def _check(out: Path, want: dict[str, str], sizes: dict[str, tuple[int, int]]) -> None:
    """Every reader gives each picture the rows its label text says ("" for no file: no rows), and
    batches mixing backgrounds and boxes collate with their counts."""
    from h5forge.read.jax import Source
    from h5forge.read.torch import H5Dataset

    latest = out / "dataset_latest.h5"
    got = _stored(latest)
    assert set(got) == set(want)
    for sid, boxes in got.items():
        expected = _from_label(want[sid], *sizes[sid])
        assert boxes.shape == expected.shape and boxes.dtype == np.float32, sid
        assert np.allclose(boxes, expected, atol=1e-3), sid
    for split in SPLITS:
        ds = H5Dataset(latest, split, fields=("images", "boxes"))
        ids = ds.reader.ids()
        if not ids:
            continue
        for i, sid in enumerate(ids):
            image, boxes = ds[i]
            assert tuple(boxes.shape) == (len(_from_label(want[sid], *sizes[sid])), 5), sid
        for k, (images, batch) in enumerate(ds.loader(batch_size=3, shuffle=False)):
            chunk = ids[3 * k : 3 * k + 3]
            rows = [_from_label(want[sid], *sizes[sid]) for sid in chunk]
            assert batch.lengths.tolist() == [len(r) for r in rows]
            assert tuple(batch.values.shape) == (len(chunk), max(len(r) for r in rows), 5)
            assert tuple(images.shape) == (len(chunk), 3, SIZE, SIZE)
            for j, r in enumerate(rows):
                assert np.allclose(batch.values[j, : len(r)].numpy(), r, atol=1e-3)
                assert not batch.values[j, len(r) :].numpy().any()
        jax_batch = Source(latest, split, fields=["boxes"]).get_batch(list(range(len(ids))))
        assert jax_batch["boxes"].lengths.tolist() == [len(_from_label(want[s], *sizes[s])) for s in ids]
        labels = np.concatenate([_from_label(want[s], *sizes[s])[:, 4] for s in ids]).astype(np.int64)
        with h5py.File(os.path.realpath(latest), "r") as f:  # a background adds to no class
            assert f[split].attrs["boxes_class_boxes"].tolist() == np.bincount(labels, minlength=len(CLASSES)).tolist()


def _check_only_backgrounds(out: Path, backgrounds: list[str]) -> None:
    """A batch of background pictures alone collates: (B, 0, 5) values, every count 0."""
    from torch.utils.data import DataLoader

    from h5forge.read.torch import H5Dataset, collate

    ds = H5Dataset(out / "dataset_latest.h5", "train", fields=("images", "boxes"))
    rows = [ds.reader.ids().index(sid) for sid in backgrounds]
    images, boxes = next(iter(DataLoader(ds, batch_size=len(rows), sampler=rows, collate_fn=collate)))
    assert tuple(images.shape) == (len(rows), 3, SIZE, SIZE)
    assert tuple(boxes.values.shape) == (len(rows), 0, 5) and boxes.lengths.tolist() == [0] * len(rows)


def _init_spec(raw: Path, tmp_path: Path, inbox: Path) -> Path:
    """The spec ``init`` writes for ``raw``, its picture size and crop set to the tests' own rules."""
    from h5forge._init import infer_spec

    found = infer_spec(raw, tmp_path / "init.yaml")
    assert not any("label file" in n for n in found.notes), found.notes
    line = next(line for line in found.text.splitlines() if "missing:" in line)
    assert line.split("#")[0].split() == ["missing:", "empty"]
    assert "1 of 4" in line and "background" in line
    spec = yaml.safe_load(found.text)
    assert spec["fields"]["boxes"]["missing"] == "empty"
    spec["source"] = {"root": str(raw), "inbox": str(inbox)}
    spec["fields"]["images"].update(size=[SIZE, SIZE], larger="crop")
    spec["output"] = {"dir": str(tmp_path / "out"), "retire_after_seconds": 0}
    spec["verify"] = {"resample": 50, "latency_reads": 0}
    spec["append"] = {"settle_seconds": SETTLE}
    spec["splits"] = {"ratios": {"train": 1.0}}  # one split: batches of several backgrounds
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _save(pixels: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def _as_if_moved_in(*paths: Path) -> None:
    """An old mtime, as ``mv`` or ``cp -p`` of a picture leaves it (its ctime is now)."""
    past = time.time() - 3600
    for p in paths:
        os.utime(p, (past, past))


def test_backgrounds_through_init_build_append_rebuild_and_rollback(coco_folder, tmp_path):
    from tests.test_cli import run

    raw, inbox = _background_folder(coco_folder, tmp_path), tmp_path / "inbox"
    spec = _init_spec(raw, tmp_path, inbox)
    sizes = {name: (h, w) for name, (h, w, _) in PICTURES.items()}
    labels = {name: (raw / "labels" / f"{name}.txt").read_text() for name in PICTURES if name != "chelsea"}
    labels["chelsea"] = ""  # no file: no boxes

    first = h5forge.build(spec)
    assert first.version == 1 and first.rejected == 0 and sum(first.counts.values()) == 4, first
    assert "0 sources changed" in first.health["sources"], first.health
    _check(tmp_path / "out", labels, sizes)
    _check_only_backgrounds(tmp_path / "out", ["chelsea", "rocket"])
    v1 = dict(labels)
    assert h5forge.build(spec).unchanged  # a background's input key is the same from build to build

    # the inbox: a labelled picture, and a picture without a label file (moved in: an old mtime)
    ihc, flipped = _picture("immunohistochemistry"), np.ascontiguousarray(_picture("coffee")[:, ::-1])
    _save(ihc, inbox / "images" / "ihc.png")
    _save(flipped, inbox / "images" / "mirror.png")
    labels["mirror"], sizes["mirror"] = "0 0.3 0.4 0.2 0.5\n2 0.7 0.6 0.3 0.3\n", flipped.shape[:2]
    (inbox / "labels" / "mirror.txt").parent.mkdir()
    (inbox / "labels" / "mirror.txt").write_text(labels["mirror"])
    _as_if_moved_in(*inbox.rglob("*.png"), inbox / "labels" / "mirror.txt")
    added = h5forge.append(spec)
    assert (added.version, added.added, added.waiting) == (2, 1, 1), added  # ihc may still get its label
    assert (inbox / "images" / "ihc.png").exists()
    _check(tmp_path / "out", labels, sizes)

    time.sleep(SETTLE + 0.5)
    added = h5forge.append(spec)
    assert (added.version, added.added, added.waiting) == (3, 1, 0), added
    labels["ihc"], sizes["ihc"] = "", ihc.shape[:2]
    assert (inbox / "processed" / "v0003" / "images" / "ihc.png").is_file()
    _check(tmp_path / "out", labels, sizes)

    # label files appear for both backgrounds, the appended one beside its picture in processed/:
    # a rebuild cleans those two again and gives them their boxes
    labels["chelsea"] = "2 0.45 0.5 0.6 0.7\n"
    labels["ihc"] = "1 0.5 0.5 0.25 0.25\n0 0.1 0.1 0.1 0.1\n"
    (raw / "labels" / "chelsea.txt").write_text(labels["chelsea"])
    (inbox / "processed" / "v0003" / "labels").mkdir()
    (inbox / "processed" / "v0003" / "labels" / "ihc.txt").write_text(labels["ihc"])
    before = _stored(tmp_path / "out" / "dataset_latest.h5")
    rebuilt = h5forge.build(spec)
    assert rebuilt.version == 4 and rebuilt.rejected == 0, rebuilt
    _check(tmp_path / "out", labels, sizes)
    after = _stored(tmp_path / "out" / "dataset_latest.h5")
    assert sorted(s for s in after if not np.array_equal(after[s], before[s])) == ["chelsea", "ihc"]
    assert "0 sources changed" in rebuilt.health["sources"], rebuilt.health

    assert run("rollback", tmp_path / "out", "v1").returncode == 0
    _check(tmp_path / "out", v1, sizes)


def test_a_picture_without_its_label_file_is_refused_by_default(coco_folder, tmp_path):
    raw = _background_folder(coco_folder, tmp_path)
    spec = _spec(raw, tmp_path / "out", {"files": "labels/*.txt"})
    spec["max_rejected"] = 1
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = h5forge.build(tmp_path / "spec.yaml")
    assert [(r.sample_id, r.reason) for r in result.rejections] == [
        ("chelsea", "incomplete sample: no file for boxes (labels/*.txt)")
    ]
    assert set(_stored(result.path)) == set(PICTURES) - {"chelsea"}


def test_the_option_leaves_the_spec_of_a_dataset_without_it_as_it_was(tmp_path):
    """The default is not written into the stored spec, nor so into the rules hash: a dataset
    built before the key existed is not cleaned again for it."""
    from pydantic import ValidationError

    from h5forge._ingest.incremental.inputs import rules_hash
    from h5forge.spec import DatasetSpec

    plain = DatasetSpec.model_validate(_spec(tmp_path, tmp_path / "out", {"files": "labels/*.txt"}))
    refuse = DatasetSpec.model_validate(_spec(tmp_path, tmp_path / "out", {"files": "labels/*.txt", "missing": "refuse"}))
    empty = DatasetSpec.model_validate(_spec(tmp_path, tmp_path / "out", {"files": "labels/*.txt", "missing": "empty"}))
    assert "missing" not in plain.model_dump(mode="json")["fields"]["boxes"]
    assert empty.model_dump(mode="json")["fields"]["boxes"]["missing"] == "empty"
    assert rules_hash(plain) == rules_hash(refuse) != rules_hash(empty)
    assert DatasetSpec.model_validate_json(empty.model_dump_json()) == empty
    with pytest.raises(ValidationError, match="missing is for YOLO label files"):
        DatasetSpec.model_validate(_spec(tmp_path, tmp_path / "out", {"coco": "a.json", "missing": "empty"}))


@pytest.mark.parametrize(
    "make,reason",
    [
        (lambda p: os.mkfifo(p), "not a regular file: a FIFO (named pipe)"),
        (lambda p: p.symlink_to(p.parent / "gone.txt"), "not a regular file: a broken symlink"),
        (lambda p: p.mkdir(), "not a regular file: a folder"),
        (lambda p: p.write_text("2 0.5 0.5 0.4 0.4\n" * 4000), "larger than"),
        (lambda p: p.symlink_to(p.parents[2] / "elsewhere.txt"), "symlink leads outside the source folder"),
    ],
    ids=["fifo", "broken-symlink", "folder", "too-large", "symlink-out"],
)
def test_a_label_file_that_cannot_be_read_refuses_its_picture(coco_folder, tmp_path, make, reason):
    """Under ``missing: empty`` a label file that is there but cannot be read never makes its
    picture a background: the picture is refused with the reason, in a build and from an inbox."""
    raw = _background_folder(coco_folder, tmp_path)
    (tmp_path / "elsewhere.txt").write_text("0 0.5 0.5 0.1 0.1\n")
    make(raw / "labels" / "chelsea.txt")
    spec = _spec(raw, tmp_path / "out", {"files": "labels/*.txt", "missing": "empty", "max_bytes": 4096})
    spec["max_rejected"] = 1
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = h5forge.build(tmp_path / "spec.yaml")
    refused = {r.sample_id: r.reason for r in result.rejections}
    assert list(refused) == ["chelsea"] and reason in refused["chelsea"], refused
    assert set(_stored(result.path)) == set(PICTURES) - {"chelsea"}


def test_an_inbox_fifo_label_file_goes_to_quarantine_with_its_picture(coco_folder, tmp_path):
    raw, inbox = _background_folder(coco_folder, tmp_path), tmp_path / "inbox"
    spec = _spec(raw, tmp_path / "out", {"files": "labels/*.txt", "missing": "empty"})
    spec["source"]["inbox"] = str(inbox)
    spec["append"] = {"settle_seconds": 0}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert h5forge.build(tmp_path / "spec.yaml").version == 1
    _save(_picture("immunohistochemistry"), inbox / "images" / "ihc.png")
    (inbox / "labels").mkdir()
    os.mkfifo(inbox / "labels" / "ihc.txt")
    added = h5forge.append(tmp_path / "spec.yaml")
    assert added.added == 0 and [r.sample_id for r in added.rejections] == ["ihc"], added
    assert "FIFO" in added.rejections[0].reason
    quarantine = inbox / "quarantine"
    assert (quarantine / "images" / "ihc.png").is_file() and (quarantine / "images" / "ihc.png.reason").is_file()
    assert "ihc" not in _stored(tmp_path / "out" / "dataset_latest.h5")


def test_an_inbox_picture_waits_for_its_label_file_while_it_may_come(coco_folder, tmp_path):
    """The scan's rule, at chosen moments: a picture without a label file waits until it has been in
    the inbox ``settle_seconds`` (by its ctime: a moved-in picture's old mtime does not count), and a
    label file that arrives meanwhile makes it a picture with boxes."""
    from h5forge._ingest.append import scan_inbox
    from h5forge.spec import load_spec

    raw, inbox = _background_folder(coco_folder, tmp_path), tmp_path / "inbox"
    spec = _spec(raw, tmp_path / "out", {"files": "labels/*.txt", "missing": "empty"})
    spec["source"]["inbox"] = str(inbox)
    spec["append"] = {"settle_seconds": 30}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    loaded = load_spec(tmp_path / "spec.yaml")
    _save(_picture("immunohistochemistry"), inbox / "images" / "ihc.png")
    _save(_picture("camera"), inbox / "images" / "cam.png")
    _as_if_moved_in(*inbox.rglob("*.png"))
    now = time.time()
    scan = scan_inbox(loaded, inbox, now=now)
    assert scan.ready == [] and sorted(r.sample_id for r in scan.waiting) == ["cam", "ihc"]
    assert all(r.waitable and "no file for boxes (labels/*.txt) yet" in r.reason for r in scan.waiting)
    (inbox / "labels").mkdir()
    (inbox / "labels" / "cam.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    _as_if_moved_in(inbox / "labels" / "cam.txt")
    scan = scan_inbox(loaded, inbox, now=now)
    assert [(r.id, r.files) for r in scan.ready] == [("cam", {"images": "images/cam.png", "boxes": "labels/cam.txt"})]
    assert [r.sample_id for r in scan.waiting] == ["ihc"]
    later = scan_inbox(loaded, inbox, now=now + 31)
    assert sorted((r.id, sorted(r.files)) for r in later.ready) == [("cam", ["boxes", "images"]), ("ihc", ["images"])]


def test_a_label_file_arriving_after_its_picture_was_taken_as_a_background_goes_to_quarantine(coco_folder, tmp_path):
    """The picture was published as a background (no label file within the settle time); its label
    file arrives alone. It can make no new sample (latest holds the id), so it does not wait in the
    inbox for ever, unseen by every build: it goes to quarantine/ saying so, and put beside its
    picture in processed/ a rebuild gives the picture its boxes. A lone file of a sample latest does
    not hold still waits for its picture."""
    raw, inbox = _background_folder(coco_folder, tmp_path), tmp_path / "inbox"
    spec = _spec(raw, tmp_path / "out", {"files": "labels/*.txt", "missing": "empty"})
    spec["source"]["inbox"] = str(inbox)
    spec["append"] = {"settle_seconds": 0}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert h5forge.build(tmp_path / "spec.yaml").version == 1
    ihc = _picture("immunohistochemistry")
    _save(ihc, inbox / "images" / "ihc.png")
    assert h5forge.append(tmp_path / "spec.yaml").added == 1
    assert _stored(tmp_path / "out" / "dataset_latest.h5")["ihc"].shape == (0, 5)

    label = "1 0.5 0.5 0.25 0.25\n"
    (inbox / "labels").mkdir()
    (inbox / "labels" / "ihc.txt").write_text(label)
    (inbox / "labels" / "newcomer.txt").write_text(label)  # its picture may still come
    added = h5forge.append(tmp_path / "spec.yaml")
    assert (added.added, added.waiting) == (0, 1), added
    assert [r.sample_id for r in added.rejections] == ["ihc"], added.rejections
    assert "already in the dataset" in added.rejections[0].reason and "rebuild" in added.rejections[0].reason
    assert not (inbox / "labels" / "ihc.txt").exists() and (inbox / "labels" / "newcomer.txt").is_file()
    assert (inbox / "quarantine" / "labels" / "ihc.txt").read_text() == label
    assert "already in the dataset" in (inbox / "quarantine" / "labels" / "ihc.txt.reason").read_text()

    (inbox / "processed" / "v0002" / "labels").mkdir()
    (inbox / "quarantine" / "labels" / "ihc.txt").rename(inbox / "processed" / "v0002" / "labels" / "ihc.txt")
    rebuilt = h5forge.build(tmp_path / "spec.yaml")
    assert rebuilt.rejected == 0, rebuilt
    assert np.allclose(_stored(tmp_path / "out" / "dataset_latest.h5")["ihc"], _from_label(label, *ihc.shape[:2]), atol=1e-3)


def test_a_picture_both_labelled_and_a_background_is_a_leak_warning_not_a_failed_build(coco_folder, tmp_path):
    """The same picture in train with its label file and in val without one (a background): the
    leak check reads a background's missing label file as no file (the build failed with a
    KeyError after writing every sample); the build publishes both with a warning naming them."""
    import shutil

    raw, flat = _ultralytics_folder(coco_folder, tmp_path)
    shutil.copy(raw / "images" / "train" / "astronaut.png", raw / "images" / "val" / "astronaut.png")
    spec = _spec(raw, tmp_path / "out", {"files": "labels/*/*.txt", "missing": "empty"})
    spec["fields"]["images"]["files"] = "images/*/*.png"
    spec["source"]["ids"] = "path"
    spec["annotations"] = {"columns": {"split": "str"}, "folders": {"split": -1}, "required": False}
    spec["splits"] = {"column": "split"}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    built = h5forge.build(tmp_path / "spec.yaml")
    assert built.rejected == 0 and built.counts == {"train": 3, "val": 2, "test": 0}, built
    assert built.warnings == (
        "leak between splits: 1 raw input(s) of images are in more than one split "
        "('train/astronaut' (train), 'val/astronaut' (val), labelled differently)",
    )
    got = _stored(Path(built.path))
    assert got["val/astronaut"].shape == (0, 5)
    label = (raw / "labels" / "train" / "astronaut.txt").read_text()
    assert np.allclose(got["train/astronaut"], _from_label(label, 512, 512), atol=1e-3)


def _split_layout(coco_folder: Path, tmp_path: Path, roboflow: bool = False) -> Path:
    """Ultralytics' split layout (Roboflow's with ``roboflow``), chelsea in val, rocket a
    background in train, and a test split of pictures no one labelled: no label folder for it."""
    flat = _yolo_folder(coco_folder, tmp_path)
    raw = tmp_path / "split"
    split_of = {"astronaut": "train", "coffee": "train", "rocket": "train", "chelsea": "val"}

    def folder(kind: str, split: str) -> Path:
        return raw / split / kind if roboflow else raw / kind / split

    for name, split in split_of.items():
        for kind, suffix in (("images", ".png"), ("labels", ".txt")):
            folder(kind, split).mkdir(parents=True, exist_ok=True)
            (flat / kind / f"{name}{suffix}").rename(folder(kind, split) / f"{name}{suffix}")
    (folder("labels", "train") / "rocket.txt").unlink()
    _save(_picture("immunohistochemistry"), folder("images", "test") / "ihc.png")
    _save(_picture("camera"), folder("images", "test") / "cam.png")
    return raw


@pytest.mark.parametrize("roboflow", [False, True], ids=["ultralytics", "roboflow"])
def test_pictures_of_a_split_without_its_label_folder_are_unlabelled_not_backgrounds(coco_folder, tmp_path, roboflow):
    """A test split published without labels (images/test/ and no labels/test/, as competitions
    hand it out) is no split of background pictures: under missing: empty, each of its pictures is
    refused with the label folder it lacks (they were published as pictures with no objects, exit
    0). A background beside label files of its split is still one, and an empty label folder
    makes the split's pictures backgrounds."""
    from h5forge._init import infer_spec

    raw = _split_layout(coco_folder, tmp_path, roboflow)
    found = infer_spec(raw, tmp_path / "init.yaml")
    spec = yaml.safe_load(found.text)
    assert spec["fields"]["boxes"]["missing"] == "empty"
    test = "test/labels" if roboflow else "labels/test"
    pictures = "test/images" if roboflow else "images/test"
    assert f"{pictures}/ holds 2 pictures and has no {test}/: a build refuses them as unlabelled" in " ".join(found.notes)
    spec["output"] = {"dir": str(tmp_path / "out"), "allow_removals": True}
    spec["fields"]["images"].update(size=[SIZE, SIZE], larger="crop")
    spec["max_rejected"] = 2
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    built = h5forge.build(tmp_path / "spec.yaml")
    refused = {r.sample_id: r.reason for r in built.rejections}
    assert sorted(refused) == (["cam", "ihc"] if roboflow else ["test/cam", "test/ihc"]), refused
    assert all(f"{test}/ does not exist" in reason for reason in refused.values()), refused
    assert built.counts == {"train": 3, "val": 1, "test": 0}, built
    got = _stored(Path(built.path))
    assert got["rocket" if roboflow else "train/rocket"].shape == (0, 5)

    (raw / test).mkdir()  # said so: the test split's pictures are backgrounds
    built = h5forge.build(tmp_path / "spec.yaml")
    assert built.rejections == () and built.counts == {"train": 3, "val": 1, "test": 2}, built


def test_an_appended_background_of_a_split_stays_one_in_the_rebuild(coco_folder, tmp_path):
    """An inbox in split folders: a background beside its split's label folder is appended, its
    picture moved to processed/ without any label folder (it has no label file to move); the
    rebuild keeps it a background (it was judged in the inbox), while an inbox picture of a split
    without its label folder goes to quarantine as unlabelled."""
    raw, inbox = _split_layout(coco_folder, tmp_path), tmp_path / "inbox"
    shutil.rmtree(raw / "images" / "test")
    spec = _spec(raw, tmp_path / "out", {"files": "labels/*/*.txt", "missing": "empty"})
    spec["fields"]["images"]["files"] = "images/*/*.png"
    spec["source"].update(ids="path", inbox=str(inbox))
    spec["annotations"] = {"columns": {"split": "str"}, "folders": {"split": -1}, "required": False}
    spec["splits"] = {"column": "split"}
    spec["append"] = {"settle_seconds": 0}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert h5forge.build(tmp_path / "spec.yaml").counts == {"train": 3, "val": 1, "test": 0}
    _save(_picture("immunohistochemistry"), inbox / "images" / "train" / "ihc.png")
    _save(_picture("camera"), inbox / "images" / "val" / "cam.png")
    _save(_picture("coins"), inbox / "images" / "test" / "coins.png")  # no labels/test/
    (inbox / "labels" / "val").mkdir(parents=True)
    (inbox / "labels" / "val" / "cam.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    (inbox / "labels" / "train").mkdir()  # no file in it: ihc is a background
    added = h5forge.append(tmp_path / "spec.yaml")
    assert (added.added, added.counts) == (2, {"train": 4, "val": 2, "test": 0}), added
    assert [r.sample_id for r in added.rejections] == ["test/coins"], added.rejections
    assert "labels/test/ does not exist" in added.rejections[0].reason
    assert (inbox / "quarantine" / "images" / "test" / "coins.png").is_file()
    assert not (inbox / "processed" / "v0002" / "labels" / "train").exists()
    before = _stored(tmp_path / "out" / "dataset_latest.h5")
    assert before["train/ihc"].shape == (0, 5) and before["val/cam"].shape == (1, 5)
    rebuilt = h5forge.build(tmp_path / "spec.yaml")
    assert rebuilt.rejections == () and rebuilt.counts == {"train": 4, "val": 2, "test": 0}, rebuilt
    after = _stored(tmp_path / "out" / "dataset_latest.h5")
    assert set(after) == set(before) and all(np.array_equal(after[s], before[s]) for s in before)

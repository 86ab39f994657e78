"""A raw picture shared across splits (a leak) or under other labels (a conflict) is a warning of
the build and of an append, in the log, the health report and the result; nothing is rejected.
Pictures from skimage.data written by Pillow, through real builds and appends."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import h5py
import numpy as np

import h5forge
from h5forge._ingest.leaks import MAX_NAMED, Holder, Shared, leak_warnings
from h5forge.spec import parse_spec
from tests.helpers.data import age_files

PICTURES = {"camera": "camera", "coffee": "coffee", "moon": "moon", "rocket": "rocket", "page": "page"}


def _picture(folder: Path, name: str, source: str) -> np.ndarray:
    import skimage.data
    from PIL import Image

    pixels = np.asarray(Image.fromarray(getattr(skimage.data, source)()).convert("L").resize((48, 48)))
    (folder / "images").mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(folder / "images" / f"{name}.png")
    return pixels


def _mask(folder: Path, name: str, pixels: np.ndarray, level: int) -> None:
    from PIL import Image

    (folder / "masks").mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.where(pixels > level, 255, 0).astype(np.uint8)).save(folder / "masks" / f"{name}.png")


def _sample(folder: Path, name: str, source: str, level: int, split: str, label: str) -> dict:
    _mask(folder, name, _picture(folder, name, source), level)
    return {"id": name, "split": split, "label": label}


def _write_records(folder: Path, records: list[dict]) -> None:
    (folder / "annotations.json").write_text(json.dumps(records))


def _spec(tmp_path: Path):
    return parse_spec(
        {
            "name": "leaks",
            "source": {"root": "raw", "inbox": "inbox"},
            "output": {"dir": "out"},
            "splits": {"column": "split"},
            "fields": {
                "images": {"kind": "image", "files": "images/*.png", "size": [48, 48]},
                "masks": {"kind": "mask", "files": "masks/*.png", "like": "images"},
            },
            "annotations": {"file": "annotations.json", "id_key": "id", "columns": {"label": "str", "split": "str"}},
        },
        tmp_path,
    )


def _raw(tmp_path: Path) -> Path:
    raw = tmp_path / "raw"
    records = [
        _sample(raw, "cam_train", "camera", 100, "train", "man"),
        _sample(raw, "cam_val", "camera", 140, "val", "man"),  # the same picture, another mask: a leak
        _sample(raw, "coffee_a", "coffee", 100, "train", "cup"),
        _sample(raw, "coffee_b", "coffee", 160, "train", "mug"),  # the same picture, other labels: a conflict
        _sample(raw, "moon", "moon", 100, "train", "moon"),
        _sample(raw, "rocket", "rocket", 100, "test", "rocket"),
        _sample(raw, "page", "page", 255, "val", "page"),  # an empty mask, byte for byte
        _sample(raw, "empty_rocket", "rocket", 90, "train", "rocket"),  # the rocket picture again: a leak
    ]
    _mask(raw, "empty_rocket", np.zeros((48, 48), np.uint8), 0)  # the empty mask of page: not a leak
    _write_records(raw, records)
    return raw


def _ids(path: str) -> dict[str, list[str]]:
    with h5py.File(path, "r") as f:
        return {s: sorted(x.decode() for x in f[s]["ids"][()]) for s in ("train", "val", "test")}


def _image(path: str, split: str, sid: str) -> np.ndarray:
    with h5py.File(path, "r") as f:
        ids = [x.decode() for x in f[split]["ids"][()]]
        return f[split]["images"][ids.index(sid)]


def test_a_build_warns_of_a_picture_in_two_splits_or_under_two_labels_and_keeps_every_sample(tmp_path, caplog):
    _raw(tmp_path)
    with caplog.at_level(logging.WARNING):
        built = h5forge.build(_spec(tmp_path))
    leak = (
        "leak between splits: 2 raw input(s) of images are in more than one split "
        "('cam_train' (train), 'cam_val' (val), labelled differently; "
        "'empty_rocket' (train), 'rocket' (test), labelled differently)"
    )
    conflict = (
        "label conflict: 1 raw input(s) of images are in samples labelled differently "
        "('coffee_a' (train), 'coffee_b' (train))"
    )
    assert built.warnings == (leak, conflict)
    assert "2 warnings (.warnings)" in repr(built)
    logged = [r.getMessage() for r in caplog.records]
    assert logged.count(leak) == 1 and logged.count(conflict) == 1  # once, when found
    health = json.loads((tmp_path / "out" / "reports" / "dataset_v0001.health.json").read_text())
    assert leak in health["warnings"] and conflict in health["warnings"]
    assert "## Warnings" in (tmp_path / "out" / "reports" / "dataset_v0001.health.md").read_text()
    # a warning only: every sample is in its split, with its values
    assert built.rejected == 0
    assert _ids(built.path) == {
        "train": ["cam_train", "coffee_a", "coffee_b", "empty_rocket", "moon"],
        "val": ["cam_val", "page"],
        "test": ["rocket"],
    }
    np.testing.assert_array_equal(_image(built.path, "train", "cam_train"), _image(built.path, "val", "cam_val"))


def test_an_append_warns_of_an_inbox_picture_latest_holds_in_another_split(tmp_path, caplog):
    _raw(tmp_path)
    built = h5forge.build(_spec(tmp_path))
    inbox = tmp_path / "inbox"
    records = [
        _sample(inbox, "cam_test", "camera", 120, "test", "man"),  # camera again, in test
        _sample(inbox, "moon_train", "moon", 130, "train", "moon"),  # moon again, other mask, same split
        _sample(inbox, "fresh", "page", 100, "train", "page"),  # page's picture with another mask: val holds it
    ]
    shutil.copy(tmp_path / "raw" / "masks" / "moon.png", inbox / "masks" / "moon_same.png")
    shutil.copy(inbox / "images" / "moon_train.png", inbox / "images" / "moon_same.png")
    records.append({"id": "moon_same", "split": "train", "label": "moon"})  # moon, its mask: a duplicate
    _write_records(inbox, records)
    age_files(inbox)
    with caplog.at_level(logging.WARNING):
        added = h5forge.append(_spec(tmp_path))
    leak = (
        "leak between splits: 2 raw input(s) of images are in more than one split "
        "('cam_test' (test), 'cam_train' (train), 'cam_val' (val), labelled differently; "
        "'fresh' (train), 'page' (val), labelled differently)"
    )
    conflict = (
        "label conflict: 1 raw input(s) of images are in samples labelled differently "
        "('moon' (train), 'moon_train' (train))"
    )
    assert added.warnings == (leak, conflict)
    assert [r.getMessage() for r in caplog.records].count(leak) == 1
    health = json.loads((tmp_path / "out" / "reports" / "dataset_v0002.health.json").read_text())
    assert leak in health["warnings"] and conflict in health["warnings"]
    assert added.added == 3 and [r.sample_id for r in added.rejections] == ["moon_same"]
    ids = _ids(added.path)
    assert ids["test"] == ["cam_test", "rocket"] and "moon_train" in ids["train"] and "fresh" in ids["train"]
    np.testing.assert_array_equal(_image(added.path, "test", "cam_test"), _image(built.path, "train", "cam_train"))


def test_a_build_without_shared_pictures_warns_of_nothing(tmp_path):
    raw = tmp_path / "raw"
    records = [_sample(raw, name, source, 100, "train", name) for name, source in PICTURES.items()]
    _write_records(raw, records)
    for name in PICTURES:  # every sample the same mask: masks are labels, not pictures
        _mask(raw, name, np.zeros((48, 48), np.uint8), 0)
    assert h5forge.build(_spec(tmp_path)).warnings == ()


def test_a_warning_names_the_first_few_shared_inputs_and_counts_the_rest():
    found = [
        Shared("images", (Holder(f"a{k}", "train", "x"), Holder(f"b{k}", "val", "x"))) for k in range(MAX_NAMED + 3)
    ]
    [line] = leak_warnings(found)
    assert line.startswith(f"leak between splits: {MAX_NAMED + 3} raw input(s) of images are in more than one split ")
    assert "'a4' (train), 'b4' (val); and 3 more)" in line and "'a5'" not in line

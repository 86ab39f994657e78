"""``kind: boxes`` on real COCO files: scikit-image's bundled pictures, their objects encoded with
pycocotools (RLE masks, ``toBbox``, ``area``) and the files read back by ``pycocotools.coco.COCO``;
the same objects as YOLO labels. The expected boxes are computed here from the crop/pad/scale
rules, not by the kind's code."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

import h5forge
from h5forge._format.names import SPLITS
from h5forge.read._reader import SplitReader

SIZE = 256
CLASSES = ("person", "cup", "cat")
# picture -> objects as (class, x0, y0, x1, y1) pixel rectangles of a binary mask, some at the border
PICTURES = {
    "astronaut": (512, 512, [("person", 150, 30, 360, 512), ("cup", 5, 400, 60, 470)]),
    "coffee": (400, 600, [("cup", 180, 40, 470, 330), ("cup", 0, 0, 120, 90), ("person", 560, 300, 600, 400)]),
    "chelsea": (300, 451, [("cat", 60, 20, 400, 300)]),
    "rocket": (427, 640, []),
}


def _picture(name: str) -> np.ndarray:
    import skimage.data

    return getattr(skimage.data, name)()


@pytest.fixture(scope="module")
def coco_folder(tmp_path_factory) -> Path:
    from PIL import Image
    from pycocotools import mask as rle
    from pycocotools.coco import COCO

    raw = tmp_path_factory.mktemp("coco") / "raw"
    (raw / "images").mkdir(parents=True)
    (raw / "annotations").mkdir()
    images, annotations = [], []
    for i, (name, (h, w, objects)) in enumerate(PICTURES.items(), 1):
        pixels = _picture(name)
        assert pixels.shape[:2] == (h, w)
        Image.fromarray(pixels).save(raw / "images" / f"{name}.png")
        images.append({"id": i, "file_name": f"{name}.png", "height": h, "width": w})
        for cls, x0, y0, x1, y1 in objects:
            m = np.zeros((h, w), np.uint8)
            m[y0:y1, x0:x1] = 1
            encoded = rle.encode(np.asfortranarray(m))
            bbox = [float(v) for v in rle.toBbox(encoded)]
            assert bbox == [x0, y0, x1 - x0, y1 - y0]
            annotations.append({"id": len(annotations) + 1, "image_id": i, "category_id": CLASSES.index(cls) + 1,
                                "bbox": bbox, "area": float(rle.area(encoded)), "iscrowd": 0,
                                "segmentation": {"size": encoded["size"], "counts": encoded["counts"].decode()}})
    # a crowd region is not an object
    annotations.append({"id": 99, "image_id": 1, "category_id": 1, "bbox": [0, 0, 50, 50], "area": 2500.0,
                        "iscrowd": 1, "segmentation": {"size": [512, 512], "counts": "0"}})
    categories = [{"id": k + 1, "name": c, "supercategory": "thing"} for k, c in enumerate(CLASSES)]
    path = raw / "annotations" / "instances_val.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    api = COCO(str(path))  # the reference reader takes the file
    assert len(api.getAnnIds(iscrowd=False)) == sum(len(o) for _, _, o in PICTURES.values())
    return raw


def _spec(raw: Path, out: Path, boxes: dict, larger: str = "crop") -> dict:
    return {"name": "boxes", "source": {"root": str(raw)},
            "fields": {"images": {"kind": "image", "files": "images/*.png", "size": [SIZE, SIZE], "larger": larger},
                       "boxes": {"kind": "boxes", "like": "images", "classes": list(CLASSES), **boxes}},
            "output": {"dir": str(out)}, "verify": {"resample": 4, "latency_reads": 0}}


def _build(tmp_path: Path, spec: dict) -> dict[str, dict[str, np.ndarray]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = h5forge.build(path)
    assert result.version == 1 and result.rejected == 0, result
    out = {}
    for split in SPLITS:
        if result.counts.get(split):
            with SplitReader(result.path, split, fields=["boxes", "boxes_clipped", "boxes_dropped"]) as r:
                v = r.read(range(len(r)))
                for i, sid in enumerate(r.ids()):
                    out[sid] = {k: v[k][i] for k in v}
    return out


def _expected(name: str, larger: str, outside: str) -> tuple[np.ndarray, int, int]:
    """(rows x0 y0 x1 y1 class, clipped, dropped) by the image rules: a centre crop (the odd
    pixel at the bottom/right) or a shrink keeping the aspect, then an even pad."""
    h, w, objects = PICTURES[name]
    scale = min(SIZE / h, SIZE / w) if larger == "shrink" else 1.0
    sh, sw = (max(1, min(SIZE, round(h * scale))), max(1, min(SIZE, round(w * scale)))) if scale < 1 else (h, w)
    top, left = max(sh - SIZE, 0) // 2, max(sw - SIZE, 0) // 2
    ch, cw = min(sh, SIZE), min(sw, SIZE)
    pt, pl = (SIZE - ch) // 2, (SIZE - cw) // 2
    rows, clipped, dropped = [], 0, 0
    for cls, x0, y0, x1, y1 in objects:
        box = np.array([x0 * sw / w, y0 * sh / h, x1 * sw / w, y1 * sh / h]) - [left, top, left, top]
        inside = np.clip(box, 0, [cw, ch, cw, ch])
        cut = not np.allclose(inside, box)
        if inside[2] - inside[0] < 1 or inside[3] - inside[1] < 1 or (cut and outside == "drop"):
            dropped += 1
            continue
        clipped += cut
        rows.append([*(inside + [pl, pt, pl, pt]), CLASSES.index(cls)])
    return np.array(rows, np.float32).reshape(-1, 5), clipped, dropped


@pytest.mark.parametrize("larger,outside", [("crop", "clip"), ("crop", "drop"), ("shrink", "clip")])
def test_coco_boxes_follow_the_picture(coco_folder, tmp_path, larger, outside):
    got = _build(tmp_path, _spec(coco_folder, tmp_path / "out", {"coco": "annotations/instances_val.json",
                                                                 "outside": outside}, larger))
    assert set(got) == set(PICTURES)
    for name in PICTURES:
        rows, clipped, dropped = _expected(name, larger, outside)
        assert np.allclose(got[name]["boxes"], rows, atol=1e-3), (name, got[name]["boxes"], rows)
        assert (got[name]["boxes_clipped"], got[name]["boxes_dropped"]) == (clipped, dropped), name
    if larger == "crop":  # the coffee cup in the corner leaves the 256 x 256 centre crop entirely
        assert got["coffee"]["boxes_dropped"] >= 1


def _yolo_folder(coco_folder: Path, tmp_path: Path) -> Path:
    import shutil

    raw = tmp_path / "yolo"
    shutil.copytree(coco_folder / "images", raw / "images")
    (raw / "labels").mkdir()
    for name, (h, w, objects) in PICTURES.items():
        lines = [f"{CLASSES.index(c)} {(x0 + x1) / 2 / w:.9f} {(y0 + y1) / 2 / h:.9f} {(x1 - x0) / w:.9f} "
                 f"{(y1 - y0) / h:.9f}" for c, x0, y0, x1, y1 in objects]
        (raw / "labels" / f"{name}.txt").write_text("\n".join(lines) + ("\n" if lines else ""))
    (raw / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    return raw


SPLIT_OF = {"astronaut": "train", "coffee": "train", "rocket": "train", "chelsea": "val"}


def _ultralytics_folder(coco_folder: Path, tmp_path: Path, year: str = "") -> tuple[Path, Path]:
    """The YOLO folder in Ultralytics' split layout, ``images/<split><year>/`` beside
    ``labels/<split><year>/`` (``SPLIT_OF``): (that folder, the flat one left with its classes.txt)."""
    flat = _yolo_folder(coco_folder, tmp_path)
    raw = tmp_path / "split"
    for name, split in SPLIT_OF.items():
        for folder, suffix in (("images", ".png"), ("labels", ".txt")):
            (raw / folder / f"{split}{year}").mkdir(parents=True, exist_ok=True)
            (flat / folder / f"{name}{suffix}").rename(raw / folder / f"{split}{year}" / f"{name}{suffix}")
    return raw, flat


def test_yolo_labels_give_the_same_boxes(coco_folder, tmp_path):
    raw = _yolo_folder(coco_folder, tmp_path)
    yolo = _build(tmp_path / "y", _spec(raw, tmp_path / "y" / "out", {"files": "labels/*.txt"}))
    coco = _build(tmp_path / "c", _spec(coco_folder, tmp_path / "c" / "out", {"coco": "annotations/instances_val.json"}))
    assert set(yolo) == set(coco) == set(PICTURES)
    for name in PICTURES:
        assert np.allclose(yolo[name]["boxes"], coco[name]["boxes"], atol=1e-3), name
        assert yolo[name]["boxes_dropped"] == coco[name]["boxes_dropped"]


def test_init_recognises_coco_and_yolo_folders(coco_folder, tmp_path):
    from h5forge._init import infer_spec

    found = infer_spec(coco_folder, tmp_path / "coco.yaml")
    fields = yaml.safe_load(found.text)["fields"]
    assert found.layout == "boxes"
    assert fields["boxes"] == {"kind": "boxes", "like": "images", "coco": "annotations/instances_val.json",
                               "classes": list(CLASSES), "outside": "clip", "masks": False}
    assert "masks: false" in found.text and "instance mask" in found.text  # the file has segmentations
    assert fields["images"]["files"] == "images/*.png" and fields["images"]["larger"] == "shrink"
    assert not any("taken by no glob" in n for n in found.notes), found.notes  # the COCO file is the field's
    found = infer_spec(_yolo_folder(coco_folder, tmp_path), tmp_path / "yolo.yaml")
    fields = yaml.safe_load(found.text)["fields"]
    assert found.layout == "boxes" and fields["boxes"]["files"] == "labels/*.txt"
    assert fields["boxes"]["classes"] == list(CLASSES)


def test_init_keeps_each_yolo_class_name_at_its_index(coco_folder, tmp_path):
    """A label's class number is the name's position: data.yaml names keyed by quoted numbers ("10"
    sorts before "2" as text) and a classes.txt with a blank line among the names (and a byte-order
    mark) keep every name at its index, an index named by no one taking a placeholder."""
    from h5forge._init import infer_spec

    raw = _yolo_folder(coco_folder, tmp_path)
    (raw / "classes.txt").unlink()
    names = [f"thing{i}" for i in range(12)]
    (raw / "data.yaml").write_text("names:\n" + "".join(f"  '{i}': {n}\n" for i, n in enumerate(names)))
    found = infer_spec(raw, tmp_path / "spec.yaml")
    assert yaml.safe_load(found.text)["fields"]["boxes"]["classes"] == names
    (raw / "classes.txt").write_text("\ufeffperson\n\ncat\n\n", encoding="utf-8")
    found = infer_spec(raw, tmp_path / "spec.yaml")
    assert yaml.safe_load(found.text)["fields"]["boxes"]["classes"] == ["person", "class_1", "cat"]
    assert any("classes.txt names no class 1" in n for n in found.notes), found.notes


@pytest.mark.parametrize("year", ["", "2017"])
def test_init_recognises_ultralytics_split_folders_and_the_build_keeps_each_split(coco_folder, tmp_path, year):
    """Ultralytics' own layout, images/<split>/ beside labels/<split>/ and the names in data.yaml
    (its coco128 names the folders with COCO's year, images/train2017/): ``init`` writes a boxes spec
    taking the split from the folders (it was read as class folders named train and val, every
    picture labelled with its split, its boxes left out); the build publishes each picture in its
    folder's split with its label file's boxes."""
    from h5forge._init import infer_spec

    raw, _ = _ultralytics_folder(coco_folder, tmp_path, year)
    (raw / "data.yaml").write_text(yaml.safe_dump({"path": ".", "train": "images/train", "val": "images/val",
                                                   "names": dict(enumerate(CLASSES))}))
    found = infer_spec(raw, tmp_path / "spec.yaml")
    data = yaml.safe_load(found.text)
    assert found.layout == "boxes", found.text
    assert data["source"]["ids"] == "path" and data["splits"]["column"] == "split"
    assert data["fields"]["boxes"]["files"] == "labels/*/*.txt"
    assert data["fields"]["images"]["files"] == "images/*/*.png"
    assert data["fields"]["boxes"]["classes"] == list(CLASSES)
    data["output"]["dir"] = str(tmp_path / "out")
    data["fields"]["images"].update(size=[SIZE, SIZE], larger="crop")  # the sizes _expected computes with
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
    result = h5forge.build(tmp_path / "spec.yaml")
    assert result.rejections == () and result.counts == {"train": 3, "val": 1, "test": 0}
    for split in ("train", "val"):
        with SplitReader(result.path, split, fields=["boxes"]) as r:
            got = dict(zip(r.ids(), r.read(range(len(r)))["boxes"]))
        assert set(got) == {f"{split}{year}/{name}" for name, s in SPLIT_OF.items() if s == split}
        for sid, boxes in got.items():
            assert np.allclose(boxes, _expected(sid.split("/")[1], "crop", "clip")[0], atol=1e-3), sid


def test_init_recognises_split_folders_holding_images_and_labels_and_the_build_keeps_each_split(coco_folder, tmp_path):
    """Roboflow's Ultralytics export, train/images/ beside train/labels/ (and valid/, test/) with a
    data.yaml naming ../train/images: ``init`` writes a boxes spec taking the split from the folder
    above images/ (it was read as one class named 'images', the boxes left out); the build publishes
    each picture in its folder's split with its label file's boxes."""
    from h5forge._init import infer_spec

    flat = _yolo_folder(coco_folder, tmp_path)
    raw = tmp_path / "roboflow"
    split_of = {"astronaut": "train", "coffee": "train", "rocket": "test", "chelsea": "valid"}
    for name, split in split_of.items():
        for folder, suffix in (("images", ".png"), ("labels", ".txt")):
            (raw / split / folder).mkdir(parents=True, exist_ok=True)
            (flat / folder / f"{name}{suffix}").rename(raw / split / folder / f"{name}{suffix}")
    (raw / "data.yaml").write_text(yaml.safe_dump({"train": "../train/images", "val": "../valid/images",
                                                   "test": "../test/images", "nc": 3, "names": list(CLASSES)}))
    found = infer_spec(raw, tmp_path / "spec.yaml")
    data = yaml.safe_load(found.text)
    assert found.layout == "boxes", found.text
    assert data["fields"]["images"]["files"] == "*/images/*.png"
    assert data["fields"]["boxes"]["files"] == "*/labels/*.txt"
    assert data["fields"]["boxes"]["classes"] == list(CLASSES)
    assert data["splits"]["column"] == "split" and data["annotations"]["folders"] == {"split": -2}
    assert not any("taken by no glob" in n for n in found.notes), found.notes
    data["output"]["dir"] = str(tmp_path / "out")
    data["fields"]["images"].update(size=[SIZE, SIZE], larger="crop")  # the sizes _expected computes with
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
    result = h5forge.build(tmp_path / "spec.yaml")
    assert result.rejections == () and result.counts == {"train": 2, "val": 1, "test": 1}
    for split, folder in (("train", "train"), ("val", "valid"), ("test", "test")):
        with SplitReader(result.path, split, fields=["boxes"]) as r:
            got = dict(zip(r.ids(), r.read(range(len(r)))["boxes"]))
        assert set(got) == {name for name, s in split_of.items() if s == folder}
        for name, boxes in got.items():
            assert np.allclose(boxes, _expected(name, "crop", "clip")[0], atol=1e-3), name


def _decode_one(raw: Path, tmp_path: Path, boxes: dict, picture: str):
    from h5forge._ingest.discover import discover
    from h5forge.kinds import decode_sample, stored_kinds
    from h5forge.spec import DatasetSpec

    spec = DatasetSpec.model_validate(_spec(raw, tmp_path / "out", boxes))
    ref = next(r for r in discover(spec).samples if r.id == picture)
    return decode_sample(stored_kinds(spec), raw, ref)


def test_bad_boxes_reject_the_picture_with_the_reason(coco_folder, tmp_path):
    from h5forge._samples import Reject

    raw = _yolo_folder(coco_folder, tmp_path)
    (raw / "labels" / "chelsea.txt").write_text("2 0.5 0.5 -0.1 0.2\n")
    with pytest.raises(Reject, match="line 1: negative width or height"):
        _decode_one(raw, tmp_path, {"files": "labels/*.txt"}, "chelsea")
    (raw / "labels" / "chelsea.txt").write_text("7 0.5 0.5 0.1 0.2\n")
    with pytest.raises(Reject, match="class 7 is not a class index 0..2"):
        _decode_one(raw, tmp_path, {"files": "labels/*.txt"}, "chelsea")
    with pytest.raises(Reject, match="category 'cat' is not one of the classes"):
        _decode_with_classes(coco_folder, tmp_path)
    data = json.loads((coco_folder / "annotations" / "instances_val.json").read_text())
    data["images"][2]["width"] = 450
    (tmp_path / "sized").mkdir()
    bad = tmp_path / "sized" / "instances_val.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(Reject, match=r"says the picture is 450x300 \(WxH\); it is 451x300"):
        _decode_one(coco_folder, tmp_path, {"coco": str(bad)}, "chelsea")


@pytest.mark.parametrize("spelling", [
    pytest.param(lambda lines: "\ufeff" + "\n".join(lines) + "\n", id="byte-order mark"),
    pytest.param(lambda lines: "\r\n".join(lines) + "\r\n", id="CRLF"),
    pytest.param(lambda lines: "\n".join(line.replace(" ", "\t") for line in lines), id="tabs, no final newline"),
    pytest.param(lambda lines: "\n\n".join(lines) + "\n\n  \n", id="blank lines"),
])
def test_a_yolo_label_file_as_editors_write_it_gives_the_same_boxes(coco_folder, tmp_path, spelling):
    """The same label lines as Windows editors and exporters write them: the same boxes as the plain file."""
    raw = _yolo_folder(coco_folder, tmp_path)
    plain = (raw / "labels" / "coffee.txt").read_text().splitlines()
    assert len(plain) == 3
    (raw / "labels" / "coffee.txt").write_bytes(spelling(plain).encode("utf-8"))
    decoded = _decode_one(raw, tmp_path, {"files": "labels/*.txt"}, "coffee")
    assert np.allclose(decoded["boxes"].value, _expected("coffee", "crop", "clip")[0], atol=1e-3)


@pytest.mark.parametrize("line,number", [
    ("2 225.5 150 200 150", "225.5"),  # a label in pixels: every box would leave the frame and be dropped
    ("2 0.5 0.5 3 0.2", "3"),  # three pictures wide: clipped to a full-width box no one drew
    ("2 1.2 0.5 0.1 0.1", "1.2"),  # the centre beyond the right edge
    ("2 0.5 -0.1 0.1 0.1", "-0.1"),  # the centre above the top edge
    ("2 0.1 0.2 0.3 0.2 1.4 0.4", "1.4"),  # a polygon vertex
])
def test_a_yolo_number_outside_zero_to_one_rejects_the_picture(coco_folder, tmp_path, line, number):
    """YOLO's numbers are fractions of the picture's size: a label with one outside 0..1 (written in
    pixels, or for another picture) rejects its picture with the reason, and the others are
    published as their labels say; a box that only reaches past the edge is clipped as before."""
    raw = _yolo_folder(coco_folder, tmp_path)
    (raw / "labels" / "chelsea.txt").write_text(line + "\n")
    spec = _spec(raw, tmp_path / "out", {"files": "labels/*.txt"})
    spec["max_rejected"] = 0.5
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = h5forge.build(tmp_path / "spec.yaml")
    assert [(r.sample_id, r.reason) for r in result.rejections] == [
        ("chelsea", f"line 1: {number} is no fraction of the picture's size (YOLO coordinates lie in 0..1; "
                    "a label in pixels?)")]
    got = {}
    for split in SPLITS:
        if result.counts.get(split):
            with SplitReader(result.path, split, fields=["boxes"]) as r:
                got.update(zip(r.ids(), r.read(range(len(r)))["boxes"]))
    assert set(got) == set(PICTURES) - {"chelsea"}
    for name in got:
        assert np.allclose(got[name], _expected(name, "crop", "clip")[0], atol=1e-3), name
    h, w, _ = PICTURES["chelsea"]  # its numbers within 0..1, the box reaching 0.05 above the top edge
    (raw / "labels" / "chelsea.txt").write_text("2 0.5 0.05 0.2 0.2\n")
    decoded = _decode_one(raw, tmp_path, {"files": "labels/*.txt"}, "chelsea")
    top, left = (h - SIZE) // 2, (w - SIZE) // 2
    assert np.allclose(decoded["boxes"].value, [[0.4 * w - left, 0, 0.6 * w - left, 0.15 * h - top, 2]], atol=1e-3)
    assert decoded["boxes_clipped"].value == 1


def _decode_with_classes(raw: Path, tmp_path: Path):
    from h5forge._ingest.discover import discover
    from h5forge.kinds import decode_sample, stored_kinds
    from h5forge.spec import DatasetSpec

    data = _spec(raw, tmp_path / "out", {"coco": "annotations/instances_val.json"})
    data["fields"]["boxes"]["classes"] = ["person", "cup"]
    spec = DatasetSpec.model_validate(data)
    ref = next(r for r in discover(spec).samples if r.id == "chelsea")
    return decode_sample(stored_kinds(spec), raw, ref)


def test_two_coco_files_are_indexed_once_each(coco_folder, tmp_path):
    """A spec may list several COCO files (train, val): each is parsed once, not once a sample."""
    from h5forge.kinds.boxes import sources

    data = json.loads((coco_folder / "annotations" / "instances_val.json").read_text())
    first = dict(data, images=data["images"][:2])
    second = dict(data, images=data["images"][2:], annotations=[a for a in data["annotations"] if a["image_id"] > 2])
    for name, part in (("a.json", first), ("b.json", second)):
        (tmp_path / name).write_text(json.dumps(part))
    parsed = []
    real = sources._parse
    sources._parse = lambda path, rel: parsed.append(rel) or real(path, rel)
    try:
        for name in ("astronaut", "chelsea", "coffee", "rocket") * 2:
            decoded = _decode_one(coco_folder, tmp_path, {"coco": [str(tmp_path / "a.json"), str(tmp_path / "b.json")]},
                                  name)
            assert len(decoded["boxes"].value) == len(_expected(name, "crop", "clip")[0])
    finally:
        sources._parse = real
    assert sorted(parsed) == sorted({str(tmp_path / "a.json"), str(tmp_path / "b.json")})


def test_a_changed_coco_entry_changes_only_its_samples_input_key(coco_folder, tmp_path):
    """The COCO file is shared by every picture: an incremental build must see that one picture's
    boxes changed (its input key), and that the others did not."""
    import shutil

    from h5forge._ingest.discover import discover
    from h5forge._ingest.incremental.inputs import fingerprint
    from h5forge.spec import DatasetSpec

    raw = tmp_path / "raw"
    shutil.copytree(coco_folder, raw)
    spec = DatasetSpec.model_validate(_spec(raw, tmp_path / "out", {"coco": "annotations/instances_val.json"}))
    before = fingerprint(spec, discover(spec)).samples
    path = raw / "annotations" / "instances_val.json"
    data = json.loads(path.read_text())
    next(a for a in data["annotations"] if a["image_id"] == 3)["bbox"][0] += 5
    path.write_text(json.dumps(data))
    after = fingerprint(spec, discover(spec)).samples
    assert [sid for sid in before if before[sid] != after[sid]] == ["chelsea"]


def test_batches_are_padded_with_counts(coco_folder, tmp_path):
    from torch.utils.data import DataLoader

    from h5forge.read._collate import Padded
    from h5forge.read.jax import Source
    from h5forge.read.torch import H5Dataset, collate

    spec = _spec(coco_folder, tmp_path / "out", {"coco": "annotations/instances_val.json"})
    spec["splits"] = {"ratios": {"train": 1.0}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    path = h5forge.build(tmp_path / "spec.yaml").path
    ds = H5Dataset(path, "train", fields=["images", "boxes"])
    images, boxes = next(iter(DataLoader(ds, batch_size=4, collate_fn=collate)))
    assert isinstance(boxes, Padded) and tuple(images.shape) == (4, 3, SIZE, SIZE)
    ids = ds.reader.ids()
    want = [len(_expected(sid, "crop", "clip")[0]) for sid in ids]
    assert boxes.lengths.tolist() == want and tuple(boxes.values.shape) == (4, max(want), 5)
    for i, sid in enumerate(ids):
        assert np.allclose(boxes.values[i, :want[i]].numpy(), _expected(sid, "crop", "clip")[0], atol=1e-3)
        assert not boxes.values[i, want[i]:].numpy().any()  # padding
    batch = Source(path, "train", fields=["boxes"]).get_batch([0, 1, 2, 3])
    assert np.array_equal(batch["boxes"].lengths, boxes.lengths.numpy())


def test_preview_outlines_the_boxes_over_the_picture(coco_folder, tmp_path):
    from h5forge._views.preview import load_samples

    spec = _spec(coco_folder, tmp_path / "out", {"coco": "annotations/instances_val.json"})
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    path = h5forge.build(tmp_path / "spec.yaml").path
    drawn = {d.id: d for d in load_samples(path, n=len(PICTURES))}
    chelsea = drawn["chelsea"]
    (overlay,) = chelsea.overlays["images"]
    x0, y0, x1, y1, _ = _expected("chelsea", "crop", "clip")[0][0]
    assert overlay[int(y0), int(x0) + 5].any() and overlay[int(y1) - 1, int(x0) + 5].any()  # top and bottom edges
    assert not overlay[int((y0 + y1) / 2), int((x0 + x1) / 2)].any()  # inside: transparent
    assert any("boxes: 1 (1 cat)" == c for c in chelsea.captions)
    assert not drawn["rocket"].overlays.get("images", [np.zeros(1)])[0].any()  # no object, nothing drawn


def _masks_of(result_path: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for split in SPLITS:
        with SplitReader(result_path, split, fields=["boxes", "boxes_masks"]) as r:
            v = r.read(range(len(r)))
            for i, sid in enumerate(r.ids()):
                out[sid] = (v["boxes"][i], v["boxes_masks"][i])
    return out


def test_instance_masks_from_coco_rle_and_polygons(coco_folder, tmp_path):
    """RLE masks (as the fixture wrote them) and the same objects as polygons come out cropped with
    the picture, one per kept box, equal to pycocotools' own decoding cropped by the plan."""
    from pycocotools import mask as rle

    data = json.loads((coco_folder / "annotations" / "instances_val.json").read_text())
    polygons = tmp_path / "polygons.json"
    for a in data["annotations"]:
        x, y, bw, bh = a["bbox"]
        a["segmentation"] = [[x, y, x + bw, y, x + bw, y + bh, x, y + bh]]
    polygons.write_text(json.dumps(data))
    for source in ("annotations/instances_val.json", str(polygons)):
        spec = _spec(coco_folder, tmp_path / source.replace("/", "_") / "out", {"coco": source, "masks": True})
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
        result = h5forge.build(tmp_path / "spec.yaml")
        assert result.rejected == 0
        got = _masks_of(result.path)
        ann = json.loads(Path(source if source.startswith("/") else coco_folder / source).read_text())
        for i, (name, (h, w, objects)) in enumerate(PICTURES.items(), 1):
            boxes, masks = got[name]
            assert masks.shape == (len(boxes), SIZE, SIZE) and masks.dtype == np.uint8
            top, left = (h - SIZE) // 2, (w - SIZE) // 2
            want = []
            for a in (a for a in ann["annotations"] if a["image_id"] == i and not a["iscrowd"]):
                seg = a["segmentation"]
                enc = rle.merge(rle.frPyObjects(seg, h, w)) if isinstance(seg, list) else \
                    {"size": seg["size"], "counts": seg["counts"].encode()}
                m = rle.decode(enc)[top:top + SIZE, left:left + SIZE]
                if m.sum() >= 1 and m.any(axis=0).sum() >= 1:
                    want.append(m)
            kept = [m for m in want if m.any(axis=1).sum() >= 1 and m.any(axis=0).sum() >= 1]
            assert len(kept) == len(masks), name
            for m, k in zip(masks, kept):
                assert np.array_equal(m, k), name
            for (x0, y0, x1, y1, _), m in zip(boxes, masks):  # each mask lies in its box
                ys, xs = np.nonzero(m)
                assert xs.min() >= np.floor(x0) and xs.max() < np.ceil(x1) and ys.min() >= np.floor(y0)


def test_a_yolo_polygon_is_its_boxes_instance_mask(coco_folder, tmp_path):
    """A YOLO segmentation line (a triangle) gives its bounding box and the triangle as its mask."""
    raw = _yolo_folder(coco_folder, tmp_path)
    h, w, _ = PICTURES["chelsea"]
    (raw / "labels" / "chelsea.txt").write_text(f"2 {100 / w} {80 / h} {300 / w} {80 / h} {200 / w} {260 / h}\n")
    decoded = _decode_one(raw, tmp_path, {"files": "labels/*.txt", "masks": True}, "chelsea")
    boxes, masks = decoded["boxes"].value, decoded["boxes_masks"].value
    top, left = (h - SIZE) // 2, (w - SIZE) // 2  # 22, 97
    assert np.allclose(boxes, [[100 - left, 80 - top, 300 - left, 260 - top, 2]], atol=1e-3)
    (m,) = masks
    assert m[150 - top, 200 - left] == 1  # inside the triangle
    assert m[255 - top, 102 - left] == 0  # the box's bottom-left corner is outside it
    assert m.sum() < 0.6 * (200 * 180)  # about half the box



def test_a_yolo_oriented_box_gives_the_upright_box_around_its_corners(coco_folder, tmp_path):
    """An Ultralytics OBB line ``class x1 y1 ... x4 y4`` (a 120 x 60 rectangle turned 30 degrees on
    chelsea) is stored as the upright box around its four corners, computed here from the rectangle."""
    raw = _yolo_folder(coco_folder, tmp_path)
    h, w, _ = PICTURES["chelsea"]
    turn = np.deg2rad(30)
    half = np.array([[-60, -30], [60, -30], [60, 30], [-60, 30]], np.float64)
    corners = half @ np.array([[np.cos(turn), np.sin(turn)], [-np.sin(turn), np.cos(turn)]]) + [225, 150]
    line = "1 " + " ".join(f"{x / w:.9f} {y / h:.9f}" for x, y in corners)
    (raw / "labels" / "chelsea.txt").write_text(line + "\n")
    boxes = _decode_one(raw, tmp_path, {"files": "labels/*.txt"}, "chelsea")["boxes"].value
    top, left = (h - SIZE) // 2, (w - SIZE) // 2
    reach = 60 * np.cos(turn) + 30 * np.sin(turn), 60 * np.sin(turn) + 30 * np.cos(turn)
    want = [225 - reach[0] - left, 150 - reach[1] - top, 225 + reach[0] - left, 150 + reach[1] - top, 1]
    assert np.allclose(boxes, [want], atol=1e-3), (boxes, want)


def _pose_folder(coco_folder: Path, tmp_path: Path, kpt_shape: tuple[int, int]) -> Path:
    """The YOLO folder with Ultralytics' pose labels: each line ``class cx cy w h`` followed by K
    keypoints of D numbers (x, y inside the box; visibility 2 when D is 3), and a data.yaml naming
    the classes and declaring ``kpt_shape``."""
    k, d = kpt_shape
    raw = _yolo_folder(coco_folder, tmp_path)
    (raw / "classes.txt").unlink()
    rng = np.random.default_rng(10 * k + d)
    for name in PICTURES:
        lines = []
        for line in (raw / "labels" / f"{name}.txt").read_text().splitlines():
            _, cx, cy, bw, bh = (float(v) for v in line.split())
            xs, ys = rng.uniform(cx - bw / 2, cx + bw / 2, k), rng.uniform(cy - bh / 2, cy + bh / 2, k)
            points = np.column_stack([xs, ys, np.full(k, 2.0)])[:, :d]
            lines.append(line + "".join(f" {v:.6f}" for v in points.ravel()))
        (raw / "labels" / f"{name}.txt").write_text("".join(f"{line}\n" for line in lines))
    (raw / "data.yaml").write_text(yaml.safe_dump({"path": ".", "train": "images", "val": "images",
                                                   "kpt_shape": [k, d], "names": dict(enumerate(CLASSES))}))
    return raw


@pytest.mark.parametrize("kpt_shape", [(4, 2), (2, 3), (17, 3)])
def test_yolo_pose_labels_give_the_box_of_their_first_four_numbers(coco_folder, tmp_path, kpt_shape):
    """Ultralytics' pose labels: ``init`` takes ``kpt_shape`` from data.yaml into the spec, and every
    reader gives each line's box, its first four numbers (the keypoints were read as polygon vertices:
    a line of 4 + 2K numbers gave the box around the box's centre, its size and the keypoints, and
    other lines were refused as no polygon)."""
    from h5forge._init import infer_spec
    from h5forge.read.torch import H5Dataset

    raw = _pose_folder(coco_folder, tmp_path, kpt_shape)
    found = infer_spec(raw, tmp_path / "spec.yaml")
    data = yaml.safe_load(found.text)
    assert data["fields"]["boxes"]["kpt_shape"] == list(kpt_shape), found.text
    data["output"]["dir"] = str(tmp_path / "out")
    data["fields"]["images"].update(size=[SIZE, SIZE], larger="crop")  # the sizes _expected computes with
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
    result = h5forge.build(tmp_path / "spec.yaml")
    assert result.rejections == () and sum(result.counts.values()) == len(PICTURES)
    seen = set()
    for split in SPLITS:
        if result.counts.get(split):
            ds = H5Dataset(result.path, split, fields=("boxes",))
            for i, sid in enumerate(ds.reader.ids()):
                assert np.allclose(ds[i].numpy(), _expected(sid, "crop", "clip")[0], atol=1e-3), sid
                seen.add(sid)
    assert seen == set(PICTURES)


@pytest.mark.parametrize("line,reason", [
    ("0 0.5 0.5 0.2 0.2", r"line 1: 4 numbers; a pose line of kpt_shape \[2, 3\] holds 10: class cx cy w h "
                          r"and 2 keypoints of 3 numbers"),
    ("0 0.5 0.5 0.2 0.2 0.45 0.5 2 0.55 0.5", r"line 1: 9 numbers; a pose line of kpt_shape \[2, 3\] holds 10"),
    ("0 0.5 0.5 0.2 0.2 0.45 0.5 2 1.5 0.5 2", r"line 1: 1.5 is no fraction of the picture's size"),
    ("0 0.5 0.5 0.2 0.2 0.45 0.5 -1 0.55 0.5 2", r"line 1: keypoint 1 has the visibility -1, below 0"),
])
def test_a_pose_line_that_does_not_fit_kpt_shape_rejects_its_picture(coco_folder, tmp_path, line, reason):
    from h5forge._samples import Reject

    raw = _yolo_folder(coco_folder, tmp_path)
    (raw / "labels" / "chelsea.txt").write_text(f"{line}\n")
    with pytest.raises(Reject, match=reason):
        _decode_one(raw, tmp_path, {"files": "labels/*.txt", "kpt_shape": [2, 3]}, "chelsea")


def test_pose_lines_are_refused_when_data_yaml_declares_kpt_shape_and_the_spec_does_not(coco_folder, tmp_path):
    """Ultralytics reads a line by the dataset's kpt_shape: with data.yaml declaring one and the spec
    none, a line that is no plain box is refused with the key to set, never read as a polygon; a
    plain box line is still its box."""
    from h5forge._samples import Reject

    raw = _pose_folder(coco_folder, tmp_path, (4, 2))
    with pytest.raises(Reject, match=r"line 1: 12 numbers, and data.yaml declares kpt_shape \[4, 2\]: a pose line "
                                     r"\(class cx cy w h and keypoints\), no polygon; set the field's kpt_shape: "
                                     r"\[4, 2\]"):
        _decode_one(raw, tmp_path, {"files": "labels/*.txt"}, "chelsea")
    h, w, _ = PICTURES["chelsea"]
    (raw / "labels" / "chelsea.txt").write_text("2 0.5 0.5 0.2 0.2\n")
    boxes = _decode_one(raw, tmp_path, {"files": "labels/*.txt"}, "chelsea")["boxes"].value
    assert np.allclose(boxes, _from_label("2 0.5 0.5 0.2 0.2\n", h, w), atol=1e-3)


@pytest.mark.parametrize("boxes,message", [
    ({"coco": "annotations/instances_val.json", "kpt_shape": [17, 3]}, "kpt_shape is for YOLO pose labels"),
    ({"files": "labels/*.txt", "kpt_shape": [17, 4]}, r"kpt_shape \[17, 4\]: K keypoints \(K >= 1\) of 2"),
    ({"files": "labels/*.txt", "kpt_shape": [0, 3]}, r"kpt_shape \[0, 3\]: K keypoints \(K >= 1\) of 2"),
])
def test_kpt_shape_is_refused_where_it_cannot_describe_the_labels(tmp_path, boxes, message):
    from pydantic import ValidationError

    from h5forge.spec import DatasetSpec

    with pytest.raises(ValidationError, match=message):
        DatasetSpec.model_validate(_spec(tmp_path, tmp_path / "out", boxes))


def _from_label(text: str, h: int, w: int) -> np.ndarray:
    """The rows a YOLO label file gives a picture of h x w under ``_spec``'s centre crop to SIZE
    (clipped to it, dropped when under a pixel), computed from its text."""
    top, left = max(h - SIZE, 0) // 2, max(w - SIZE, 0) // 2
    ch, cw = min(h, SIZE), min(w, SIZE)
    pt, pl = (SIZE - ch) // 2, (SIZE - cw) // 2
    rows = []
    for line in text.split("\n"):
        if line.strip():
            c, cx, cy, bw, bh = (float(v) for v in line.split())
            box = np.array([(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h])
            box = np.clip(box - [left, top, left, top], 0, [cw, ch, cw, ch])
            if box[2] - box[0] >= 1 and box[3] - box[1] >= 1:
                rows.append([*(box + [pl, pt, pl, pt]), c])
    return np.array(rows, np.float32).reshape(-1, 5)


def test_yolo_boxes_through_rebuild_append_and_rollback_are_the_label_files(coco_folder, tmp_path):
    """Build, a label file edited, a rebuild, a picture and its label file appended from the inbox,
    a rollback: after each, every reader (SplitReader, H5Dataset one by one and in batches) gives the
    boxes the label files of that version say."""
    import shutil

    from h5forge.read.torch import H5Dataset
    from tests.helpers.data import age_files
    from tests.test_cli import run

    raw, inbox = _yolo_folder(coco_folder, tmp_path), tmp_path / "inbox"
    spec = _spec(raw, tmp_path / "out", {"files": "labels/*.txt"})
    spec["source"]["inbox"] = str(inbox)
    spec["output"]["retire_after_seconds"] = 0
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    sizes = {name: (h, w) for name, (h, w, _) in PICTURES.items()}
    labels = {name: (raw / "labels" / f"{name}.txt").read_text() for name in PICTURES}

    def check(want: dict[str, str]) -> None:
        latest = tmp_path / "out" / "dataset_latest.h5"
        got = {}
        for split in SPLITS:
            with SplitReader(latest, split, fields=["boxes"]) as r:
                got.update(zip(r.ids(), r.read(range(len(r)))["boxes"]))
                n = len(r)
            if n:
                ds = H5Dataset(latest, split, fields=("boxes",))
                ids = ds.reader.ids()
                for i, sid in enumerate(ids):
                    assert np.allclose(ds[i].numpy(), _from_label(want[sid], *sizes[sid]), atol=1e-3), sid
                for k, batch in enumerate(ds.loader(batch_size=2, shuffle=False)):
                    for j, n in enumerate(batch.lengths.tolist()):
                        sid = ids[2 * k + j]
                        assert np.allclose(batch.values[j, :n].numpy(), _from_label(want[sid], *sizes[sid]), atol=1e-3)
        assert set(got) == set(want)
        for sid, boxes in got.items():
            assert np.allclose(boxes, _from_label(want[sid], *sizes[sid]), atol=1e-3), sid

    assert h5forge.build(tmp_path / "spec.yaml").version == 1
    check(labels)
    v1 = dict(labels)
    labels["coffee"] = "2 0.5 0.5 0.2 0.3\n0 0.4 0.45 0.1 0.1\n"  # another class, one more box
    (raw / "labels" / "coffee.txt").write_text(labels["coffee"])
    assert h5forge.build(tmp_path / "spec.yaml").version == 2
    check(labels)
    (inbox / "images").mkdir(parents=True)
    (inbox / "labels").mkdir()
    shutil.copy(raw / "images" / "chelsea.png", inbox / "images" / "kitten.png")
    labels["kitten"], sizes["kitten"] = "1 0.5 0.5 0.25 0.25\n", sizes["chelsea"]
    (inbox / "labels" / "kitten.txt").write_text(labels["kitten"])
    age_files(inbox)
    assert h5forge.append(tmp_path / "spec.yaml").version == 3
    check(labels)
    assert run("rollback", tmp_path / "out", "v1").returncode == 0
    check(v1)

"""``h5forge init`` on the folders users actually bring, written with Pillow from scikit-image's
photographs: every picture format found is listed, class folders (with or without split folders),
annotation files beside the pictures (JSON list, JSON Lines, CSV), multi-class and palette masks,
super-resolution pairs. Each inferred spec is valid and builds; what cannot be inferred safely is a
note, in the spec and on the command line."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml
from PIL import Image, ImageDraw
from skimage import data, filters

import h5forge
from h5forge._format.layout import decode_str
from h5forge._ingest.discover import discover
from h5forge.errors import UsageError
from h5forge._init import infer_spec
from h5forge.read.torch import H5Dataset
from h5forge.spec import load_spec, parse_spec

H5FORGE = str(Path(sys.executable).parent / "h5forge")
SPLITS = ("train", "val", "test")
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "coins", "moon", "immunohistochemistry")


def photo(i: int, size: int = 64) -> Image.Image:
    """A small real photograph: the ``i``-th of PHOTOS (cycled), shrunk, a different crop each time."""
    img = Image.fromarray(getattr(data, PHOTOS[i % len(PHOTOS)])())
    img.thumbnail((size + 24, size + 24))
    j = i // len(PHOTOS) % 3
    return img.crop((j * 8, j * 4, j * 8 + size, j * 4 + size - 8 * (i % 2)))


def infer(raw: Path, tmp: Path):
    """(inferred, parsed spec, spec path): the spec text as ``init`` writes it, parsed by the library."""
    spec_path = tmp / "config" / f"{raw.name}.yaml"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    inferred = infer_spec(raw, spec_path)
    spec_path.write_text(inferred.text)
    spec = parse_spec(yaml.safe_load(inferred.text), spec_path.parent, str(spec_path))
    for note in inferred.notes:
        assert f"# note: {note}" in inferred.text
    return inferred, spec, spec_path


def build(spec_path: Path, out: Path):
    """The spec built by the pipeline into ``out``: (the published version, the build result).
    These folders hold bad inputs on purpose, more than ``init``'s default share, so every input
    may be rejected here (the limit has tests of its own)."""
    spec = load_spec(spec_path, output=out)
    result = h5forge.build(spec.model_copy(update={"max_rejected": 1.0}))
    return Path(result.path), result


def all_ids(path: Path) -> list[str]:
    with h5py.File(path, "r") as f:
        return [i for s in SPLITS for i in decode_str(f[s]["ids"][()])]


# ---- several picture formats in one folder ----------------------------------------------------

FORMATS = (".png", ".jpg", ".JPG", ".jpeg", ".tif", ".bmp", ".webp", ".png", ".jpg")


def test_every_picture_format_found_is_listed_and_built(tmp_path):
    raw = tmp_path / "mixed"
    (raw / "images").mkdir(parents=True)
    (raw / "masks").mkdir()
    for i, ext in enumerate(FORMATS):
        pic = photo(i)
        pic.save(raw / "images" / f"p{i}{ext}")
        grey = np.asarray(pic.convert("L"))
        Image.fromarray(((grey > filters.threshold_otsu(grey)) * 255).astype(np.uint8)).save(
            raw / "masks" / f"p{i}.png")
    (raw / "images" / "notes.txt").write_text("not a picture")
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert inferred.layout == "segment"
    assert [n.split(" (")[0] for n in inferred.notes] == ["1 file under the folder is taken by no glob: images/notes.txt"]
    files = spec.fields["images"].files
    assert files[:2] == ("images/*.png", "images/*.jpg")  # the most common first (ties: png, jpg, ...)
    assert set(files) == {f"images/*{e}" for e in FORMATS}  # upper-case .JPG too: glob is case-sensitive
    assert spec.fields["masks"].files == "masks/*.png" and spec.fields["masks"].classes is None
    path, summary = build(spec_path, tmp_path / "out")
    assert summary.rejections == () and sorted(all_ids(path)) == sorted(f"p{i}" for i in range(len(FORMATS)))


def test_the_cell_demo_keeps_its_binary_masks_and_notes_the_defects(raw_demo, tmp_path):
    inferred, spec, _ = infer(raw_demo, tmp_path)
    assert spec.fields["images"].files == "images/*.png" and spec.fields["masks"].classes is None
    assert spec.annotations.file == "annotations.json" and spec.annotations.required
    assert any("[128]" in n and "bad_mask128.png" in n for n in inferred.notes)  # one stray mask, not a class
    assert "# label: {kind: label, column: label, classes: [dividing, healthy, infected]}" in inferred.text


# ---- class folders ----------------------------------------------------------------------------

def class_tree(root: Path, split_names=None, per_class=3) -> dict[str, int]:
    """root/<class>/ (or root/<split>/<class>/) with the same file names in every class."""
    counts: dict[str, int] = {}
    made = 0  # each picture another photo or crop: identical files would be one sample kept, the rest duplicates
    for c, cls in enumerate(("zebra", "apple", "Bicycle", "yes")):  # 'yes' must stay a string in YAML
        for split in split_names or [None]:
            folder = root / split / cls if split else root / cls
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(per_class):
                ext = (".jpg", ".png", ".JPG", ".webp")[(c + k) % 4]
                photo(made).convert("RGB").save(folder / f"img{k}{ext}")
                made += 1
                counts[cls] = counts.get(cls, 0) + 1
    return counts


def test_class_folders_become_a_label_from_the_folder_names(tmp_path):
    raw = tmp_path / "pets"
    counts = class_tree(raw)
    (raw / "README.txt").write_text("downloaded from somewhere")
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert inferred.layout == "classify"
    assert spec.source.ids == "path"
    assert set(spec.fields["images"].files) == {"*/*.jpg", "*/*.png", "*/*.JPG", "*/*.webp"}
    assert spec.fields["label"].classes == ("Bicycle", "apple", "yes", "zebra")  # sorted: a stable order
    ann = spec.annotations
    assert (ann.file, ann.columns, ann.folders, ann.required) == (None, {"label": "str"}, {"label": -1}, False)
    assert spec.splits.column is None

    path, summary = build(spec_path, tmp_path / "out")
    assert summary.rejections == ()
    ids = all_ids(path)
    assert len(ids) == sum(counts.values()) and "zebra/img0" in ids and "apple/img0" in ids  # no collision
    with h5py.File(path, "r") as f:
        got = sum(np.asarray(f[s].attrs["label_class_counts"]) for s in SPLITS)
    assert dict(zip(spec.fields["label"].classes, got.tolist())) == counts
    ds = H5Dataset(path, split="train", fields=("images", "label"))
    image, label = ds[0]
    with h5py.File(path, "r") as f:
        assert image.dtype == torch.uint8 and np.array_equal(image.numpy(), f["train/images"][0])  # as stored
    assert spec.fields["label"].classes[int(label)] == ds.ids()[0].split("/")[0]


@pytest.mark.parametrize("folders", [("training", "validation", "test"), ("train2017", "val2017", "test2017")])
def test_split_and_class_folders_take_the_split_from_the_folder(tmp_path, folders):
    raw = tmp_path / "flowers"
    class_tree(raw, split_names=list(folders), per_class=2)
    for k in range(2):  # an unlabelled test folder, as on Kaggle
        photo(k).save(raw / folders[2] / f"unlabelled{k}.png")
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert inferred.layout == "classify"
    assert set(spec.fields["images"].files) == {"*/*/*.jpg", "*/*/*.png", "*/*/*.JPG", "*/*/*.webp"}
    ann = spec.annotations
    assert ann.columns == {"label": "str", "split": "str"} and ann.folders == {"label": -1, "split": -2}
    assert spec.splits.column == "split"
    assert any(f"2 pictures lie directly in {folders[2]}/" in n for n in inferred.notes)
    path, summary = build(spec_path, tmp_path / "out")
    assert summary.rejections == ()
    with h5py.File(path, "r") as f:
        for folder, split in zip(folders, ("train", "val", "test")):
            ids = decode_str(f[split]["ids"][()])
            assert len(ids) == 8 and all(i.startswith(folder + "/") for i in ids)


def test_a_csv_keyed_by_bare_file_names_joins_class_folders_and_a_clash_is_refused(tmp_path):
    raw = tmp_path / "people"
    for c, cls in enumerate(("faces", "cars")):
        (raw / cls).mkdir(parents=True)
        for k in range(3):
            photo(c * 3 + k).convert("RGB").save(raw / cls / f"{cls[:-1]}_{k:03d}.jpg")
    with open(raw / "quality.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["filename", "quality"])
        for c, cls in enumerate(("faces", "cars")):
            for k in range(3):
                w.writerow([f"{cls[:-1]}_{k:03d}.jpg", 10 * c + k])
    inferred, spec, spec_path = infer(raw, tmp_path)
    ann = spec.annotations
    assert (ann.file, ann.id_key, ann.columns) == ("quality.csv", "filename", {"label": "str", "quality": "int"})
    path, summary = build(spec_path, tmp_path / "out")
    assert summary.rejections == ()
    ds = H5Dataset(path, split="train", fields=("label", "quality"))
    for i, sid in enumerate(ds.ids()):
        label, quality = ds[i]
        cls, name = sid.split("/")
        assert spec.fields["label"].classes[int(label)] == cls
        assert int(quality) == 10 * ("faces", "cars").index(cls) + int(name[-3:])

    photo(9).convert("RGB").save(raw / "cars" / "face_001.jpg")  # the same bare name in two folders
    spec = load_spec(spec_path)
    inv = discover(spec)
    clash = [r for r in inv.rejections if r.sample_id == "face_001"]
    assert [r.paths for r in clash] == [("quality.csv#face_001", "cars/face_001.jpg", "faces/face_001.jpg")]
    assert "found in 2 folders (cars/face_001.jpg, faces/face_001.jpg)" in clash[0].reason
    unjoined = sorted(r.sample_id for r in inv.rejections if r.reason.startswith("no annotation record"))
    assert unjoined == ["cars/face_001", "faces/face_001"]
    assert len(inv.samples) == 5


# ---- annotations beside the pictures ----------------------------------------------------------

def picture_folder(root: Path, n: int = 6) -> list[str]:
    (root / "images").mkdir(parents=True)
    for i in range(n):
        photo(i).convert("RGB").save(root / "images" / f"s{i:02d}.png")
    return [f"s{i:02d}" for i in range(n)]


RECORDS = [{"grade": i % 3, "score": i / 4, "ok": i % 2 == 0, "site": ("north", "south")[i % 2],
            "label": ("benign", "malignant", "normal")[i % 3]} for i in range(6)]


def test_a_json_list_joins_by_the_file_name_column(tmp_path):
    raw = tmp_path / "json"
    stems = picture_folder(raw)
    records = [{"image": f"images/{s}.png", **r} for s, r in zip(stems, RECORDS)]
    (raw / "labels.json").write_text(json.dumps(records))
    inferred, spec, spec_path = infer(raw, tmp_path)
    ann = spec.annotations
    assert (ann.file, ann.id_key, ann.required) == ("labels.json", "image", True)
    assert ann.columns == {"grade": "int", "label": "str", "ok": "bool", "score": "float", "site": "str"}
    assert set(ann.index_by) == {"grade", "label", "ok", "site"}
    assert inferred.layout == "images" and spec.fields["label"].classes == ("benign", "malignant", "normal")
    path, summary = build(spec_path, tmp_path / "out")
    assert summary.rejections == () and sorted(all_ids(path)) == stems


def test_json_lines_and_a_note_for_each_file_that_cannot_be_used(tmp_path):
    raw = tmp_path / "jsonl"
    stems = picture_folder(raw)
    (raw / "meta.jsonl").write_text("\n".join(json.dumps({"sample_id": s, **r}) for s, r in zip(stems, RECORDS)))
    (raw / "dataset_info.json").write_text(json.dumps({"version": 2, "licence": "CC-BY", "classes": 3}))
    (raw / "broken.json").write_text('[{"id": "s00", "grade": 1},')
    (raw / "other.csv").write_text("patient,age\np1,40\np2,51\n")
    (raw / "no_header.csv").write_text("s00.png,benign\ns01.png,normal\n")
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert (spec.annotations.file, spec.annotations.id_key) == ("meta.jsonl", "sample_id")
    assert spec.annotations.columns["grade"] == "int" and spec.annotations.columns["ok"] == "bool"
    notes = "\n".join(inferred.notes)
    assert "dataset_info.json is not used: it holds a JSON object (keys: version, licence, classes)" in notes
    assert "broken.json is not used" in notes
    assert "other.csv is not used: no column names the samples" in notes
    assert "no_header.csv is not used: its first line names a sample" in notes

    r = subprocess.run([H5FORGE, "init", str(raw), "--out", str(tmp_path / "cli.yaml")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    printed = [line for line in r.stdout.splitlines() if line.startswith("note: ")]
    assert printed == [f"note: {n}" for n in inferred.notes]
    assert "# note: broken.json is not used" in (tmp_path / "cli.yaml").read_text()
    path, summary = build(spec_path, tmp_path / "out")
    assert summary.rejections == () and len(all_ids(path)) == len(stems)


def test_csv_column_types_are_inferred_from_the_text(tmp_path):
    raw = tmp_path / "csv"
    stems = picture_folder(raw)
    with open(raw / "annotations.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["filename", "grade", "score", "ok", "site", "code", "label"])
        for s, r in zip(stems, RECORDS):
            w.writerow([f"{s}.png", r["grade"], r["score"], str(r["ok"]).lower(), r["site"], f"{r['grade']:03d}x",
                        r["label"]])
        w.writerow(["ghost.png", 1, 0.5, "true", "north", "001x", "normal"])  # a record without a picture
    inferred, spec, spec_path = infer(raw, tmp_path)
    ann = spec.annotations
    assert (ann.file, ann.id_key) == ("annotations.csv", "filename")
    assert ann.columns == {"code": "str", "grade": "int", "label": "str", "ok": "bool", "score": "float",
                           "site": "str"}
    path, summary = build(spec_path, tmp_path / "out")
    assert [(r.sample_id, r.reason) for r in summary.rejections] == [("ghost", "annotation record without files")]
    ds = H5Dataset(path, split="train", fields=("images", "label", "grade", "score", "ok"))
    image, label, grade, score, ok = ds[0]
    i = stems.index(ds.ids()[0])
    assert (int(grade), float(score), bool(ok)) == (RECORDS[i]["grade"], RECORDS[i]["score"], RECORDS[i]["ok"])
    assert spec.fields["label"].classes[int(label)] == RECORDS[i]["label"]


def test_partial_annotations_and_missing_values_are_noted(tmp_path):
    raw = tmp_path / "partial"
    stems = picture_folder(raw)
    records = [{"id": s, "grade": i} for i, s in enumerate(stems[:4])]
    records[1]["grade"] = None
    (raw / "annotations.json").write_text(json.dumps(records))
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert "annotations.json has records for 4 of 6 samples" in "\n".join(inferred.notes)
    assert "column 'grade' is missing in 1 of 4 records" in "\n".join(inferred.notes)
    path, summary = build(spec_path, tmp_path / "out")
    assert len(all_ids(path)) == 3 and len(summary.rejections) == 3


# ---- multi-class and palette masks ------------------------------------------------------------

def otsu_classes(pic: Image.Image) -> np.ndarray:
    grey = np.asarray(pic.convert("L"))
    return np.digitize(grey, filters.threshold_multiotsu(grey, classes=3)).astype(np.uint8)


def test_voc_style_palette_masks_give_classes_and_the_ignore_value(tmp_path):
    raw = tmp_path / "VOC"
    (raw / "JPEGImages").mkdir(parents=True)
    (raw / "SegmentationClass").mkdir()
    palette = [0, 0, 0, 128, 0, 0, 0, 128, 0] + [0, 0, 0] * 252 + [224, 224, 192]
    for i in range(8):
        pic = photo(i).convert("RGB")
        pic.save(raw / "JPEGImages" / f"2007_{i:06d}.jpg")
        classes = otsu_classes(pic)
        classes[:2] = 255  # the VOC border: ignored
        if i == 5:
            classes[10:14, 10:14] = 9  # a value nobody declared
        mask = Image.frombytes("P", classes.shape[::-1], classes.tobytes())
        mask.putpalette(palette)
        mask.save(raw / "SegmentationClass" / f"2007_{i:06d}.png")
    inferred, spec, spec_path = infer(raw, tmp_path)
    masks = spec.fields["masks"]
    assert masks.files == "SegmentationClass/*.png" and spec.fields["images"].files == "JPEGImages/*.jpg"
    assert (masks.classes, masks.ignore_value) == (3, 255)
    assert "palette PNGs: the palette index" in inferred.text
    assert any("[9]" in n and "2007_000005.png" in n for n in inferred.notes)
    path, summary = build(spec_path, tmp_path / "out")
    [rejection] = summary.rejections
    assert rejection.sample_id == "2007_000005" and "[9] are not classes 0..2" in rejection.reason
    ds = H5Dataset(path, split="train", fields=("images", "masks"))
    _, mask = ds[0]
    assert set(torch.unique(mask).tolist()) <= {0, 1, 2, 255}


def test_palette_masks_numbering_their_colours_per_file_are_read_by_colour(tmp_path):
    """An editor's indexed export numbers the colours in each file's own order: the same colour is
    index 1 in one mask and 2 in the next. ``init`` declares the palette by the colours it finds
    (black first), so the build stores each colour as one class in every mask; read by index, each
    file's classes were permuted, exit 0."""
    raw = tmp_path / "indexed"
    (raw / "images").mkdir(parents=True)
    (raw / "masks").mkdir()
    colours = [(0, 0, 0), (200, 30, 30), (30, 200, 30)]
    orders = [(0, 1, 2), (2, 0, 1), (1, 2, 0), (2, 1, 0), (0, 2, 1), (1, 0, 2)]
    drawn = {}
    for i, order in enumerate(orders):
        pic = photo(i)
        pic.save(raw / "images" / f"m{i}.png")
        drawn[f"m{i}"] = classes = otsu_classes(pic)
        mask = Image.fromarray(np.asarray(order, np.uint8)[classes], "P")  # class k drawn in colours[k]
        mask.putpalette([c for k in np.argsort(order) for c in colours[int(k)]])
        mask.save(raw / "masks" / f"m{i}.png")
    inferred, spec, spec_path = infer(raw, tmp_path)
    masks = spec.fields["masks"]
    assert masks.classes == 3 and masks.palette == {0: (0, 0, 0), 1: (30, 200, 30), 2: (200, 30, 30)}
    assert any("number their colours differently" in n for n in inferred.notes), inferred.notes
    path, summary = build(spec_path, tmp_path / "out")
    assert summary.rejections == ()
    by_colour = np.array([0, 2, 1], np.uint8)  # class k drawn in colours[k]: its class by the palette
    for split in SPLITS:
        with h5py.File(path, "r") as f:
            ids = decode_str(f[split]["ids"][()])
            stored = f[split]["masks"][()]
        for row, sid in enumerate(ids):
            want = by_colour[drawn[sid]]
            h, w = want.shape
            got = stored[row, 0]
            assert np.array_equal(got[got != 255].reshape(h, w), want), sid


def test_masks_beyond_two_values_without_an_ignore_value(tmp_path):
    raw = tmp_path / "otsu"
    (raw / "images").mkdir(parents=True)
    (raw / "masks").mkdir()
    for i in range(6):
        pic = photo(i)
        pic.save(raw / "images" / f"m{i}.png")
        classes = otsu_classes(pic)
        classes[0, 0] = 3 if i % 2 else classes[0, 0]  # class 3 in half of them
        Image.fromarray(classes).save(raw / "masks" / f"m{i}.png")
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert (spec.fields["masks"].classes, spec.fields["masks"].ignore_value) == (4, None)
    path, summary = build(spec_path, tmp_path / "out")
    assert summary.rejections == ()


@pytest.mark.parametrize("lossy", ["jpg", "tif"])
def test_jpeg_masks_are_not_taken_for_classes_by_their_compression_noise(tmp_path, lossy):
    raw = tmp_path / "kvasir"  # Kvasir-SEG ships its binary masks as JPEG: values near 0 and 255
    (raw / "images").mkdir(parents=True)
    (raw / "masks").mkdir()
    for i in range(8):
        pic = photo(i).convert("RGB")
        pic.save(raw / "images" / f"cju{i}.jpg")
        mask = Image.fromarray(np.where(otsu_classes(pic) > 0, 255, 0).astype(np.uint8))
        if i >= 6:
            mask.save(raw / "masks" / f"cju{i}.png")
        else:  # a TIFF of JPEG-compressed pixels is as lossy as a JPEG
            mask.save(raw / "masks" / f"cju{i}.{lossy}", **({"compression": "jpeg"} if lossy == "tif" else {}))
    inferred, spec, spec_path = infer(raw, tmp_path)
    masks = spec.fields["masks"]
    assert (masks.classes, masks.ignore_value) == (None, None)  # binary, as the PNG masks say
    assert masks.threshold == 128 and not [n for n in inferred.notes if "JPEG" in n]
    [line] = [x for x in inferred.text.splitlines() if "threshold:" in x]
    assert "# JPEG masks: a value >= 128 is 1, below is 0" in line
    path, summary = build(spec_path, tmp_path / "out")
    assert summary.rejections == () and len(all_ids(path)) == 8
    with h5py.File(path, "r") as f:
        assert set(np.unique(np.concatenate([f[s]["masks"][()].ravel() for s in SPLITS]))) <= {0, 1, 255}


def kvasir_shape(w: int, h: int, i: int) -> Image.Image:
    """A polyp drawn as Kvasir-SEG's annotators draw it: a white region (an ellipse and a triangle) on black."""
    m = Image.new("L", (w, h), 0)
    d = ImageDraw.Draw(m)
    d.ellipse((w * .2 + i, h * .2, w * .6 + i, h * .7), fill=255)
    d.polygon([(w * .65, h * .1), (w * .95, h * .4), (w * .7, h * .8)], fill=255)
    return m


def test_kvasir_jpeg_masks_get_a_threshold_and_build_as_the_files_cut_at_it(tmp_path):
    raw = tmp_path / "Kvasir-SEG"  # images/cju*.jpg beside masks/cju*.jpg, grey and RGB JPEG masks
    (raw / "images").mkdir(parents=True)
    (raw / "masks").mkdir()
    drawn = {}
    for i in range(9):
        w, h = 96 + 8 * i, 80
        sid = f"cju{i:04d}"
        Image.fromarray(getattr(data, PHOTOS[i % 4])()).convert("RGB").resize((w, h)).save(raw / "images" / f"{sid}.jpg")
        mask = kvasir_shape(w, h, i)
        drawn[sid] = np.asarray(mask) // 255
        (mask.convert("RGB") if i % 2 else mask).save(raw / "masks" / f"{sid}.jpg", quality=(75, 85, 95)[i % 3])
    grey = Image.fromarray(data.camera()).resize((96, 80))  # a grey photograph given as a mask
    grey.convert("RGB").save(raw / "images" / "cju9999.jpg")
    grey.save(raw / "masks" / "cju9999.jpg", quality=90)
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert spec.fields["masks"].threshold == 128 and spec.fields["masks"].classes is None
    [note] = [n for n in inferred.notes if "JPEG" in n]
    assert note.startswith("1 of 10 sampled JPEG (or other lossy) masks have over 5% of their pixels 64..191")
    path, summary = build(spec_path, tmp_path / "out")
    [rejection] = summary.rejections
    assert rejection.sample_id == "cju9999" and "far from 0 and 255" in rejection.reason
    size = spec.fields["images"].size
    with h5py.File(path, "r") as f:
        stored = {sid: m[0] for s in SPLITS for sid, m in zip(decode_str(f[s]["ids"][()]), f[s]["masks"][()])}
    assert sorted(stored) == sorted(drawn)
    for sid, truth in drawn.items():
        values = np.asarray(Image.open(raw / "masks" / f"{sid}.jpg").convert("L"))
        assert not np.isin(values, (0, 255)).all()  # JPEG moved values: read exactly, it would be rejected
        h, w = truth.shape  # centre-cropped to the field's width, padded to its height with 255
        top, left = (size[0] - h) // 2, max(0, (w - size[1]) // 2)
        ph, pw = min(h, size[0]), min(w, size[1])
        got = stored[sid][max(0, top):max(0, top) + ph, max(0, (size[1] - w) // 2):][:, :pw]
        assert got.shape == (ph, pw) and got.any() and np.array_equal(got, (values >= 128)[:ph, left:left + pw]), sid
        assert (got != truth[:ph, left:left + pw]).sum() == 0, sid  # these hard edges stay on their side of 128


def test_masks_named_with_a_suffix_after_their_image_stem_pair(tmp_path):
    raw = tmp_path / "isic"  # ISIC: ISIC_0000000.jpg beside ISIC_0000000_segmentation.png
    (raw / "images").mkdir(parents=True)
    (raw / "masks").mkdir()
    truth = {}
    for i in range(8):
        pic = photo(i).convert("RGB")
        pic.save(raw / "images" / f"ISIC_{i:07d}.jpg")
        truth[f"ISIC_{i:07d}"] = np.where(otsu_classes(pic) > 0, 255, 0).astype(np.uint8)
        Image.fromarray(truth[f"ISIC_{i:07d}"]).save(raw / "masks" / f"ISIC_{i:07d}_segmentation.png")
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert spec.fields["masks"].id_suffix == "_segmentation" and inferred.unbuildable is None
    path, summary = build(spec_path, tmp_path / "out")
    assert summary.rejections == () and sorted(all_ids(path)) == sorted(truth)
    with h5py.File(path, "r") as f:
        for s in SPLITS:
            for sid, mask in zip(decode_str(f[s]["ids"][()]), f[s]["masks"][()]):
                h, w = truth[sid].shape  # smaller than the field's size: padded evenly with 255
                top, left = (mask.shape[1] - h) // 2, (mask.shape[2] - w) // 2
                assert np.array_equal(mask[0, top:top + h, left:left + w], truth[sid] // 255), sid


@pytest.mark.parametrize("values, classes, ignore, stray", [
    ([{0, 1}, {0, 255}, {0, 1}, {0, 255}, {0, 1}, {0, 1, 128}], None, None, 128),  # binary, one stray
    ([{0, 1, 4}, {0, 1, 4}, {0, 1, 2}, {0, 1}, {0, 1}, {0, 1}], 5, None, None),  # a rare class inside 0..4
    ([{0, 1, 2, 255}, {0, 2, 255}, {0, 1}, {0, 1, 2}, {0, 1, 2}, {0, 1, 2, 9}], 3, 255, 9),
])
def test_mask_values_decide_binary_classes_and_strays(tmp_path, values, classes, ignore, stray):
    raw = tmp_path / "m"
    (raw / "images").mkdir(parents=True)
    (raw / "masks").mkdir()
    for i, present in enumerate(values):
        photo(i).save(raw / "images" / f"m{i}.png")
        mask = np.zeros((photo(i).height, 64), np.uint8)
        for k, v in enumerate(sorted(present)):
            mask[k * 6:(k + 1) * 6] = v
        Image.fromarray(mask).save(raw / "masks" / f"m{i}.png")
    inferred, spec, _ = infer(raw, tmp_path)
    assert (spec.fields["masks"].classes, spec.fields["masks"].ignore_value) == (classes, ignore)
    strays = [n for n in inferred.notes if n.startswith("mask values")]
    assert strays == ([] if stray is None else [strays[0]]) and (stray is None or f"[{stray}]" in strays[0])


# ---- super-resolution pairs -------------------------------------------------------------------

def sr_pairs(root: Path, lr: str, hr: str, scales: list[float]) -> None:
    (root / lr).mkdir(parents=True)
    (root / hr).mkdir(parents=True)
    for i, k in enumerate(scales):
        big = photo(i, size=96).convert("RGB")
        big.save(root / hr / f"{i:04d}.png")
        big.resize((round(big.width / k), round(big.height / k)), Image.Resampling.BICUBIC).save(
            root / lr / f"{i:04d}.png")


def test_div2k_style_folders_pair_and_the_scale_is_measured(tmp_path):
    raw = tmp_path / "DIV2K"
    sr_pairs(raw, "DIV2K_train_LR_x4", "DIV2K_train_HR", [4] * 7 + [3])
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert inferred.layout == "sr"
    low, high = spec.fields["low_res"], spec.fields["high_res"]
    assert (low.files, high.files, high.kind, high.like, high.scale) == (
        "DIV2K_train_LR_x4/*.png", "DIV2K_train_HR/*.png", "paired", "low_res", 4)
    assert any(n.startswith("1 of 8 sampled pairs are not x4") for n in inferred.notes)
    path, summary = build(spec_path, tmp_path / "out")
    [rejection] = summary.rejections
    assert rejection.sample_id == "0007" and "scale 4 needs" in rejection.reason
    ds = H5Dataset(path, split="train", fields=("low_res", "high_res"))
    low_px, high_px = ds[0]
    assert high_px.shape[1:] == (4 * low_px.shape[1], 4 * low_px.shape[2])


def test_div2k_names_with_the_scale_in_the_lr_name_pair(tmp_path):
    raw = tmp_path / "DIV2K"
    sr_pairs(raw, "DIV2K_train_LR_x4", "DIV2K_train_HR", [4] * 6)
    for p in (raw / "DIV2K_train_LR_x4").iterdir():
        p.rename(p.with_name(f"{p.stem}x4.png"))  # 0001x4.png beside the HR 0001.png, as DIV2K names them
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert inferred.layout == "sr" and inferred.unbuildable is None
    low, high = spec.fields["low_res"], spec.fields["high_res"]
    assert (low.id_suffix, high.kind, high.scale) == ("x4", "paired", 4)
    path, summary = build(spec_path, tmp_path / "out")
    assert summary.rejections == () and sorted(all_ids(path)) == [f"{i:04d}" for i in range(6)]
    with h5py.File(path, "r") as f:
        sid = decode_str(f["train"]["ids"][()])[0]
        hr = np.asarray(Image.open(raw / "DIV2K_train_HR" / f"{sid}.png"), dtype=np.int64)
        stored = f["train"]["high_res"][0]
        assert stored.shape[1:] == (4 * f["train"]["low_res"].shape[2], 4 * f["train"]["low_res"].shape[3])
        assert int(stored.astype(np.int64).sum()) == int(hr.sum())  # the whole HR picture, padded with 0


def test_init_exits_1_naming_why_when_its_spec_builds_nothing(tmp_path):
    raw = tmp_path / "unpaired"
    sr_pairs(raw, "lr", "hr", [2] * 4)
    for k, p in enumerate(sorted((raw / "lr").iterdir())):
        p.rename(p.with_name(f"low_{k}.png"))  # LR names that share nothing with the HR names
    r = subprocess.run([H5FORGE, "init", str(raw), "--out", str(tmp_path / "u.yaml")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "error:" in r.stderr and "publishes nothing: every one of the 8 inputs is rejected" in r.stderr
    assert (tmp_path / "u.yaml").is_file()


def test_a_scale_that_is_not_an_integer_is_not_guessed(tmp_path):
    raw = tmp_path / "odd"
    sr_pairs(raw, "lr", "hr", [2.5] * 4)
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert inferred.layout == "sr" and spec.fields["high_res"].kind == "image"
    assert any("ratio could not be inferred" in n for n in inferred.notes)


def test_low_res_high_res_names_and_no_folder_at_all(tmp_path):
    raw = tmp_path / "pairs"
    sr_pairs(raw, "low_res", "high_res", [2] * 3)
    _, spec, _ = infer(raw, tmp_path)
    assert spec.fields["high_res"].scale == 2 and spec.fields["high_res"].files == "high_res/*.png"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no layout h5forge knows"):
        infer_spec(empty, tmp_path / "e.yaml")


@pytest.mark.parametrize("with_coco", [False, True])
def test_coco_split_folders_named_with_a_year_are_never_classes(tmp_path, with_coco):
    raw = tmp_path / "coco"  # images/train2017/*.jpg, images/val2017/*.jpg (+ annotations/instances_*.json)
    for split, n in (("train2017", 6), ("val2017", 3)):
        (raw / "images" / split).mkdir(parents=True)
        entries = []
        for i in range(n):
            name = f"{i + 100 * (split == 'val2017'):012d}.jpg"
            photo(i).convert("RGB").save(raw / "images" / split / name)
            entries.append({"id": i + 1, "file_name": name, "width": 64, "height": 64 - 8 * (i % 2)})
        if with_coco:
            (raw / "annotations").mkdir(exist_ok=True)
            coco = {"images": entries, "categories": [{"id": 1, "name": "person"}],
                    "annotations": [{"id": e["id"], "image_id": e["id"], "category_id": 1, "bbox": [4, 4, 20, 20],
                                     "area": 400, "iscrowd": 0} for e in entries]}
            (raw / "annotations" / f"instances_{split}.json").write_text(json.dumps(coco))
    if not with_coco:
        with pytest.raises(UsageError, match="no layout h5forge knows found"):
            infer_spec(raw, tmp_path / "coco.yaml")  # refused, never a label field of classes [train2017, val2017]
        return
    found = infer_spec(raw, tmp_path / "coco.yaml")  # COCO's boxes, each picture in its folder's split
    spec = yaml.safe_load(found.text)
    assert found.layout == "boxes" and "label" not in spec["fields"]
    assert spec["fields"]["images"]["files"] == ["images/train2017/*.jpg", "images/val2017/*.jpg"]
    assert spec["splits"]["column"] == "split" and spec["annotations"]["folders"] == {"split": -1}

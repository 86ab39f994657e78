"""``kind: boxes`` on malformed and hostile annotation files: a segmentation that does not cover its
picture, non-finite coordinates, a COCO file that is a FIFO, /dev/zero or a link out of the source,
a picture with too many objects or a polygon too long. Each rejects its picture (or every picture
of the file) with a reason and takes the rest; masks are checked against pycocotools' own decoding
of real pictures (scikit-image's bundled photos)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

import h5forge
from h5forge._format.layout import decode_str
from h5forge._samples import Reject
from tests.helpers.data import REPO
from h5forge.read._reader import SplitReader
from tests.kinds.boxes.test_boxes import (  # noqa: F401
    _ultralytics_folder,
    CLASSES,
    PICTURES,
    SIZE,
    _decode_one,
    _expected,
    _masks_of,
    _spec,
    _yolo_folder,
    coco_folder,
)

COCO = "annotations/instances_val.json"


def _with_segmentation(coco_folder: Path, tmp_path: Path, image_id: int, segmentation, **changes) -> Path:
    """A copy of the fixture's COCO file in which the first object of ``image_id`` has
    ``segmentation`` (and ``changes``); returns its path."""
    data = json.loads((coco_folder / COCO).read_text())
    ann = next(a for a in data["annotations"] if a["image_id"] == image_id and not a["iscrowd"])
    ann["segmentation"] = segmentation
    ann.update(changes)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))  # json writes NaN and Infinity as COCO tools' JSON may hold them
    return path


def _chelsea_mask() -> np.ndarray:
    """The cat of scikit-image's chelsea photo, roughly: its darker-than-median pixels in the box."""
    import skimage.data

    grey = skimage.data.chelsea().mean(axis=2)
    m = np.zeros(grey.shape, np.uint8)
    m[20:300, 60:400] = grey[20:300, 60:400] < np.median(grey)
    return m


def _column_runs(mask: np.ndarray) -> list[int]:
    """An uncompressed COCO RLE's counts of ``mask``, written out here (column order, 0s first)."""
    flat = mask.T.ravel()
    edges = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.r_[0, edges, flat.size]).tolist()
    return ([0] if flat[0] else []) + runs


@pytest.mark.parametrize("form", ["compressed", "uncompressed"])
def test_rle_masks_of_a_real_photo_equal_pycocotools(coco_folder, tmp_path, form):
    from pycocotools import mask as rle

    mask = _chelsea_mask()
    h, w = mask.shape
    encoded = rle.encode(np.asfortranarray(mask))
    if form == "compressed":
        seg = {"size": [h, w], "counts": encoded["counts"].decode()}
    else:
        seg = {"size": [h, w], "counts": _column_runs(mask)}
        assert np.array_equal(rle.decode(rle.frPyObjects(seg, h, w)), mask)  # the reference reads them alike
    path = _with_segmentation(coco_folder, tmp_path, 3, seg)
    decoded = _decode_one(coco_folder, tmp_path, {"coco": str(path), "masks": True}, "chelsea")
    (got,) = decoded["boxes_masks"].value
    top, left = (h - 256) // 2, (w - 256) // 2
    assert np.array_equal(got, rle.decode(encoded)[top : top + 256, left : left + 256])


def test_compressed_counts_of_many_masks_decode_as_pycocotools_decodes_them():
    """Masks of every texture (real photos thresholded at many levels, noise, a checkerboard, all
    and nothing) through pycocotools' encoder, read back by the kind's checked decoder."""
    import skimage.data
    from pycocotools import mask as rle

    from h5forge.kinds.boxes.instances import Runs, _raw_mask, _string_counts

    rng = np.random.default_rng(0)
    grey = skimage.data.camera()[:97, :131]
    masks = [(grey < t).astype(np.uint8) for t in (0, 30, 90, 128, 200, 256)]
    masks += [(rng.random((97, 131)) < p).astype(np.uint8) for p in (0.01, 0.5, 0.99)]
    masks.append((np.indices((97, 131)).sum(axis=0) % 2).astype(np.uint8))
    for m in masks:
        counts = rle.encode(np.asfortranarray(m))["counts"]
        runs = _string_counts(counts, m.shape, "x", "y")
        assert np.array_equal(_raw_mask(Runs(runs), m.shape), m)
        assert len(counts) <= 2 * m.size + 64


def _truncated_counts(h: int, w: int) -> str:
    """A real compressed RLE of the photo's mask with its last run lengths cut off."""
    from pycocotools import mask as rle

    counts = rle.encode(np.asfortranarray(_chelsea_mask()))["counts"].decode()
    cut = len(counts) // 2
    while ord(counts[cut - 1]) - 48 & 0x20:  # end on a whole number
        cut -= 1
    return counts[:cut]


CHELSEA = (300, 451)
BAD_SEGMENTATIONS = {
    "short list RLE": ({"size": [300, 451], "counts": [5]}, "the RLE's run lengths cover 5 pixels; its 451x300 (WxH) "
                                                           "picture has 135,300"),
    "long list RLE": ({"size": [300, 451], "counts": [135_300, 7]}, "cover 135,307 pixels"),
    "run longer than the picture": ({"size": [300, 451], "counts": [2**62, 5]}, "a run of the RLE is longer than"),
    "negative run": ({"size": [300, 451], "counts": [135_301, -1]}, "negative"),
    "non-integer run": ({"size": [300, 451], "counts": [135_300.0]}, "list of integers"),
    "short compressed RLE": ({"size": [300, 451], "counts": _truncated_counts(*CHELSEA)}, "the RLE's run lengths cover"),
    "compressed RLE cut inside a number": ({"size": [300, 451], "counts": "PQ"}, "ends inside a number"),
    "counts string longer than any RLE": ({"size": [300, 451], "counts": "1" * 300_000}, "longer than any RLE of its "
                                                                                         "picture"),
    "character outside the RLE alphabet": ({"size": [300, 451], "counts": "0~"}, "outside its alphabet"),
    "RLE of another size": ({"size": [300, 450], "counts": [135_000]}, "segmentation is 450x300 (WxH); the picture is "
                                                                       "451x300"),
    "RLE without a size": ({"counts": [135_300]}, "size must be [height, width]"),
    "polygon of 2 vertices": ([[10, 10, 200, 200]], "a polygon has 2 vertices; it needs at least 3"),
    "odd coordinate count": ([[10, 10, 200, 10, 200]], "odd number (5) of coordinates"),
    "NaN vertex": ([[10, 10, float("nan"), 10, 200, 200]], "a polygon coordinate is not a finite number"),
    "infinite vertex": ([[10, 10, float("inf"), 10, 200, 200]], "a polygon coordinate is not a finite number"),
    "integer too large for a float": ([[10, 10, 10**400, 10, 200, 200]], "a polygon coordinate is not a finite number"),
    "vertex far outside": ([[10, 10, 1e9, 10, 200, 200]], "a polygon vertex lies more than the picture's size outside"),
    "polygon of strings": ([["10", 10, 200, 10, 200, 200]], "a polygon must be a list of numbers"),
    "neither": ("a string", "segmentation is neither polygons nor RLE"),
}


@pytest.mark.parametrize("name", BAD_SEGMENTATIONS)
def test_a_malformed_segmentation_rejects_its_picture_with_the_reason(coco_folder, tmp_path, name):
    seg, reason = BAD_SEGMENTATIONS[name]
    path = _with_segmentation(coco_folder, tmp_path, 3, seg)
    with pytest.raises(Reject, match="annotation 6 of .*edited.json: .*") as err:
        _decode_one(coco_folder, tmp_path, {"coco": str(path), "masks": True}, "chelsea")
    assert reason in err.value.reason, err.value.reason


def test_a_short_rle_is_rejected_and_the_other_pictures_are_published(coco_folder, tmp_path):
    """With ``masks: true`` a COCO RLE whose counts stop short used to be stored as whatever the
    heap held; the build now refuses that picture with its reason and publishes the rest, each
    mask equal to pycocotools' decoding."""
    from pycocotools import mask as rle

    path = _with_segmentation(coco_folder, tmp_path, 3, {"size": [300, 451], "counts": [5]})
    spec = _spec(coco_folder, tmp_path / "out", {"coco": str(path), "masks": True})
    spec["max_rejected"] = 0.5
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = h5forge.build(tmp_path / "spec.yaml")
    assert result.version == 1
    assert [(r.sample_id, r.reason) for r in result.rejections] == [
        ("chelsea", "annotation 6 of " + str(path) + ": the RLE's run lengths cover 5 pixels; its 451x300 (WxH) "
                    "picture has 135,300")]
    got = _masks_of(result.path)
    assert set(got) == set(PICTURES) - {"chelsea"}
    ann = json.loads(path.read_text())
    for i, (name, (h, w, _)) in enumerate(PICTURES.items(), 1):
        if name == "chelsea":
            continue
        top, left = (h - 256) // 2, (w - 256) // 2
        want = [rle.decode({"size": a["segmentation"]["size"], "counts": a["segmentation"]["counts"].encode()})
                [top:top + 256, left:left + 256] for a in ann["annotations"] if a["image_id"] == i and not a["iscrowd"]]
        want = [m for m in want if m.any(axis=0).sum() >= 1 and m.any(axis=1).sum() >= 1]
        assert len(got[name][1]) == len(want) and all(np.array_equal(a, b) for a, b in zip(got[name][1], want)), name
    from h5forge._pipeline.verify import verify

    assert verify(tmp_path / "out").ok


@pytest.mark.parametrize("line", ["0 0.1 0.1 nan 0.2 0.3 0.3", "0 nan 0.1 0.2 0.2 0.3 0.3", "0 0.5 0.5 inf 0.2",
                                  "0 0.1 0.1 0.2 0.1 0.3 -inf"])
def test_a_yolo_line_with_a_non_finite_coordinate_is_rejected(coco_folder, tmp_path, line):
    raw = _yolo_folder(coco_folder, tmp_path)
    (raw / "labels" / "chelsea.txt").write_text(line + "\n")
    for masks in (False, True):
        with pytest.raises(Reject, match="line 1: a coordinate is not a finite number"):
            _decode_one(raw, tmp_path, {"files": "labels/*.txt", "masks": masks}, "chelsea")


@pytest.mark.parametrize("bbox", [[float("nan"), 10, 20, 20], [10, 10, float("inf"), 20], [10, 10, 20, 10**400]])
def test_a_coco_bbox_with_a_non_finite_coordinate_is_rejected(coco_folder, tmp_path, bbox):
    path = _with_segmentation(coco_folder, tmp_path, 3, None, bbox=bbox)
    with pytest.raises(Reject, match="annotation 6 of .*: a coordinate is not a finite number"):
        _decode_one(coco_folder, tmp_path, {"coco": str(path)}, "chelsea")


FRESH = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    from h5forge._ingest.clean import clean_batch
    from h5forge._ingest.discover import discover
    from h5forge.spec import parse_spec

    data = json.loads(sys.argv[1])
    spec = parse_spec(data, Path(data["source"]["root"]))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    inv = discover(spec)
    batch = clean_batch(spec, inv.root, inv.samples, encode=False)
    with open("/proc/self/status") as fh:  # this process image's own peak (ru_maxrss may count a parent's)
        peak = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
    print(json.dumps({"taken": batch.ids, "rejected": sorted([r.sample_id, r.reason] for r in
                      [*inv.rejections, *batch.rejections]), "peak_over_imports": peak - base * 1024}))
""")


def test_a_coco_file_that_cannot_be_parsed_is_parsed_once_for_all_its_pictures(coco_folder, tmp_path):
    from h5forge._ingest.discover import discover
    from h5forge.kinds.boxes import sources
    from h5forge.spec import DatasetSpec

    raw = _coco_copy(coco_folder, tmp_path)
    (raw / COCO).write_text('{"images": [' + "1, " * 10_000 + "]")
    spec = DatasetSpec.model_validate(_spec(raw, tmp_path / "out", {"coco": COCO}))
    parsed = []
    real = sources._parse
    sources._parse = lambda data, rel: parsed.append(rel) or real(data, rel)
    try:
        samples = discover(spec).samples
    finally:
        sources._parse = real
    assert parsed == [COCO]
    assert {s.shared["boxes"][1] for s in samples} == {
        "not a COCO instances file (JSONDecodeError: Expecting value: line 1 column 30013 (char 30012)): it needs "
        "images, annotations and categories"}


def _clean_fresh(spec: dict) -> dict:
    """Discovery and cleaning in a process of their own; a hang is a failure, not a stuck suite."""
    res = subprocess.run([sys.executable, "-c", FRESH, json.dumps(spec)], capture_output=True, text=True,
                         timeout=600, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _coco_copy(coco_folder: Path, tmp_path: Path) -> Path:
    import shutil

    raw = tmp_path / "raw"
    shutil.copytree(coco_folder / "images", raw / "images")
    (raw / "annotations").mkdir()
    return raw


@pytest.mark.parametrize("what", ["fifo", "dev-zero", "dev-zero allowed", "outside", "too large"])
def test_a_coco_file_that_is_no_regular_file_in_the_source_rejects_its_pictures_unread(coco_folder, tmp_path, what):
    raw = _coco_copy(coco_folder, tmp_path)
    target = raw / COCO
    if what == "fifo":
        os.mkfifo(target)
        reason = "not a regular file (a folder, device, pipe or socket)"
    elif what == "dev-zero":
        target.symlink_to("/dev/zero")
        reason = "symlink leads outside the source folder (to /dev/zero); set source.allow_symlinks_outside: true to take it"
    elif what == "dev-zero allowed":
        target.symlink_to("/dev/zero")
        reason = "not a regular file (a folder, device, pipe or socket)"
    elif what == "outside":
        elsewhere = tmp_path / "elsewhere.json"
        elsewhere.write_bytes((coco_folder / COCO).read_bytes())
        target.symlink_to(elsewhere)
        reason = (f"symlink leads outside the source folder (to {os.path.realpath(elsewhere)}); "
                  "set source.allow_symlinks_outside: true to take it")
    else:
        target.write_bytes((coco_folder / COCO).read_bytes())
        reason = f"{target.stat().st_size:,} bytes, larger than the limit of 1,000"
    spec = _spec(raw, tmp_path / "out", {"coco": COCO, **({"max_bytes": 1000} if what == "too large" else {})})
    spec["source"]["allow_symlinks_outside"] = what == "dev-zero allowed"
    got = _clean_fresh(spec)
    assert got["taken"] == []
    assert [sid for sid, _ in got["rejected"]] == sorted(PICTURES)
    assert {r for _, r in got["rejected"]} == {f"cannot read the COCO file {COCO}: {reason}"}
    assert got["peak_over_imports"] < 64 << 20, got


def test_a_coco_file_linked_from_outside_is_taken_when_the_spec_allows_it(coco_folder, tmp_path):
    raw = _coco_copy(coco_folder, tmp_path)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes((coco_folder / COCO).read_bytes())
    (raw / COCO).symlink_to(elsewhere)
    spec = _spec(raw, tmp_path / "out", {"coco": COCO})
    spec["source"]["allow_symlinks_outside"] = True
    got = _clean_fresh(spec)
    assert sorted(got["taken"]) == sorted(PICTURES) and got["rejected"] == []


def test_each_worker_is_handed_only_its_pictures_part_of_the_coco_file(coco_folder, tmp_path):
    """Discovery parses the COCO file once; a sample carries its picture's entry, annotations and
    their categories only, and cleaning needs nothing more (the file may be gone by then)."""
    from h5forge._ingest.clean import clean_batch
    from h5forge._ingest.discover import discover
    from h5forge.kinds.boxes.sources import CocoIndex
    from h5forge.spec import DatasetSpec

    raw = _coco_copy(coco_folder, tmp_path)
    data = json.loads((coco_folder / COCO).read_text())
    data["categories"].append({"id": 9, "name": "unused", "supercategory": "thing"})
    (raw / COCO).write_text(json.dumps(data))
    spec = DatasetSpec.model_validate(_spec(raw, tmp_path / "out", {"coco": COCO, "masks": True}))
    samples = discover(spec).samples
    by_name = {im["file_name"]: im["id"] for im in data["images"]}
    for ref in samples:
        part = ref.shared["boxes"]
        assert isinstance(part, CocoIndex)
        image_id = by_name[f"{ref.id}.png"]
        assert part.images == {f"{ref.id}.png": data["images"][image_id - 1]}
        mine = sorted((a for a in data["annotations"] if a["image_id"] == image_id), key=lambda a: a["id"])
        assert part.annotations == {image_id: mine}
        assert set(part.categories) == {a["category_id"] for a in mine}
        assert len(pickle.dumps(ref)) < 2 * len(json.dumps(mine)) + 2000  # what goes to the worker
    (raw / COCO).unlink()
    batch = clean_batch(spec, raw, samples)
    assert sorted(batch.ids) == sorted(PICTURES) and batch.rejections == []


def _one_picture_coco(raw: Path, annotations: list[dict]) -> None:
    import skimage.data
    from PIL import Image

    (raw / "images").mkdir(parents=True)
    Image.fromarray(skimage.data.coffee()).save(raw / "images" / "coffee.png")
    Image.fromarray(skimage.data.chelsea()).save(raw / "images" / "chelsea.png")
    images = [{"id": 1, "file_name": "coffee.png", "height": 400, "width": 600},
              {"id": 2, "file_name": "chelsea.png", "height": 300, "width": 451}]
    good = {"id": 1, "image_id": 2, "category_id": 1, "bbox": [60, 20, 340, 280], "iscrowd": 0,
            "segmentation": [[60, 20, 400, 20, 400, 300, 60, 300]]}
    (raw / "instances.json").write_text(json.dumps({"images": images, "annotations": [good, *annotations],
                                                    "categories": [{"id": 1, "name": "thing"}]}))


def _bounds_spec(raw: Path, **boxes) -> dict:
    return {"name": "bounds", "source": {"root": str(raw)},
            "fields": {"images": {"kind": "image", "files": "images/*.png", "size": [128, 128]},
                       "boxes": {"kind": "boxes", "like": "images", "coco": "instances.json", "classes": ["thing"],
                                 "masks": True, **boxes}},
            "output": {"dir": str(raw.parent / "out")}}


def test_a_picture_with_more_objects_than_the_limit_is_rejected_in_bounded_memory(tmp_path):
    anns = [{"id": k + 2, "image_id": 1, "category_id": 1, "bbox": [k % 500, k % 300, 90, 90], "iscrowd": 0}
            for k in range(20_000)]
    _one_picture_coco(tmp_path / "raw", anns)
    got = _clean_fresh(_bounds_spec(tmp_path / "raw"))
    assert got["taken"] == ["chelsea"]
    assert got["rejected"] == [["coffee", "20,000 objects, more than the field's limit of 1,000 per picture "
                                          "(max_objects)"]]
    assert got["peak_over_imports"] < 128 << 20, got  # 1 GB when each of the 20,000 masks was made


def test_a_polygon_with_more_vertices_than_the_limit_is_rejected_in_bounded_memory(tmp_path):
    k = np.arange(2_000_000)
    zigzag = np.column_stack([k % 599, np.where(k % 2, 0, 399)]).ravel().tolist()
    _one_picture_coco(tmp_path / "raw", [{"id": 2, "image_id": 1, "category_id": 1, "bbox": [0, 0, 599, 399],
                                          "iscrowd": 0, "segmentation": [zigzag]}])
    got = _clean_fresh(_bounds_spec(tmp_path / "raw"))
    assert got["taken"] == ["chelsea"]
    assert got["rejected"] == [["coffee", "annotation 2 of instances.json: a polygon of 2,000,000 vertices, more "
                                          "than the field's limit of 10,000 (max_vertices)"]]
    assert got["peak_over_imports"] < 256 << 20, got  # the parsed JSON of 4 x 10^6 numbers; 10 GB rasterised


def test_polygons_whose_outline_passes_the_limit_are_rejected(tmp_path):
    k = np.arange(5_000)
    zigzag = np.column_stack([k % 599, np.where(k % 2, 0, 399)]).ravel().tolist()  # 399 px an edge
    _one_picture_coco(tmp_path / "raw", [{"id": 2, "image_id": 1, "category_id": 1, "bbox": [0, 0, 599, 399],
                                          "iscrowd": 0, "segmentation": [zigzag]}])
    got = _clean_fresh(_bounds_spec(tmp_path / "raw", max_outline=1_000_000))
    assert got["taken"] == ["chelsea"]
    [(sid, reason)] = got["rejected"]
    assert sid == "coffee" and reason.startswith("the polygons have 1,99") and reason.endswith(
        "pixels of outline, more than the field's limit of 1,000,000 per picture (max_outline)")


def test_a_yolo_file_with_too_many_objects_or_vertices_is_rejected(coco_folder, tmp_path):
    raw = _yolo_folder(coco_folder, tmp_path)
    (raw / "labels" / "chelsea.txt").write_text("0 0.5 0.5 0.1 0.1\n" * 5)
    with pytest.raises(Reject, match=r"5 objects, more than the field's limit of 4 per picture \(max_objects\)"):
        _decode_one(raw, tmp_path, {"files": "labels/*.txt", "max_objects": 4}, "chelsea")
    (raw / "labels" / "chelsea.txt").write_text("0 " + " ".join(["0.1 0.2", "0.3 0.2", "0.2 0.4"] * 2) + "\n")
    with pytest.raises(Reject, match=r"line 1: a polygon of 6 vertices, more than the field's limit of 5"):
        _decode_one(raw, tmp_path, {"files": "labels/*.txt", "max_vertices": 5}, "chelsea")


@pytest.mark.parametrize("where", ["classes.txt", "labels/classes.txt"])
def test_yolo_classes_file_is_the_datasets_not_an_unused_file(coco_folder, tmp_path, where):
    """``init`` names the classes from classes.txt; the build then counts the file as the
    dataset's: no warning of a file taken by no glob, no sample made of it."""
    from h5forge._init import infer_spec

    raw = _yolo_folder(coco_folder, tmp_path)
    if where != "classes.txt":
        (raw / "classes.txt").rename(raw / where)
    found = infer_spec(raw, tmp_path / "spec.yaml")
    assert not any("taken by no glob" in n for n in found.notes), found.notes
    spec = yaml.safe_load(found.text)
    assert spec["fields"]["boxes"]["classes"] == ["person", "cup", "cat"]
    spec["output"] = {"dir": str(tmp_path / "out")}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = h5forge.build(tmp_path / "spec.yaml")
    assert (result.unclaimed, result.rejected, sum(result.counts.values())) == (0, 0, len(PICTURES))


def test_a_classes_file_in_each_split_folder_is_the_datasets_not_a_sample(coco_folder, tmp_path):
    """Ultralytics' split layout with the names in labels/train/classes.txt and labels/val/classes.txt
    (as some exporters write them): ``init`` names the classes from them, and the build takes
    neither file for a sample (each was an incomplete sample with no picture) nor warns of it."""
    from h5forge._init import infer_spec

    raw, flat = _ultralytics_folder(coco_folder, tmp_path)
    for split in ("train", "val"):
        (raw / "labels" / split / "classes.txt").write_text((flat / "classes.txt").read_text())
    found = infer_spec(raw, tmp_path / "spec.yaml")
    spec = yaml.safe_load(found.text)
    assert spec["fields"]["boxes"]["classes"] == ["person", "cup", "cat"], found.notes
    assert not any("taken by no glob" in n or "rejects" in n for n in found.notes), found.notes
    spec["output"] = {"dir": str(tmp_path / "out")}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = h5forge.build(tmp_path / "spec.yaml")
    assert (result.unclaimed, result.rejected, result.rejections) == (0, 0, ())
    assert result.counts == {"train": 3, "val": 1, "test": 0}


INIT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from h5forge._init import infer_spec

    found = infer_spec(Path(sys.argv[1]), Path(sys.argv[2]))
    print(json.dumps({"layout": found.layout, "notes": found.notes, "text": found.text}))
""")


def test_init_reads_annotation_files_as_a_build_does(coco_folder, tmp_path):
    """A FIFO named like a COCO file, a /dev/zero link and a malformed one beside the real file:
    ``init`` neither waits nor fails, and says which it left out."""
    raw = _coco_copy(coco_folder, tmp_path)
    (raw / COCO).write_bytes((coco_folder / COCO).read_bytes())
    os.mkfifo(raw / "annotations" / "instances_fifo.json")
    (raw / "annotations" / "instances_zero.json").symlink_to("/dev/zero")
    bad = json.loads((coco_folder / COCO).read_text())
    bad["categories"][0]["id"] = "one"
    (raw / "annotations" / "instances_bad.json").write_text(json.dumps(bad))
    res = subprocess.run([sys.executable, "-c", INIT, str(raw), str(tmp_path / "spec.yaml")], capture_output=True,
                         text=True, timeout=600, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    found = json.loads(res.stdout.strip().splitlines()[-1])
    assert found["layout"] == "boxes"
    assert yaml.safe_load(found["text"])["fields"]["boxes"]["coco"] == COCO
    for name in ("bad", "fifo", "zero"):
        assert f"annotations/instances_{name}.json is not a COCO instances file init can read: left out" in found["notes"]


# ---- ids that repeat: COCO files merged by concatenating their lists keep each file's numbering ----


def _edited(coco_folder: Path, tmp_path: Path, edit) -> Path:
    data = json.loads((coco_folder / COCO).read_text())
    edit(data)
    path = tmp_path / "merged.json"
    path.write_text(json.dumps(data))
    return path


def test_two_image_entries_with_one_id_reject_both_pictures_never_share_their_boxes(coco_folder, tmp_path):
    """astronaut (id 1) and coffee (id 2) both numbered 1: pycocotools' index would give each of them
    the other's objects; the pictures are refused with the reason, the others published."""

    def same_id(data):
        data["images"][1]["id"] = 1
        for a in data["annotations"]:
            a["image_id"] = 1 if a["image_id"] == 2 else a["image_id"]

    path = _edited(coco_folder, tmp_path, same_id)
    for picture in ("astronaut", "coffee"):
        with pytest.raises(Reject, match=r"image id 1 is used by 2 image entries of .*merged.json \(.*\)"):
            _decode_one(coco_folder, tmp_path, {"coco": str(path)}, picture)
    spec = {**_spec(coco_folder, tmp_path / "out", {"coco": str(path)}), "max_rejected": 0.5}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = h5forge.build(tmp_path / "spec.yaml")
    assert result.version == 1
    assert sorted(r.sample_id for r in result.rejections) == ["astronaut", "coffee"]
    with h5py.File(result.path, "r") as f:
        ids = [i for s in ("train", "val", "test") if s in f for i in decode_str(f[s]["ids"][()])]
    assert sorted(ids) == ["chelsea", "rocket"]


def test_a_category_id_naming_two_classes_rejects_the_pictures_that_use_it(coco_folder, tmp_path):
    """Category 3 listed twice, as 'cat' and as 'person': which name a box of it has cannot be told
    (a dict of the list keeps the last, turning chelsea's cat into a person)."""
    path = _edited(coco_folder, tmp_path, lambda d: d["categories"].append({"id": 3, "name": "person"}))
    with pytest.raises(Reject, match=r"category id 3 names more than one class in .*merged.json: 'cat', 'person'"):
        _decode_one(coco_folder, tmp_path, {"coco": str(path)}, "chelsea")
    _decode_one(coco_folder, tmp_path, {"coco": str(path)}, "rocket")  # no object of category 3: taken
    same = _edited(coco_folder, tmp_path, lambda d: d["categories"].append({"id": 3, "name": "cat"}))
    _decode_one(coco_folder, tmp_path, {"coco": str(same)}, "chelsea")  # listed twice with one name: taken


def test_an_annotation_listed_twice_in_a_picture_rejects_it(coco_folder, tmp_path):
    """The same object twice (a file merged with itself, in part) would be stored as two boxes."""

    def twice(data):
        data["annotations"].append(next(a for a in data["annotations"] if a["image_id"] == 3))

    path = _edited(coco_folder, tmp_path, twice)
    with pytest.raises(Reject, match=r"annotation id 6 is listed twice in .*merged.json, the same object each time"):
        _decode_one(coco_folder, tmp_path, {"coco": str(path)}, "chelsea")
    _decode_one(coco_folder, tmp_path, {"coco": str(path)}, "coffee")


def test_two_objects_an_exporter_numbered_alike_are_both_kept(coco_folder, tmp_path):
    """One annotation id on two different boxes of a picture: the file names two objects, both stored."""
    data = json.loads((coco_folder / COCO).read_text())
    first = next(a for a in data["annotations"] if a["image_id"] == 3)
    x, y, w, h = first["bbox"]
    other = {**first, "bbox": [x + 1, y + 1, w - 2, h - 2]}
    before = _decode_one(coco_folder, tmp_path, {"coco": COCO}, "chelsea")
    path = _edited(coco_folder, tmp_path, lambda d: d["annotations"].append(other))
    after = _decode_one(coco_folder, tmp_path, {"coco": str(path)}, "chelsea")
    was, now = np.asarray(before["boxes"].value), np.asarray(after["boxes"].value)
    assert len(now) == len(was) + 1  # the cat fills the cropped picture: both boxes clip alike


def test_an_image_entry_whose_id_is_a_list_rejects_only_its_picture(coco_folder, tmp_path):
    """coffee's image id written as [2]: coffee has no integer id and is refused; the file's other
    pictures are read as ever, not refused with the file."""

    def listed_id(data):
        entry = next(im for im in data["images"] if im["file_name"].startswith("coffee"))
        entry["id"] = [entry["id"]]

    path = _edited(coco_folder, tmp_path, listed_id)
    with pytest.raises(Reject, match=r"the image entry of 'coffee\.[a-z]+' in .*merged.json has no integer id"):
        _decode_one(coco_folder, tmp_path, {"coco": str(path)}, "coffee")
    for picture in ("astronaut", "chelsea", "rocket"):
        _decode_one(coco_folder, tmp_path, {"coco": str(path)}, picture)


def _split_folders(coco_folder: Path, tmp_path: Path, val_classes: str) -> Path:
    """Ultralytics' split layout, chelsea in val, with a classes.txt in each split's labels."""
    raw, flat = _ultralytics_folder(coco_folder, tmp_path)
    (raw / "labels" / "train" / "classes.txt").write_text((flat / "classes.txt").read_text())
    (raw / "labels" / "val" / "classes.txt").write_text(val_classes)
    return raw


def test_a_split_whose_classes_file_numbers_the_classes_otherwise_is_refused_not_relabelled(coco_folder, tmp_path):
    """labels/val/classes.txt lists the classes in another order than labels/train/classes.txt, whose
    names ``init`` writes: chelsea's line ``2 ...`` (a cat in val's numbering) is refused with both
    names, never stored as the class the field's list has at 2; train's pictures are published as
    their files say. A val file that agrees at the numbers used (a longer list) is taken, and
    editing it so it disagrees cleans chelsea again in the next build."""
    from h5forge._init import infer_spec

    raw = _split_folders(coco_folder, tmp_path, "cat\ncup\nperson\n")
    (raw / "labels" / "val" / "chelsea.txt").write_text("0 0.5 0.5 0.4 0.4\n")  # a cat, in val's numbers
    found = infer_spec(raw, tmp_path / "spec.yaml")
    assert any("labels/val/classes.txt names other classes" in n and "refuses" in n for n in found.notes), found.notes
    spec = yaml.safe_load(found.text)
    assert spec["fields"]["boxes"]["classes"] == list(CLASSES)
    spec["output"] = {"dir": str(tmp_path / "out"), "allow_removals": True}  # the last build refuses chelsea
    spec["fields"]["images"].update(size=[SIZE, SIZE], larger="crop")
    spec["max_rejected"] = 1
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = h5forge.build(tmp_path / "spec.yaml")
    assert [r.sample_id for r in result.rejections] == ["val/chelsea"], result.rejections
    assert "class 0 is 'cat' in labels/val/classes.txt but 'person'" in result.rejections[0].reason
    assert result.counts == {"train": 3, "val": 0, "test": 0}
    with SplitReader(result.path, "train", fields=["boxes"]) as r:
        got = dict(zip(r.ids(), r.read(range(len(r)))["boxes"]))
    for sid, boxes in got.items():
        assert np.allclose(boxes, _expected(sid.split("/")[1], "crop", "clip")[0], atol=1e-3), sid

    (raw / "labels" / "val" / "classes.txt").write_text("person\ncup\ncat\ndog\n")
    (raw / "labels" / "val" / "chelsea.txt").write_text("2 0.5 0.5 0.4 0.4\n")
    result = h5forge.build(tmp_path / "spec.yaml")
    assert result.rejections == () and result.counts == {"train": 3, "val": 1, "test": 0}, result
    with SplitReader(result.path, "val", fields=["boxes"]) as r:
        assert r.read([0])["boxes"][0][:, 4].tolist() == [CLASSES.index("cat")]
    (raw / "labels" / "val" / "classes.txt").write_text("person\ncat\ncup\n")  # only the file changes
    result = h5forge.build(tmp_path / "spec.yaml")
    assert [r.sample_id for r in result.rejections] == ["val/chelsea"], result
    assert "class 2 is 'cup' in labels/val/classes.txt but 'cat'" in result.rejections[0].reason


def test_an_inbox_classes_file_numbers_its_own_label_files_only(coco_folder, tmp_path):
    """An inbox batch's classes.txt names the numbers of the label files it came with: one that
    lists the classes in another order refuses the batch's pictures that use a number it names
    otherwise (to quarantine/, with both names). Labels appended before it came are judged by what
    was beside them then: the rebuild still publishes them as their files say."""
    from PIL import Image

    from tests.kinds.boxes.test_boxes import _picture
    from tests.kinds.boxes.test_boxes_background import _stored

    raw, inbox = _yolo_folder(coco_folder, tmp_path), tmp_path / "inbox"
    spec = _spec(raw, tmp_path / "out", {"files": "labels/*.txt"})
    spec["source"]["inbox"] = str(inbox)
    spec["append"] = {"settle_seconds": 0}
    spec["output"]["allow_removals"] = False
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert h5forge.build(tmp_path / "spec.yaml").rejected == 0
    (inbox / "images").mkdir(parents=True)
    (inbox / "labels").mkdir()
    Image.fromarray(_picture("immunohistochemistry")).save(inbox / "images" / "ihc.png")
    (inbox / "labels" / "ihc.txt").write_text("2 0.5 0.5 0.5 0.5\n")  # a cat, in the dataset's numbers
    assert h5forge.append(tmp_path / "spec.yaml").added == 1

    (inbox / "classes.txt").write_text("cat\ncup\nperson\n")  # the next batch's exporter numbers otherwise
    Image.fromarray(_picture("camera")).save(inbox / "images" / "cam.png")
    (inbox / "labels" / "cam.txt").write_text("0 0.5 0.5 0.5 0.5\n")  # a cat, in its numbers
    added = h5forge.append(tmp_path / "spec.yaml")
    assert added.added == 0 and [r.sample_id for r in added.rejections] == ["cam"], added
    assert "class 0 is 'cat' in classes.txt but 'person'" in added.rejections[0].reason
    assert (inbox / "quarantine" / "labels" / "cam.txt").is_file()

    rebuilt = h5forge.build(tmp_path / "spec.yaml")
    assert rebuilt.rejected == 0, rebuilt.rejections
    assert _stored(tmp_path / "out" / "dataset_latest.h5")["ihc"][:, 4].tolist() == [CLASSES.index("cat")]

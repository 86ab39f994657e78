"""``h5forge init`` on segmentation folders laid out as the public sets are (ISIC 2018, Oxford-IIIT
Pet, Cityscapes, ADE20K, DRIVE, a plain ``img/`` + ``label/``), written with Pillow from
scikit-image's photographs: the spec pairs each picture with the mask that labels it, and the
built values are the source files' own, decoded here with Pillow."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from h5forge._format.layout import decode_str
from h5forge.errors import UsageError
from h5forge._init import infer_spec
from tests.init.test_infer import SPLITS, build, infer, photo


def classes_of(pic: Image.Image, k: int) -> np.ndarray:
    grey = np.asarray(pic.convert("L")).astype(int)
    return np.minimum(grey * k // 256, k - 1).astype(np.uint8)


def built_pairs(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray, str]]:
    """{id: (image HWC, mask HW, split)} as published, the padding cut away (every source picture
    is 64 wide, 56 or 64 high, in a 64 x 64 field: padded at most 4 rows top and bottom)."""
    out = {}
    with h5py.File(path, "r") as f:
        for s in SPLITS:
            for sid, img, mask in zip(decode_str(f[s]["ids"][()]), f[s]["images"][()], f[s]["masks"][()]):
                out[sid] = (img.transpose(1, 2, 0), mask[0], s)
    return out


def assert_built_as(path: Path, truth: dict[str, tuple[Path, Path]], scale: int = 1) -> dict[str, str]:
    """Every id of ``truth`` is published with its picture's pixels and its mask's values (over
    ``scale``: a {0,255} mask is stored as {0,1}); returns each id's split."""
    built = built_pairs(path)
    assert sorted(built) == sorted(truth)
    for sid, (image_file, mask_file) in truth.items():
        image, mask, _ = built[sid]
        want_image = np.asarray(Image.open(image_file).convert("RGB"))
        want_mask = np.asarray(Image.open(mask_file)) // scale
        top = (image.shape[0] - want_image.shape[0]) // 2
        rows = slice(top, top + want_image.shape[0])
        assert np.array_equal(image[rows], want_image), sid
        assert np.array_equal(mask[rows], want_mask), sid
    return {sid: split for sid, (_, _, split) in built.items()}


def test_isic_input_and_ground_truth_folders_are_pictures_and_masks(tmp_path):
    raw = tmp_path / "isic2018"
    pictures, truths = raw / "ISIC2018_Task1-2_Training_Input", raw / "ISIC2018_Task1_Training_GroundTruth"
    pictures.mkdir(parents=True)
    truths.mkdir()
    truth = {}
    for i in range(8):
        sid = f"ISIC_{i:07d}"
        pic = photo(i).convert("RGB")
        pic.save(pictures / f"{sid}.jpg", quality=95)
        Image.fromarray(classes_of(pic, 2) * 255).save(truths / f"{sid}_segmentation.png")
        truth[sid] = (pictures / f"{sid}.jpg", truths / f"{sid}_segmentation.png")
    (pictures / "LICENSE.txt").write_text("CC-BY-NC")
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert inferred.layout == "segment" and "label" not in spec.fields  # not two classes of pictures
    assert spec.fields["images"].files == "ISIC2018_Task1-2_Training_Input/*.jpg"
    masks = spec.fields["masks"]
    assert (masks.files, masks.id_suffix, masks.classes) == (
        "ISIC2018_Task1_Training_GroundTruth/*_segmentation.png", "_segmentation", None)
    path, result = build(spec_path, tmp_path / "out")
    assert result.rejections == ()
    assert_built_as(path, truth, scale=255)


def test_oxford_pet_trimaps_nested_in_annotations_are_the_masks(tmp_path):
    raw = tmp_path / "oxford-iiit-pet"
    for d in ("images", "annotations/trimaps", "annotations/xmls"):
        (raw / d).mkdir(parents=True)
    truth, lines = {}, []
    for i in range(8):
        sid = f"{'Abyssinian' if i % 2 else 'beagle'}_{i + 1}"
        pic = photo(i).convert("RGB")
        pic.save(raw / "images" / f"{sid}.jpg", quality=95)
        Image.fromarray(classes_of(pic, 3) + 1).save(raw / "annotations/trimaps" / f"{sid}.png")  # 1, 2, 3
        (raw / "annotations/xmls" / f"{sid}.xml").write_text("<annotation/>")
        lines.append(f"{sid} {1 + i % 2} {1 + i % 2} 1")
        truth[sid] = (raw / "images" / f"{sid}.jpg", raw / "annotations/trimaps" / f"{sid}.png")
    (raw / "annotations/list.txt").write_text("#Image CLASS-ID SPECIES BREED ID\n" + "\n".join(lines) + "\n")
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert inferred.layout == "segment"
    masks = spec.fields["masks"]
    assert masks.files == "annotations/trimaps/*.png" and masks.classes == 4  # the trimap values 1..3
    path, result = build(spec_path, tmp_path / "out")
    assert result.rejections == ()
    assert_built_as(path, truth)


def test_cityscapes_label_ids_pair_by_both_ends_and_the_split_folders(tmp_path):
    raw = tmp_path / "cityscapes"
    truth = {}
    for n, (split, city, k) in enumerate(
        [("train", "aachen", k) for k in range(4)] + [("train", "bochum", k) for k in range(3)]
        + [("val", "frankfurt", k) for k in range(3)]
    ):
        pictures, gt = raw / "leftImg8bit" / split / city, raw / "gtFine" / split / city
        pictures.mkdir(parents=True, exist_ok=True)
        gt.mkdir(parents=True, exist_ok=True)
        sid = f"{city}_{k:06d}_000019"
        pic = photo(n).convert("RGB")
        pic.save(pictures / f"{sid}_leftImg8bit.png")
        labels = classes_of(pic, 4) + 5  # label ids 5..8
        Image.fromarray(labels).save(gt / f"{sid}_gtFine_labelIds.png")
        Image.fromarray(np.stack([labels * 20, labels * 3, labels], -1)).save(gt / f"{sid}_gtFine_color.png")
        Image.fromarray(labels.astype(np.uint16) * 1000 + k).save(gt / f"{sid}_gtFine_instanceIds.png")
        (gt / f"{sid}_gtFine_polygons.json").write_text("{}")
        truth[sid] = (pictures / f"{sid}_leftImg8bit.png", gt / f"{sid}_gtFine_labelIds.png")
    inferred, spec, spec_path = infer(raw, tmp_path)
    images, masks = spec.fields["images"], spec.fields["masks"]
    assert (images.files, images.id_suffix) == ("leftImg8bit/*/*/*_leftImg8bit.png", "_leftImg8bit")
    assert (masks.files, masks.id_suffix) == ("gtFine/*/*/*_gtFine_labelIds.png", "_gtFine_labelIds")
    assert masks.classes == 9 and spec.splits.column == "split" and spec.annotations.folders == {"split": -2}
    assert any("_gtFine_color" in n and "_gtFine_instanceIds" in n for n in inferred.notes)
    path, result = build(spec_path, tmp_path / "out")
    assert result.rejections == ()
    splits = assert_built_as(path, truth)
    assert {sid: s for sid, s in splits.items() if s != "train"} == {f"frankfurt_{k:06d}_000019": "val" for k in range(3)}


def test_ade20k_split_folders_are_splits_not_classes(tmp_path):
    raw = tmp_path / "ADEChallengeData2016"
    truth = {}
    for split, prefix, n in (("training", "ADE_train", 6), ("validation", "ADE_val", 3)):
        (raw / "images" / split).mkdir(parents=True)
        (raw / "annotations" / split).mkdir(parents=True)
        for k in range(n):
            sid = f"{prefix}_{k + 1:08d}"
            pic = photo(k + (0 if split == "training" else 10)).convert("RGB")
            pic.save(raw / "images" / split / f"{sid}.jpg", quality=95)
            Image.fromarray(classes_of(pic, 5)).save(raw / "annotations" / split / f"{sid}.png")
            truth[sid] = (raw / "images" / split / f"{sid}.jpg", raw / "annotations" / split / f"{sid}.png")
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert inferred.layout == "segment" and "label" not in spec.fields
    assert (spec.fields["images"].files, spec.fields["masks"].files) == ("images/*/*.jpg", "annotations/*/*.png")
    path, result = build(spec_path, tmp_path / "out")
    assert result.rejections == ()
    splits = assert_built_as(path, truth)
    assert {s for sid, s in splits.items() if sid.startswith("ADE_val")} == {"val"}


def drive(raw: Path, n: int = 8) -> dict[str, tuple[Path, Path]]:
    """DRIVE: training/images/21_training.tif, the vessels in 1st_manual/21_manual1.gif, the
    field of view (the same disc in every picture) in mask/21_training_mask.gif; test/ unlabelled."""
    truth = {}
    for split, first in (("training", 21), ("test", 1)):
        for d in ("images", "mask") + (("1st_manual",) if split == "training" else ()):
            (raw / split / d).mkdir(parents=True)
        for k in range(first, first + (n if split == "training" else 3)):
            pic = photo(2 * k).convert("RGB")  # every picture 64 x 64, as DRIVE's are one size
            pic.save(raw / split / "images" / f"{k:02d}_{split}.tif")
            yy, xx = np.mgrid[:64, :64]
            fov = (((yy - 32) ** 2 + (xx - 32) ** 2) < 30**2).astype(np.uint8) * 255
            Image.fromarray(fov).save(raw / split / "mask" / f"{k:02d}_{split}_mask.gif")
            if split == "training":
                manual = raw / split / "1st_manual" / f"{k:02d}_manual1.gif"
                Image.fromarray(classes_of(pic, 2) * 255).save(manual)
                truth[f"{k:02d}"] = (raw / split / "images" / f"{k:02d}_{split}.tif", manual)
    return truth


def test_drive_vessels_are_the_label_not_the_field_of_view_masks(tmp_path):
    raw = tmp_path / "DRIVE"
    truth = drive(raw)
    inferred, spec, spec_path = infer(raw, tmp_path)
    images, masks = spec.fields["images"], spec.fields["masks"]
    assert (images.files, images.id_suffix) == ("training/images/*_training.tif", "_training")
    assert (masks.files, masks.id_suffix) == ("training/1st_manual/*_manual1.gif", "_manual1")
    assert any("training/mask/*_training_mask" in n and "field-of-view" in n for n in inferred.notes)
    assert spec.splits.column is None  # one split folder holds labels: the ratios split it
    path, result = build(spec_path, tmp_path / "out")
    assert result.rejections == ()
    # GIF masks are palette pictures: the stored value is the index, 1 for white here
    assert_built_as(path, truth)


def test_two_kinds_of_mask_init_cannot_tell_apart_are_refused(tmp_path):
    raw = tmp_path / "two"
    for d in ("images", "expert_a", "expert_b"):
        (raw / d).mkdir(parents=True)
    for i in range(6):
        pic = photo(i).convert("RGB")
        pic.save(raw / "images" / f"s{i}.png")
        Image.fromarray(classes_of(pic, 2)).save(raw / "expert_a" / f"s{i}.png")
        Image.fromarray(classes_of(pic, 3)).save(raw / "expert_b" / f"s{i}.png")
    with pytest.raises(UsageError, match=r"several kinds of mask.*expert_a/\*.*expert_b/\*"):
        infer_spec(raw, tmp_path / "two.yaml")


def test_plain_img_and_label_folders_pair(tmp_path):
    raw = tmp_path / "plain"
    (raw / "img").mkdir(parents=True)
    (raw / "label").mkdir()
    truth = {}
    for i in range(8):
        pic = photo(i).convert("RGB")
        pic.save(raw / "img" / f"{i:03d}.png")
        Image.fromarray(classes_of(pic, 2)).save(raw / "label" / f"{i:03d}.png")
        truth[f"{i:03d}"] = (raw / "img" / f"{i:03d}.png", raw / "label" / f"{i:03d}.png")
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert (spec.fields["images"].files, spec.fields["masks"].files) == ("img/*.png", "label/*.png")
    path, result = build(spec_path, tmp_path / "out")
    assert result.rejections == ()
    assert_built_as(path, truth)


def test_split_folders_of_unlabelled_pictures_are_not_classes(tmp_path):
    raw = tmp_path / "unlabelled"
    for split in ("train", "val"):
        (raw / "images" / split).mkdir(parents=True)
        for i in range(4):
            photo(i).convert("RGB").save(raw / "images" / split / f"{split}{i}.jpg")
    with pytest.raises(UsageError, match="no layout h5forge knows"):  # never label = the split's name
        infer_spec(raw, tmp_path / "unlabelled.yaml")

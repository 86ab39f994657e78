"""DICOM SEG masks of DICOM cases, written with highdicom from the case's own slices: read as the
case's ``volume_mask`` equal to the segmentation array highdicom was given (segment k as class k,
empty slices 0, fractional segments at one half, label maps as they are), beside the case's slices or in a mask folder,
for a single-frame series and a multi-frame file; SEGs that do not fit their volume (size,
positions, frame of reference), or whose segments overlap, rejected with a reason naming both."""

from __future__ import annotations

import warnings

import h5py
import highdicom as hd
import numpy as np
import pydicom
from pydicom.sr.codedict import codes

from h5forge._format.layout import decode_str
from h5forge.read.torch import H5Dataset
from tests.kinds.test_volume import spec_data, write_series
from tests.kinds.test_volume_multiframe import enhanced_ct, ct_slices


def by_position(slices):
    return sorted(slices, key=lambda ds: float(ds.ImagePositionPatient[2]))


def segment(number: int, label: str) -> hd.seg.SegmentDescription:
    return hd.seg.SegmentDescription(
        segment_number=number,
        segment_label=label,
        segmented_property_category=codes.SCT.Tissue,
        segmented_property_type=codes.SCT.Organ,
        algorithm_type=hd.seg.SegmentAlgorithmTypeValues.MANUAL,
    )


def write_seg(path, sources, labels, kind="BINARY", segments=None):
    """highdicom's Segmentation of ``sources`` from ``labels``: a (D, H, W) label map (values 1..K)
    or (D, H, W, K) per-segment arrays (BINARY or FRACTIONAL)."""
    count = segments or int(labels.max())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seg = hd.seg.Segmentation(
            source_images=sources,
            pixel_array=labels,
            segmentation_type=kind,
            segment_descriptions=[segment(k, f"region {k}") for k in range(1, count + 1)],
            series_instance_uid=hd.UID(),
            series_number=20,
            sop_instance_uid=hd.UID(),
            instance_number=1,
            manufacturer="h5forge tests",
            manufacturer_model_name="test",
            software_versions="1",
            device_serial_number="1",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    seg.save_as(path)
    return seg


def two_regions(hu):
    """Class 1 where a slice is brightest, class 2 in a band below, slice 0 left empty."""
    labels = np.zeros(hu.shape, np.uint8)
    labels[hu > np.percentile(hu, 90)] = 1
    labels[(hu > np.percentile(hu, 60)) & (hu <= np.percentile(hu, 70))] = 2
    labels[0] = 0
    return labels


def mask_spec(root, out, mask_files="masks/*", classes=3):
    data = spec_data(root, out)
    data["fields"]["ct_mask"] = {"kind": "volume_mask", "files": mask_files, "like": "ct", "classes": classes}
    return data


def test_a_seg_is_read_as_the_cases_mask_on_its_slices(tmp_path, build_spec):
    root = tmp_path / "raw"
    truth = {}
    series = by_position(ct_slices(root / "cases" / "single", seed=1))  # one file per slice
    hu = np.stack([s.pixel_array.astype(float) for s in series])
    truth["single"] = two_regions(hu)
    seg = write_seg(root / "masks" / "single.dcm", series, truth["single"])
    assert int(seg.NumberOfFrames) == 2 * 5  # two segments on five slices: the empty slice is left out
    lc = enhanced_ct(ct_slices(tmp_path / "slices", seed=2))  # one multi-frame file
    (root / "cases" / "multi").mkdir()
    lc.save_as(root / "cases" / "multi" / "volume.dcm")
    in_frame_order = two_regions(lc.pixel_array.astype(float))
    write_seg(root / "masks" / "multi" / "seg.dcm", [lc], in_frame_order)  # a mask folder holding the SEG
    z = [float(g.PlanePositionSequence[0].ImagePositionPatient[2]) for g in lc.PerFrameFunctionalGroupsSequence]
    assert z != sorted(z)  # the file's frames are not in slice order: the mask follows the slices
    truth["multi"] = in_frame_order[np.argsort(z)]
    fractions = np.random.default_rng(3).choice([0.0, 0.2, 0.8, 1.0], size=(*hu.shape, 1))
    truth["fractional"] = (fractions[..., 0] >= 0.5).astype(np.uint8)
    series = by_position(ct_slices(root / "cases" / "fractional", seed=4))
    write_seg(root / "masks" / "fractional.dcm", series, fractions, kind="FRACTIONAL", segments=1)
    series = by_position(ct_slices(root / "cases" / "labelmap", seed=12))
    truth["labelmap"] = two_regions(np.stack([s.pixel_array.astype(float) for s in series]))
    seg = write_seg(root / "masks" / "labelmap.dcm", series, truth["labelmap"], kind="LABELMAP")
    assert seg.SegmentationType == "LABELMAP" and int(seg.NumberOfFrames) == 5  # one frame per slice
    path, summary = build_spec(mask_spec(root, tmp_path / "out"))
    assert summary.rejections == ()
    read = H5Dataset(path, fields=("ct", "ct_mask"))
    with h5py.File(path, "r") as f:
        ids = decode_str(f["train"]["ids"][()])
    for i, sid in enumerate(ids):
        _, mask = read[i]
        assert np.array_equal(mask.numpy(), truth[sid]), sid
    assert sorted(ids) == ["fractional", "labelmap", "multi", "single"]


def test_a_seg_beside_its_slices_in_the_case_folder(tmp_path, build_spec):
    root = tmp_path / "raw"
    series = by_position(ct_slices(root / "cases" / "a", seed=5))
    labels = (np.stack([s.pixel_array for s in series]) > 1500).astype(np.uint8)
    write_seg(root / "cases" / "a" / "seg.dcm", series, labels)
    path, summary = build_spec(mask_spec(root, tmp_path / "out", mask_files="cases/*", classes=None))
    assert summary.rejections == ()
    with h5py.File(path, "r") as f:
        assert np.array_equal(f["train"]["ct_mask"][()], labels)
        assert f["train"]["ct_lengths"][()].tolist() == [6]  # the SEG is no slice of the volume


def test_a_seg_that_does_not_fit_its_volume_is_rejected_naming_both(tmp_path, build_spec):
    root = tmp_path / "raw"
    series = by_position(ct_slices(root / "cases" / "good", seed=6))
    labels = two_regions(np.stack([s.pixel_array.astype(float) for s in series]))
    write_seg(root / "masks" / "good.dcm", series, labels)
    # the SEG of a series 3 mm apart, on a volume 2.5 mm apart (same frame of reference)
    ct_slices(root / "cases" / "shifted", seed=7)
    write_seg(root / "masks" / "shifted.dcm", by_position(ct_slices(tmp_path / "other", spacing=3.0)), labels)
    # a CT SEG on an MR series of 64 x 64
    write_series(root / "cases" / "small", source="MR_small.dcm", depth=6, spacing=2.5)
    write_seg(root / "masks" / "small.dcm", series, labels)
    # a CT SEG in another frame of reference
    ct_slices(root / "cases" / "elsewhere", seed=8)
    moved = [pydicom.dcmread(p) for p in sorted((tmp_path / "other").iterdir())]
    for ds in moved:
        ds.FrameOfReferenceUID = "1.2.3.4"
        ds.ImagePositionPatient = [-50.0, -60.0, float(ds.ImagePositionPatient[2]) / 3.0 * 2.5]
    write_seg(root / "masks" / "elsewhere.dcm", by_position(moved), labels)
    # two segments overlapping
    ct_slices(root / "cases" / "overlap", seed=9)
    k = 3  # segment 2 covers segment 1 on this slice only
    both = np.stack([labels == 1, labels == 2], axis=-1).astype(np.uint8)
    both[k, ..., 1] |= both[k, ..., 0]
    write_seg(root / "masks" / "overlap.dcm", series, both, segments=2)
    path, summary = build_spec(mask_spec(root, tmp_path / "out"))
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert set(reasons) == {"shifted", "small", "elsewhere", "overlap"}
    assert reasons["shifted"].startswith("SEG frame ")
    assert "lies on no slice of its volume cases/shifted (nearest: slice " in reasons["shifted"]
    assert reasons["small"] == "SEG frames are 128x128 but the slices of its volume cases/small are 64x64"
    assert reasons["elsewhere"] == (f"FrameOfReferenceUID 1.2.3.4 differs from its volume's (cases/elsewhere: "
                                    f"{series[0].FrameOfReferenceUID})")
    overlap = int((labels[k] == 1).sum())
    assert overlap > 0
    assert reasons["overlap"] == f"segments 1 and 2 overlap in {overlap} voxels of slice {k}: a voxel holds one class"
    with h5py.File(path, "r") as f:
        assert decode_str(f["train"]["ids"][()]) == ["good"]
        assert np.array_equal(f["train"]["ct_mask"][()], labels)


def test_a_seg_needs_classes_for_its_segments_and_a_dicom_volume(tmp_path, build_spec):
    import nibabel

    root = tmp_path / "raw"
    series = by_position(ct_slices(root / "cases" / "good", seed=10))
    one = (np.stack([s.pixel_array for s in series]) > 1500).astype(np.uint8)
    write_seg(root / "masks" / "good.dcm", series, one)
    ct_slices(root / "cases" / "two", seed=11)
    write_seg(root / "masks" / "two.dcm", series, two_regions(np.stack([s.pixel_array for s in series])))
    nibabel.save(nibabel.Nifti1Image(np.zeros((128, 128, 6), np.int16), np.eye(4)), root / "cases" / "nifti.nii.gz")
    write_seg(root / "masks" / "nifti.dcm", series, one)
    path, summary = build_spec(mask_spec(root, tmp_path / "out", classes=None))
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert reasons == {
        "two": "the SEG holds 2 segments; set classes: 3 to read them",
        "nifti": "a DICOM SEG mask needs a DICOM volume; cases/nifti.nii.gz is not one",
    }
    with h5py.File(path, "r") as f:
        assert np.array_equal(f["train"]["ct_mask"][()], one)

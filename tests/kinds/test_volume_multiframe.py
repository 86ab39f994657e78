"""Multi-frame DICOM cases: an enhanced CT file (highdicom's legacy converted enhanced image, with
per-frame and shared functional groups) read as a case, in a folder or as a single file, equal to
what pydicom reads from the single-frame slices it was made of; legacy multi-frame files (pydicom's
bundled RT Dose with its GridFrameOffsetVector, a multi-frame secondary capture with
SpacingBetweenSlices); and files whose frames cannot form one stack, rejected with their reasons."""

from __future__ import annotations

import copy
import warnings

import h5py
import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid

from h5forge._format.layout import decode_str
from h5forge.read.torch import H5Dataset
from tests.kinds.test_volume import SIZE, spec_data, write_series

SPACING = 2.5


def ct_slices(folder, depth=6, spacing=SPACING, seed=0, intercepts=(-1024,)):
    """Single-frame CT files from pydicom's CT_small.dcm, each slice its own pixels (the base + 11 k)
    and intercept, saved in shuffled order; returned as pydicom reads them back, shuffled."""
    folder.mkdir(parents=True, exist_ok=True)
    base = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    series, rng = generate_uid(), np.random.default_rng(seed)
    for k in rng.permutation(depth):
        ds = copy.deepcopy(base)
        ds.SeriesInstanceUID = series
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.ImagePositionPatient = [-50.0, -60.0, spacing * k]
        ds.PixelData = (base.pixel_array + 11 * k).astype(np.int16).tobytes()
        ds.RescaleIntercept = intercepts[k % len(intercepts)]
        ds.InstanceNumber = int(rng.integers(1, 1000))  # deliberately not the slice order
        ds.save_as(folder / f"{ds.SOPInstanceUID}.dcm", enforce_file_format=True)
    return [pydicom.dcmread(p) for p in sorted(folder.iterdir())]


def hu_by_position(slices):
    """(D, H, W) values pydicom reads slice by slice, in order of position along the normal (z)."""
    ordered = sorted(slices, key=lambda ds: float(ds.ImagePositionPatient[2]))
    return np.stack([ds.pixel_array * float(ds.RescaleSlope) + float(ds.RescaleIntercept) for ds in ordered])


def enhanced_ct(slices):
    """highdicom's legacy converted enhanced CT image of single-frame slices: one multi-frame file."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hd.legacy.LegacyConvertedEnhancedCTImage(
            slices, series_instance_uid=hd.UID(), series_number=9, sop_instance_uid=hd.UID(), instance_number=1
        )


def multiframe_secondary_capture(slices, spacing_tag=True):
    """A legacy multi-frame file written with pydicom: Multi-frame Grayscale Word Secondary Capture
    holding the slices in position order, one ImagePositionPatient and SpacingBetweenSlices."""
    ordered = sorted(slices, key=lambda ds: float(ds.ImagePositionPatient[2]))
    ds = copy.deepcopy(ordered[0])
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.7.3"
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.SeriesInstanceUID = generate_uid()
    ds.NumberOfFrames = len(ordered)
    ds.PixelData = np.stack([s.pixel_array for s in ordered]).astype(np.int16).tobytes()
    ds.RescaleIntercept = -1024
    del ds.SliceThickness, ds.SpacingBetweenSlices  # CT_small.dcm says 5 mm and 5 mm
    if spacing_tag:
        ds.SpacingBetweenSlices = SPACING
    return ds


def test_an_enhanced_ct_file_reads_as_its_single_frame_series(tmp_path, build_spec):
    root = tmp_path / "raw"
    slices = ct_slices(root / "cases" / "series", intercepts=(-1024, -1000, -990))
    lc = enhanced_ct(slices)
    per_frame = lc.PerFrameFunctionalGroupsSequence
    assert int(lc.NumberOfFrames) == 6 and "ImageOrientationPatient" not in lc
    assert len({float(g.PixelValueTransformationSequence[0].RescaleIntercept) for g in per_frame}) == 3
    (root / "cases" / "enhanced").mkdir()
    lc.save_as(root / "cases" / "enhanced" / "volume.dcm")  # a case folder holding one multi-frame file
    lc.save_as(root / "cases" / "single.dcm")  # a case that is one multi-frame file
    expected = hu_by_position(slices)
    path, summary = build_spec(spec_data(root, tmp_path / "out"))
    assert summary.rejections == ()
    with h5py.File(path, "r") as f:
        g = f["train"]
        ids = decode_str(g["ids"][()])
        assert sorted(ids) == ["enhanced", "series", "single"]
        stored = H5Dataset(path, fields=("ct",))
        pixel = [float(v) for v in slices[0].PixelSpacing]
        for i, sid in enumerate(ids):
            assert np.array_equal(stored[i].numpy(), expected), sid
            assert g["ct_spacing"][i].tolist() == pytest.approx([SPACING, *pixel]), sid
            assert g["ct_origin"][i].tolist() == pytest.approx([-50.0, -60.0, 0.0]), sid
        series = decode_str(g["ct_series"][()])
        assert series[ids.index("single")] == series[ids.index("enhanced")] == lc.SeriesInstanceUID
        assert decode_str(g["ct_modality"][()]) == ["CT"] * 3


def test_legacy_multiframe_files_take_their_frame_positions_from_the_header(tmp_path, build_spec):
    root = tmp_path / "raw"
    slices = ct_slices(tmp_path / "slices")
    (root / "cases").mkdir(parents=True)
    multiframe_secondary_capture(slices).save_as(root / "cases" / "sc.dcm", enforce_file_format=True)
    multiframe_secondary_capture(slices, spacing_tag=False).save_as(root / "cases" / "nospacing.dcm",
                                                                   enforce_file_format=True)
    dose = pydicom.dcmread(get_testdata_file("rtdose.dcm"))
    dose.save_as(root / "cases" / "dose.dcm")
    cine = pydicom.dcmread(get_testdata_file("examples_ybr_color.dcm"))
    cine.save_as(root / "cases" / "cine.dcm")
    gray = multiframe_secondary_capture(slices)
    del gray.ImagePositionPatient, gray.ImageOrientationPatient
    gray.save_as(root / "cases" / "nogeometry.dcm", enforce_file_format=True)
    path, summary = build_spec(spec_data(root, tmp_path / "out", dtype="float32"))
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert reasons == {
        "nospacing": "a legacy multi-frame file with 6 frames gives one ImagePositionPatient and no "
        "GridFrameOffsetVector, SpacingBetweenSlices or SliceThickness: the frames' positions are unknown",
        "nogeometry": "Multi-frame Grayscale Word Secondary Capture Image Storage with 6 frames and no patient "
        "geometry (no functional groups, no ImagePositionPatient/ImageOrientationPatient): its frames cannot be "
        "placed as slices",
        "cine": "colour pixels (3 samples per pixel): a volume holds one value per voxel",
    }
    with h5py.File(path, "r") as f:
        g = f["train"]
        ids = decode_str(g["ids"][()])
        assert sorted(ids) == ["dose", "sc"]
        stored = H5Dataset(path, fields=("ct",))
        assert np.array_equal(stored[ids.index("sc")].numpy(), hu_by_position(slices))
        # RT Dose: 15 frames of 10 x 10 at GridFrameOffsetVector 0, 5, ... 70 mm, centred in 128 x 128,
        # in Gy (the stored values x DoseGridScaling)
        offsets = [float(v) for v in dose.GridFrameOffsetVector]
        values = stored[ids.index("dose")].numpy()
        assert values.shape == (15, *SIZE)
        gray = (dose.pixel_array * float(dose.DoseGridScaling)).astype(np.float32)
        assert values[:, 59:69, 59:69].max() > 1.0 and np.array_equal(values[:, 59:69, 59:69], gray)
        d = ids.index("dose")
        assert g["ct_spacing"][d].tolist() == pytest.approx([offsets[1] - offsets[0], 10.0, 10.0])
        # the first stored voxel: 59 rows and columns of padding before the dose grid's first
        iop = np.array([float(v) for v in dose.ImageOrientationPatient])
        first = np.array([float(v) for v in dose.ImagePositionPatient])
        assert g["ct_origin"][d].tolist() == pytest.approx(first - 59 * 10.0 * (iop[:3] + iop[3:]))
        assert g["ct_spacing"][ids.index("sc")][0] == pytest.approx(SPACING)


def test_frames_that_do_not_form_one_stack_are_rejected_with_their_reason(tmp_path, build_spec):
    root = tmp_path / "raw"
    slices = ct_slices(tmp_path / "slices")
    (root / "cases").mkdir(parents=True)

    def save(name, change):
        lc = enhanced_ct(slices)
        change(lc.PerFrameFunctionalGroupsSequence)
        lc.save_as(root / "cases" / f"{name}.dcm")

    def two_stacks(frames):  # 6 frames at 3 positions, as two echoes of one stack
        for i, item in enumerate(frames):
            item.PlanePositionSequence[0].ImagePositionPatient = [-50.0, -60.0, SPACING * (i % 3)]

    def tilted(frames):
        plane = pydicom.Dataset()
        plane.ImageOrientationPatient = [1, 0, 0, 0, 0, -1]
        frames[2].PlaneOrientationSequence = [plane]

    def unplaced(frames):
        del frames[3].PlanePositionSequence

    save("good", lambda frames: None)
    save("twostacks", two_stacks)
    save("tilted", tilted)
    save("unplaced", unplaced)
    path, summary = build_spec(spec_data(root, tmp_path / "out"))
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert reasons == {
        "twostacks": "6 frames at 3 positions: not one stack of slices (several stacks, echoes or time points "
        "in one series?)",
        "tilted": "frames lie in 2 different orientations (ImageOrientationPatient): not one stack of slices "
        "(a multi-plane localizer?)",
        "unplaced": "frame 4 of 6 has no ImagePositionPatient (PlanePositionSequence) in its per-frame or shared "
        "functional groups: its place in the volume is unknown",
    }
    with h5py.File(path, "r") as f:
        assert decode_str(f["train"]["ids"][()]) == ["good"]


def test_a_multiframe_file_is_bounded_by_its_frames_before_decoding(tmp_path, build_spec):
    root = tmp_path / "raw"
    slices = ct_slices(tmp_path / "slices")
    (root / "cases").mkdir(parents=True)
    enhanced_ct(slices).save_as(root / "cases" / "six.dcm")
    lowest = sorted(slices, key=lambda ds: float(ds.ImagePositionPatient[2]))[:3]
    enhanced_ct(lowest).save_as(root / "cases" / "three.dcm")
    path, summary = build_spec(spec_data(root, tmp_path / "out", max_decoded_bytes=500_000))
    [bad] = summary.rejections
    assert bad.sample_id == "six"
    assert bad.reason == ("6 slices of 128x128 would take 786,432 bytes decoded, more than max_decoded_bytes "
                          "500,000; rejected before decoding")
    with h5py.File(path, "r") as f:
        assert f["train"]["ct_lengths"][()].tolist() == [3]


def test_series_largest_counts_the_frames_of_a_multiframe_file(tmp_path, build_spec):
    root = tmp_path / "raw"
    case = root / "cases" / "mixed"
    slices = ct_slices(tmp_path / "slices")
    case.mkdir(parents=True)
    enhanced_ct(slices).save_as(case / "volume.dcm")
    scout = ct_slices(case / "scout", depth=3, seed=5)  # three single-frame files of another series
    path, summary = build_spec(spec_data(root, tmp_path / "out", series="largest"))
    assert summary.rejections == ()
    with h5py.File(path, "r") as f:
        assert f["train"]["ct_lengths"][()].tolist() == [6]
        assert decode_str(f["train"]["ct_series"][()]) != [scout[0].SeriesInstanceUID]


def test_an_enhanced_mr_file_is_padded_as_mr(tmp_path, build_spec):
    root = tmp_path / "raw"
    hu = write_series(tmp_path / "slices", source="MR_small.dcm", depth=4, spacing=1.5)
    slices = [pydicom.dcmread(p) for p in sorted((tmp_path / "slices").iterdir())]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mr = hd.legacy.LegacyConvertedEnhancedMRImage(
            slices, series_instance_uid=hd.UID(), series_number=3, sop_instance_uid=hd.UID(), instance_number=1
        )
    (root / "cases").mkdir(parents=True)
    mr.save_as(root / "cases" / "mr.dcm")
    path, summary = build_spec(spec_data(root, tmp_path / "out"))
    assert summary.rejections == ()
    with h5py.File(path, "r") as f:
        g = f["train"]
        values = g["ct"][()]
        assert values.shape == (4, *SIZE) and (values[:, :32] == 0).all()  # 64 x 64 in 128 x 128, MR: 0
        assert np.array_equal(values[:, 32:96, 32:96], np.broadcast_to(hu, (4, 64, 64)))
        assert decode_str(g["ct_modality"][()]) == ["MR"] and g["ct_spacing"][0][0] == pytest.approx(1.5)

"""NIfTI-2 files and 4-D NIfTI files, from nibabel's bundled test data (``example_nifti2.nii.gz``,
``example4d.nii.gz``, ``functional.nii``) and files nibabel writes: built with ``h5forge.build``,
read back with ``H5Dataset`` equal to nibabel's values in the stored (z, [c,] y, x) order; what
the field cannot store is rejected with its shape and the option that would read it."""

from __future__ import annotations

import shutil
import struct

import h5py
import nibabel
import numpy as np
import pytest
import torch
from nibabel.testing import data_path

from h5forge._format.layout import decode_str
from h5forge.kinds import field_kinds
from h5forge.read.torch import H5Dataset
from h5forge.spec import DatasetSpec

AFFINE = np.array([[0.7, 0, 0, -40.0], [0, 0.8, 0, -20.0], [0, 0, 2.5, 10.0], [0, 0, 0, 1]])


def lps_origin(affine, xyz_shape, size) -> np.ndarray:
    """Where the first stored voxel of a (x, y, z) NIfTI volume centred in ``size`` (rows, columns)
    lies, in LPS: the affine's RAS point of voxel (-left pad, -top pad, 0) with x and y negated."""
    top, left = (size[0] - xyz_shape[1]) // 2, (size[1] - xyz_shape[0]) // 2
    return np.diag([-1, -1, 1]) @ (np.asarray(affine)[:3] @ [-left, -top, 0, 1])


def spec_data(root, out, files="cases/*", size=(32, 32), **volume) -> dict:
    return {"name": "nifti", "source": {"root": str(root)}, "output": {"dir": str(out)},
            "splits": {"ratios": {"train": 1.0}}, "compute": {"batch_size": 2},
            "fields": {"ct": {"kind": "volume", "files": files, "size": list(size), **volume}}}


def stored_case(g, field, row):
    lengths = g[f"{field}_lengths"][()]
    start = int(lengths[:row].sum())
    return g[field][start:start + int(lengths[row])]


def as_stored(img) -> np.ndarray:
    """nibabel's values in the stored order: (x, y, z) -> (z, y, x), (x, y, z, c) -> (z, c, y, x)."""
    data = img.get_fdata()
    return np.transpose(data, (2, 1, 0) if data.ndim == 3 else (2, 3, 1, 0))


def test_nifti2_files_are_read_like_nifti1(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    rng = np.random.default_rng(5)
    vol = rng.integers(-1000, 1500, size=(30, 20, 6)).astype(np.int16)  # (x, y, z)
    nibabel.Nifti2Image(vol, AFFINE).to_filename(root / "cases" / "two_gz.nii.gz")
    nibabel.Nifti2Image(vol, AFFINE).to_filename(root / "cases" / "two_plain.nii")
    nibabel.Nifti1Image(vol, AFFINE).to_filename(root / "cases" / "one.nii.gz")
    assert nibabel.load(root / "cases" / "two_plain.nii").header["sizeof_hdr"] == 540
    path, summary = build_spec(spec_data(root, tmp_path / "out", files=["cases/*.nii.gz", "cases/*.nii"]))
    assert summary.rejections == ()
    expected = np.transpose(vol, (2, 1, 0))  # 20 rows x 30 columns, padded to 32 x 32
    ds = H5Dataset(path, fields=("ct",))
    assert sorted(ds.ids()) == ["one", "two_gz", "two_plain"]
    for i, sid in enumerate(ds.ids()):
        case = ds[i]
        assert case.shape == (6, 32, 32) and case.dtype == torch.int16, sid
        assert np.array_equal(case.numpy()[:, 6:26, 1:31], expected), sid
    with h5py.File(path, "r") as f:
        g = f["train"]
        for row in range(3):
            assert np.allclose(g["ct_spacing"][row], [2.5, 0.8, 0.7])
            # in LPS, of the first voxel stored: 6 rows and 1 column of padding before the file's first
            assert np.allclose(g["ct_origin"][row], [40.0 + 0.7, 20.0 + 6 * 0.8, 10.0])
            assert np.allclose(g["ct_origin"][row], lps_origin(AFFINE, vol.shape, (32, 32)))
            assert np.allclose(g["ct_orientation"][row], [-1, 0, 0, 0, -1, 0])
            assert np.allclose(g["ct_direction"][row], [[0, 0, 1], [0, -1, 0], [-1, 0, 0]])


def test_a_4d_nifti_with_fourth_axis_channels_is_stored_as_channels_of_each_slice(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    shutil.copy(data_path / "example4d.nii.gz", root / "cases" / "one.nii.gz")  # NIfTI-1, 128x96x24x2
    shutil.copy(data_path / "example_nifti2.nii.gz", root / "cases" / "two.nii.gz")  # NIfTI-2, 32x20x12x2
    shutil.copy(data_path / "functional.nii", root / "cases" / "twenty.nii")  # 17x21x3x20: 20 on the 4th axis
    rng = np.random.default_rng(6)
    flat = rng.integers(0, 400, size=(40, 50, 5)).astype(np.int16)  # a 3-D file: one channel, not two
    nibabel.Nifti1Image(flat, AFFINE).to_filename(root / "cases" / "flat.nii.gz")
    data = spec_data(root, tmp_path / "out", files=["cases/*.nii.gz", "cases/*.nii"], size=(96, 128),
                     fourth_axis="channels", channels=2)
    path, summary = build_spec(data)
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert reasons == {
        "twenty": "the fourth axis holds 20 channels (17x21x3x20); the field's channels is 2",
        "flat": "a 3-D NIfTI file (40x50x5) has one channel; the field's channels is 2",
    }
    one = as_stored(nibabel.load(data_path / "example4d.nii.gz"))  # (24, 2, 96, 128)
    two = as_stored(nibabel.load(data_path / "example_nifti2.nii.gz"))  # (12, 2, 20, 32)
    assert one.shape == (24, 2, 96, 128) and two.shape == (12, 2, 20, 32)
    ds = H5Dataset(path, fields=("ct",))
    cases = {sid: ds[i].numpy() for i, sid in enumerate(ds.ids())}
    assert cases["one"].shape == (24, 2, 96, 128) and np.array_equal(cases["one"], one)
    assert cases["two"].shape == (12, 2, 96, 128)
    assert np.array_equal(cases["two"][:, :, 38:58, 48:80], two)
    for c, lowest in enumerate((49, 46)):  # signed data: each channel padded with its own lowest value
        assert two[:, c].min() == lowest and (cases["two"][:, c, :38] == lowest).all()
    [(values, depths)] = list(ds.loader(batch_size=2))  # padded to the deeper case, channels kept
    assert values.shape == (2, 24, 2, 96, 128) and sorted(depths.tolist()) == [12, 24]
    slices = H5Dataset(path, fields=("ct",), unit="slice")
    assert len(slices) == 36 and slices[0].shape == (2, 96, 128)
    start = {"one": 0, "two": 24} if list(ds.ids()) == ["one", "two"] else {"two": 0, "one": 12}
    assert np.array_equal(slices[start["one"] + 7].numpy(), one[7])
    assert np.array_equal(slices[start["two"] + 5].numpy()[:, 38:58, 48:80], two[5])
    stack = H5Dataset(path, fields=("ct",), unit="slice", context=1)[start["one"] + 7]  # 2.5-D: neighbours first
    assert stack.shape == (3, 2, 96, 128) and np.array_equal(stack.numpy(), one[6:9])
    kind = field_kinds(DatasetSpec.model_validate(data))["ct"]
    assert np.array_equal(kind.preview(cases["one"]), kind.preview(cases["one"][:, 0]))  # the first channel's
    with h5py.File(path, "r") as f:
        g = f["train"]
        ids = decode_str(g["ids"][()])
        assert g["ct"].shape == (36, 2, 96, 128) and g["ct"].chunks == (1, 2, 96, 128)
        for sid, img in (("one", "example4d.nii.gz"), ("two", "example_nifti2.nii.gz")):
            zooms = nibabel.load(data_path / img).header.get_zooms()
            assert np.allclose(g["ct_spacing"][ids.index(sid)], [zooms[2], zooms[1], zooms[0]])
            image = nibabel.load(data_path / img)
            assert np.allclose(g["ct_origin"][ids.index(sid)], lps_origin(image.affine, image.shape, (96, 128)))


def test_4d_files_without_the_option_and_5d_files_are_rejected_and_a_trailing_axis_of_one_is_3d(
    tmp_path, build_spec
):
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    shutil.copy(data_path / "example4d.nii.gz", root / "cases" / "four.nii.gz")
    shutil.copy(data_path / "example_nifti2.nii.gz", root / "cases" / "four2.nii.gz")
    rng = np.random.default_rng(7)
    nibabel.Nifti1Image(rng.integers(0, 9, size=(8, 8, 4, 2, 3)).astype(np.int16), AFFINE).to_filename(
        root / "cases" / "five.nii.gz")
    single = rng.integers(-50, 50, size=(30, 20, 5, 1)).astype(np.int16)  # (x, y, z, t=1)
    nibabel.Nifti2Image(single, AFFINE).to_filename(root / "cases" / "single.nii.gz")
    path, summary = build_spec(spec_data(root, tmp_path / "out", files="cases/*.nii.gz"))
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert reasons == {
        "four": "a 4-D NIfTI file (128x96x24x2): set the field's fourth_axis: channels and channels: 2 "
                "to store its fourth axis as the channels of each slice, or fourth_axis: time to make each time "
                "point a sample",
        "four2": "a 4-D NIfTI file (32x20x12x2): set the field's fourth_axis: channels and channels: 2 "
                 "to store its fourth axis as the channels of each slice, or fourth_axis: time to make each time "
                 "point a sample",
        "five": "a 5-D NIfTI file (8x8x4x2x3) is not read: a volume is 3-D, or 4-D with fourth_axis: channels "
                "or time",
    }
    ds = H5Dataset(path, fields=("ct",))
    assert list(ds.ids()) == ["single"]
    assert np.array_equal(ds[0].numpy()[:, 6:26, 1:31], np.transpose(single[..., 0], (2, 1, 0)))


def test_label_volumes_are_3d_also_beside_a_volume_with_channels(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    (root / "masks").mkdir()
    rng = np.random.default_rng(8)
    truth = {}
    for sid in ("a", "b"):
        vol = rng.integers(0, 1000, size=(30, 20, 5, 3)).astype(np.int16)  # (x, y, z, contrast)
        nibabel.Nifti2Image(vol, AFFINE).to_filename(root / "cases" / f"{sid}.nii.gz")
        labels = (vol[..., 0] > 700).astype(np.uint8)
        truth[sid] = (np.transpose(vol, (2, 3, 1, 0)), np.transpose(labels, (2, 1, 0)))
        written = labels if sid == "a" else np.stack([labels, labels], axis=3)  # b: a 4-D label file
        nibabel.Nifti1Image(written, AFFINE).to_filename(root / "masks" / f"{sid}.nii.gz")
    data = spec_data(root, tmp_path / "out", files="cases/*.nii.gz", fourth_axis="channels", channels=3)
    data["fields"]["ct_mask"] = {"kind": "volume_mask", "files": "masks/*.nii.gz", "like": "ct"}
    path, summary = build_spec(data)
    [bad] = summary.rejections
    assert bad.sample_id == "b"
    assert bad.reason == "a label volume must be 3-D (one label per voxel); this one is 4-D (30x20x5x2)"
    ds = H5Dataset(path, fields=("ct", "ct_mask"))
    assert list(ds.ids()) == ["a"]
    ct, mask = ds[0]
    vol, labels = truth["a"]
    assert ct.shape == (5, 3, 32, 32) and mask.shape == (5, 32, 32)
    assert np.array_equal(ct.numpy()[:, :, 6:26, 1:31], vol)
    assert np.array_equal(mask.numpy()[:, 6:26, 1:31], labels)


def test_fourth_axis_and_channels_come_together(tmp_path):
    with pytest.raises(ValueError, match="fourth_axis: channels needs channels: <how many the fourth axis holds>"):
        DatasetSpec.model_validate(spec_data(tmp_path, tmp_path / "out", fourth_axis="channels"))
    with pytest.raises(ValueError, match="channels is the length of a 4-D file's fourth axis: set fourth_axis"):
        DatasetSpec.model_validate(spec_data(tmp_path, tmp_path / "out", channels=2))
    with pytest.raises(ValueError, match="channels is the length of a 4-D file's fourth axis: set fourth_axis"):
        DatasetSpec.model_validate(spec_data(tmp_path, tmp_path / "out", fourth_axis="time", channels=2))


def test_a_4d_case_appended_from_the_inbox_reads_back_and_verifies(tmp_path, build_spec):
    import h5forge
    from h5forge._pipeline.verify import verify
    from tests.helpers.data import age_files

    root, inbox = tmp_path / "raw", tmp_path / "inbox"
    (root / "cases").mkdir(parents=True)
    (inbox / "cases").mkdir(parents=True)
    shutil.copy(data_path / "example_nifti2.nii.gz", root / "cases" / "first.nii.gz")
    rng = np.random.default_rng(9)
    late = rng.integers(-300, 300, size=(30, 20, 4, 2)).astype(np.int16)
    nibabel.Nifti2Image(late, AFFINE).to_filename(inbox / "cases" / "late.nii.gz")
    age_files(inbox)
    data = spec_data(root, tmp_path / "out", files="cases/*.nii.gz", fourth_axis="channels", channels=2)
    data["source"]["inbox"] = str(inbox)
    build_spec(data)
    result = h5forge.append(DatasetSpec.model_validate(data))
    assert result.version == 2 and result.added == 1, result
    assert verify(tmp_path / "out").ok
    ds = H5Dataset(result.path, fields=("ct",))
    cases = {sid: ds[i].numpy() for i, sid in enumerate(ds.ids())}
    assert np.array_equal(cases["late"][:, :, 6:26, 1:31], np.transpose(late, (2, 3, 1, 0)))
    assert np.array_equal(cases["first"][:, :, 6:26], as_stored(nibabel.load(data_path / "example_nifti2.nii.gz")))


def test_a_file_that_is_no_nifti_header_is_rejected_with_its_header_size(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    nibabel.Nifti2Image(np.ones((8, 8, 3), np.int16), AFFINE).to_filename(root / "cases" / "good.nii")
    (root / "cases" / "notes.nii").write_text("not a volume, a text file named like one\n")
    (root / "cases" / "stub.nii").write_bytes(b"\x1c\x02")
    path, summary = build_spec(spec_data(root, tmp_path / "out", files="cases/*.nii", size=(8, 8)))
    assert {r.sample_id: r.reason for r in summary.rejections} == {
        "notes": f"not a NIfTI file: its header's first field (sizeof_hdr) is {struct.unpack('<i', b'not ')[0]}, "
                 "not 348 (NIfTI-1) or 540 (NIfTI-2)",
        "stub": "not a NIfTI file: 2 bytes, shorter than a header",
    }
    assert list(H5Dataset(path, fields=("ct",)).ids()) == ["good"]


# ---- fourth_axis: time: one sample per time point, every time point of a case in the case's split

def time_spec(root, out, files=("cases/*.nii.gz", "cases/*.nii"), size=(96, 128), **more) -> dict:
    data = spec_data(root, out, files=list(files), size=size, fourth_axis="time", dtype="float32", **more)
    data["splits"] = {"ratios": {"train": 0.4, "val": 0.3, "test": 0.3}}
    return data


def placed(volume: np.ndarray, size=(96, 128)) -> tuple[slice, slice]:
    """Where a (D, H, W) volume smaller than ``size`` sits after the even pad (odd pixel bottom/right)."""
    top, left = (size[0] - volume.shape[1]) // 2, (size[1] - volume.shape[2]) // 2
    return slice(top, top + volume.shape[1]), slice(left, left + volume.shape[2])


def by_id(path, field="ct") -> dict[str, tuple[str, np.ndarray]]:
    """{id: (split, stored value)} of every sample of a version."""
    out = {}
    with h5py.File(path, "r") as f:
        for split in ("train", "val", "test"):
            g = f[split]
            for row, sid in enumerate(decode_str(g["ids"][()])):
                out[sid] = (split, stored_case(g, field, row))
    return out


def test_fourth_axis_time_makes_each_time_point_a_sample_with_nibabels_values(tmp_path, build_spec):
    import h5forge
    from h5forge._store.verify import verify_file

    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    shutil.copy(data_path / "example4d.nii.gz", root / "cases" / "one.nii.gz")  # NIfTI-1, 128x96x24x2
    shutil.copy(data_path / "functional.nii", root / "cases" / "twenty.nii")  # 17x21x3x20, scaled int16
    rng = np.random.default_rng(10)
    written = rng.integers(-500, 500, size=(30, 20, 4, 3)).astype(np.int16)  # (x, y, z, t), NIfTI-2 gzipped
    nibabel.Nifti2Image(written, AFFINE).to_filename(root / "cases" / "three.nii.gz")
    flat = rng.integers(0, 99, size=(30, 20, 4)).astype(np.int16)  # a 3-D file: one time point
    nibabel.Nifti1Image(flat, AFFINE).to_filename(root / "cases" / "flat.nii.gz")
    path, summary = build_spec(time_spec(root, tmp_path / "out"))
    assert summary.rejections == ()
    stored = by_id(path)
    expected = {
        **{f"one@t{t:04d}": nibabel.load(data_path / "example4d.nii.gz").get_fdata()[..., t] for t in range(2)},
        **{f"twenty@t{t:04d}": nibabel.load(data_path / "functional.nii").get_fdata()[..., t] for t in range(20)},
        **{f"three@t{t:04d}": written[..., t] for t in range(3)},
        "flat@t0000": flat,
    }
    assert sorted(stored) == sorted(expected)
    for sid, xyz in expected.items():
        want = np.transpose(xyz, (2, 1, 0)).astype(np.float32)  # (x, y, z) -> (z, y, x), as a 3-D file
        rows, columns = placed(want)
        split, value = stored[sid]
        assert value.shape == (len(want), 96, 128) and value.dtype == np.float32, sid
        assert np.array_equal(value[:, rows, columns], want), sid
    for case in ("one", "twenty", "three"):  # every time point of a case is in the case's split
        assert len({split for sid, (split, _) in stored.items() if sid.startswith(case + "@")}) == 1, case
    with h5py.File(path, "r") as f:
        g = f[stored["three@t0002"][0]]
        row = decode_str(g["ids"][()]).index("three@t0002")
        assert np.allclose(g["ct_spacing"][row], [2.5, 0.8, 0.7])
        assert np.allclose(g["ct_origin"][row], lps_origin(AFFINE, written.shape, (96, 128)))
        assert decode_str(g["source_files"][row]) == ["cases/three.nii.gz"]
    report = verify_file(path, resample=26)  # every time point cleaned again from its file and compared
    assert report.ok, report.errors
    assert report.checks["sources"] == "ok (26 samples re-derived from their sources and compared, 0 sources " \
                                       "changed or gone)"
    again = h5forge.build(DatasetSpec.model_validate({"max_rejected": 1.0, **time_spec(root, tmp_path / "out")}))
    assert again.unchanged and again.version == 1


def test_the_time_points_of_a_case_share_its_split_and_a_changed_file_replaces_them_all(tmp_path, build_spec):
    import h5forge
    from h5forge.errors import SamplesRemoved
    from h5forge._ingest.splits import ratio_split

    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    rng = np.random.default_rng(11)
    for i in range(12):
        vol = rng.integers(0, 300, size=(8, 6, 2, 4)).astype(np.int16)
        nibabel.Nifti1Image(vol, AFFINE).to_filename(root / "cases" / f"case{i:02d}.nii")
    data = time_spec(root, tmp_path / "out", files=("cases/*.nii",), size=(6, 8))
    path, summary = build_spec(data)
    stored = by_id(path)
    assert len(stored) == 48 and summary.rejections == ()
    splits = DatasetSpec.model_validate(data).splits
    for i in range(12):
        case = f"case{i:02d}"
        got = {stored[f"{case}@t{t:04d}"][0] for t in range(4)}
        assert got == {ratio_split(case, splits)}, case  # the case's id decides, not the time point's
    # by their own ids, the time points of some case would have gone to different splits
    assert any(len({ratio_split(f"case{i:02d}@t{t:04d}", splits) for t in range(4)}) > 1 for i in range(12))
    assert len({split for split, _ in stored.values()}) == 3

    shorter = rng.integers(300, 600, size=(8, 6, 2, 3)).astype(np.int16)  # case03 now holds 3 other time points
    nibabel.Nifti1Image(shorter, AFFINE).to_filename(root / "cases" / "case03.nii")
    with pytest.raises(SamplesRemoved, match="1 sample.* would leave latest: case03@t0003; nothing published"):
        h5forge.build(DatasetSpec.model_validate({"max_rejected": 1.0, **data}))
    data["output"]["allow_removals"] = True
    result = h5forge.build(DatasetSpec.model_validate({"max_rejected": 1.0, **data}))
    assert result.version == 2 and not result.unchanged
    after = by_id(result.path)
    assert sorted(sid for sid in after if sid.startswith("case03")) == ["case03@t0000", "case03@t0001", "case03@t0002"]
    for t in range(3):
        assert np.array_equal(after[f"case03@t{t:04d}"][1], np.transpose(shorter[..., t], (2, 1, 0)))
    assert all(np.array_equal(after[sid][1], stored[sid][1]) for sid in stored if not sid.startswith("case03"))


def test_4d_time_points_appended_from_the_inbox_are_taken_once_and_verify(tmp_path, build_spec):
    import h5forge
    from h5forge._pipeline.verify import verify
    from tests.helpers.data import age_files

    root, inbox = tmp_path / "raw", tmp_path / "inbox"
    (root / "cases").mkdir(parents=True)
    (inbox / "cases").mkdir(parents=True)
    shutil.copy(data_path / "example4d.nii.gz", root / "cases" / "first.nii.gz")
    shutil.copy(data_path / "functional.nii", inbox / "cases" / "late.nii")
    age_files(inbox)
    data = time_spec(root, tmp_path / "out")
    data["source"]["inbox"] = str(inbox)
    build_spec(data)
    spec = DatasetSpec.model_validate(data)
    result = h5forge.append(spec)
    assert result.version == 2 and result.added == 20, result
    assert verify(tmp_path / "out").ok
    assert (inbox / "processed" / "v0002" / "cases" / "late.nii").is_file()
    stored = by_id(result.path)
    assert sorted(stored) == ["first@t0000", "first@t0001", *(f"late@t{t:04d}" for t in range(20))]
    assert len({stored[f"late@t{t:04d}"][0] for t in range(20)}) == 1
    functional = nibabel.load(data_path / "functional.nii").get_fdata()
    want = np.transpose(functional[..., 13], (2, 1, 0)).astype(np.float32)
    assert np.array_equal(stored["late@t0013"][1][(slice(None), *placed(want))], want)

    shutil.copy(data_path / "functional.nii", inbox / "cases" / "late.nii")  # the same file dropped once more
    age_files(inbox)
    second = h5forge.append(spec)
    assert second.added == 0
    reasons = {r.sample_id: r.reason for r in second.rejections}
    assert len(reasons) == 20  # each time point is the duplicate of the same time point, not of the first
    assert reasons["late@t0013"].startswith("duplicate: identical content is already in the dataset as 'late@t0013'")
    assert (inbox / "quarantine" / "cases" / "late.nii").is_file()
    assert sorted(by_id(h5forge.build(spec).path)) == sorted(stored)  # a rebuild from processed/: the same samples
    assert h5forge.build(spec).unchanged


def test_a_3d_label_volume_labels_every_time_point_and_a_4d_one_is_rejected(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    (root / "masks").mkdir()
    rng = np.random.default_rng(12)
    series = {sid: rng.integers(0, 1000, size=(30, 20, 5, 3)).astype(np.int16) for sid in ("a", "b")}
    labels = (series["a"][..., 0] > 700).astype(np.uint8)  # (x, y, z): one label volume for every time point
    for sid, vol in series.items():
        nibabel.Nifti2Image(vol, AFFINE).to_filename(root / "cases" / f"{sid}.nii.gz")
    nibabel.Nifti1Image(labels, AFFINE).to_filename(root / "masks" / "a.nii.gz")
    nibabel.Nifti1Image(np.stack([labels] * 3, axis=3), AFFINE).to_filename(root / "masks" / "b.nii.gz")
    data = time_spec(root, tmp_path / "out", files=("cases/*.nii.gz",), size=(32, 32))
    data["fields"]["ct_mask"] = {"kind": "volume_mask", "files": "masks/*.nii.gz", "like": "ct"}
    path, summary = build_spec(data)
    assert {r.sample_id: r.reason for r in summary.rejections} == {
        f"b@t{t:04d}": "a label volume must be 3-D (one label per voxel); this one is 4-D (30x20x5x3)" for t in range(3)
    }
    ct, mask = by_id(path), by_id(path, "ct_mask")
    assert sorted(ct) == ["a@t0000", "a@t0001", "a@t0002"]
    for t in range(3):
        assert np.array_equal(ct[f"a@t{t:04d}"][1][:, 6:26, 1:31], np.transpose(series["a"][..., t], (2, 1, 0)))
        assert np.array_equal(mask[f"a@t{t:04d}"][1][:, 6:26, 1:31], np.transpose(labels, (2, 1, 0)))


def test_files_time_points_cannot_be_counted_of_are_rejected_at_discovery(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    rng = np.random.default_rng(13)
    nibabel.Nifti1Image(rng.integers(0, 9, size=(8, 6, 2, 2)).astype(np.int16), AFFINE).to_filename(
        root / "cases" / "good.nii")
    nibabel.Nifti1Image(rng.integers(0, 9, size=(8, 6, 2, 2, 3)).astype(np.int16), AFFINE).to_filename(
        root / "cases" / "five.nii")
    (root / "cases" / "stub.nii").write_bytes(b"\x5c\x01\x00\x00" + b"\0" * 96)  # sizeof_hdr 348, then nothing
    whole = (root / "cases" / "good.nii").read_bytes()
    (root / "cases" / "cut.nii").write_bytes(whole[: len(whole) - 100])  # the last time point is cut short
    path, summary = build_spec(time_spec(root, tmp_path / "out", files=("cases/*.nii",), size=(6, 8)))
    assert {(r.sample_id, r.stage): r.reason for r in summary.rejections} == {
        ("five", "discover"): "a 5-D NIfTI file (8x6x2x2x3) is not read: a volume is 3-D, or 4-D with "
                              "fourth_axis: channels or time",
        ("stub", "discover"): "not a NIfTI file: 100 bytes, shorter than a header",
        ("cut@t0001", "clean"): "the header declares 2 time points of 192 bytes; the file ends before time point 1 does",
    }
    assert sorted(by_id(path)) == ["cut@t0000", "good@t0000", "good@t0001"]


def test_a_4d_file_whose_header_is_still_being_written_waits_in_the_inbox(tmp_path, build_spec):
    import h5forge
    from tests.helpers.data import age_files

    root, inbox = tmp_path / "raw", tmp_path / "inbox"
    (root / "cases").mkdir(parents=True)
    (inbox / "cases").mkdir(parents=True)
    shutil.copy(data_path / "example4d.nii.gz", root / "cases" / "first.nii.gz")
    data = time_spec(root, tmp_path / "out")
    data["source"]["inbox"] = str(inbox)
    build_spec(data)
    spec = DatasetSpec.model_validate(data)
    whole = (data_path / "functional.nii").read_bytes()
    (inbox / "cases" / "late.nii").write_bytes(whole[:200])  # the copy has just begun: no whole header yet
    waiting = h5forge.append(spec)
    assert (waiting.version, waiting.added, waiting.waiting, waiting.rejections) == (None, 0, 1, ())
    assert (inbox / "cases" / "late.nii").is_file() and not (inbox / "quarantine").exists()
    (inbox / "cases" / "late.nii").write_bytes(whole)
    age_files(inbox)
    result = h5forge.append(spec)
    assert result.version == 2 and result.added == 20


def test_two_time_fields_of_a_case_must_hold_as_many_time_points(tmp_path, build_spec):
    root = tmp_path / "raw"
    for folder in ("bold", "asl"):
        (root / folder).mkdir(parents=True)
    rng = np.random.default_rng(14)
    series = {(folder, sid, n): rng.integers(0, 99, size=(8, 6, 2, n)).astype(np.int16)
              for folder, sid, n in (("bold", "a", 3), ("asl", "a", 3), ("bold", "b", 3), ("asl", "b", 2))}
    for (folder, sid, _), vol in series.items():
        nibabel.Nifti1Image(vol, AFFINE).to_filename(root / folder / f"{sid}.nii")
    data = time_spec(root, tmp_path / "out", files=("bold/*.nii",), size=(6, 8))
    data["fields"]["asl"] = {**data["fields"]["ct"], "files": "asl/*.nii"}
    path, summary = build_spec(data)
    assert {r.sample_id: r.reason for r in summary.rejections} == {"b": "2 samples in asl/b.nii (asl) but 3 in "
                                                                         "bold/b.nii (ct)"}
    ct, asl = by_id(path), by_id(path, "asl")
    assert sorted(ct) == sorted(asl) == ["a@t0000", "a@t0001", "a@t0002"]
    for t in range(3):  # time point t of each field's file
        assert np.array_equal(ct[f"a@t{t:04d}"][1], np.transpose(series["bold", "a", 3][..., t], (2, 1, 0)))
        assert np.array_equal(asl[f"a@t{t:04d}"][1], np.transpose(series["asl", "a", 3][..., t], (2, 1, 0)))


def test_the_annotation_record_of_an_appended_4d_case_goes_to_every_time_point_and_moves_once(tmp_path, build_spec):
    import json

    import h5forge
    from tests.helpers.data import age_files

    root, inbox = tmp_path / "raw", tmp_path / "inbox"
    (root / "cases").mkdir(parents=True)
    (inbox / "cases").mkdir(parents=True)
    shutil.copy(data_path / "example4d.nii.gz", root / "cases" / "first.nii.gz")
    (root / "records.json").write_text(json.dumps([{"id": "first", "site": "A"}]))
    shutil.copy(data_path / "functional.nii", inbox / "cases" / "late.nii")
    (inbox / "records.json").write_text(json.dumps([{"id": "late", "site": "B"}, {"id": "later", "site": "C"}]))
    age_files(inbox)
    data = time_spec(root, tmp_path / "out")
    data["source"]["inbox"] = str(inbox)
    data["annotations"] = {"file": "records.json", "columns": {"site": "str"}}
    build_spec(data)
    result = h5forge.append(DatasetSpec.model_validate(data))
    assert result.added == 20
    sites = {}
    with h5py.File(result.path, "r") as f:
        for split in ("train", "val", "test"):
            sites.update(zip(decode_str(f[split]["ids"][()]), decode_str(f[split]["meta/site"][()])))
    assert sites == {"first@t0000": "A", "first@t0001": "A", **{f"late@t{t:04d}": "B" for t in range(20)}}
    assert json.loads((inbox / "processed" / "v0002" / "records.json").read_text()) == [{"id": "late", "site": "B"}]
    assert json.loads((inbox / "records.json").read_text()) == [{"id": "later", "site": "C"}]  # still waits


def test_a_4d_file_with_a_rejected_time_point_moves_to_processed_with_the_ones_taken(tmp_path, build_spec):
    import h5forge
    from tests.helpers.data import age_files

    root, inbox = tmp_path / "raw", tmp_path / "inbox"
    (root / "cases").mkdir(parents=True)
    (inbox / "cases").mkdir(parents=True)
    shutil.copy(data_path / "example4d.nii.gz", root / "cases" / "first.nii.gz")
    rng = np.random.default_rng(15)
    vol = rng.integers(0, 99, size=(8, 6, 2, 3)).astype(np.float32)
    vol[3, 2, 1, 0] = np.nan  # time point 0 holds a NaN, which int16 cannot store
    nibabel.Nifti1Image(vol, AFFINE).to_filename(inbox / "cases" / "late.nii")
    age_files(inbox)
    data = time_spec(root, tmp_path / "out")
    data["source"]["inbox"] = str(inbox)
    data["fields"]["ct"]["dtype"] = "int16"
    build_spec(data)
    result = h5forge.append(DatasetSpec.model_validate(data))
    assert result.added == 2
    assert {r.sample_id: r.reason for r in result.rejections} == {
        "late@t0000": "1 NaN/inf voxel(s), which int16 cannot hold; set dtype: float32"}
    assert (inbox / "processed" / "v0002" / "cases" / "late.nii").is_file()
    assert not (inbox / "quarantine").exists()
    rebuilt = h5forge.build(DatasetSpec.model_validate(data))  # from processed/: the time points taken
    assert sorted(by_id(rebuilt.path)) == ["first@t0000", "first@t0001", "late@t0001", "late@t0002"]


def test_a_label_volume_off_its_volumes_voxel_grid_is_refused_not_stored_mirrored(tmp_path, build_spec):
    """nibabel's anatomical.nii (LAS: x runs to the right) with label files of one same labelling:
    written on the image's grid, turned to RAS+ by ``as_closest_canonical`` (the voxels of each slice
    mirrored left-right, same shape), and shifted 10 mm. The canonical one used to be stored as it
    is, each slice mirrored against its volume; now it and the shifted one are refused with the
    difference, and the one on the grid is stored equal to nibabel's labels on the image's grid."""
    from nibabel.processing import resample_from_to

    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    (root / "masks").mkdir()
    image = nibabel.load(data_path / "anatomical.nii")
    data = np.asarray(image.dataobj)
    labels = (data > np.percentile(data, 90)).astype(np.uint8)
    labels[:5] = 0  # no label in the 5 right-most columns: a mirrored file differs
    on_grid = nibabel.Nifti1Image(labels, image.affine)
    shifted = image.affine.copy()
    shifted[2, 3] += 10.0
    files = {"same": on_grid, "canonical": nibabel.as_closest_canonical(on_grid),
             "shifted": nibabel.Nifti1Image(labels, shifted)}
    assert files["canonical"].shape == labels.shape and not np.array_equal(files["canonical"].dataobj, labels)
    for sid, labelled in files.items():
        nibabel.save(image, root / "cases" / f"{sid}.nii")
        nibabel.save(labelled, root / "masks" / f"{sid}.nii.gz")
    data_spec = spec_data(root, tmp_path / "out", files="cases/*.nii", size=(41, 33))
    data_spec["fields"]["ct_mask"] = {"kind": "volume_mask", "files": "masks/*.nii.gz", "like": "ct"}
    path, summary = build_spec(data_spec)
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert set(reasons) == {"canonical", "shifted"}
    assert reasons["canonical"] == (
        "label volume is not on the voxel grid of its volume cases/canonical.nii: axes (LPS) "
        "[0, 0, 1, 0, -1, 0, -1, 0, 0], its volume's [0, 0, 1, 0, -1, 0, 1, 0, 0] (resample or reorient it onto "
        "the volume's grid)")
    assert reasons["shifted"] == (
        "label volume is not on the voxel grid of its volume cases/shifted.nii: first voxel at [-32, 40, -6] mm "
        "(LPS), its volume's at [-32, 40, -16] (resample or reorient it onto the volume's grid)")
    with h5py.File(path, "r") as f:
        g = f["train"]
        assert decode_str(g["ids"][()]) == ["same"]
        want = np.asarray(resample_from_to(files["canonical"], image, order=0).dataobj)  # back on the grid
        assert np.array_equal(want, labels)
        assert np.array_equal(stored_case(g, "ct_mask", 0), np.transpose(want, (2, 1, 0)))

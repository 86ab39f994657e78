"""Every volume's geometry in one frame (LPS), checked against SimpleITK's reading of the same files.

h5forge stores a case as (D, H, W): slices, rows, columns; SimpleITK's image axes are (x, y, z) =
(columns, rows, slices), and ``GetArrayFromImage`` gives (z, y, x), the same order as h5forge's.
So h5forge's spacing is SimpleITK's reversed, and row k of ``<field>_direction`` is SimpleITK's
direction column 2 - k.
"""

from __future__ import annotations

import copy
import json
import os

import h5py
import nibabel
import numpy as np
import pydicom
import pytest
import SimpleITK as sitk
from nibabel.testing import data_path
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid

from h5forge._format.layout import decode_str
from h5forge._format.names import SPEC


def rotation(ax: float, ay: float, az: float) -> np.ndarray:
    """A rotation by these angles (degrees) about x, then y, then z."""
    cx, cy, cz = np.cos(np.radians([ax, ay, az]))
    sx, sy, sz = np.sin(np.radians([ax, ay, az]))
    rx = np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
    ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    rz = np.array([[cz, -sz, 0], [sz, cz, 0], [0, 0, 1]])
    return rz @ ry @ rx


def write_oblique_series(folder, depth=5, step=3.0) -> None:
    """A CT series from pydicom's CT_small.dcm, tilted 20 degrees about two axes, each slice with its
    own pixels, saved in shuffled order with InstanceNumbers that are not the slice order."""
    folder.mkdir(parents=True)
    base = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    turn = rotation(20, 0, 15)
    row, column = turn[:, 0], turn[:, 1]
    normal = np.cross(row, column)
    series, rng = generate_uid(), np.random.default_rng(3)
    for k in rng.permutation(depth):
        ds = copy.deepcopy(base)
        ds.SeriesInstanceUID, ds.SOPInstanceUID = series, generate_uid()
        ds.ImageOrientationPatient = [round(float(v), 6) for v in (*row, *column)]
        ds.ImagePositionPatient = [round(float(v), 4) for v in np.array([-80.0, 30.0, 12.5]) + k * step * normal]
        ds.PixelData = rng.integers(-900, 1200, size=(int(ds.Rows), int(ds.Columns))).astype("<i2").tobytes()
        ds.InstanceNumber = int(rng.integers(1, 1000))
        ds.save_as(folder / f"{generate_uid()}.dcm", enforce_file_format=True)


def write_oblique_nifti(path) -> None:
    """A NIfTI-1 file whose qform and sform hold one rotated, non-isotropic affine."""
    affine = np.eye(4)
    affine[:3, :3] = rotation(-12, 25, 40) @ np.diag([0.9, 1.3, 2.5])
    affine[:3, 3] = [14.0, -33.0, 51.0]
    data = np.random.default_rng(4).integers(-300, 300, size=(18, 14, 6)).astype(np.int16)  # (x, y, z)
    image = nibabel.Nifti1Image(data, affine)
    image.set_qform(affine, code=1)
    image.set_sform(affine, code=1)
    image.to_filename(path)


def spec_for(root, out, files, size) -> dict:
    return {
        "name": "frames",
        "source": {"root": str(root)},
        "output": {"dir": str(out)},
        "splits": {"ratios": {"train": 1.0}},
        "compute": {"batch_size": 4},
        "fields": {"vol": {"kind": "volume", "files": files, "size": list(size), "dtype": "float32"}},
    }


def stored_cases(path) -> dict[str, dict[str, np.ndarray]]:
    with h5py.File(path, "r") as f:
        g = f["train"]
        starts = np.concatenate([[0], np.cumsum(g["vol_lengths"][()])])
        return {
            sid: {
                "values": g["vol"][starts[i] : starts[i + 1]],
                **{key: g[f"vol_{key}"][i] for key in ("spacing", "origin", "direction", "orientation")},
            }
            for i, sid in enumerate(decode_str(g["ids"][()]))
        }


def assert_same_geometry(case: dict, image: sitk.Image, first_index=(0.0, 0.0, 0.0)) -> None:
    """h5forge's origin, spacing and direction are SimpleITK's, in h5forge's (D, H, W) order.
    ``first_index``: SimpleITK's (x, y, z) index of the first voxel h5forge stores."""
    theirs = np.array(image.GetDirection()).reshape(3, 3)
    assert np.allclose(case["spacing"], image.GetSpacing()[::-1], atol=1e-5)
    assert np.allclose(case["direction"], theirs.T[::-1], atol=1e-5)
    assert np.allclose(case["orientation"], np.concatenate([theirs[:, 0], theirs[:, 1]]), atol=1e-5)
    assert np.allclose(case["origin"], image.TransformContinuousIndexToPhysicalPoint(first_index), atol=1e-3)


def test_a_dicom_series_has_simpleitks_geometry_and_voxel_order(tmp_path, build_spec):
    root = tmp_path / "raw"
    write_oblique_series(root / "cases" / "tilted")
    path, result = build_spec(spec_for(root, tmp_path / "out", "cases/*", (128, 128)))
    assert result.rejections == ()
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(root / "cases" / "tilted")))
    image = reader.Execute()
    case = stored_cases(path)["tilted"]
    assert np.array_equal(case["values"], sitk.GetArrayFromImage(image).astype(np.float32))
    assert_same_geometry(case, image)
    assert not np.allclose(np.abs(case["direction"]), np.eye(3), atol=0.1)  # oblique indeed


NIFTI_FILES = ("anatomical.nii", "reoriented_anat_moved.nii", "standard.nii.gz")


def test_nifti_files_have_simpleitks_geometry_in_lps(tmp_path, build_spec):
    """nibabel's own test files (axes flipped in one, no qform in another) and an oblique file:
    the geometry SimpleITK reads from each, in LPS, is what h5forge stores."""
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    for name in NIFTI_FILES:
        (root / "cases" / name).write_bytes((data_path / name).read_bytes())
    write_oblique_nifti(root / "cases" / "oblique.nii.gz")
    cases = {}
    for name in (*NIFTI_FILES, "oblique.nii.gz"):  # one build per file: each at its own in-plane size
        x, y = nibabel.load(root / "cases" / name).shape[:2]
        path, _ = build_spec(spec_for(root, tmp_path / name, f"cases/{name}", (y, x)))
        [(sid, case)] = stored_cases(path).items()
        image = sitk.ReadImage(str(root / "cases" / name))
        assert np.array_equal(case["values"], sitk.GetArrayFromImage(image).astype(np.float32)), name
        assert_same_geometry(case, image)
        cases[name] = case
    assert not np.allclose(np.abs(cases["oblique.nii.gz"]["direction"]), np.eye(3)[::-1], atol=0.1)
    anatomical = nibabel.load(root / "cases" / "anatomical.nii").affine  # RAS: x and y change sign in LPS
    assert np.allclose(cases["anatomical.nii"]["origin"], anatomical[:3, 3] * [-1, -1, 1])


def test_the_origin_is_that_of_the_first_voxel_stored_after_crop_and_pad(tmp_path, build_spec):
    """A case padded in rows and cropped in columns: its origin is the point of the stored voxel
    [0, 0, 0], which SimpleITK places at index (4 cropped columns, -3 padded rows, 0)."""
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    write_oblique_nifti(root / "cases" / "oblique.nii.gz")  # 14 rows x 18 columns
    path, _ = build_spec(spec_for(root, tmp_path / "out", "cases/*.nii.gz", (20, 10)))
    case = stored_cases(path)["oblique"]
    image = sitk.ReadImage(str(root / "cases" / "oblique.nii.gz"))
    assert np.array_equal(case["values"][:, 3:17, :], sitk.GetArrayFromImage(image)[:, :, 4:14].astype(np.float32))
    assert_same_geometry(case, image, first_index=(4.0, -3.0, 0.0))


def test_a_version_written_before_the_one_frame_still_reads_and_is_rebuilt_before_an_append(tmp_path, build_spec):
    """A version of an earlier h5forge (its spec has no frame, there is no direction column) is
    read; the spec read from it says its frame is 'as-read'; an append to it asks for a rebuild."""
    import h5forge
    from h5forge.errors import ReadError, VersionError
    from h5forge.read._reader import SplitReader
    from h5forge.spec import DatasetSpec, spec_from_json

    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    write_oblique_nifti(root / "cases" / "oblique.nii.gz")
    data = spec_for(root, tmp_path / "out", "cases/*.nii.gz", (14, 18))
    path, _ = build_spec(data)
    with h5py.File(path, "r+") as f:  # as an earlier h5forge wrote it
        for split in ("train", "val", "test"):
            del f[f"{split}/vol_direction"]
        stored = json.loads(f[SPEC][()].decode())
        del stored["fields"]["vol"]["frame"]
        del f[SPEC]
        f.create_dataset(SPEC, data=json.dumps(stored))
    with h5py.File(path, "r") as f:
        spec = spec_from_json(f[SPEC][()].decode())
    assert spec.fields["vol"].frame == "as-read"
    with SplitReader(str(path), "train", fields=("vol", "vol_origin", "vol_spacing")) as r:
        row = r.read_one(0)
    assert row["vol"].shape == (6, 14, 18) and row["vol_origin"].shape == (3,)
    with pytest.raises(ReadError, match="has no field or column 'vol_direction'"):
        SplitReader(str(path), "train", fields=("vol_direction",))
    inbox = tmp_path / "inbox"
    (inbox / "cases").mkdir(parents=True)
    (inbox / "cases" / "more.nii.gz").write_bytes((root / "cases" / "oblique.nii.gz").read_bytes())
    os.utime(inbox / "cases" / "more.nii.gz", (1e9, 1e9))  # settled long ago
    with pytest.raises(VersionError, match="holds no vol_direction.*rebuild it with `h5forge build`"):
        h5forge.append(DatasetSpec.model_validate(data), inbox=inbox)


def test_a_spec_cannot_ask_for_the_earlier_frame(tmp_path):
    from h5forge.spec import DatasetSpec

    data = spec_for(tmp_path, tmp_path / "out", "cases/*", (8, 8))
    data["fields"]["vol"]["frame"] = "as-read"
    with pytest.raises(ValueError, match="a build writes LPS"):
        DatasetSpec.model_validate(data)


def test_a_nifti_whose_sform_scales_disagree_with_its_voxel_sizes_is_refused(tmp_path, build_spec):
    """nibabel's anatomical.nii with its sform rescaled to 1.5 x 1.5 x 3 mm, its pixdim left at 2 mm:
    nibabel (the sform, as the NIfTI standard says) puts its last slice at z = 102 mm, SimpleITK (the
    pixdim, warning of "unexpected scales in sform") at z = 78 mm. The stored spacing used to be the
    pixdim's beside the sform's origin and directions: 24 mm off nibabel's voxels. Refused with the
    two, and an untouched copy beside it keeps SimpleITK's (and nibabel's) geometry."""
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    original = nibabel.load(data_path / "anatomical.nii")
    nibabel.save(original, root / "cases" / "kept.nii.gz")
    edited = nibabel.Nifti1Image(np.asarray(original.dataobj), None, original.header.copy())
    sform = np.diag([-1.5, 1.5, 3.0, 1.0])
    sform[:3, 3] = [10.0, -20.0, 30.0]
    edited.set_sform(sform, code=2)
    edited.set_qform(None, code=0)
    edited.header.set_zooms((2.0, 2.0, 2.0))
    nibabel.save(edited, root / "cases" / "rescaled.nii.gz")
    assert np.allclose(nibabel.load(root / "cases" / "rescaled.nii.gz").affine, sform)
    x, y = original.shape[:2]
    path, result = build_spec(spec_for(root, tmp_path / "out", "cases/*.nii.gz", (y, x)))
    assert [(r.sample_id, r.reason) for r in result.rejections] == [
        ("rescaled", "the sform's voxel sizes 1.5 x 1.5 x 3 mm (x, y, z) differ from the header's pixdim "
                     "2 x 2 x 2 mm: where its voxels lie cannot be told (nibabel reads the sform, ITK the pixdim)")]
    case = stored_cases(path)["kept"]
    image = sitk.ReadImage(str(root / "cases" / "kept.nii.gz"))
    assert np.array_equal(case["values"], sitk.GetArrayFromImage(image).astype(np.float32))
    assert_same_geometry(case, image)

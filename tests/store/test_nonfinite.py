"""NaN in stored values: a NIfTI volume with NaN voxels (nibabel's own test file
``resampled_anat_moved.nii``) and signal channels with ``nonfinite: keep`` build, verify HEALTHY
(a NaN equals a NaN with the same bits when a sample is compared with its source), and the
report counts the NaN/inf values kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import nibabel
import nibabel.testing
import numpy as np
import pyedflib
import pyedflib.data
import pytest

import h5forge
from h5forge._format import arrays
from h5forge.spec import DatasetSpec
from h5forge._store.verify import verify_file

NIFTI = Path(nibabel.testing.data_path) / "resampled_anat_moved.nii"


def test_a_nifti_volume_with_nan_voxels_builds_verifies_and_counts_them(tmp_path):
    (tmp_path / "raw" / "cases").mkdir(parents=True)
    shutil.copy(NIFTI, tmp_path / "raw" / "cases" / "anat.nii")
    truth = np.transpose(np.asanyarray(nibabel.load(NIFTI).dataobj), (2, 1, 0)).astype(np.float32)
    nan = int(np.isnan(truth).sum())
    assert nan > 0  # the file is the case: it holds NaN voxels
    spec = DatasetSpec.model_validate({
        "name": "mr", "source": {"root": str(tmp_path / "raw")}, "output": {"dir": str(tmp_path / "out")},
        "splits": {"ratios": {"train": 1.0}},
        "fields": {"mr": {"kind": "volume", "files": "cases/*.nii", "size": list(truth.shape[1:]),
                          "dtype": "float32"}}})
    result = h5forge.build(spec)
    assert result.version == 1 and result.counts["train"] == 1
    report = verify_file(result.path, resample=1)
    assert report.ok, report.errors
    assert report.checks["sources"].startswith("ok (1 samples re-derived")
    assert report.stats["nonfinite"] == {"mr": nan}
    assert report.checks["non-finite values"] == f"{nan} kept (mr: {nan})"
    with h5py.File(result.path, "r") as f:
        stored = f["train"]["mr"][()]
        assert stored.tobytes() == truth.tobytes()  # NaN where the file has NaN, bit for bit


def test_an_int16_volume_with_nan_voxels_is_rejected_with_the_reason(tmp_path):
    (tmp_path / "raw" / "cases").mkdir(parents=True)
    shutil.copy(NIFTI, tmp_path / "raw" / "cases" / "anat.nii")
    from h5forge.kinds import stored_kinds
    from h5forge._samples import Reject, SampleRef

    spec = DatasetSpec.model_validate({
        "name": "mr", "source": {"root": str(tmp_path / "raw")}, "output": {"dir": str(tmp_path / "out")},
        "splits": {"ratios": {"train": 1.0}},
        "fields": {"mr": {"kind": "volume", "files": "cases/*.nii", "size": [21, 17]}}})
    kind = stored_kinds(spec)["mr"]
    with pytest.raises(Reject) as rej:
        kind.decode(tmp_path / "raw", SampleRef("anat", "train", {"mr": "cases/anat.nii"}, {}), {})
    assert rej.value.reason == "153 NaN/inf voxel(s), which int16 cannot hold; set dtype: float32"


def test_signals_with_nonfinite_keep_build_verify_and_count_them(tmp_path):
    """pyedflib's real recording, with the gaps a dropped sensor leaves written as NaN and inf."""
    edf = pyedflib.EdfReader(str(Path(pyedflib.data.__file__).parent / "test_generator.edf"))
    rate, values = float(edf.getSampleFrequency(0)), edf.readSignal(0)
    edf.close()
    (tmp_path / "raw" / "rec").mkdir(parents=True)
    kept = {}
    for k, name in enumerate(("a", "b", "c")):
        v = values[k * 1000:(k + 2) * 1000].copy()
        v[100 * (k + 1):100 * (k + 1) + 7 * k] = np.nan
        v[-1] = np.inf if k else v[-1]
        np.save(tmp_path / "raw" / "rec" / f"{name}.npy", v.astype(np.float32))
        kept[name] = int((~np.isfinite(v)).sum())
    total = sum(kept.values())
    assert total == 7 + 14 + 2
    spec = DatasetSpec.model_validate({
        "name": "sig", "source": {"root": str(tmp_path / "raw")}, "output": {"dir": str(tmp_path / "out")},
        "splits": {"ratios": {"train": 1.0}},
        "fields": {"ch": {"kind": "signal", "files": "rec/*.npy", "rate": rate, "nonfinite": "keep"}}})
    result = h5forge.build(spec)
    assert result.version == 1 and result.counts["train"] == 3
    report = verify_file(result.path, resample=3)
    assert report.ok, report.errors
    assert report.checks["sources"].startswith("ok (3 samples re-derived")
    assert report.stats["nonfinite"] == {"ch": total}
    assert result.health["non-finite values"] == f"{total} kept (ch: {total})"
    with h5py.File(result.path, "r") as f:
        g = f["train"]
        ids = [i.decode() for i in g["ids"][()]]
        read = arrays.RowReader(g, "ch", arrays.Stored((), np.float32, True, True))
        for i, sid in enumerate(ids):
            want = np.load(tmp_path / "raw" / "rec" / f"{sid}.npy")
            assert read.row(i).tobytes() == want.tobytes()

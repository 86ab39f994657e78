"""``h5forge init`` on volumes and signals, from real files: DICOM series written by pydicom from
its bundled CT (``demo-data --kind ct``), multi-rate EDF recordings written by pyedflib
(``demo-data --kind signals``), NIfTI volumes written by nibabel, CSV recordings with a time column
and per-channel .npy folders. Each inferred spec parses, builds through the library (no Prefect),
every good case or recording lands, every broken one is rejected with its reason, and a sample
reads back through the torch reader."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import nibabel
import numpy as np
import pydicom
import pyedflib
import pytest
import torch
import yaml
from PIL import Image
from pydicom.data import get_testdata_file

import h5forge
from h5forge._demo import CT_SPACING, CT_SPHERE_HU, SIGNAL_CHANNELS, generate_ct
from h5forge._format.layout import decode_str
from h5forge._init import infer_spec
from h5forge.read.torch import H5Dataset
from h5forge.spec import load_spec, override, parse_spec

H5FORGE = str(Path(sys.executable).parent / "h5forge")
SPLITS = ("train", "val", "test")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([H5FORGE, *args], capture_output=True, text=True, timeout=600)


def init(raw: Path, tmp: Path):
    """``h5forge init`` on the command line; (its output, the spec path, the parsed spec)."""
    spec_path = tmp / "config" / f"{raw.name}.yaml"
    r = cli("init", str(raw), "--out", str(spec_path))
    assert r.returncode == 0, r.stderr
    text = spec_path.read_text()
    spec = parse_spec(yaml.safe_load(text), spec_path.parent, str(spec_path))
    for line in r.stdout.splitlines():
        if line.startswith("note: "):
            assert f"# {line}" in text
    return r.stdout, spec_path, spec


def build(spec):
    """The spec built by the pipeline: (the published version, the build result). These folders
    hold bad inputs on purpose, more than ``init``'s default share, so every input may be rejected
    here (the limit has tests of its own)."""
    result = h5forge.build(spec.model_copy(update={"max_rejected": 1.0}))
    return Path(result.path), result


def stored_ids(path: Path) -> dict[str, tuple[str, int]]:
    """sample id -> (split, row)."""
    with h5py.File(path, "r") as f:
        return {sid: (s, row) for s in SPLITS for row, sid in enumerate(decode_str(f[s]["ids"][()]))}


# ---- CT: DICOM series per case folder -----------------------------------------------------------

def test_ct_demo_inits_builds_and_reads_back(tmp_path):
    raw = tmp_path / "ct"
    r = cli("demo-data", str(raw), "--kind", "ct", "--n", "6")
    assert r.returncode == 0 and "wrote 6 ct samples and 3 defective inputs" in r.stdout, r.stderr
    assert all(p.suffix == "" for p in (raw / "case_001").iterdir()), "scanner-style files without a suffix"
    assert all(p.suffix == ".dcm" for p in (raw / "case_000").iterdir())

    stdout, spec_path, spec = init(raw, tmp_path)
    ct, mask = spec.fields["ct"], spec.fields["ct_mask"]
    assert (ct.kind, ct.files, ct.size, ct.series) == ("volume", "case_*", (128, 128), "largest")
    assert (mask.kind, mask.files, mask.like, mask.classes) == ("volume_mask", "masks/*", "ct", None)
    assert spec.compute.batch_size == 2
    assert "case_two_series: 'axial' 12 slices, 'scout' 3 slices" in stdout and "(volume layout)" in stdout

    path, summary = build(override(spec, output=tmp_path / "out" / "ct"))
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert reasons.keys() == {"case_missing_slice", "case_mask_depth"}
    gap = re.search(r"missing slice: a gap of ([\d.]+) mm .* \(spacing ([\d.]+) mm\)", reasons["case_missing_slice"])
    assert gap and float(gap[1]) == 2 * float(gap[2])
    assert "mask is 9x128x128 (DxHxW) but its volume case_mask_depth is 10x128x128" in reasons["case_mask_depth"]
    ids = stored_ids(path)
    assert set(ids) == {f"case_{i:03d}" for i in range(6)} | {"case_two_series"}

    base = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    base_hu = base.pixel_array.astype(np.float64) * float(base.RescaleSlope) + float(base.RescaleIntercept)
    with h5py.File(path, "r") as f:
        for sid, (split, row) in ids.items():
            g = f[split]
            depth = int(g["ct_lengths"][row])
            start = int(g["ct_lengths"][:row].sum())
            volume, labels = g["ct"][start:start + depth], g["ct_mask"][start:start + depth]
            files = list((raw / sid).iterdir())
            assert depth == (12 if sid == "case_two_series" else len(files)), sid  # the scout is left out
            # slices sorted by position: the +400 HU sphere sits exactly where the mask slices say
            residual = volume - base_hu - CT_SPHERE_HU * labels.astype(np.float64)
            assert np.abs(residual).max() < 80 and labels.any(), sid
            assert g["ct_spacing"][row][0] in CT_SPACING
            assert decode_str(g["ct_modality"][row:row + 1]) == ["CT"]

    # without series: largest, the folder of two series is rejected as ambiguous
    data = yaml.safe_load(spec_path.read_text())
    del data["fields"]["ct"]["series"]
    strict = override(parse_spec(data, spec_path.parent), output=tmp_path / "out" / "strict")
    _, summary = build(strict)
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert "ambiguous: 2 series in one case folder (['axial', 'scout'])" in reasons["case_two_series"]

    # LZ4 saves little on these slices: init stores them uncompressed; without the line (lz4, the
    # default) the values are the same
    text = yaml.safe_load(spec_path.read_text())
    assert text["fields"]["ct"]["codec"] == "none"
    del text["fields"]["ct"]["codec"]
    packed_path, _ = build(override(parse_spec(text, spec_path.parent), output=tmp_path / "out" / "lz4"))
    with h5py.File(path, "r") as f, h5py.File(packed_path, "r") as g:
        for split in SPLITS:
            assert f[split]["ct"].compression is None and g[split]["ct"].compression is not None
            np.testing.assert_array_equal(g[split]["ct"][()], f[split]["ct"][()])

    split, row = ids["case_000"]
    volume = H5Dataset(path, split=split, fields=("ct",))[row]
    assert volume.ndim == 3 and volume.shape[1:] == (128, 128) and volume.dtype == torch.int16
    assert volume.shape[0] == len(list((raw / "case_000").iterdir()))


def write_case(folder: Path, source: str, depth: int) -> None:
    """A series of ``depth`` slices from one of pydicom's files, a slice per position."""
    import copy

    from pydicom.uid import generate_uid

    folder.mkdir(parents=True)
    base = pydicom.dcmread(get_testdata_file(source))
    series = generate_uid()
    for k in range(depth):
        ds = copy.deepcopy(base)
        ds.SeriesInstanceUID, ds.SOPInstanceUID = series, generate_uid()
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.ImagePositionPatient = [0.0, 0.0, 3.0 * k]
        ds.save_as(folder / f"{k}.dcm", enforce_file_format=True)


@pytest.mark.parametrize("mix", [("CT_small.dcm", "MR_small.dcm"), ("MR_small.dcm", "MR_small.dcm")])
def test_dicom_volume_fields_are_named_by_the_modality_they_hold(tmp_path, mix):
    """CT and MR cases in one folder: the field is named volume, with a note; MR only: mr."""
    raw = tmp_path / "study"
    for i, source in enumerate(mix * 2):
        write_case(raw / "cases" / f"case{i}", source, 3 + i)
    out, spec_path, spec = init(raw, tmp_path)
    mixed = mix[0] != mix[1]
    assert list(spec.fields) == (["volume"] if mixed else ["mr"])
    if mixed:
        assert ("note: the sampled cases hold series of more than one modality (CT in 2, MR in 2 of 4): the field "
                "is named volume, and each case's modality is in its volume_modality column") in out
        assert "(mixed: CT/MR, 4 case folders in cases/)" in spec_path.read_text()
    path, summary = build(override(spec, output=tmp_path / "out"))
    assert summary.rejections == ()
    field = list(spec.fields)[0]
    with h5py.File(path, "r") as f:
        modality = {sid: m for s in SPLITS for sid, m in zip(decode_str(f[s]["ids"][()]),
                                                              decode_str(f[s][f"{field}_modality"][()]))}
    assert modality == {f"case{i}": source[:2] for i, source in enumerate(mix * 2)}


def test_dicom_cases_folder_with_a_stray_file_and_a_loose_entry(tmp_path):
    made = tmp_path / "made"
    generate_ct(made, n=3, seed=4, bad=False)
    raw = tmp_path / "study"
    (raw / "cases").mkdir(parents=True)
    for case in ("case_000", "case_001", "case_002"):
        shutil.move(made / case, raw / "cases" / case)
    shutil.move(made / "masks", raw / "masks")
    (raw / "cases" / "case_002" / "notes.txt").write_text("contrast given at 10:42\n")
    (raw / "cases" / "README").write_text("exported from PACS\n")
    inferred = infer_spec(raw, tmp_path / "study.yaml")
    spec = parse_spec(yaml.safe_load(inferred.text), tmp_path)
    assert spec.fields["ct"].files == "cases/*" and spec.fields["ct"].series is None
    assert spec.fields["ct_mask"].files == "masks/*"
    notes = " | ".join(inferred.notes)
    assert "(e.g. case_002/notes.txt)" in notes and "cases/README" in notes


# ---- NIfTI volumes ------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["images-labels", "top-level-png-masks"])
def test_nifti_volumes_init_and_build(tmp_path, layout):
    raw = tmp_path / "nifti"
    rng = np.random.default_rng(3)
    volumes = {}
    for i, depth in enumerate((5, 7, 6)):
        sid = f"patient_{i:02d}"
        vol = rng.integers(-1000, 1200, size=(40, 32, depth)).astype(np.int16)  # (x, y, z)
        labels = (vol > 600).astype(np.uint8) + (vol > 1000)  # classes 0, 1, 2
        if layout == "images-labels":
            for folder, data in (("images", vol), ("labels", labels)):
                (raw / folder).mkdir(parents=True, exist_ok=True)
                nibabel.save(nibabel.Nifti1Image(data, np.diag([0.7, 0.8, 2.5, 1.0])),
                             raw / folder / f"{sid}.nii.gz")
        else:
            raw.mkdir(exist_ok=True)
            nibabel.save(nibabel.Nifti1Image(vol, np.diag([0.7, 0.8, 2.5, 1.0])), raw / f"{sid}.nii.gz")
            (raw / "masks" / sid).mkdir(parents=True)
            for k, sl in enumerate(np.transpose(labels, (2, 1, 0))):
                Image.fromarray(sl).save(raw / "masks" / sid / f"{k}.png")
        volumes[sid] = (np.transpose(vol, (2, 1, 0)), np.transpose(labels, (2, 1, 0)))
    inferred = infer_spec(raw, tmp_path / "nifti.yaml")
    spec = parse_spec(yaml.safe_load(inferred.text), tmp_path)
    volume, mask = spec.fields["volume"], spec.fields["volume_mask"]
    images = "images/*.nii.gz" if layout == "images-labels" else "*.nii.gz"
    masks = "labels/*.nii.gz" if layout == "images-labels" else "masks/*"
    assert (volume.kind, volume.files, volume.size) == ("volume", images, (32, 40))  # (rows=y, columns=x)
    assert (mask.kind, mask.files, mask.like, mask.classes) == ("volume_mask", masks, "volume", 3)
    assert inferred.layout == "volume" and spec.compute.batch_size == 2

    path, summary = build(override(spec, output=tmp_path / "out"))
    assert summary.rejections == ()
    with h5py.File(path, "r") as f:
        for sid, (split, row) in stored_ids(path).items():
            g = f[split]
            start, depth = int(g["volume_lengths"][:row].sum()), int(g["volume_lengths"][row])
            assert np.array_equal(g["volume"][start:start + depth], volumes[sid][0])
            assert np.array_equal(g["volume_mask"][start:start + depth], volumes[sid][1])
            assert np.allclose(g["volume_spacing"][row], [2.5, 0.8, 0.7])


def test_4d_nifti_volumes_init_writes_fourth_axis_channels_and_builds(tmp_path):
    raw = tmp_path / "nifti4d"
    (raw / "images").mkdir(parents=True)
    rng = np.random.default_rng(4)
    volumes = {}
    for i, depth in enumerate((5, 7, 6)):  # multi-contrast MR: 3 contrasts on the fourth axis, NIfTI-2
        vol = rng.integers(0, 2000, size=(40, 32, depth, 3)).astype(np.int16)  # (x, y, z, c)
        nibabel.Nifti2Image(vol, np.diag([0.7, 0.8, 2.5, 1.0])).to_filename(raw / "images" / f"case_{i}.nii.gz")
        volumes[f"case_{i}"] = np.transpose(vol, (2, 3, 1, 0))
    odd = rng.integers(0, 2000, size=(40, 32, 4, 2)).astype(np.int16)  # two contrasts: not this field's three
    nibabel.Nifti1Image(odd, np.eye(4)).to_filename(raw / "images" / "case_odd.nii.gz")
    inferred = infer_spec(raw, tmp_path / "nifti4d.yaml")
    spec = parse_spec(yaml.safe_load(inferred.text), tmp_path)
    volume = spec.fields["volume"]
    assert (volume.files, volume.size, volume.fourth_axis, volume.channels) == (
        "images/*.nii.gz", (32, 40), "channels", 3)
    assert ("4 of 4 sampled NIfTI volumes are 4-D: their fourth axis (length 3 in 3) is kept as the channels "
            "of each slice (fourth_axis: channels); if it is time, set fourth_axis: time without channels: each "
            "time point becomes a sample (<case>@t0000, ...), all in the case's split; the other 1 sampled volume "
            "will be rejected") in inferred.notes
    assert "a sample per time point, <case>@t0000, ..., in the case's split" in inferred.text
    assert "fourth_axis: channels" in inferred.text and "# note: 4 of 4 sampled" in inferred.text

    path, summary = build(override(spec, output=tmp_path / "out"))
    assert {r.sample_id: r.reason for r in summary.rejections} == {
        "case_odd": "the fourth axis holds 2 channels (40x32x4x2); the field's channels is 3"}
    for sid, (split, row) in stored_ids(path).items():
        ds = H5Dataset(path, split=split, fields=("volume",))
        case = ds[list(ds.ids()).index(sid)]
        assert case.shape == (len(volumes[sid]), 3, 32, 40)
        assert np.array_equal(case.numpy(), volumes[sid])


def test_functional_runs_under_func_init_with_a_sample_per_time_point_and_build(tmp_path):
    raw = tmp_path / "bids"
    (raw / "func").mkdir(parents=True)
    rng = np.random.default_rng(6)
    runs = {}
    for i, points in enumerate((3, 4)):
        run = rng.integers(0, 900, size=(12, 10, 5, points)).astype(np.int16)  # (x, y, z, t)
        nibabel.Nifti1Image(run, np.diag([3.0, 3.0, 4.0, 1.0])).to_filename(
            raw / "func" / f"sub-0{i}_task-rest_bold.nii.gz")
        runs[f"sub-0{i}_task-rest_bold"] = run
    out, spec_path, spec = init(raw, tmp_path)
    volume = spec.fields["volume"]
    assert (volume.files, volume.size, volume.fourth_axis, volume.channels) == ("func/*.nii.gz", (10, 12), "time", None)
    assert "4-D functional runs: each time point becomes a sample (fourth_axis: time)" in out
    path, summary = build(override(spec, output=tmp_path / "out"))
    assert summary.rejections == ()
    ids = stored_ids(path)
    assert sorted(ids) == [f"{run}@t{t:04d}" for run, data in sorted(runs.items()) for t in range(data.shape[3])]
    for sid, (split, row) in ids.items():
        run, t = sid.split("@t")
        ds = H5Dataset(path, split=split, fields=("volume",))
        assert np.array_equal(ds[list(ds.ids()).index(sid)].numpy(), np.transpose(runs[run][..., int(t)], (2, 1, 0)))


@pytest.mark.parametrize("named", ["by-case", "alike"])
def test_one_folder_per_case_holding_a_nifti_file_inits_and_builds(tmp_path, named):
    """cases/<case>/<case>_t1.nii.gz (ids: the file names), or <case>/image.nii.gz in every folder
    (ids: their paths, <case>/image)."""
    raw = tmp_path / "study"
    top = raw / "cases" if named == "by-case" else raw
    rng = np.random.default_rng(7)
    volumes = {}
    for i, depth in enumerate((4, 6, 5)):
        case = f"case{i:02d}"
        (top / case).mkdir(parents=True)
        vol = rng.integers(-500, 500, size=(16, 12, depth)).astype(np.int16)
        name = f"{case}_t1" if named == "by-case" else "image"
        nibabel.Nifti1Image(vol, np.diag([0.9, 0.9, 3.0, 1.0])).to_filename(top / case / f"{name}.nii.gz")
        volumes[f"{case}_t1" if named == "by-case" else f"{case}/image"] = np.transpose(vol, (2, 1, 0))
    out, spec_path, spec = init(raw, tmp_path)
    volume = spec.fields["volume"]
    assert (volume.files, volume.size) == ("cases/*/*.nii.gz" if named == "by-case" else "*/*.nii.gz", (12, 16))
    assert spec.source.ids == ("stem" if named == "by-case" else "path")
    if named == "alike":
        assert "a sample's id is its path below the case folders, <case>/<file>" in out
    path, summary = build(override(spec, output=tmp_path / "out"))
    assert summary.rejections == ()
    ids = stored_ids(path)
    assert sorted(ids) == sorted(volumes)
    for sid, (split, row) in ids.items():
        ds = H5Dataset(path, split=split, fields=("volume",))
        assert np.array_equal(ds[list(ds.ids()).index(sid)].numpy(), volumes[sid])


# ---- signals ------------------------------------------------------------------------------------

def test_signals_demo_inits_builds_and_reads_back(tmp_path):
    raw = tmp_path / "signals"
    r = cli("demo-data", str(raw), "--kind", "signals", "--n", "8")
    assert r.returncode == 0 and "wrote 8 signals samples and 3 defective inputs" in r.stdout, r.stderr
    stdout, _, spec = init(raw, tmp_path)
    assert list(spec.fields) == ["acc", "volt", "temp"]
    for name, (label, (rate, *_)) in zip(spec.fields, SIGNAL_CHANNELS.items()):
        f = spec.fields[name]
        assert (f.kind, f.files, f.channel, f.rate) == ("signal", "*.edf", label, rate)
    assert spec.compute.batch_size is None  # unset: the build picks it (_ingest.parallel.batch_samples)
    assert "rec_truncated.edf" in stdout and "truncated?" in stdout
    assert "'ACC' is at 500 Hz in 1 of 10 sampled files (rec_bad_rate.edf)" in stdout
    assert "'TEMP' is missing in 1 of 10 sampled files (rec_no_temp.edf)" in stdout
    assert "filesize" not in stdout, "pyedflib's C library must not print on init's output"

    path, summary = build(override(spec, output=tmp_path / "out"))
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert reasons.keys() == {"rec_bad_rate", "rec_no_temp", "rec_truncated"}
    assert "recorded at 500 Hz, the spec declares 1000 Hz" in reasons["rec_bad_rate"]
    assert "channel 'TEMP' not in the recording; channels: ['ACC', 'VOLT']" in reasons["rec_no_temp"]
    assert "not a readable EDF/BDF file" in reasons["rec_truncated"]
    ids = stored_ids(path)
    assert set(ids) == {f"rec_{i:03d}" for i in range(8)}

    sid = sorted(s for s, (split, _) in ids.items() if split == "train")[0]
    split, row = ids[sid]
    acc, temp = H5Dataset(path, split=split, fields=("acc", "temp"))[row]
    edf = pyedflib.EdfReader(str(raw / f"{sid}.edf"))
    try:
        duration = int(edf.getFileDuration())  # of the recording, in seconds
        assert acc.shape == (1000 * duration,) and temp.shape == (duration,) and 2 <= duration <= 10
        assert torch.equal(acc, torch.from_numpy(edf.readSignal(0).astype(np.float32)))
        assert torch.equal(temp, torch.from_numpy(edf.readSignal(2).astype(np.float32)))
    finally:
        edf.close()


def test_csv_recordings_give_one_field_per_column_at_the_measured_rate(tmp_path):
    raw = tmp_path / "csv"
    raw.mkdir()
    for i, (rate, seconds) in enumerate(((250, 2), (250, 3), (250, 1), (125, 2))):
        t = np.arange(rate * seconds) / rate
        rows = "".join(f"{x:.6f},{np.sin(7 * x + i):.5f},{np.cos(x):.5f},ok\n" for x in t)
        (raw / f"session_{i}.csv").write_text("time,ECG lead II,resp,quality\n" + rows)
    inferred = infer_spec(raw, tmp_path / "csv.yaml")
    spec = parse_spec(yaml.safe_load(inferred.text), tmp_path)
    assert inferred.layout == "signals" and list(spec.fields) == ["ecg_lead_ii", "resp"]
    ecg = spec.fields["ecg_lead_ii"]
    assert (ecg.files, ecg.channel, ecg.rate) == ("*.csv", "ECG lead II", 250)
    notes = " | ".join(inferred.notes)
    assert "is at 125 Hz in 1 of 4 sampled files (session_3.csv), not 250 Hz" in notes
    assert "columns holding text are not declared: quality" in notes
    path, summary = build(override(spec, output=tmp_path / "out"))
    assert {r.sample_id: r.reason for r in summary.rejections}.keys() == {"session_3"}
    assert sorted(stored_ids(path)) == ["session_0", "session_1", "session_2"]


def test_npy_channel_folders_need_a_rate_or_init_exits_2_with_a_todo(tmp_path):
    raw = tmp_path / "wearable"
    rng = np.random.default_rng(0)
    for rec, seconds in (("walk", 3), ("run", 2)):
        for folder, rate in (("acc", 50), ("temp", 1)):
            (raw / folder).mkdir(parents=True, exist_ok=True)
            np.save(raw / folder / f"{rec}.npy", rng.normal(size=rate * seconds).astype(np.float32))
            if folder == "acc":
                (raw / folder / f"{rec}.json").write_text('{"rate": 50}')
    spec_path = tmp_path / "wearable.yaml"
    r = cli("init", str(raw), "--out", str(spec_path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "note: fields.temp.rate: no temp/<stem>.json sidecar gives the rate" in r.stdout
    assert "incomplete: fill in fields.temp.rate (the TODO lines)" in r.stderr
    text = spec_path.read_text()
    assert "    # rate: TODO  <- samples per second" in text and "rate: 50" in text
    with pytest.raises(ValueError, match="fields.temp.signal.rate: Field required"):
        load_spec(spec_path)  # nothing invalid passes silently

    for rec in ("walk", "run"):
        (raw / "temp" / f"{rec}.json").write_text('{"rate": 1}')
    _, _, spec = init(raw, tmp_path / "again")
    assert {n: (f.files, f.rate, f.channel) for n, f in spec.fields.items()} == {
        "acc": ("acc/*.npy", 50, None), "temp": ("temp/*.npy", 1, None)}
    path, summary = build(override(spec, output=tmp_path / "out"))
    assert summary.rejections == ()
    split, row = stored_ids(path)["walk"]
    acc, temp = H5Dataset(path, split=split, fields=("acc", "temp"))[row]
    assert acc.shape == (150,) and temp.shape == (3,)

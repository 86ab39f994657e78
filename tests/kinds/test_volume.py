"""CT volumes from real DICOM data (pydicom's bundled CT and MR files): series built from their
pixel data and headers with new positions and UIDs, files shuffled; slices sorted by position,
HU equal to pixel_array x slope + intercept, broken cases rejected with their reasons; NIfTI
volumes with nibabel; masks per slice; read back per case."""

from __future__ import annotations

import copy
import json

import h5py
import nibabel
import numpy as np
import pydicom
import pytest
import torch
from PIL import Image
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid

from h5forge._format import arrays
from h5forge._format.layout import decode_str
from h5forge.read.torch import H5Dataset

SIZE = [128, 128]


def write_series(folder, source="CT_small.dcm", depth=6, spacing=2.5, skip=(), duplicate=None, seed=0,
                 description="axial"):
    """A series from a real file's pixels and header: one slice per position, saved in shuffled order."""
    folder.mkdir(parents=True, exist_ok=True)
    base = pydicom.dcmread(get_testdata_file(source))
    series, rng = generate_uid(), np.random.default_rng(seed)
    for k in rng.permutation(depth):
        if k in skip:
            continue
        ds = copy.deepcopy(base)
        ds.SeriesInstanceUID, ds.SOPInstanceUID = series, generate_uid()
        ds.SeriesDescription = description
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        z = spacing * (duplicate if k == depth - 1 and duplicate is not None else k)
        ds.ImagePositionPatient = [-50.0, -60.0, z]
        ds.InstanceNumber = int(rng.integers(1, 1000))  # deliberately not the slice order
        ds.save_as(folder / f"{generate_uid()}.dcm", enforce_file_format=True)
    hu = base.pixel_array.astype(np.float64) * float(base.get("RescaleSlope", 1)) + float(base.get("RescaleIntercept", 0))
    return hu  # every slice holds the same real pixels


def spec_data(root, out, **volume):
    return {"name": "ct", "source": {"root": str(root)}, "output": {"dir": str(out)},
            "splits": {"ratios": {"train": 1.0}}, "compute": {"batch_size": 2},
            "fields": {"ct": {"kind": "volume", "files": "cases/*", "size": SIZE, **volume}}}


def test_dicom_series_are_sorted_by_position_and_broken_cases_rejected(tmp_path, build_spec):
    root = tmp_path / "raw"
    hu = write_series(root / "cases" / "good", depth=6)
    write_series(root / "cases" / "gap", depth=6, skip=(3,))
    write_series(root / "cases" / "dup", depth=6, duplicate=2)
    write_series(root / "cases" / "two", depth=4)
    write_series(root / "cases" / "two", depth=3, seed=1, description="scout")
    write_series(root / "cases" / "mr", source="MR_small_jpeg_ls_lossless.dcm", depth=5, spacing=1.0)
    rle = write_series(root / "cases" / "mr_rle", source="MR_small_RLE.dcm", depth=3, spacing=1.0)
    path, summary = build_spec(spec_data(root, tmp_path / "out"))
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert "missing slice: a gap of 5.00 mm" in reasons["gap"]
    assert "duplicate slice positions" in reasons["dup"]
    assert "ambiguous: 2 series" in reasons["two"] and "scout" in reasons["two"]
    assert set(reasons) == {"gap", "dup", "two"}
    with h5py.File(path, "r") as f:
        g = f["train"]
        ids = decode_str(g["ids"][()])
        read = arrays.RowReader(g, "ct", arrays.Stored(tuple(SIZE), np.int16, True, True, 1))
        good = read.row(ids.index("good"))
        assert good.shape == (6, 128, 128) and good.dtype == np.int16
        assert np.array_equal(good, np.broadcast_to(hu, good.shape))
        mr = read.row(ids.index("mr_rle"))
        assert np.array_equal(mr[:, 32:96, 32:96], np.broadcast_to(rle, (3, 64, 64)))  # 64x64 padded to 128
        assert (mr[:, :32] == 0).all()  # an MR case is padded with 0, a CT case with air
        assert list(g["ct_spacing"][ids.index("good")]) == [2.5, *[float(v) for v in pydicom.dcmread(
            get_testdata_file("CT_small.dcm")).PixelSpacing]]
        assert decode_str(g["ct_modality"][()]) == ["CT" if i == "good" else "MR" for i in ids]
        assert g["ct" + arrays.LENGTHS][()].tolist() == [6 if i == "good" else 5 if i == "mr" else 3 for i in ids]
    ds = H5Dataset(path, fields=("ct",), return_index=True)
    (values, depths), rows = next(iter(ds.loader(batch_size=3, num_workers=0, shuffle=False)))
    assert values.shape == (3, 6, 128, 128) and depths.tolist() == [6 if ids[r] == "good" else 5 if ids[r] == "mr"
                                                                    else 3 for r in rows.tolist()]


def test_series_rule_picks_one_and_an_undecodable_syntax_is_named(tmp_path, build_spec):
    root = tmp_path / "raw"
    write_series(root / "cases" / "two", depth=4)
    write_series(root / "cases" / "two", depth=3, seed=1, description="scout")
    odd = root / "cases" / "mpeg"
    write_series(odd, depth=2)
    for p in odd.iterdir():
        ds = pydicom.dcmread(p)
        ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.4.100"  # MPEG2: no handler decodes it
        ds.PixelData = pydicom.encaps.encapsulate([b"\x00" * 64])
        ds["PixelData"].VR = "OB"
        ds.save_as(p, enforce_file_format=True)
    path, summary = build_spec(spec_data(root, tmp_path / "out", series="largest"))
    [bad] = summary.rejections
    assert bad.sample_id == "mpeg" and "MPEG2" in bad.reason and "1.2.840.10008.1.2.4.100" in bad.reason
    with h5py.File(path, "r") as f:
        assert f["train"]["ct" + arrays.LENGTHS][()].tolist() == [4]


def test_series_picked_by_uid_or_by_a_header_value_when_descriptions_tie(tmp_path, build_spec):
    root = tmp_path / "raw"
    case = root / "cases" / "tie"
    write_series(case, depth=3, spacing=2.0, description="")
    before = set(case.iterdir())
    write_series(case, depth=3, spacing=5.0, seed=1, description="")  # same size, no description
    second = set(case.iterdir()) - before
    for p in case.iterdir():
        ds = pydicom.dcmread(p)
        ds.SeriesNumber = 8 if p in second else 7
        ds.save_as(p, enforce_file_format=True)
    uid = str(pydicom.dcmread(next(iter(second))).SeriesInstanceUID)
    for n, rule in enumerate(({"uid": uid}, {"uid": [uid, "1.2.3"]}, {"SeriesNumber": "^8$"})):
        path, summary = build_spec(spec_data(root, tmp_path / f"out{n}", series=rule))
        assert summary.rejections == ()
        with h5py.File(path, "r") as f:
            assert decode_str(f["train"]["ct_series"][()]) == [uid]
            assert f["train"]["ct_spacing"][0][0] == pytest.approx(5.0)
    from h5forge._ingest.discover import discover
    from h5forge.kinds import field_kinds
    from h5forge._samples import Reject
    from h5forge.spec import DatasetSpec

    spec = DatasetSpec.model_validate(spec_data(root, tmp_path / "out9", series={"SeriesNumber": "^9$"}))
    [ref] = discover(spec).samples
    with pytest.raises(Reject, match=r"series rules .* match 0 of the 2 series .*" + uid.replace(".", r"\.")):
        field_kinds(spec)["ct"].decode(root, ref, {})
    with pytest.raises(ValueError, match="series rule 'seriesnumber': uid or a DICOM keyword"):
        DatasetSpec.model_validate(spec_data(root, tmp_path / "o", series={"seriesnumber": "3"}))


def test_nifti_volumes_with_slice_masks(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    rng = np.random.default_rng(0)
    truth = {}
    for name, depth in (("a", 7), ("b", 4)):
        vol = rng.integers(-1000, 1500, size=(100, 90, depth)).astype(np.int16)  # (x, y, z)
        nibabel.save(nibabel.Nifti1Image(vol, np.diag([0.8, 0.9, 3.0, 1.0])), root / "cases" / f"{name}.nii.gz")
        labels = (np.transpose(vol, (2, 1, 0)) > 800).astype(np.uint8)  # (z, y, x)
        (root / "masks" / name).mkdir(parents=True)
        for k, sl in enumerate(labels):
            Image.fromarray(sl * 255).save(root / "masks" / name / f"slice_{k:03d}.png")
        truth[name] = (np.transpose(vol, (2, 1, 0)), labels)
    Image.fromarray(np.full((90, 100), 128, np.uint8)).save(root / "masks" / "b" / "slice_002.png")
    data = spec_data(root, tmp_path / "out")
    data["fields"]["ct"]["files"] = "cases/*.nii.gz"
    data["fields"]["ct_mask"] = {"kind": "volume_mask", "files": "masks/*", "like": "ct"}
    path, summary = build_spec(data)
    [bad] = summary.rejections
    assert bad.sample_id == "b" and "mask values [0, 128, 255] not allowed" in bad.reason
    with h5py.File(path, "r") as f:
        g = f["train"]
        assert decode_str(g["ids"][()]) == ["a"]
        vol, labels = truth["a"]
        assert np.array_equal(g["ct"][()][:, 19:109, 14:114], vol)  # 90 rows x 100 columns, padded to 128 x 128
        assert np.array_equal(g["ct_mask"][()][:, 19:109, 14:114], labels)
        assert np.allclose(g["ct_spacing"][0], [3.0, 0.9, 0.8])
        assert g.attrs["ct_mask_class_pixels"].tolist() == [labels.size - labels.sum(), labels.sum()]  # no padding
        assert (g["ct_mask"][()][:, :19] == 255).all()


def test_volume_mask_must_follow_a_volume(tmp_path):
    from h5forge.spec import DatasetSpec

    data = spec_data(tmp_path, tmp_path / "out")
    data["fields"]["m"] = {"kind": "volume_mask", "files": "m/*", "like": "nope"}
    with pytest.raises(ValueError, match="fields.m.like: 'nope' is not a volume field"):
        DatasetSpec.model_validate(data)


def test_slices_of_cases_for_2d_and_25d_training(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    rng = np.random.default_rng(1)
    for name, depth in (("a", 5), ("b", 3)):
        vol = rng.integers(-1000, 1000, size=(128, 128, depth)).astype(np.int16)
        nibabel.save(nibabel.Nifti1Image(vol, np.eye(4)), root / "cases" / f"{name}.nii.gz")
    data = spec_data(root, tmp_path / "out")
    data["fields"]["ct"]["files"] = "cases/*.nii.gz"
    path, _ = build_spec(data)
    cases = H5Dataset(path, fields=("ct",))
    volumes = [cases[i] for i in range(len(cases))]
    flat = torch.cat(volumes)
    slices = H5Dataset(path, fields=("ct",), unit="slice", return_index=True)
    assert len(slices) == 8 == len(flat)
    seen = []
    for sl, case in slices.loader(batch_size=3, num_workers=2, shuffle=True, seed=4):
        assert sl.shape[1:] == (128, 128)
        for s, c in zip(sl, case.tolist()):
            hits = [k for k in range(len(volumes[c])) if torch.equal(volumes[c][k], s)]
            assert hits, "a slice must come from its own case"
            seen.append((c, hits[0]))
    assert sorted(seen) == [(0, k) for k in range(len(volumes[0]))] + [(1, k) for k in range(len(volumes[1]))]
    stacks = H5Dataset(path, fields=("ct",), unit="slice", context=1)
    first_of_b = len(volumes[0])
    stack = stacks[first_of_b]  # first slice of case b: its lower neighbour is itself
    assert stack.shape == (3, 128, 128)
    assert torch.equal(stack[0], volumes[1][0]) and torch.equal(stack[1], volumes[1][0])
    assert torch.equal(stack[2], volumes[1][1])


@pytest.mark.parametrize("source", ["CT_small.dcm", "MR_small.dcm", "MR_small_bigendian.dcm", "MR_small_RLE.dcm",
                                    "MR_small_jpeg_ls_lossless.dcm", "JPEG2000.dcm"])
def test_every_bundled_transfer_syntax_that_decodes_round_trips(source, tmp_path, build_spec):
    root = tmp_path / "raw"
    hu = write_series(root / "cases" / "one", source=source, depth=3, spacing=2.0)
    size = [max(hu.shape[0], 8), max(hu.shape[1], 8)]
    path, summary = build_spec(spec_data(root, tmp_path / "out", size=size, dtype="float32"))
    assert summary.rejections == ()
    with h5py.File(path, "r") as f:
        stored = f["train"]["ct"][()]
        assert np.array_equal(stored, np.broadcast_to(hu, stored.shape).astype(np.float32)), \
            pydicom.dcmread(get_testdata_file(source)).file_meta.TransferSyntaxUID.name


def test_a_zero_rescale_slope_and_a_nan_slice_position_are_refused(tmp_path, build_spec):
    root = tmp_path / "raw"
    write_series(root / "cases" / "good", depth=4)
    write_series(root / "cases" / "slope0", depth=4)
    write_series(root / "cases" / "nanpos", depth=4)
    for p in sorted((root / "cases" / "slope0").iterdir())[:1]:
        ds = pydicom.dcmread(p)
        ds.RescaleSlope = 0
        ds.save_as(p, enforce_file_format=True)
    for p in sorted((root / "cases" / "nanpos").iterdir())[:1]:
        ds = pydicom.dcmread(p)
        ds.ImagePositionPatient = [-50.0, -60.0, float("nan")]
        ds.save_as(p, enforce_file_format=True)
    path, summary = build_spec(spec_data(root, tmp_path / "out"))
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert set(reasons) == {"slope0", "nanpos"}
    assert reasons["slope0"] == "RescaleSlope is 0 in 1 of 4 slices"
    assert reasons["nanpos"] == "ImagePositionPatient is not a finite position in 1 of 4 slices"
    with h5py.File(path, "r") as f:
        assert decode_str(f["train"]["ids"][()]) == ["good"]
        assert np.isfinite(f["train"]["ct_spacing"][()]).all()


def test_ct_slices_are_read_as_whole_chunks_from_the_mapped_file(tmp_path, build_spec):
    """One slice is one LZ4 chunk: a slice read takes its bytes from the mapped file and decompresses
    them in process (h5forge.read._direct), to exactly what h5py reads."""
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    rng = np.random.default_rng(2)
    for name, depth in (("a", 4), ("b", 3)):
        vol = rng.integers(-1000, 1000, size=(96, 96, depth)).astype(np.int16)
        nibabel.save(nibabel.Nifti1Image(vol, np.eye(4)), root / "cases" / f"{name}.nii.gz")
    data = spec_data(root, tmp_path / "out")
    data["fields"]["ct"]["files"] = "cases/*.nii.gz"
    data["storage"] = {**data.get("storage", {}), "codec": "lz4"}
    path, _ = build_spec(data)
    slices = H5Dataset(path, fields=("ct",), unit="slice", context=1)
    reader = slices.reader
    got = [slices.slices.read(reader, [i])["ct"][0] for i in range(len(slices))]  # stored values, (3, H, W)
    direct = reader._direct["ct"]
    assert direct is not None and direct.codec == "lz4" and direct._index  # the mapped chunk index, built
    with h5py.File(path, "r") as f:
        stored = f[reader.split][reader.fields["ct"].path][()]
    assert len(got) == len(stored) == 7
    firsts, lasts = [0] * 4 + [4] * 3, [3] * 4 + [6] * 3  # each case's first and last slice
    for i, stack in enumerate(got):
        want = stored[[max(i - 1, firsts[i]), i, min(i + 1, lasts[i])]]
        assert stack.dtype == want.dtype and np.array_equal(stack, want), i


def test_a_volume_field_has_its_own_codec(tmp_path, build_spec):
    """``codec`` on a volume field overrides storage.codec for its slices alone (``none``: slices are
    copied straight from the mapped file by unit="slice" readers); a misspelt one is refused."""
    from h5forge.spec import DatasetSpec

    root = tmp_path / "raw"
    hu = write_series(root / "cases" / "one", depth=3)
    data = spec_data(root, tmp_path / "out", codec="none")
    data["storage"] = {"codec": "zstd"}
    path, _ = build_spec(data)
    with h5py.File(path, "r") as f:
        ct = f["train"]["ct"]
        assert ct.id.get_create_plist().get_nfilters() == 0 and ct.chunks == (1, *SIZE)
        assert np.array_equal(ct[()], np.broadcast_to(hu, ct.shape))
    slices = H5Dataset(path, fields=("ct",), unit="slice")
    assert slices.reader._direct == {} and np.array_equal(slices[1].numpy(), hu)
    assert slices.reader._direct["ct"].codec == "none"
    with h5py.File(path, "r") as f:
        assert json.loads(f["meta"]["spec"][()])["fields"]["ct"]["codec"] == "none"
    default, _ = build_spec(spec_data(root, tmp_path / "default"))
    with h5py.File(default, "r") as f:  # unset, it is not stored: the spec is what it was without the option
        assert "codec" not in json.loads(f["meta"]["spec"][()])["fields"]["ct"]
        assert f["train"]["ct"].id.get_create_plist().get_filter(0)[0] == 32004  # storage.codec, lz4
    bad = spec_data(root, tmp_path / "out2", codec="lz5")
    with pytest.raises(ValueError, match=r"fields\.ct\.volume\.codec\n  Value error, unknown codec 'lz5'"):
        DatasetSpec.model_validate(bad)


def test_slice_masks_are_read_by_the_2d_mask_rules(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    rng = np.random.default_rng(1)
    truth = {}
    for name in ("palette", "grey", "wide", "float", "sizes", "jpeg"):
        nibabel.save(nibabel.Nifti1Image(rng.integers(-1000, 1000, (32, 24, 3)).astype(np.int16), np.eye(4)),
                     root / "cases" / f"{name}.nii.gz")
        truth[name] = rng.integers(0, 3, (3, 24, 32)).astype(np.uint8)  # (z, y, x)
        (root / "masks" / name).mkdir(parents=True)
        for k, classes in enumerate(truth[name]):
            out = root / "masks" / name / f"slice_{k:03d}.png"
            if name == "palette":  # drawn in colours whose luminance is no class: read by index
                picture = Image.fromarray(classes, "P")
                picture.putpalette([0, 0, 0, 128, 0, 0, 0, 128, 0])
                picture.save(out)
            elif name == "wide":  # 16-bit: 1000 is no class, and would be clamped to 255 by a conversion
                Image.fromarray(classes.astype(np.uint16) * 1000).save(out)
            elif name == "float":  # 32-bit float TIFF: 1.5 is no class, and would be cut to 1
                Image.fromarray(classes.astype(np.float32) * 1.5, "F").save(out.with_suffix(".tif"))
            elif name == "jpeg":  # a block of class 1 keeps values 0 and 1, on other pixels than drawn
                block = np.zeros_like(classes)
                block[5:17, 7:23] = 1
                Image.fromarray(block).save(out.with_suffix(".jpg"), quality=90)
            elif name == "sizes" and k == 1:
                Image.fromarray(classes[:12]).save(out)
            else:
                Image.fromarray(classes).save(out)
    data = spec_data(root, tmp_path / "out")
    data["fields"]["ct"]["files"] = "cases/*.nii.gz"
    data["fields"]["ct_mask"] = {"kind": "volume_mask", "files": "masks/*", "like": "ct", "classes": 3}
    path, summary = build_spec(data)
    assert {r.sample_id: r.reason for r in summary.rejections} == {
        "wide": "mask values 0..2000 are outside 0..255",
        "float": "mask values [1.5, 3] are not classes 0..2",
        "sizes": "slice masks of several sizes (HxW): 12x32, 24x32",
        "jpeg": "class mask is a JPEG, a lossy format whose values near edges are not the classes drawn: "
                "save it as PNG"}
    with h5py.File(path, "r") as f:
        g = f["train"]
        ids, lengths = decode_str(g["ids"][()]), g["ct_mask_lengths"][()].tolist()
        assert ids == ["grey", "palette"] and lengths == [3, 3]
        for row, name in enumerate(ids):
            stored = g["ct_mask"][3 * row : 3 * row + 3]
            assert np.array_equal(stored[:, 52:76, 48:80], truth[name]), name  # 24 x 32 padded to 128 x 128

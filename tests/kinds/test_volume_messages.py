"""What a rejected DICOM case is told is true of its files: a series tie lists the tied series
with their slice counts, a truncated slice is named as truncated (never skipped, never "no DICOM
image"), and a library's warnings go to the log, not the terminal."""

from __future__ import annotations

import logging
import re
import warnings

import pydicom
import pytest

from tests.kinds.test_volume import spec_data, write_series


def clean(root, **volume):
    from h5forge._ingest.clean import clean_batch
    from h5forge._ingest.discover import discover
    from h5forge.spec import DatasetSpec

    spec = DatasetSpec.model_validate({"max_rejected": 1.0, **spec_data(root, root.parent / "out", **volume)})
    inv = discover(spec)
    batch = clean_batch(spec, inv.root, inv.samples, encode=False)
    return batch.ids, {r.sample_id: (r.paths, r.reason) for r in batch.rejections}


def test_a_series_tie_lists_the_tied_series_and_the_smaller_ones_with_their_counts(tmp_path):
    root = tmp_path / "raw"
    case = root / "cases" / "tied"
    write_series(case, depth=3, description="AX T2", seed=1)
    write_series(case, depth=3, description="AX T2 REPEAT", seed=2)
    write_series(case, depth=1, description="FAST LOCALIZER", seed=3)
    write_series(root / "cases" / "clear", depth=4, description="AX T2", seed=4)
    write_series(root / "cases" / "clear", depth=1, description="FAST LOCALIZER", seed=5)
    ids, rejected = clean(root, series="largest")
    assert ids == ["clear"]
    assert rejected["tied"][1] == (
        "series: largest is a tie: 2 series hold 3 slices each (['AX T2', 'AX T2 REPEAT']); the others hold "
        "fewer ('FAST LOCALIZER' 1); pick one by its SeriesDescription or series: {uid: ...}")


def test_a_truncated_jpeg_2000_slice_rejects_its_case_naming_the_file_and_its_warning_is_logged(tmp_path, caplog):
    root = tmp_path / "raw"
    write_series(root / "cases" / "whole", source="MR_small_jp2klossless.dcm", depth=3)
    write_series(root / "cases" / "cut", source="MR_small_jp2klossless.dcm", depth=3, seed=1)
    middle = sorted((root / "cases" / "cut").iterdir(), key=lambda p: pydicom.dcmread(p).ImagePositionPatient[2])[1]
    middle.write_bytes(middle.read_bytes()[:2000])  # the copy stopped inside the pixel data's fragments
    with warnings.catch_warnings(), caplog.at_level(logging.INFO, logger="h5forge.kinds"):
        warnings.simplefilter("error")  # a warning reaching the terminal would fail here
        ids, rejected = clean(root)
    assert ids == ["whole"]  # the case with a lost slice is never stored as two slices
    files, reason = rejected["cut"]
    assert files == (f"cases/cut/{middle.name}",)
    assert reason == ("not a whole slice (2,000 bytes): pydicom reads no data set from it beyond its file meta; "
                      "pydicom warns: End of file reached before delimiter (FFFE,E0DD) found in file <no filename>")
    assert any(r.name == "h5forge.kinds" and middle.name in r.getMessage() and "UserWarning" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("source, cut, reason", [
    ("MR_small_jp2klossless.dcm", 1400, "not a whole slice (1,400 bytes): it belongs to the series of the case's "
                                        "slices, but holds no pixel data"),
    ("MR_small_jp2klossless.dcm", 1500, "not a whole slice (1,500 bytes): its header describes a 64x64 image (MR), "
                                        "but it holds no pixel data"),
    ("CT_small.dcm", 20000, r"pixel data in Explicit VR Little Endian \(1\.2\.840\.10008\.1\.2\.1\) cannot be decoded "
                            r"\(damaged or cut short\?\): The number of bytes of pixel data is less than expected "
                            r"\(136\d\d vs 32768 bytes\) - the dataset may be corrupted, .*"),
])
def test_a_slice_cut_anywhere_before_its_pixels_is_named(tmp_path, source, cut, reason):
    root = tmp_path / "raw"
    write_series(root / "cases" / "whole", source=source, depth=3)
    write_series(root / "cases" / "cut", source=source, depth=3, seed=1)
    victim = sorted((root / "cases" / "cut").iterdir())[0]
    victim.write_bytes(victim.read_bytes()[:cut])
    ids, rejected = clean(root)
    assert ids == ["whole"]
    files, said = rejected["cut"]
    assert files == (f"cases/cut/{victim.name}",)
    assert said == reason or re.fullmatch(reason, said), said  # the header's length varies with its UIDs


def _edit_one_slice(case, edit, every=False) -> None:
    for path in sorted(case.iterdir())[: None if every else 1]:
        ds = pydicom.dcmread(path)
        edit(ds)
        ds.save_as(path, enforce_file_format=True)


def test_a_series_whose_pixel_spacing_differs_or_is_missing_is_rejected_not_stored_with_the_firsts(tmp_path):
    """pydicom's CT_small.dcm (0.661 mm pixels) as a 4-slice series: one slice at 0.5 mm used to be
    stored under the first slice's spacing, and a series without PixelSpacing (or with 0 or a
    negative one) with a spacing of 0 or below; each case is rejected with what its files say."""
    root = tmp_path / "raw"
    for name in ("good", "mixed", "missing", "zero", "negative"):
        write_series(root / "cases" / name, depth=4, seed=len(name))
    _edit_one_slice(root / "cases" / "mixed", lambda ds: setattr(ds, "PixelSpacing", [0.5, 0.5]))
    _edit_one_slice(root / "cases" / "missing", lambda ds: delattr(ds, "PixelSpacing"), every=True)
    _edit_one_slice(root / "cases" / "zero", lambda ds: setattr(ds, "PixelSpacing", [0, 0]), every=True)
    _edit_one_slice(root / "cases" / "negative", lambda ds: setattr(ds, "PixelSpacing", [-0.661468, 0.661468]),
                    every=True)
    ids, rejected = clean(root)
    assert ids == ["good"]
    reasons = {sid: reason for sid, (_, reason) in rejected.items()}
    assert reasons == {
        "mixed": "slices have different pixel spacings (PixelSpacing, mm): [0.5, 0.5] in 1, [0.661468, 0.661468] "
                 "in 3 of 4 slices",
        "missing": "PixelSpacing is missing or not a positive size in 4 of 4 slices (e.g. [0, 0]): the in-plane "
                   "spacing is unknown",
        "zero": "PixelSpacing is missing or not a positive size in 4 of 4 slices (e.g. [0, 0]): the in-plane "
                "spacing is unknown",
        "negative": "PixelSpacing is missing or not a positive size in 4 of 4 slices (e.g. [-0.661468, 0.661468]): "
                    "the in-plane spacing is unknown",
    }

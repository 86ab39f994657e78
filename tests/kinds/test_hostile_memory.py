"""Peak memory per hostile input, for the fault suite's figures: each input is cleaned beside a
good sample of its kind in a fresh process whose peak RSS is measured (test_memory_bounds's
helper), and must be rejected with a reason while the good sample is taken. The table is printed
(run with ``-s``); docs/security.md quotes it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import nibabel
import numpy as np
import pydicom
import pytest

from tests.helpers.lifecycle import png_bomb
from tests.kinds.test_memory_bounds import MIB, clean_in_a_fresh_process, image_spec, small_png
from tests.kinds.test_signal import write_edf
from tests.kinds.test_signal_bounds import _edf_claiming, _npy_claiming, signal_spec, write_wide_csv
from tests.kinds.test_volume import write_series
from tests.kinds.test_volume_bounds import _nifti_declaring, volume_spec


def _pictures(root: Path, make: Callable[[Path], None]) -> dict:
    small_png(root / "images" / "good.png")
    make(root / "images" / "bad.png")
    return image_spec(root)


def _truncated(path: Path) -> None:
    small_png(path, size=(300, 300))
    path.write_bytes(path.read_bytes()[:200])


def _deep_sidecar(root: Path) -> dict:
    (root / "npy").mkdir(parents=True)
    np.save(root / "npy" / "good.npy", np.arange(50, dtype=np.float32))
    np.save(root / "npy" / "bad.npy", np.arange(50, dtype=np.float32))
    (root / "npy" / "bad.json").write_text("[" * 200_000 + "]" * 200_000)
    return signal_spec(root, "npy/*.npy", rate=100)


def _rle_dicom(root: Path) -> dict:
    write_series(root / "cases" / "good", source="MR_small_RLE.dcm", depth=3)
    write_series(root / "cases" / "bad", source="MR_small_RLE.dcm", depth=1, seed=3)
    [victim] = (root / "cases" / "bad").iterdir()
    ds = pydicom.dcmread(victim)
    ds.Rows = ds.Columns = 65535
    ds.save_as(victim, enforce_file_format=True)
    return volume_spec(root, "cases/*")


def _nifti(root: Path) -> dict:
    root.mkdir(parents=True)
    nibabel.save(nibabel.Nifti1Image(np.ones((8, 8, 4), np.int16), np.eye(4)), root / "good.nii")
    _nifti_declaring(root / "bad.nii", (2048, 2048, 1024))
    return volume_spec(root, "*.nii")


def _edf(root: Path) -> dict:
    (root / "rec").mkdir(parents=True)
    write_edf(root / "rec" / "good.edf", 2, seed=0)
    _edf_claiming(root / "rec" / "bad.edf", 99_999_999)
    return signal_spec(root, "rec/*.edf", "ACC")


def _npy(root: Path) -> dict:
    (root / "npy").mkdir(parents=True)
    np.save(root / "npy" / "good.npy", np.arange(50, dtype=np.float32))
    _npy_claiming(root / "npy" / "bad.npy", (10**10,))
    return signal_spec(root, "npy/*.npy")


def _wide_csv(root: Path) -> dict:
    write_wide_csv(root / "csv", "bad.csv")
    return signal_spec(root, "csv/*.csv", "c7")


def _coco(root: Path, bad: list[dict]) -> dict:
    """A good and a bad picture, their boxes in one COCO file; the bad one's objects are ``bad``."""
    import json

    small_png(root / "images" / "good.png")
    small_png(root / "images" / "bad.png")
    images = [{"id": i, "file_name": f"{n}.png", "height": 40, "width": 40} for i, n in ((1, "good"), (2, "bad"))]
    good = {"id": 1, "image_id": 1, "category_id": 1, "bbox": [5, 5, 20, 20], "iscrowd": 0}
    (root / "instances.json").write_text(json.dumps({"images": images, "annotations": [good, *bad],
                                                     "categories": [{"id": 1, "name": "thing"}]}))
    spec = image_spec(root)
    spec["fields"]["boxes"] = {"kind": "boxes", "like": "images", "coco": "instances.json", "classes": ["thing"],
                               "masks": True}
    return spec


def _coco_objects(root: Path) -> dict:
    return _coco(root, [{"id": k + 2, "image_id": 2, "category_id": 1, "bbox": [k % 30, k % 20, 9, 9], "iscrowd": 0}
                        for k in range(20_000)])


def _coco_polygon(root: Path) -> dict:
    k = np.arange(200_000)
    zigzag = np.column_stack([k % 39, np.where(k % 2, 0, 39)]).ravel().tolist()
    return _coco(root, [{"id": 2, "image_id": 2, "category_id": 1, "bbox": [0, 0, 39, 39], "iscrowd": 0,
                         "segmentation": [zigzag]}])


HOSTILE: dict[str, Callable[[Path], dict]] = {
    "PNG bomb (10000x10000 declared, 100 kB)": lambda r: _pictures(r, lambda p: p.write_bytes(png_bomb())),
    "truncated PNG": lambda r: _pictures(r, _truncated),
    "FIFO named .png": lambda r: _pictures(r, lambda p: os.mkfifo(p)),
    "symlink to /dev/zero named .png": lambda r: _pictures(r, lambda p: p.symlink_to("/dev/zero")),
    "folder named .png": lambda r: _pictures(r, lambda p: p.mkdir()),
    "JSON sidecar nested 200,000 deep": _deep_sidecar,
    "DICOM RLE slice declaring 65535x65535": _rle_dicom,
    "NIfTI of 1,352 bytes declaring 2048x2048x1024": _nifti,
    "EDF declaring 99,999,999 records": _edf,
    ".npy of 200 bytes declaring 10^10 values": _npy,
    "CSV with 1,000,001 columns": _wide_csv,
    "COCO picture with 20,000 objects, masks: true": _coco_objects,
    "COCO polygon of 200,000 vertices, masks: true": _coco_polygon,
}


@pytest.mark.slow
@pytest.mark.soak
def test_peak_memory_per_hostile_input(tmp_path):
    rows = []
    for i, (name, make) in enumerate(HOSTILE.items()):
        got = clean_in_a_fresh_process(make(tmp_path / f"h{i}" / "raw"))
        assert got["taken"] == ["good"], (name, got)
        [(sid, reason)] = got["rejected"]
        assert sid == "bad" and reason and not reason.startswith("unexpected "), (name, reason)
        rows.append((name, (got["peak_rss"] - got["base_rss"]) / MIB, reason))
    print("\n| hostile input | peak over the base (MiB) | reason |\n|---|---|---|")
    for name, peak, reason in rows:
        print(f"| {name} | {peak:.0f} | {reason[:90]}{'…' if len(reason) > 90 else ''} |")
    assert all(peak < 64 for _, peak, _ in rows), rows


def test_a_deeply_nested_sidecar_is_a_rejection_with_its_reason(tmp_path):
    got = clean_in_a_fresh_process(_deep_sidecar(tmp_path / "raw"))
    assert got["taken"] == ["good"]
    assert got["rejected"] == [["bad", "sidecar must be a JSON object with a numeric rate: it is nested too "
                                       "deeply to read"]]

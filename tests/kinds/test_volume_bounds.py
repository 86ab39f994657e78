"""Volumes whose headers promise more than memory can hold are rejected before any voxel is
decoded, and a case folder's files obey the same symlink and size rules as pictures. Each case
is cleaned in a fresh process whose peak RSS is measured."""

from __future__ import annotations

import gzip
import json
import struct
import zlib

import nibabel
import numpy as np
import pydicom
from pydicom.data import get_testdata_file

from tests.kinds.test_memory_bounds import GIB, MIB, clean_in_a_fresh_process
from tests.kinds.test_volume import write_series


def volume_spec(root, files, **volume) -> dict:
    return {
        "name": "bounds",
        "source": {"root": str(root)},
        "fields": {"ct": {"kind": "volume", "files": files, "size": [64, 64], **volume}},
        "output": {"dir": str(root.parent / "out")},
    }


def test_an_rle_slice_declaring_65535_square_is_rejected_before_decoding(tmp_path):
    root = tmp_path / "raw"
    write_series(root / "cases" / "good", source="MR_small_RLE.dcm", depth=3)
    write_series(root / "cases" / "bomb", source="MR_small_RLE.dcm", depth=1, seed=3)
    [victim] = (root / "cases" / "bomb").iterdir()
    ds = pydicom.dcmread(victim)
    ds.Rows = ds.Columns = 65535  # the RLE pixel data stays a few kB
    ds.save_as(victim, enforce_file_format=True)
    got = clean_in_a_fresh_process(volume_spec(root, "cases/*"))
    assert got["taken"] == ["good"]
    [(sid, reason)] = got["rejected"]
    assert sid == "bomb" and reason.startswith("1 slices of 65535x65535 would take 34,358,689,800 bytes decoded"), (
        reason
    )
    assert got["peak_rss"] - got["base_rss"] < 128 * MIB, got


def _nifti_declaring(path, shape, dtype=np.int16, image=nibabel.Nifti1Image) -> None:
    """A real NIfTI-1 (or NIfTI-2) header (nibabel's) declaring ``shape``, followed by 1,000 bytes
    of voxels."""
    img = image(np.zeros((2, 2, 2), dtype), np.eye(4))
    img.header.set_data_shape(shape)
    header = img.header.binaryblock + b"\0" * 4
    img.header.set_data_offset(len(header))  # voxels right after the header and its 4-byte extension flag
    header = img.header.binaryblock + b"\0" * 4
    path.write_bytes(header + b"\0" * 1000)


def test_a_small_nifti_declaring_gigabytes_is_rejected_before_decoding(tmp_path):
    root = tmp_path / "raw"
    root.mkdir()
    nibabel.save(
        nibabel.Nifti1Image(np.arange(8 * 8 * 4, dtype=np.int16).reshape(8, 8, 4), np.eye(4)), root / "good.nii"
    )
    _nifti_declaring(root / "liar.nii", (2048, 2048, 1024))
    assert (root / "liar.nii").stat().st_size == 1352
    got = clean_in_a_fresh_process(volume_spec(root, "*.nii"))
    assert got["taken"] == ["good"]
    [(sid, reason)] = got["rejected"]
    assert sid == "liar" and reason.startswith("a volume of 2048x2048x1024 would take 34,359,738,368 bytes"), reason
    assert got["peak_rss"] - got["base_rss"] < 128 * MIB, got
    # within the limit, but the file holds fewer voxels than its header says
    _nifti_declaring(root / "liar.nii", (64, 64, 16))
    got = clean_in_a_fresh_process(volume_spec(root, "*.nii"))
    assert dict(got["rejected"])["liar"] == "the header declares 131,072 bytes of voxels, the file holds 1,000"


def test_a_small_4d_nifti2_declaring_gigabytes_is_rejected_before_decoding(tmp_path):
    root = tmp_path / "raw"
    root.mkdir()
    nibabel.Nifti2Image(np.arange(8 * 8 * 4 * 2, dtype=np.int16).reshape(8, 8, 4, 2), np.eye(4)).to_filename(
        root / "good.nii"
    )
    _nifti_declaring(root / "liar.nii", (2048, 2048, 512, 2), image=nibabel.Nifti2Image)
    assert (root / "liar.nii").stat().st_size == 544 + 1000  # NIfTI-2: a 540-byte header with int64 dimensions
    spec = volume_spec(root, "*.nii", fourth_axis="channels", channels=2)
    got = clean_in_a_fresh_process(spec)
    assert got["taken"] == ["good"]
    [(sid, reason)] = got["rejected"]
    assert sid == "liar" and reason.startswith("a volume of 2048x2048x512x2 would take 34,359,738,368 bytes"), reason
    assert got["peak_rss"] - got["base_rss"] < 128 * MIB, got
    # within the limit, but the file holds fewer voxels than its header says
    _nifti_declaring(root / "liar.nii", (64, 64, 16, 2), image=nibabel.Nifti2Image)
    got = clean_in_a_fresh_process(spec)
    assert dict(got["rejected"])["liar"] == "the header declares 262,144 bytes of voxels, the file holds 1,000"


def test_a_gzip_bomb_nifti_is_rejected_while_it_decompresses(tmp_path):
    root = tmp_path / "raw"
    root.mkdir()
    nibabel.save(nibabel.Nifti1Image(np.ones((8, 8, 4), np.int16), np.eye(4)), root / "good.nii.gz")
    img = nibabel.Nifti1Image(np.zeros((2, 2, 2), np.int16), np.eye(4))
    img.header.set_data_shape((512, 512, 512))
    img.header.set_data_offset(352)  # 256 MiB of int16 voxels: all zeros, a few hundred kB gzipped
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    body = [deflate.compress(img.header.binaryblock + b"\0" * 4)]
    zeros = bytes(16 * MIB)
    for _ in range(16):
        body.append(deflate.compress(zeros))
    body.append(deflate.flush())
    (root / "bomb.nii.gz").write_bytes(b"".join(body))
    assert (root / "bomb.nii.gz").stat().st_size < 1 * MIB
    got = clean_in_a_fresh_process(volume_spec(root, "*.nii.gz", max_decoded_bytes=64 * MIB))
    assert got["taken"] == ["good"]
    assert dict(got["rejected"])["bomb"] == f"decompresses to more than {64 * MIB + MIB:,} bytes (max_decoded_bytes)"
    # bounded by the limit (the output buffer grows to it), not by the 256 MiB the bomb holds
    assert got["peak_rss"] - got["base_rss"] < 3 * 64 * MIB, got
    assert gzip.decompress((root / "good.nii.gz").read_bytes())[:4] == struct.pack("<i", 348)


def test_a_symlink_in_a_case_folder_out_of_the_source_is_rejected_unread(tmp_path):
    root = tmp_path / "raw"
    write_series(root / "cases" / "good", depth=3)
    write_series(root / "cases" / "linked", depth=3, seed=2)
    giant = tmp_path / "elsewhere" / "giant.dcm"
    giant.parent.mkdir()
    with open(giant, "wb") as fh:
        fh.truncate(GIB)
    (root / "cases" / "linked" / "extra.dcm").symlink_to(giant)
    got = clean_in_a_fresh_process(volume_spec(root, "cases/*"))
    assert got["taken"] == ["good"]
    [(sid, reason)] = got["rejected"]
    assert sid == "linked" and reason.startswith(f"symlink leads outside the source folder (to {giant})"), reason
    assert got["peak_rss"] - got["base_rss"] < 64 * MIB, got
    spec = volume_spec(root, "cases/*")
    spec["source"]["allow_symlinks_outside"] = True  # allowed: the size rule still holds, unread
    got = clean_in_a_fresh_process(spec)
    assert dict(got["rejected"])["linked"] == (
        f"file is {GIB:,} bytes, larger than the field's limit of {256 * MIB:,} (max_bytes)"
    )
    assert got["peak_rss"] - got["base_rss"] < 64 * MIB, got


def test_a_multiframe_file_declaring_4000_frames_of_4096_square_is_rejected_before_decoding(tmp_path):
    root = tmp_path / "raw"
    (root / "cases").mkdir(parents=True)
    pydicom.dcmread(get_testdata_file("rtdose_rle.dcm")).save_as(root / "cases" / "dose.dcm")
    ds = pydicom.dcmread(get_testdata_file("rtdose_rle.dcm"))
    ds.NumberOfFrames, ds.Rows, ds.Columns = 4000, 4096, 4096  # the RLE frames stay 15 of 10 x 10
    ds.save_as(root / "cases" / "bomb.dcm")
    assert (root / "cases" / "bomb.dcm").stat().st_size < 16_384
    got = clean_in_a_fresh_process(volume_spec(root, "cases/*", dtype="float32"))
    assert got["taken"] == ["dose"]
    [(sid, reason)] = got["rejected"]
    assert sid == "bomb" and reason.startswith("4000 slices of 4096x4096 would take 536,870,912,000 bytes decoded"), (
        reason
    )
    assert got["peak_rss"] - got["base_rss"] < 128 * MIB, got


LAST_TIME_POINT = """
import json, sys
from pathlib import Path
import numpy as np
import psutil
from h5forge.kinds.volume import load_case

def peak():  # VmHWM: this process image's own peak
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))

root, rel, t, limit = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
base = psutil.Process().memory_info().rss
values, meta, digest = load_case(root, rel, max_decoded=limit, time=t)
print(json.dumps({"shape": list(values.shape), "zeros": bool(not values.any()), "base_rss": base,
                  "peak_rss": peak()}))
"""


def test_the_last_time_point_of_a_gzipped_4d_file_is_decoded_without_holding_the_file(tmp_path):
    import subprocess
    import sys

    from tests.helpers.data import REPO

    img = nibabel.Nifti1Image(np.zeros((2, 2, 2), np.int16), np.eye(4))
    img.header.set_data_shape((256, 256, 64, 32))  # 32 time points of 8 MiB: 256 MiB of int16 zeros
    img.header.set_data_offset(352)
    deflate = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    body = [deflate.compress(img.header.binaryblock + b"\0" * 4)]
    body += [deflate.compress(bytes(8 * MIB)) for _ in range(32)]
    body.append(deflate.flush())
    (tmp_path / "bold.nii.gz").write_bytes(b"".join(body))
    assert (tmp_path / "bold.nii.gz").stat().st_size < MIB
    res = subprocess.run(
        [sys.executable, "-c", LAST_TIME_POINT, str(tmp_path), "bold.nii.gz", "31", str(64 * MIB)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    # within max_decoded_bytes (64 MiB) one time point is 32 MiB decoded; the whole file would be 2 GiB
    assert got["shape"] == [64, 256, 256] and got["zeros"]
    # the time point (8 MiB read, 32 MiB decoded and its copies: 68 MiB measured), never the 256 MiB the
    # file expands to
    assert got["peak_rss"] - got["base_rss"] < 160 * MIB, got


def _nifti2_of_548_bytes(path, time_points: int) -> None:
    """A NIfTI-2 header (nibabel's) declaring 1x1x1 int16 voxels at ``time_points`` time points,
    followed by its 4-byte extension flag and 4 bytes of voxels: 548 bytes."""
    _nifti_declaring(path, (1, 1, 1, time_points), image=nibabel.Nifti2Image)
    path.write_bytes(path.read_bytes()[:548])


def test_a_nifti2_declaring_ten_billion_time_points_makes_ids_only_for_what_the_file_holds(tmp_path):
    """Ids are made from the header: the time points it declares are bounded by what the file can
    hold (its size over a time point's bytes): the two time points the 548-byte file holds are
    samples, the third is rejected saying where the file ends, and no id is made past it. A gzipped
    file may hold up to deflate's ratio times its size: past max_time_points, it is rejected whole."""
    root = tmp_path / "raw"
    root.mkdir()
    nibabel.Nifti2Image(np.arange(4 * 4 * 2 * 3, dtype=np.int16).reshape(4, 4, 2, 3), np.eye(4)).to_filename(
        root / "good.nii"
    )
    _nifti2_of_548_bytes(root / "liar.nii", 10**10)
    assert (root / "liar.nii").stat().st_size == 548
    got = clean_in_a_fresh_process(volume_spec(root, "*.nii", fourth_axis="time"))
    assert sorted(got["taken"]) == ["good@t0000", "good@t0001", "good@t0002", "liar@t0000", "liar@t0001"]
    assert got["rejected"] == [
        [
            "liar@t0002",
            "the header declares 10,000,000,000 time points of 2 bytes; the file ends before time point 2 does",
        ]
    ]
    assert got["peak_rss"] - got["base_rss"] < 64 * MIB, got
    gz = gzip.compress((root / "liar.nii").read_bytes())
    (root / "liar.nii").unlink()
    (root / "liar.nii.gz").write_bytes(gz)
    got = clean_in_a_fresh_process(volume_spec(root, ["*.nii", "*.nii.gz"], fourth_axis="time"))
    assert got["rejected"] == [
        [
            "liar",
            f"the header declares 10,000,000,000 time points (a file of {len(gz):,} bytes "
            f"gzipped holds at most {len(gz) * 1032 // 2:,}), more than max_time_points "
            "10,000",
        ]
    ]
    assert got["peak_rss"] - got["base_rss"] < 64 * MIB, got
    # a true file with more time points than the field's limit
    (root / "liar.nii.gz").unlink()
    got = clean_in_a_fresh_process(volume_spec(root, "*.nii", fourth_axis="time", max_time_points=2))
    assert got["taken"] == [] and got["rejected"] == [
        ["good", "the header declares 3 time points, more than max_time_points 2"]
    ]

"""A zstd chunk that zstd finds corrupt, read through HDF5: hdf5plugin's Zstd filter then returns
uninitialised memory instead of an error, and that memory can hold the chunk's true values (a
buffer the same process freed after decoding the intact chunk). The fuzz soak found verify calling
such a version HEALTHY; verify asks zstd itself."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from h5forge._format.chunk_codec import zstd_intact
from h5forge._format.codecs import ensure_filters
from h5forge._store.verify import verify_file
from tests.helpers.tamper import copy_writable, flip, raw_pair, small_version

QUICK = {"resample": 0, "latency_reads": 0}


def corrupt_copy(version: Path, work: Path) -> tuple[Path, int]:
    """A copy of ``version`` with one bit of val/masks' first chunk flipped such that zstd refuses
    the chunk while HDF5 reads it without an error; the chunk's size."""
    with h5py.File(version, "r") as f:
        ds = f["val/masks"]
        info = ds.id.get_chunk_info(0)
        size = int(np.prod(ds.chunks)) * ds.dtype.itemsize
        _, raw = ds.id.read_direct_chunk((0,) * ds.ndim)
    assert zstd_intact(raw, size) is True
    for at in range(len(raw)):
        for bit in range(8):
            bad = bytearray(raw)
            bad[at] ^= 1 << bit
            if zstd_intact(bytes(bad), size) is False:
                copy_writable(version, work)
                flip(work, int(info.byte_offset) + at, 1 << bit)
                try:
                    with h5py.File(work, "r") as f:
                        f["val/masks"][0]
                except OSError:
                    continue  # HDF5 saw this one: verify's read fails anyway
                return work, size
    raise AssertionError("no flip that zstd refuses and HDF5 reads")


def test_a_chunk_zstd_refuses_is_broken_even_where_memory_holds_its_true_values(tmp_path):
    ensure_filters()
    version = tmp_path / "v" / "dataset_v0001.h5"
    small_version(version, raw_pair(tmp_path)[0], codec="zstd")
    damaged, _ = corrupt_copy(version, tmp_path / "damaged.h5")
    with h5py.File(version, "r") as f:
        truth = f["val/masks"][()]  # decoded here, then freed: the damaged read may get this memory back
    report = verify_file(damaged, **QUICK)
    assert not report.ok and report.checks["checksums"] == "FAILED", report.checks
    assert any("val/masks: its stored chunk 0 is corrupt (zstd cannot decode it)" in e for e in report.errors)
    assert verify_file(version, **QUICK).ok and truth.shape[0] == 2

"""The provenance columns' stored types: a thin version maps them from its row files, where h5forge's
readers and checksums read them, but plain HDF5 reads them with the type the thin file itself holds.
The fuzz soak found a flipped bit in that type (a source_sha256 of 64 bytes made 10,944,576) that
verify called HEALTHY while h5py read every hash padded with zeros."""

from __future__ import annotations

import h5py
import pytest

from h5forge._store.verify import verify_file
from tests.helpers.tamper import raw_pair, thin_version

HEX64 = b"\x13\x01\x00\x00\x40\x00\x00\x00"  # an HDF5 string type (version 1, class 3), ASCII, 64 bytes


@pytest.mark.parametrize(("name", "shape"), [("source_sha256", "(2,)"), ("checksum", "()")])
def test_a_provenance_column_of_another_type_is_broken(tmp_path, name, shape):
    thin = thin_version(tmp_path / "thin", *raw_pair(tmp_path))
    data = thin.read_bytes()
    with h5py.File(thin, "r") as f:
        assert f[f"train/{name}"].is_virtual and f[f"train/{name}"].dtype == "S64"
        header = h5py.h5o.get_info(f[f"train/{name}"].id).addr
    at = data.index(HEX64, header) + 4  # the type's size, in the dataset's own header
    damaged = bytearray(data)
    damaged[at + 1] = 0x01  # 64 bytes become 320
    thin.chmod(0o644)
    thin.write_bytes(bytes(damaged))
    with h5py.File(thin, "r") as f:
        assert f[f"train/{name}"].dtype == "S320"  # what plain HDF5 now reads every hash as
    report = verify_file(thin, resample=0, latency_reads=0)
    assert not report.ok and report.checks["structure"] == "FAILED", report.checks
    assert report.errors == [f"/train/{name} holds {shape} of |S320, expected {shape} of |S64"], report.errors

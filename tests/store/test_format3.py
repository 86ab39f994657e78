"""Format 3: rows are checksummed with BLAKE3, hashed once in the cleaning worker. Format-2 files
(sha256 rows) still verify; an append to a format-2 version stays in format 2 (one thin version
holds rows hashed one way), and the next build makes a format-3 version."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import blake3
import h5py
import numpy as np
import yaml

import h5forge
from h5forge._format.checksums import canonical, stored_checksums
from h5forge._format.names import SPLITS
from h5forge.kinds import stored_kinds
from h5forge.spec import spec_from_json
from h5forge._store.verify import verify_file
from tests.helpers.data import age_files, drop_samples, write_spec_file
from tests.helpers.files import make_raw

QUICK = dict(resample=0, latency_reads=0)
# written by h5forge in format 2 (12 samples of 32x32 images): dataset_v0001.h5 and its latest link
FORMAT2 = Path(__file__).parent / "fixtures" / "format2_version.tar.gz"


def first_row_checksum(path: Path, hasher) -> tuple[str, str]:
    """The stored checksum of train row 0, and the one ``hasher`` computes from its values."""
    with h5py.File(path, "r") as f:
        g = f["train"]
        kinds = stored_kinds(spec_from_json(f["meta/spec"][()].decode()))
        values = hasher()
        for name in kinds:
            values.update(canonical(g[name][0]))
        row = hasher(values.digest())
        for name in ("ids", "source_files", "source_sha256"):
            row.update(canonical(g[name][0]))
        return g["checksum"][0].decode(), row.hexdigest()


def spec_file(tmp_path: Path, raw: Path, out: Path) -> Path:
    path = write_spec_file(raw, out, tmp_path / "spec.yaml", inbox=tmp_path / "inbox")
    data = yaml.safe_load(path.read_text())
    data["fields"]["images"]["size"] = [32, 32]
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_build_writes_format_3_with_blake3_row_checksums_that_verify(tmp_path):
    raw = make_raw(tmp_path / "raw", n=12, seed=5)
    result = h5forge.build(spec_file(tmp_path, raw, tmp_path / "out"))
    with h5py.File(result.path, "r") as f:
        assert int(f.attrs["format_version"]) == 3
    stored, computed = first_row_checksum(Path(result.path), blake3.blake3)
    assert stored == computed and len(stored) == 64
    assert stored != first_row_checksum(Path(result.path), hashlib.sha256)[1]
    report = verify_file(result.path, **QUICK)
    assert report.ok, report.errors
    assert report.checks["checksums"] == "ok (12 samples)"


def test_a_changed_value_in_a_format_3_file_is_found(tmp_path):
    raw = make_raw(tmp_path / "raw", n=12, seed=5)
    path = tmp_path / "copy.h5"
    path.write_bytes(Path(h5forge.build(spec_file(tmp_path, raw, tmp_path / "out")).path).read_bytes())
    with h5py.File(path, "r+") as f:
        row = f["train/masks"][1]
        row.flat[0] ^= 1
        f["train/masks"][1] = row
    report = verify_file(path, **QUICK)
    assert not report.ok
    assert any("train[1]" in e and "does not match its checksum" in e for e in report.errors)


def test_a_format_2_version_verifies_takes_an_append_in_format_2_and_is_rebuilt_in_format_3(tmp_path, raw_new):
    out = tmp_path / "out"
    out.mkdir()
    with tarfile.open(FORMAT2) as tar:
        tar.extractall(out, filter="data")
    v1 = out / "dataset_v0001.h5"
    stored, computed = first_row_checksum(v1, hashlib.sha256)
    assert stored == computed  # the fixture's rows are sha256
    report = verify_file(v1, **QUICK)
    assert report.ok, report.errors
    assert report.checks["checksums"] == "ok (12 samples)"

    raw = make_raw(tmp_path / "raw", n=12, seed=5)
    spec = spec_file(tmp_path, raw, out)
    new_ids = drop_samples(raw_new, tmp_path / "inbox", ["cell_000001", "cell_000002", "cell_000003"], rename="n_")
    age_files(tmp_path / "inbox")
    appended = h5forge.append(spec)
    assert appended.version == 2
    v2 = out / "dataset_v0002.h5"
    with h5py.File(v2, "r") as f:
        assert int(f.attrs["format_version"]) == 2
        ids = {i.decode() for s in SPLITS for i in f[s]["ids"][()]}
        kinds = stored_kinds(spec_from_json(f["meta/spec"][()].decode()))
        n = int(f["train"].attrs["count"])
        assert [c.encode() for c in stored_checksums(f["train"], kinds, 0, n)] == list(f["train/checksum"][()])
    assert set(new_ids) < ids and len(ids) == 15
    report = verify_file(v2, **QUICK)
    assert report.ok, report.errors

    rebuilt = h5forge.build(spec)
    assert rebuilt.version == 3
    with h5py.File(rebuilt.path, "r") as f:
        assert int(f.attrs["format_version"]) == 3
        assert {i.decode() for s in SPLITS for i in f[s]["ids"][()]} == ids
    stored, computed = first_row_checksum(Path(rebuilt.path), blake3.blake3)
    assert stored == computed
    assert verify_file(rebuilt.path, **QUICK).ok


def test_the_same_values_hash_the_same_in_memory_and_from_the_file_in_both_formats():
    from h5forge._format.checksums import values_digest

    value = np.arange(12, dtype=">u2").reshape(3, 4)  # big-endian: hashed as little-endian bytes
    for fmt, hasher in ((2, hashlib.sha256), (3, blake3.blake3)):
        assert values_digest([value, "label"], fmt) == hasher(canonical(value) + canonical("label")).digest()
    assert values_digest([value], 2) != values_digest([value], 3)

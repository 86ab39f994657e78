"""verify as an adversary meets it: every value a reader returns is covered, broken files give a
BROKEN report (never an exception), and nothing stored in the file makes verify read outside the
source root or run for ever."""

from __future__ import annotations

import json
import os
import resource
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from h5forge._format.names import FORMAT_VERSION, SPLITS
from h5forge._store.verify import verify_file
from tests.helpers.tamper import copy_writable, flip, raw_pair, reader_view, small_version, thin_version

H5FORGE = str(Path(sys.executable).parent / "h5forge")
QUICK = {"resample": 0, "latency_reads": 0}


@pytest.fixture(scope="module")
def raws(tmp_path_factory):
    return raw_pair(tmp_path_factory.mktemp("trust"))


@pytest.fixture(scope="module")
def good(raws, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("good") / "dataset_v0001.h5"
    small_version(path, raws[0])
    os.chmod(path, 0o444)
    return path


@pytest.fixture
def copy(good, tmp_path) -> Path:
    return copy_writable(good, tmp_path / "dataset_v0001.h5")


def resign(path: Path) -> None:
    """Recompute every checksum and digest: a tamperer who knows the format."""
    from h5forge._format.checksums import stored_checksums, write_digests, write_file_digest
    from h5forge.kinds import stored_kinds
    from h5forge.spec import spec_from_json

    with h5py.File(path, "r+") as f:
        kinds = stored_kinds(spec_from_json(f["meta/spec"][()].decode()))
        for split in SPLITS:
            g = f[split]
            n = int(g.attrs["count"])
            if n:
                g["checksum"][:] = np.array(stored_checksums(g, kinds, 0, n), dtype="S64")
        write_digests(f)
        write_file_digest(f)


def run_limited(*args) -> subprocess.CompletedProcess:
    """The CLI in a process that may use 2 GiB at most (so a runaway read fails fast, not the
    machine); the timeout only bounds a read that never ends."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run([H5FORGE, *map(str, args)], capture_output=True, text=True, timeout=600,
                          preexec_fn=limit)


def test_the_fresh_file_is_healthy(good):
    report = verify_file(good, **QUICK)
    assert report.ok, report.errors
    assert report.checks["format"] == f"ok (h5forge v{FORMAT_VERSION})"
    assert report.checks["checksums"] == "ok (12 samples)"
    assert report.checks["split digests"] == "ok (3 splits)"


# ---- item 2: every value a reader can return is covered --------------------------------------

def test_a_label_edited_in_place_is_detected(good, tmp_path):
    """'infected' -> 'healthy!' wherever the file holds it (the column and the label index)."""
    data = good.read_bytes()
    offsets = [i for i in range(len(data)) if data.startswith(b"infected", i)]
    assert len(offsets) >= 2
    for at in offsets:
        edited = copy_writable(good, tmp_path / f"edit_{at}.h5")
        with open(edited, "r+b") as fh:
            fh.seek(at)
            fh.write(b"healthy!")
        assert reader_view(edited) != reader_view(good)
        report = verify_file(edited, **QUICK)
        assert not report.ok, f"edit at {at} passed verify"


def _bump(g: h5py.Group, name: str) -> None:
    ds = g[name]
    value = ds[0]
    if ds.dtype.kind in "OS":  # a string (or a row of them): change its first character
        text = value if not isinstance(value, np.ndarray) else value[0]
        text = text.decode() if isinstance(text, bytes) else text
        changed = ("X" if text[0] != "X" else "Y") + text[1:]
        if isinstance(value, np.ndarray):
            value = value.copy()
            value[0] = changed.encode() if ds.dtype.kind == "S" else changed
        else:
            value = changed
    elif ds.dtype == bool:
        value = not value
    else:
        value = np.asarray(value).copy()
        value.flat[0] = value.flat[0] + 1 if value.flat[0] < 200 else 1
    ds[0] = value


@pytest.mark.parametrize("name", ["images", "masks", "ids", "source_files", "source_sha256", "checksum",
                                  "meta/label", "meta/num_cells", "meta/stain", "meta/focus_score"])
def test_a_changed_per_sample_value_is_detected(copy, name):
    with h5py.File(copy, "r+") as f:
        _bump(f["train"], name)
    report = verify_file(copy, **QUICK)
    assert not report.ok
    assert report.checks["checksums"] == "FAILED"
    assert any(e.startswith("train[0] (id ") and "checksum" in e for e in report.errors), report.errors


@pytest.mark.parametrize("where, name", [
    ("train", "images_mean"), ("train", "images_std"), ("train", "images_histogram"), ("train", "masks_class_pixels"),
    ("train/masks", "classes"), ("train/images", "kind"),
])
def test_a_changed_split_or_dataset_attribute_is_detected(copy, where, name):
    with h5py.File(copy, "r+") as f:
        attrs = f[where].attrs
        assert name in attrs, list(attrs)
        value = attrs[name]
        attrs[name] = value + 1 if isinstance(value, (np.ndarray, np.number, int, float)) else f"{value}x"
    report = verify_file(copy, **QUICK)
    assert not report.ok
    assert any("train" in e and "digest" in e for e in report.errors), report.errors


@pytest.mark.parametrize("column", ["label", "stain", "masks"])
def test_a_reordered_row_index_is_detected(copy, column):
    """Swapping two rows across values keeps /index a permutation: only the digest sees it."""
    with h5py.File(copy, "r+") as f:
        rows = f[f"index/train/{column}/rows"]
        values = rows[()]
        values[[0, -1]] = values[[-1, 0]]
        rows[...] = values
    report = verify_file(copy, **QUICK)
    assert not report.ok
    assert any("digest" in e for e in report.errors), report.errors


def test_a_changed_spec_is_detected(copy):
    with h5py.File(copy, "r+") as f:
        spec = json.loads(f["meta/spec"][()].decode())
        spec["fields"]["images"]["fill"] = 7
        del f["meta/spec"]
        f.create_dataset("meta/spec", data=json.dumps(spec), dtype=h5py.string_dtype())
    report = verify_file(copy, **QUICK)
    assert not report.ok
    assert any("digest" in e for e in report.errors), report.errors


def as_format_1(path: Path) -> None:
    """What h5forge wrote before format 2: checksums of the image and mask bytes, no digests."""
    import hashlib

    with h5py.File(path, "r+") as f:
        f.attrs["format_version"] = 1
        for split in SPLITS:
            g = f[split]
            g.attrs.pop("digest", None)
            old = [hashlib.sha256(g["images"][i].tobytes() + g["masks"][i].tobytes()).hexdigest()
                   for i in range(int(g.attrs["count"]))]
            g["checksum"][:] = np.array(old, dtype="S64")


def test_an_old_format_file_says_what_its_checksums_cover(copy):
    """A format-1 file (checksums of the field bytes only) verifies, and the report says so."""
    as_format_1(copy)
    report = verify_file(copy, **QUICK)
    assert report.ok, report.errors
    assert report.checks["format"] == "ok (h5forge v1, an older format)"
    assert report.checks["checksums"] == "ok (12 samples, field bytes only)"
    assert any("format 1" in w and "ids, annotation columns" in w and "rebuild" in w for w in report.warnings)
    with h5py.File(copy, "r+") as f:  # what format 1 cannot see, it cannot report
        f["train/meta/label"][0] = "tampered"
    assert verify_file(copy, **QUICK).ok


def test_an_append_onto_a_format_1_version_asks_for_a_rebuild(raws, tmp_path):
    import h5forge
    from h5forge.errors import VersionError
    from h5forge._store.output import OWNER_FILE
    from tests.helpers.data import age_files, drop_samples
    from tests.helpers.files import spec_for, strays

    out = tmp_path / "out"
    small_version(out / "dataset_v0001.h5", raws[0])
    as_format_1(out / "dataset_v0001.h5")
    (out / "dataset_latest.h5").symlink_to("dataset_v0001.h5")
    inbox = tmp_path / "inbox"
    drop_samples(raws[1], inbox, ["new_000000"], rename="more_")
    age_files(inbox)
    spec = spec_for(raws[0], out)
    with pytest.raises(VersionError, match=r"^dataset_v0001.h5 is in format 1 \(older checksums\); rebuild it "):
        h5forge.append(spec, inbox=inbox)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted([
        "dataset_latest.h5", "dataset_v0001.h5", OWNER_FILE])  # the folder is claimed, nothing written
    assert strays(out) == []
    assert (inbox / "images" / "more_new_000000.png").exists()


# ---- item 10: a broken file is a BROKEN report, never an exception ----------------------------

def test_an_unreadable_checksum_column_is_reported(copy):
    """'filter returned failure' from the checksum read."""
    with h5py.File(copy, "r") as f:
        info = f["train/checksum"].id.get_chunk_info(0)
    for k in range(8, min(info.size, 40)):
        flip(copy, info.byte_offset + k, 0xFF)
    report = verify_file(copy, **QUICK)
    assert not report.ok
    assert any("checksum" in e and "cannot be read" in e for e in report.errors), report.errors


def test_a_corrupt_group_heap_is_reported(good, tmp_path):
    """'Object visitation failed': a group's local heap with a free list pointing past its end."""
    data = good.read_bytes()
    heaps = [i for i in range(len(data)) if data.startswith(b"HEAP", i)]
    assert len(heaps) >= 4
    for at in heaps:
        size = struct.unpack("<Q", data[at + 8:at + 16])[0]
        bad = bytearray(data)
        bad[at + 16:at + 24] = struct.pack("<Q", size + 8)
        damaged = tmp_path / f"heap_{at}.h5"
        damaged.write_bytes(bytes(bad))
        report = verify_file(damaged, **QUICK)
        assert not report.ok
        assert any("bad heap free list" in e for e in report.errors), report.errors


def test_a_file_that_crashes_hdf5_is_reported(raws, tmp_path):
    """A damaged virtual-dataset mapping makes HDF5 itself segfault when the dataset is opened
    (found by the fuzz test): verify, isolated as the CLI runs it, reports the file BROKEN."""
    thin = thin_version(tmp_path / "out", *raws)
    data = thin.read_bytes()
    at = data.find(b"train/source_files\x00")
    assert at > 0
    bad = bytearray(data)
    bad[at + 6 + 48] ^= 14
    damaged = thin.parent / "damaged.h5"
    damaged.write_bytes(bytes(bad))
    report = verify_file(damaged, isolate=True, **QUICK)
    assert not report.ok
    assert report.errors == [f"{damaged}: the HDF5 library crashed while reading it (exit code -11); "
                             "the file is corrupt"]
    r = run_limited("verify", damaged, "--compare", 0, "--latency-reads", 0)
    assert r.returncode == 1 and "crashed" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("replacement", ["zero bytes", "empty hdf5", "other version"])
def test_a_thin_version_whose_parent_was_replaced_is_broken(raws, tmp_path, replacement):
    thin = thin_version(tmp_path / "out", *raws)
    assert verify_file(thin, **QUICK).ok, verify_file(thin, **QUICK).errors
    parent = tmp_path / "out" / "dataset_v0001.h5"
    parent.unlink()
    if replacement == "zero bytes":
        parent.write_bytes(b"")
    elif replacement == "empty hdf5":
        h5py.File(parent, "w").close()
    else:
        small_version(parent, raws[1])
    report = verify_file(thin, **QUICK)
    assert not report.ok
    assert report.checks["dependencies"] == "FAILED"
    assert any("dataset_v0001.h5" in e for e in report.errors), report.errors


@pytest.mark.parametrize("keep", [0, 1, 8, 512, 2048, 0.5, -1])
def test_a_truncated_file_is_reported(good, tmp_path, keep):
    data = good.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else (len(data) + keep if keep < 0 else keep)
    cut = tmp_path / "cut.h5"
    cut.write_bytes(data[:n])
    report = verify_file(cut, **QUICK)
    assert not report.ok and report.errors


def test_a_folder_or_a_device_is_reported(tmp_path):
    for path in (tmp_path, Path("/dev/null")):
        report = verify_file(path, **QUICK)
        assert not report.ok
        assert report.errors == [f"{path}: not a regular file"]


# ---- item 13: nothing stored in the file is trusted -----------------------------------------

def test_sources_outside_the_root_or_not_regular_are_not_read(raws, tmp_path):
    raw = raws[0]
    path = tmp_path / "out" / "dataset_v0001.h5"
    small_version(path, raw)
    outside = tmp_path / "elsewhere.png"
    with h5py.File(path, "r") as f:
        first = f["train/source_files"][0][0].decode()
    shutil.copy(raw / first, outside)  # a perfectly good picture, but not below the root
    link = raw / "images" / "zero_link.png"
    link.unlink(missing_ok=True)
    link.symlink_to("/dev/zero")
    try:
        with h5py.File(path, "r+") as f:
            files = f["train/source_files"]
            rows = files[0:4]
            rows[0][0], rows[1][0] = "/dev/zero", os.path.relpath(outside, raw)
            rows[2][0], rows[3][0] = "images/zero_link.png", "images"
            files[0:4] = rows
        resign(path)
        r = run_limited("verify", path, "--resample", 100, "--latency-reads", 0)
        report = verify_file(path, resample=100, latency_reads=0)
    finally:
        link.unlink()
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 0, r.stdout + r.stderr  # the file is intact; its sources are suspicious
    assert report.ok
    warned = "\n".join(report.warnings)
    assert "train[0] source '/dev/zero' is outside the source root; not read" in warned
    assert f"train[1] source '{os.path.relpath(outside, raw)}' is outside the source root; not read" in warned
    assert "train[2] source 'images/zero_link.png' is outside the source root; not read" in warned
    assert "train[3] source 'images' is not a regular file; not read" in warned
    assert report.checks["sources"].startswith("ok (") and "4 not read" in report.checks["sources"]


def test_a_source_larger_than_the_limit_is_not_read(raws, tmp_path):
    path = tmp_path / "out" / "dataset_v0001.h5"
    small_version(path, raws[0])
    report = verify_file(path, resample=100, latency_reads=0, max_source_bytes=64)
    assert report.ok
    assert report.warnings and all("larger than the 64 bytes verify reads; not read" in w for w in report.warnings)


def _stored_spec(path: Path, **verify) -> None:
    with h5py.File(path, "r+") as f:
        spec = json.loads(f["meta/spec"][()].decode())
        spec["verify"].update(verify)
        del f["meta/spec"]
        f.create_dataset("meta/spec", data=json.dumps(spec), dtype=h5py.string_dtype())
    resign(path)


def test_counts_stored_in_the_file_are_capped(copy):
    _stored_spec(copy, latency_reads=300_000_000, resample=100_000_000)
    r = run_limited("verify", copy, "--source-root", copy.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    report = verify_file(copy, source_root=copy.parent)
    assert report.ok, report.errors
    assert report.stats["random_read_ms"]["reads"] == 1000
    assert "verify.latency_reads 300000000 stored in the file is capped at 1000; " \
           "pass --latency-reads to choose" in report.warnings
    assert "verify.resample 100000000 stored in the file is capped at 1000; pass --resample to choose" \
           in report.warnings


def test_cli_flags_override_the_stored_counts(copy):
    _stored_spec(copy, latency_reads=300_000_000)
    r = run_limited("verify", copy, "--latency-reads", 7, "--compare", 0)
    assert r.returncode == 0, r.stdout + r.stderr
    report = verify_file(copy, latency_reads=7, resample=0)
    assert report.stats["random_read_ms"]["reads"] == 7
    assert not any("capped" in w for w in report.warnings)


@pytest.mark.parametrize("attr, value", [("CLASS", b"DIMENSINN_SCALE"),
                                         ("NAME", b"This is a netCDF dimension but not a netCDF variable.      !  2")])
def test_a_changed_dimension_scale_class_or_name_is_detected(copy, attr, value):
    """No digest covers the scales' bookkeeping (HDF5 rewrites it); netCDF readers show it."""
    with h5py.File(copy, "r+") as f:
        scale = f["train/source_field"]
        scale.attrs.modify(attr, np.array(value, dtype=scale.attrs[attr].dtype))
    report = verify_file(copy, resample=0, latency_reads=0)
    assert not report.ok
    assert "/train/source_field is a dimension scale whose CLASS or NAME is not as written" in " ".join(report.errors)


def _scales(path: Path) -> list[str]:
    """Every dimension scale of the version's splits, by path."""
    found = []
    with h5py.File(path, "r") as f:
        for split in SPLITS:
            f[split].visititems(lambda name, o, s=split: found.append(f"{s}/{name}")
                                if isinstance(o, h5py.Dataset) and o.is_scale else None)
    return found


def test_the_version_has_a_scale_for_every_kind_of_axis(good):
    scales = {p.split("/", 1)[1] for p in _scales(good)}
    assert {"sample", "source_field", "images_axis1", "images_axis3", "masks_axis1"} <= scales


@pytest.mark.parametrize("write", ["ones", "zeros", "one value"])
def test_a_value_written_into_any_dimension_scale_is_detected(good, tmp_path, write):
    """A scale holds no values (netCDF readers show the fill value, zero): whatever is written into
    one, even zeros, is a change verify reports, naming the scale."""
    scales = _scales(good)
    assert len(scales) >= 3 * 5
    for k, name in enumerate(scales):
        copy = copy_writable(good, tmp_path / f"scale_{k}.h5")
        with h5py.File(copy, "r+") as f:
            ds = f[name]
            if write == "one value":
                ds[-1] = 7
            else:
                ds[...] = np.ones(ds.shape, ds.dtype) if write == "ones" else np.zeros(ds.shape, ds.dtype)
        report = verify_file(copy, checksums=False, **QUICK)
        assert not report.ok, name
        assert f"/{name} is a dimension scale that holds values" in " ".join(report.errors), (name, report.errors)



def test_a_value_written_into_a_thin_versions_dimension_scale_is_detected(raws, tmp_path):
    """A thin version's virtual datasets carry scales of their own, in its file: covered the same way."""
    thin = thin_version(tmp_path / "out", *raws)
    scales = _scales(thin)
    assert "train/sample" in scales and "train/images_axis1" in scales
    for k, name in enumerate(scales):
        folder = shutil.copytree(thin.parent, tmp_path / f"scale_{k}")  # the version and the files it reads
        with h5py.File(folder / thin.name, "r+") as f:
            f[name][0] = 1
        report = verify_file(folder / thin.name, checksums=False, **QUICK)
        assert not report.ok, name
        assert f"/{name} is a dimension scale that holds values" in " ".join(report.errors), (name, report.errors)

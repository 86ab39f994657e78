"""verify covers what the split digests leave out: the file's own attributes (name, codec,
codec_needs, parent, created_at, description, version), its diagnostics and its inputs catalog.
Each change is made with h5py on a real version file."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from h5forge._format.names import DIAGNOSTICS, Attr
from h5forge._store.verify import verify_file
from tests.helpers.tamper import copy_writable, raw_pair, small_version, thin_version

QUICK = {"resample": 0, "latency_reads": 0}


@pytest.fixture(scope="module")
def raws(tmp_path_factory):
    return raw_pair(tmp_path_factory.mktemp("filedigest"))


@pytest.fixture(scope="module")
def good(raws, tmp_path_factory):
    path = tmp_path_factory.mktemp("good") / "dataset_v0001.h5"
    small_version(path, raws[0])
    return path


def _root(name, value):
    def change(f):
        f.attrs[name] = value
    return change


def _summary(f):
    summary = json.loads(f[DIAGNOSTICS].attrs[Attr.SUMMARY])
    summary["compression_ratio"] = 0.5
    f[DIAGNOSTICS].attrs[Attr.SUMMARY] = json.dumps(summary)


def _inputs_id(f):
    ids = f["inputs/ids"]
    raw = bytearray(np.asarray(ids[0]).tobytes())
    raw[0] ^= 1
    ids[0] = np.frombuffer(bytes(raw), dtype=ids.dtype)[0]


CHANGES = {
    "name": _root(Attr.NAME, "another"), "codec": _root(Attr.CODEC, "gzip-1"),
    "codec_needs": _root(Attr.CODEC_NEEDS, "nothing"), "parent": _root(Attr.PARENT, 7),
    "created_at": _root(Attr.CREATED, "1999-01-01T00:00:00+00:00"), "description": _root(Attr.DESCRIPTION, "x"),
    "version": _root(Attr.VERSION, 4503599627370498), "diagnostics": _summary, "inputs": _inputs_id,
}


def test_the_file_as_written_verifies_with_its_digest(good):
    report = verify_file(good, **QUICK)
    assert report.ok and report.checks["file digest"] == "ok", report.errors


@pytest.mark.parametrize("what", sorted(CHANGES))
def test_a_changed_file_attribute_diagnostic_or_catalog_entry_is_detected(good, tmp_path, what):
    copy = copy_writable(good, tmp_path / "dataset_v0001.h5")
    with h5py.File(copy, "r+") as f:
        CHANGES[what](f)
    report = verify_file(copy, **QUICK)
    assert not report.ok and report.checks["file digest"] == "FAILED", (report.checks, report.errors)


def test_a_thin_version_and_an_export_carry_their_own_digest(raws, tmp_path):
    from h5forge._store.thin import export

    thin = thin_version(tmp_path / "out", *raws)
    assert verify_file(thin, **QUICK).checks["file digest"] == "ok"
    copy = export(thin, tmp_path / "copy.h5", codec="gzip-1")
    report = verify_file(copy, **QUICK)
    assert report.ok and report.checks["file digest"] == "ok", report.errors
    with h5py.File(copy, "r") as f:
        assert f.attrs[Attr.CODEC] == "gzip-1" and np.asarray(f.attrs[Attr.FILE_DIGEST]).size == 1

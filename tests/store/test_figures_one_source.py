"""Each figure has one source: a thin version's compression ratio is the same in its
/diagnostics, in ``verify`` and in ``info`` (all of its rows, over every file holding them, not
the last delta's), and an export recompressed with another codec says that codec and its own
ratio in /diagnostics. Each is checked against the bytes HDF5 reports for the files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import yaml

import h5forge
from h5forge._format.names import SPLITS
from h5forge._store.thin import export, row_files_of
from h5forge._store.verify import verify_file
from h5forge._views.info import version_info
from tests.helpers.data import REPO, age_files, drop_samples
from tests.helpers.files import make_raw

BULK = ("images", "masks")


def measured(path: Path) -> tuple[int, int]:
    """(raw, stored) array bytes of the sample arrays, over every file holding the version's rows."""
    raw = stored = 0
    folder = Path(os.path.realpath(path)).parent
    for seg in row_files_of(path):
        with h5py.File(folder / seg["file"], "r") as f:
            for split in SPLITS:
                for name in BULK:
                    ds = f[split][name]
                    raw += ds.size * ds.dtype.itemsize
                    stored += ds.id.get_storage_size()
    return raw, stored


def summary_of(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        return json.loads(f["diagnostics"].attrs["summary"])


def spec_file(tmp_path: Path, raw: Path) -> Path:
    data = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    data["source"] = {"root": str(raw), "inbox": str(tmp_path / "inbox")}
    data["output"]["dir"] = str(tmp_path / "out")
    data["fields"]["images"]["size"] = [64, 64]
    data["append"] = {"settle_seconds": 0}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_thin_versions_ratio_is_the_same_in_diagnostics_verify_and_info(tmp_path):
    raw = make_raw(tmp_path / "raw", n=30, seed=4)
    spare = make_raw(tmp_path / "spare", n=4, seed=9)
    spec = spec_file(tmp_path, raw)
    h5forge.build(spec)
    drop_samples(spare, tmp_path / "inbox", ["cell_000000", "cell_000001"], rename="new_")
    age_files(tmp_path / "inbox")
    appended = h5forge.append(spec)
    path = Path(appended.path)
    assert len(row_files_of(path)) == 2
    raw_bytes, stored_bytes = measured(path)
    ratio = round(stored_bytes / raw_bytes, 4)
    summary = summary_of(path)
    assert (summary["array_bytes_raw"], summary["array_bytes_stored"]) == (raw_bytes, stored_bytes)
    assert summary["compression_ratio"] == ratio
    assert sum(summary["split_bytes"].values()) == stored_bytes
    assert verify_file(path, resample=0, latency_reads=0).stats["compression_ratio"] == ratio
    sizes = version_info(path)["sizes"]
    assert (sizes["array_bytes_raw"], sizes["array_bytes_stored"]) == (raw_bytes, stored_bytes)
    delta = summary_of(path.parent / "dataset_v0002.delta.h5")
    assert delta["compression_ratio"] != ratio  # the delta alone is another figure


def test_an_export_with_another_codec_says_its_codec_and_ratio(tmp_path):
    raw = make_raw(tmp_path / "raw", n=30, seed=4)
    spec = spec_file(tmp_path, raw)
    source = Path(h5forge.build(spec).path)
    copy = export(source, tmp_path / "copy.h5", codec="gzip-1")
    raw_bytes, stored_bytes = measured(copy)
    summary = summary_of(copy)
    assert summary["codec"] == "gzip-1"
    assert (summary["array_bytes_raw"], summary["array_bytes_stored"]) == (raw_bytes, stored_bytes)
    assert summary["compression_ratio"] == round(stored_bytes / raw_bytes, 4)
    assert summary["compression_ratio"] != summary_of(source)["compression_ratio"]
    report = verify_file(copy, resample=0, latency_reads=0)
    assert report.ok, report.errors
    assert report.stats["codec"] == "gzip-1"
    assert report.stats["compression_ratio"] == summary["compression_ratio"]
    assert version_info(copy)["codec"] == "gzip-1"

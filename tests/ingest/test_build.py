"""Building a version without Prefect: a failed verification (the pipeline's steps) or a source without
a good sample (the pipeline) publishes nothing."""

from pathlib import Path

import h5py
import pytest

import h5forge
from h5forge.errors import VerificationFailed
from h5forge._ingest.build import write_version
from h5forge._ingest.discover import discover
from h5forge._pipeline.build import publish_version, verify_candidate
from h5forge._store.versions import latest, published, stage
from tests.helpers.data import demo_spec
from tests.helpers.files import make_version


def test_failed_verification_leaves_latest_untouched(tmp_path, small_inventory, raw_demo):
    out = tmp_path / "out"
    make_version(out, small_inventory, raw_demo)
    spec = demo_spec(raw_demo, out, codec="none")
    candidate = stage(out)
    write_version_small = discover(spec)
    write_version_small.samples = small_inventory.samples
    summary = write_version(spec, write_version_small, candidate)
    _flip_a_stored_byte(candidate.partial)
    report = verify_candidate(candidate, summary)
    assert not report.ok
    with pytest.raises(VerificationFailed, match="does not match its checksum"):
        publish_version(candidate, report)
    assert latest(out) == 1 and list(published(out)) == [1]
    assert not candidate.partial.exists()
    assert (out / "reports" / "dataset_v0002.failed.health.md").exists()


def _flip_a_stored_byte(path: Path) -> None:
    with h5py.File(path, "r") as f:
        split = next(s for s in ("train", "val", "test") if f[s].attrs["count"] > 0)
        offset = f[split]["images"].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as fh:
        fh.seek(offset + 5000)
        b = fh.read(1)
        fh.seek(offset + 5000)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_a_source_without_any_good_sample_publishes_nothing(tmp_path):
    from h5forge._ingest.build import NothingToBuild

    raw = tmp_path / "raw"
    (raw / "images").mkdir(parents=True)
    (raw / "images" / "lonely.png").write_bytes(b"")
    (raw / "annotations.json").write_text("[]")
    out = tmp_path / "out"
    spec = demo_spec(raw, out)
    with pytest.raises(NothingToBuild, match="no complete sample under"):
        h5forge.build(spec)
    assert latest(out) is None and not published(out)
    rows = (out / "quarantine" / "dataset_v0001.rejections.json").read_text()
    assert "lonely" in rows and "incomplete sample" in rows

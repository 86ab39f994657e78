"""Nightly rebuilds cost what changed: unchanged inputs publish nothing; a few changed samples give a
version identical to a full rebuild, with the unchanged ones copied from the previous version."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image, ImageOps

from h5forge._format.catalog import catalog_from_rows, read_catalog
from h5forge._format.names import SPLITS
from tests.helpers.files import make_raw, spec_for


def build(spec):
    """One version built by the pipeline (``h5forge.build``): (the published file, the build result)."""
    import h5forge

    result = h5forge.build(spec)
    assert not result.unchanged, result
    return Path(result.path), result


def contents(path: Path) -> dict:
    """Every value a version holds for its samples: each dataset of each split and of the index,
    the split attributes (counts, statistics) and the inputs catalog."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and name.split("/")[0] in (*SPLITS, "index", "inputs"):
                out[name] = obj[()]
        f.visititems(visit)
        for split in SPLITS:
            # (the split digest also covers the stored spec, which names the output folder)
            out.update({f"{split}@{k}": v for k, v in f[split].attrs.items() if k not in ("DIMENSION_LIST", "digest")})
        out["inputs@key"] = f["inputs"].attrs["key"]
        out["inputs@rules"] = f["inputs"].attrs["rules"]
    return out


def assert_same(a: Path, b: Path) -> None:
    left, right = contents(a), contents(b)
    assert sorted(left) == sorted(right)
    for k in left:
        if k.endswith("/sample") and left[k].dtype.kind == "f":  # a dimension scale holds no values
            continue
        assert np.array_equal(left[k], right[k]), k


@pytest.fixture
def raw(tmp_path) -> Path:
    return make_raw(tmp_path / "raw", n=120, seed=3)


def change_one_percent(raw: Path, spare: Path) -> dict[str, str]:
    """One sample's picture changed, one sample removed, one added (from ``spare``)."""
    records = json.loads((raw / "annotations.json").read_text())
    changed, removed = records[10]["id"], records[20]["id"]
    picture = raw / "images" / f"{changed}.png"
    with Image.open(picture) as img:
        ImageOps.invert(img.convert("RGB")).save(picture)
    for folder in ("images", "masks"):
        (raw / folder / f"{removed}.png").unlink()
        shutil.copy(spare / folder / "cell_000000.png", raw / folder / "zz_new.png")
    spare_record = json.loads((spare / "annotations.json").read_text())[0]
    records = [r for r in records if r["id"] != removed] + [{**spare_record, "id": "zz_new"}]
    (raw / "annotations.json").write_text(json.dumps(records))
    return {"changed": changed, "removed": removed, "added": "zz_new"}


def test_unchanged_inputs_are_recognised(raw, tmp_path):
    from h5forge._ingest.discover import discover
    from h5forge._ingest.incremental.inputs import fingerprint
    from h5forge._ingest.incremental.rebuild import unchanged_since

    spec = spec_for(raw, tmp_path / "out")
    build(spec)
    assert unchanged_since(spec.output.dir, fingerprint(spec, discover(spec))) == 1
    # a changed rule (the codec) or one changed annotation value is a change
    other = spec_for(raw, tmp_path / "out", codec="zstd")
    assert unchanged_since(spec.output.dir, fingerprint(other, discover(other))) is None
    records = json.loads((raw / "annotations.json").read_text())
    records[5]["num_cells"] += 1
    (raw / "annotations.json").write_text(json.dumps(records))
    assert unchanged_since(spec.output.dir, fingerprint(spec, discover(spec))) is None


@pytest.mark.parametrize("chunk_rows", [1, 4])
def test_a_one_percent_change_equals_a_full_rebuild(raw, tmp_path, chunk_rows):
    spec = spec_for(raw, tmp_path / "out", chunk_rows=chunk_rows)
    spec = spec.model_copy(update={"output": spec.output.model_copy(update={"allow_removals": True})})  # one goes
    first, full_summary = build(spec)
    assert full_summary.timings["reused"] == 0
    what = change_one_percent(raw, make_raw(tmp_path / "spare", n=2, seed=9))

    nightly, summary = build(spec)
    fresh, _ = build(spec_for(raw, tmp_path / "fresh", chunk_rows=chunk_rows))
    assert_same(nightly, fresh)
    t = summary.timings
    stored = full_summary.samples
    assert full_summary.samples + len(full_summary.rejections) == 120
    # every stored sample but the changed and the removed one is taken; the changed, the added and
    # any sample cleaning rejected last time are cleaned
    assert (t["reused"], t["cleaned"]) == (stored - 2, 120 - (stored - 2))
    if chunk_rows == 1:  # one sample per chunk: images and masks copied as stored chunks
        assert (t["reused_chunks_copied"], t["reused_rows_rewritten"]) == (2 * (stored - 2), 0)
    else:  # several samples share a chunk: rows decompressed and written again
        assert (t["reused_chunks_copied"], t["reused_rows_rewritten"]) == (0, 2 * (stored - 2))
    ids = {s: [v.decode() for v in h5py.File(nightly)[s]["ids"][()]] for s in SPLITS}
    everything = sum(ids.values(), [])
    assert what["removed"] not in everything and what["added"] in everything and what["changed"] in everything
    with h5py.File(first) as a, h5py.File(nightly) as b:  # the changed sample's pixels did change
        split = next(s for s in SPLITS if what["changed"] in ids[s])
        row = ids[split].index(what["changed"])
        old_row = [v.decode() for v in a[split]["ids"][()]].index(what["changed"])
        assert not np.array_equal(a[split]["images"][old_row], b[split]["images"][row])


def test_a_rebuild_after_appends_takes_the_appended_rows_from_their_delta(raw, tmp_path):
    """A thin latest version: its rows are taken from the files it reads (parent and delta)."""
    import h5forge
    from tests.helpers.data import age_files, drop_samples

    spec = spec_for(raw, tmp_path / "out")
    spec = spec.model_copy(update={"source": spec.source.model_copy(update={"inbox": tmp_path / "inbox"})})
    build(spec)
    spare = make_raw(tmp_path / "spare", n=3, seed=9)
    drop_samples(spare, tmp_path / "inbox", ["cell_000000", "cell_000001", "cell_000002"], rename="in_")
    age_files(tmp_path / "inbox")
    assert h5forge.append(spec).version == 2
    thin = spec.output.dir / "dataset_v0002.h5"
    with h5py.File(thin) as f:  # the merged catalog is the catalog of the thin version's rows
        merged, recomputed = read_catalog(f), catalog_from_rows(f)
    for name in ("content", "content_at", "ids"):
        assert np.array_equal(getattr(merged, name), getattr(recomputed, name)), name

    nightly, summary = build(spec)
    fresh, _ = build(spec_for(raw, tmp_path / "fresh").model_copy(update={"source": spec.source}))
    assert_same(nightly, fresh)
    stored = sum(h5py.File(thin)[s].attrs["count"] for s in SPLITS)
    assert (summary.timings["reused"], summary.timings["cleaned"]) == (stored, 120 + 3 - stored)


def nightly_spec(raw: Path, out: Path, **storage):
    spec = spec_for(raw, out, **storage)
    return spec.model_copy(update={"compute": spec.compute.model_copy(update={"batch_size": 2})})


def test_a_killed_nightly_rebuild_resumes_with_exact_statistics(raw, tmp_path):
    """A rebuild SIGKILLed after it copied and cleaned rows: its successor takes the partial file over
    with its copied and cleaned rows in place, recounts their statistics, and equals a full rebuild."""
    import os
    import signal
    import subprocess
    import sys

    from h5forge._format.names import RESUMABLE

    spec = nightly_spec(raw, tmp_path / "out")
    build(spec)
    records = json.loads((raw / "annotations.json").read_text())
    for rec in records[5::12]:  # ten pictures changed, spread over the ids
        picture = raw / "images" / f"{rec['id']}.png"
        with Image.open(picture) as img:
            ImageOps.invert(img.convert("RGB")).save(picture)
    child = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; "
         "from tests.ingest.incremental.test_rebuild import build, nightly_spec; "
         "build(nightly_spec(Path(sys.argv[1]), Path(sys.argv[2])))", str(raw), str(tmp_path / "out")],
        cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True, timeout=900,
        env={**os.environ, "H5FORGE_KILL_AT": "build:at-80%", "H5FORGE_CHECKPOINT_SECONDS": "0"})
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr

    resumed, summary = build(spec)
    assert resumed.name == "dataset_v0002.h5" and not (tmp_path / "out" / RESUMABLE).exists()
    # 8 of the 10 changed samples were cleaned before the kill: only 2 are cleaned again
    assert summary.timings["cleaned"] == 2 and summary.timings["resumed_in_place"] >= 96
    assert "resumed_rows" not in summary.timings  # none copied
    fresh, _ = build(nightly_spec(raw, tmp_path / "fresh"))
    assert_same(resumed, fresh)


def test_the_rows_a_rebuild_cleaned_are_checked_in_full(raw, tmp_path):
    from h5forge.errors import VerificationFailed
    from h5forge._ingest.incremental.rebuild import check_cleaned_rows

    spec = spec_for(raw, tmp_path / "out")
    path, _ = build(spec)
    copy = tmp_path / "copy.h5"
    shutil.copy(path, copy)
    copy.chmod(0o644)
    with h5py.File(copy, "r+") as f:
        f["train"]["images"][3] = 255 - f["train"]["images"][3]
    check_cleaned_rows(copy, spec, {"train": [0, 1, 2, 4], "val": [0]})  # the changed row is not one of them
    with pytest.raises(VerificationFailed, match=r"train\[3\]"):
        check_cleaned_rows(copy, spec, {"train": [2, 3], "val": []})


def test_ragged_signals_are_copied_row_by_row_and_equal_a_full_rebuild(tmp_path):
    """Recordings of different lengths share chunks, so their rows are read and written again."""
    from h5forge.spec import DatasetSpec
    from tests.kinds.test_signal import spec_data, write_edf

    root = tmp_path / "raw"
    (root / "rec").mkdir(parents=True)
    for i in range(8):
        write_edf(root / "rec" / f"r{i}.edf", seconds=2 + i % 3, seed=i)
    spec = DatasetSpec.model_validate(spec_data(root, tmp_path / "out"))
    build(spec)
    write_edf(root / "rec" / "r3.edf", seconds=4, seed=99)  # one recording changed, and longer
    nightly, summary = build(spec)
    fresh, _ = build(DatasetSpec.model_validate(spec_data(root, tmp_path / "fresh")))
    t = summary.timings
    assert (t["reused"], t["cleaned"], t["reused_chunks_copied"], t["reused_rows_rewritten"]) == (7, 1, 0, 3 * 7)
    assert_same(nightly, fresh)  # float sums too: rows are added and subtracted exactly


def test_an_unreadable_leftover_of_a_killed_build_is_discarded(raw, tmp_path):
    from h5forge._format.names import HASH_CACHE, LOCK, RESUME_SUFFIX
    from h5forge._ingest.discover import discover
    from h5forge._ingest.incremental.inputs import fingerprint

    spec = spec_for(raw, tmp_path / "out")
    out = Path(spec.output.dir)
    out.mkdir(parents=True)
    (out / ".dataset_v0001.h5.partial").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)  # cut short
    rules = fingerprint(spec, discover(spec)).rules
    (out / (".dataset_v0001.h5.partial" + RESUME_SUFFIX)).write_text(
        json.dumps({"counts": {"train": 5, "val": 0, "test": 0}, "stats": None, "listed": {}, "rules": rules}))
    path, summary = build(spec)
    assert "resumed_rows" not in summary.timings and summary.timings["reused"] == 0
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [HASH_CACHE, LOCK]

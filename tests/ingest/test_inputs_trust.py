"""Inputs the user drops in are never lost without a reason on record, and a run that would lose
many of them publishes nothing: mixed picture formats, the ``max_rejected`` limit, missing source
folders, Unicode spellings of one name, huge annotation files, inbox files with long names and
failures while the inbox is being sorted after a publish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import unicodedata
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from PIL import Image

import h5forge
from h5forge.errors import SourceMissing, SpecError, TooManyRejected
from h5forge._format.names import JOURNAL, REJECTIONS
from h5forge.spec import DatasetSpec, parse_spec
from tests.helpers.data import REPO

H5FORGE = str(Path(sys.executable).parent / "h5forge")


# ---- small real raw folders ---------------------------------------------------------------------

def picture(path: Path, seed: int, grey: bool = False) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    if grey:  # a binary mask
        Image.fromarray(((rng.random((24, 24)) > 0.5) * 255).astype(np.uint8)).save(path)
    else:
        Image.fromarray((rng.random((24, 24, 3)) * 255).astype(np.uint8)).save(path)


def make_pairs(root: Path, ids: list[str], suffix: str = ".png", masks: bool = True, seed: int = 0) -> None:
    for i, sid in enumerate(ids):
        picture(root / "images" / f"{sid}{suffix}", seed + i)
        if masks:
            picture(root / "masks" / f"{sid}.png", seed + 1000 + i, grey=True)


def spec_data(raw: Path, out: Path, name: str = "cells", images="images/*.png", masks: bool = True,
              **extra) -> dict:
    data = {"name": name, "source": {"root": str(raw)},
            "fields": {"images": {"kind": "image", "files": images, "size": [32, 32], "channels": 3}},
            "output": {"dir": str(out)}, **extra}
    if masks:
        data["fields"]["masks"] = {"kind": "mask", "files": "masks/*.png", "like": "images"}
    return data


def write_spec(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


def library_build(spec: DatasetSpec):
    """The spec built by the pipeline (``h5forge.build``): (the published file, the build result)."""
    result = h5forge.build(spec)
    return Path(result.path), result


def stored_ids(path: Path) -> list[str]:
    with h5py.File(path, "r") as f:
        return sorted(x.decode() for s in ("train", "val", "test") for x in f[s]["ids"][()])


def cli(*args, **env):
    return subprocess.run([H5FORGE, *map(str, args)], capture_output=True, text=True, timeout=900, cwd=REPO,
                          env={**os.environ, **env})


# ---- 1: mixed formats, and the max_rejected limit -----------------------------------------------

def test_init_on_mixed_formats_covers_every_format_and_the_build_takes_every_sample(tmp_path):
    raw = tmp_path / "mixed"
    ids = [f"s{i:03d}" for i in range(36)]
    for k, suffix in enumerate((".png", ".jpg", ".tif")):
        make_pairs(raw, ids[k::3], suffix)
    spec_path = tmp_path / "mixed.yaml"
    r = cli("init", raw, "--out", spec_path)
    assert r.returncode == 0, r.stdout + r.stderr
    files = yaml.safe_load(spec_path.read_text())["fields"]["images"]["files"]
    assert sorted(files) == ["images/*.jpg", "images/*.png", "images/*.tif"]
    assert yaml.safe_load(spec_path.read_text())["max_rejected"] == 0.1  # the limit is in sight, with its meaning
    data = yaml.safe_load(spec_path.read_text())
    data["output"]["dir"] = str(tmp_path / "out")
    write_spec(spec_path, data)
    result = h5forge.build(spec_path)
    assert result.version == 1 and result.rejected == 0 and sum(result.counts.values()) == 36


@pytest.mark.parametrize("value, limit_of_200", [(0.1, 20), ("25%", 50), (0, 0), (7, 7), (1.0, 200), ("3", 3)])
def test_max_rejected_takes_a_fraction_or_a_count(tmp_path, value, limit_of_200):
    spec = parse_spec(spec_data(tmp_path, tmp_path / "o", max_rejected=value), tmp_path)
    assert spec.rejected_limit(200) == limit_of_200
    default = parse_spec(spec_data(tmp_path, tmp_path / "o"), tmp_path)
    assert default.rejected_limit(360) == 36  # 10 % of what the build saw


@pytest.mark.parametrize("value, message", [
    (-1, "must be a count >= 0"),
    (1.5, "a fraction must be between 0 and 1, got 1.5 (a count is written as an integer)"),
    ("150%", "a percentage must be between 0 % and 100 %"),
    ("many", "'many' is neither a count (12), a fraction (0.1) nor a percentage ('10%')"),
])
def test_max_rejected_rejects_impossible_values(tmp_path, value, message):
    with pytest.raises(SpecError) as err:
        parse_spec(spec_data(tmp_path, tmp_path / "o", max_rejected=value), tmp_path)
    assert f"  max_rejected: Value error, {message}" in str(err.value)


def test_limit_is_inclusive_and_counts_every_input_seen(tmp_path):
    """8 complete samples + 2 images without a mask = 10 inputs: 2 rejected passes a limit of 2, not of 1."""
    raw = tmp_path / "raw"
    make_pairs(raw, [f"ok{i}" for i in range(8)])
    make_pairs(raw, ["lonely0", "lonely1"], masks=False)
    path, summary = library_build(parse_spec(spec_data(raw, tmp_path / "a", max_rejected=2), tmp_path))
    assert summary.rejected == 2 and len(stored_ids(path)) == 8
    with pytest.raises(TooManyRejected) as err:
        library_build(parse_spec(spec_data(raw, tmp_path / "b", max_rejected=1), tmp_path))
    assert str(err.value).startswith("2 of 10 inputs rejected (20 %), above max_rejected (1); nothing published. "
                                     "Most common reasons: 2 x incomplete sample: no file for masks (masks/*.png)")
    assert not list((tmp_path / "b").glob("*.h5")) and not list((tmp_path / "b").glob(".*.partial"))


def test_the_demo_data_stays_under_the_default_limit(tmp_path):
    """``h5forge demo-data`` writes defects on purpose; at its default sizes every kind builds."""
    from h5forge._demo import KINDS

    for kind, (generate, n) in KINDS.items():
        defects = generate(tmp_path / kind, n=3, seed=0, bad=True)  # how many defects each kind writes
        assert len(defects) <= 0.1 * (n + len(defects)), (kind, n, len(defects))


# ---- 18: a missing source folder ----------------------------------------------------------------

def test_a_missing_source_root_fails_before_anything_is_created(tmp_path):
    out = tmp_path / "out"
    spec_path = write_spec(tmp_path / "spec.yaml", spec_data(tmp_path / "nowhere", out))
    r = cli("build", spec_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.strip() == f"error: source folder {tmp_path / 'nowhere'} does not exist"
    with pytest.raises(SourceMissing, match="source folder .* does not exist"):
        h5forge.build(spec_path)
    assert not out.exists()


def test_a_missing_inbox_fails_before_anything_is_created(tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "out"
    make_pairs(raw, ["a", "b"])
    spec_path = write_spec(tmp_path / "spec.yaml", spec_data(raw, out))
    for args in (("append", spec_path, "--from", tmp_path / "typo"), ("watch", spec_path, "--inbox", tmp_path / "typo")):
        r = cli(*args)
        assert r.returncode == 1, r.stdout + r.stderr
        assert r.stderr.strip() == f"error: source folder {tmp_path / 'typo'} does not exist"
    with pytest.raises(SourceMissing, match="typo does not exist"):
        h5forge.append(spec_path, inbox=tmp_path / "typo")
    assert not out.exists() and not (tmp_path / "typo").exists()


# ---- 15: Unicode spellings ----------------------------------------------------------------------

NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")


def test_a_pair_spelled_in_two_normal_forms_is_one_sample_stored_as_given(tmp_path):
    from h5forge._ingest.discover import discover

    raw = tmp_path / "raw"
    picture(raw / "images" / f"{NFD}.png", 1)
    picture(raw / "masks" / f"{NFC}.png", 2, grey=True)
    make_pairs(raw, ["plain"])
    (raw / "annotations.json").write_text(json.dumps([{"id": NFC, "label": "a"}, {"id": "plain", "label": "b"}]))
    data = spec_data(raw, tmp_path / "out", annotations={"file": "annotations.json", "columns": {"label": "str"}})
    spec = parse_spec(data, tmp_path)
    inv = discover(spec)
    assert inv.rejections == []
    cafe = next(s for s in inv.samples if s.id != "plain")
    assert cafe.id == NFD and cafe.columns == {"label": "a"}  # the image's spelling, byte for byte
    path, _ = library_build(spec)
    assert NFD in stored_ids(path) and NFC not in stored_ids(path)


def test_two_files_whose_names_differ_only_by_normalisation_are_ambiguous(tmp_path):
    from h5forge._ingest.discover import discover

    raw = tmp_path / "raw"
    picture(raw / "images" / f"{NFD}.png", 1)
    picture(raw / "images" / f"{NFC}.png", 3)
    picture(raw / "masks" / f"{NFC}.png", 2, grey=True)
    spec = parse_spec(spec_data(raw, tmp_path / "out"), tmp_path)
    inv = discover(spec)
    assert inv.samples == []
    [r] = inv.rejections
    assert sorted(r.paths) == sorted([f"images/{NFC}.png", f"images/{NFD}.png"])
    assert r.reason == "ambiguous: 2 file names differ only by Unicode normalisation (NFC/NFD)"


# ---- 16: orphan annotation records, bounded reports ---------------------------------------------

def test_orphan_records_are_counted_not_listed_and_reports_stay_small(tmp_path):
    from h5forge._ingest.discover import ORPHANS_LISTED, discover
    from h5forge._store.reports import write_quarantine

    raw = tmp_path / "raw"
    make_pairs(raw, [f"k{i}" for i in range(5)])
    records = [{"id": f"k{i}", "label": "x" * 50} for i in range(5)]
    records += [{"id": f"orphan_{i:06d}", "label": "x" * 50} for i in range(200_000)]
    (raw / "annotations.json").write_text(json.dumps(records))
    data = spec_data(raw, tmp_path / "out", annotations={"file": "annotations.json", "columns": {"label": "str"}})
    spec = parse_spec(data, tmp_path)
    inv = discover(spec)
    assert len(inv.samples) == 5
    assert len(inv.rejections) == ORPHANS_LISTED + 1
    assert sum(r.count for r in inv.rejections) == 200_000
    summary_row = inv.rejections[-1]
    assert (summary_row.reason, summary_row.count) == ("annotation record without files", 200_000 - ORPHANS_LISTED)
    assert summary_row.as_dict()["reason"] == (f"annotation record without files: {200_000 - ORPHANS_LISTED} more, "
                                               "not listed one by one")

    with pytest.raises(TooManyRejected, match=r"^200000 of 200005 inputs rejected .* 200000 x annotation record"):
        library_build(spec)
    path, summary = library_build(parse_spec({**data, "max_rejected": 1.0, "output": {"dir": str(tmp_path / "o2")}},
                                             tmp_path))
    assert summary.rejected == 200_000 and stored_ids(path) == [f"k{i}" for i in range(5)]
    reports = write_quarantine(tmp_path / "o2", 1, summary.rejections)
    assert all(p.stat().st_size < 20_000 for p in reports), [p.stat().st_size for p in reports]
    assert "200000 input(s) were not added" in reports[1].read_text()
    with h5py.File(path, "r") as f:
        assert f[REJECTIONS].shape[0] == ORPHANS_LISTED + 1
    # the same 5 samples without the orphan records: the file is no more than a few kB smaller
    (raw / "annotations.json").write_text(json.dumps(records[:5]))
    plain, _ = library_build(parse_spec({**data, "output": {"dir": str(tmp_path / "o3")}}, tmp_path))
    assert path.stat().st_size - plain.stat().st_size < 60_000, (path.stat().st_size, plain.stat().st_size)


def test_rejection_tables_are_bounded_with_the_rest_counted(tmp_path):
    """5,000 rejected files: the quarantine JSON lists each, the Markdown report, the table in the
    version file and the Prefect artifact show the first rows and count the rest."""
    from h5forge._format.summary import TABLE_ROWS
    from h5forge._samples import Rejection
    from h5forge._store.reports import bounded_rows, write_quarantine

    rejections = [Rejection(f"bad{i}", (f"images/bad{i}.png",), "not an image") for i in range(5000)]
    rows = bounded_rows(rejections, TABLE_ROWS)
    assert len(rows) == TABLE_ROWS + 1
    assert rows[-1] == {"sample_id": "", "path": "", "reason": f"... and {5000 - TABLE_ROWS} more (see the quarantine "
                        "report)", "stage": ""}
    js, md = write_quarantine(tmp_path, 3, rejections)
    assert len(json.loads(js.read_text())) == 5000
    assert md.stat().st_size < 120_000 and f"and {5000 - TABLE_ROWS} more" in md.read_text()


# ---- 6: long names in the inbox, failures while its files are moved ----------------------------

APPEND_ONCE = textwrap.dedent("""
    import sys
    from tests.ingest.test_inputs_trust import append_once
    append_once(sys.argv[1])
""")


def append_once(spec_path: str):
    """One append by the pipeline (``h5forge.append``; a child process of the fault tests runs it):
    the published file, or None when nothing was appended."""
    return h5forge.append(spec_path).path


LONG = "é" * 125  # 250 bytes in UTF-8: the name fits, the name + ".reason" does not


@pytest.fixture
def inbox_dataset(tmp_path):
    """v1 built from 6 samples; an inbox with 2 new samples (sidecar records) and a rejected
    picture whose name is 254 bytes long."""
    raw, out, inbox = tmp_path / "raw", tmp_path / "out", tmp_path / "inbox"
    make_pairs(raw, [f"old{i}" for i in range(6)])
    data = spec_data(raw, out, max_rejected=1.0)
    data["source"]["inbox"] = str(inbox)
    data["annotations"] = {"required": False}
    data["append"] = {"settle_seconds": 0}  # every file in the inbox counts as settled
    spec_path = write_spec(tmp_path / "spec.yaml", data)
    library_build(parse_spec(data, tmp_path))
    make_pairs(inbox, ["new0", "new1"], seed=500)
    (inbox / "new0.json").write_text(json.dumps({"id": "new0"}))
    make_pairs(inbox, [LONG], seed=600)
    (inbox / "images" / f"{LONG}.png").write_bytes(b"this is no picture")
    return spec_path, out, inbox


def assert_completed(out: Path, inbox: Path):
    from h5forge._store.versions import latest

    assert latest(out) == 2 and not (out / JOURNAL).exists()
    assert sorted(stored_ids(out / "dataset_latest.h5")) == ["new0", "new1", *[f"old{i}" for i in range(6)]]
    assert sorted(p.name for p in inbox.rglob("*") if p.is_file() and "processed" not in p.parts
                  and "quarantine" not in p.parts) == []
    assert sorted(p.relative_to(inbox / "processed" / "v0002").as_posix()
                  for p in (inbox / "processed" / "v0002").rglob("*") if p.is_file()) == [
        "annotations.json", "images/new0.png", "images/new1.png", "masks/new0.png", "masks/new1.png", "new0.json"]
    moved = inbox / "quarantine" / "images" / f"{LONG}.png"
    assert moved.read_bytes() == b"this is no picture"
    [reason] = (inbox / "quarantine" / "images").glob("*.reason")
    assert len(reason.name.encode()) <= 255 and reason.name.startswith("é" * 50)
    text = reason.read_text()
    assert "not a readable picture" in text or "cannot" in text or "image" in text, text
    assert f"{LONG}.png" in text  # a shortened name still says which file it is about
    assert (inbox / "quarantine" / "masks" / f"{LONG}.png").exists()


def test_a_rejected_inbox_file_with_a_long_name_gets_a_reason_file_that_fits(inbox_dataset):
    spec_path, out, inbox = inbox_dataset
    assert append_once(str(spec_path)).endswith("dataset_v0002.h5")
    assert_completed(out, inbox)


MOVES = 7  # 4 files of the two samples, 1 sidecar, 2 files of the rejected sample


@pytest.mark.parametrize("point", [f"append:move-{i}" for i in range(MOVES)] + ["append:reasons", "append:records"])
def test_a_kill_between_inbox_moves_is_completed_by_the_next_append(inbox_dataset, point):
    spec_path, out, inbox = inbox_dataset
    child = subprocess.run([sys.executable, "-c", APPEND_ONCE, str(spec_path)], cwd=REPO, capture_output=True,
                           text=True, timeout=900, env={**os.environ, "H5FORGE_KILL_AT": point})
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    assert (out / JOURNAL).exists()  # published, the moves not finished
    assert append_once(str(spec_path)) is None  # recovery finished the moves; nothing new to append
    assert_completed(out, inbox)


def test_a_move_that_fails_is_reported_in_one_line_and_the_next_append_completes_it(inbox_dataset):
    from h5forge.errors import InboxMoveFailed

    spec_path, out, inbox = inbox_dataset
    (inbox / "quarantine").write_text("a file where the quarantine folder must go")
    with pytest.raises(InboxMoveFailed) as err:
        append_once(str(spec_path))
    message = str(err.value)
    assert "\n" not in message and message.startswith("dataset_v0002.h5 is published, but 4 inbox file(s) could "
                                                       "not be moved or written")
    assert "rerun append to finish" in message
    assert not (inbox / "images" / "new0.png").exists()  # the other moves were done
    (inbox / "quarantine").unlink()
    assert append_once(str(spec_path)) is None
    assert_completed(out, inbox)

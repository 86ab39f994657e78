"""One duplicates rule for a full build and an append (``duplicates`` in the spec): identical raw
content under two names is one sample by default (the first in id order, the rest rejected with
the name of the one kept), or every copy with ``keep_all``. Pictures written by Pillow."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import h5forge
from h5forge.spec import parse_spec
from tests.helpers.data import age_files


def _pictures(folder: Path, seeds: dict[str, int]) -> None:
    """BMP pictures: every one of the same size in bytes, so only their content tells them apart."""
    from PIL import Image

    (folder / "images").mkdir(parents=True, exist_ok=True)
    for name, seed in seeds.items():
        pixels = np.random.default_rng(seed).integers(0, 255, (24, 24, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / "images" / f"{name}.bmp")


def _spec(tmp_path: Path, **extra):
    return parse_spec(
        {
            "name": "dups",
            "source": {"root": "raw", "inbox": "inbox"},
            "output": {"dir": "out"},
            "splits": {"ratios": {"train": 1.0}},
            "max_rejected": 0.5,
            "fields": {"images": {"kind": "image", "files": "images/*.bmp", "size": [24, 24]}},
            **extra,
        },
        tmp_path,
    )


def _ids(path) -> list[str]:
    from h5forge.read._reader import SplitReader

    with SplitReader(path, "train", fields=["images"]) as r:
        return sorted(r.ids())


def test_a_build_keeps_the_first_of_identical_files_and_reports_the_rest_as_an_append_does(tmp_path):
    _pictures(tmp_path / "raw", {f"p{k}": k for k in range(6)})
    for copy in ("q_copy", "a_copy"):  # a_copy sorts first: it is the one kept
        shutil.copy(tmp_path / "raw" / "images" / "p3.bmp", tmp_path / "raw" / "images" / f"{copy}.bmp")
    built = h5forge.build(_spec(tmp_path))
    assert _ids(built.path) == ["a_copy", "p0", "p1", "p2", "p4", "p5"]
    reasons = {r.sample_id: r.reason for r in built.rejections}
    assert set(reasons) == {"p3", "q_copy"}
    for sid in ("p3", "q_copy"):
        assert reasons[sid].startswith("duplicate: identical content is earlier in this build as 'a_copy'")
    report = json.loads((tmp_path / "out" / "quarantine" / "dataset_v0001.rejections.json").read_text())
    assert {"p3", "q_copy"} <= {row["sample_id"] for row in report}
    again = h5forge.build(_spec(tmp_path))
    assert again.unchanged  # the same rule gives the same inputs: nothing new to publish

    (tmp_path / "inbox" / "images").mkdir(parents=True)
    for copy in ("z_copy", "new_twin", "new_twin2"):
        src = "p3" if copy == "z_copy" else "p5"
        shutil.copy(tmp_path / "raw" / "images" / f"{src}.bmp", tmp_path / "inbox" / "images" / f"{copy}.bmp")
    age_files(tmp_path / "inbox")
    added = h5forge.append(_spec(tmp_path))
    assert added.added == 0
    appended = {r.sample_id: r.reason for r in added.rejections}
    assert appended["z_copy"].startswith("duplicate: identical content is already in the dataset as 'a_copy'")
    assert appended["new_twin"].startswith("duplicate: identical content is already in the dataset as 'p5'")


def test_keep_all_keeps_every_copy_in_a_build_and_an_append(tmp_path):
    _pictures(tmp_path / "raw", {f"p{k}": k for k in range(4)})
    shutil.copy(tmp_path / "raw" / "images" / "p1.bmp", tmp_path / "raw" / "images" / "p1_copy.bmp")
    built = h5forge.build(_spec(tmp_path, duplicates="keep_all"))
    assert _ids(built.path) == ["p0", "p1", "p1_copy", "p2", "p3"] and built.rejected == 0
    (tmp_path / "inbox" / "images").mkdir(parents=True)
    shutil.copy(tmp_path / "raw" / "images" / "p2.bmp", tmp_path / "inbox" / "images" / "p2_again.bmp")
    age_files(tmp_path / "inbox")
    added = h5forge.append(_spec(tmp_path, duplicates="keep_all"))
    assert added.added == 1 and added.rejections == ()


def test_an_unknown_duplicates_policy_is_a_spec_error(tmp_path):
    from h5forge.errors import SpecError

    with pytest.raises(SpecError, match="duplicates"):
        _spec(tmp_path, duplicates="newest")


def test_duplicates_are_reported_but_not_counted_against_max_rejected(tmp_path):
    _pictures(tmp_path / "raw", {f"p{k}": k for k in range(4)})
    for k in range(4):  # as many copies as originals: half the inputs
        shutil.copy(tmp_path / "raw" / "images" / f"p{k}.bmp", tmp_path / "raw" / "images" / f"z{k}.bmp")
    (tmp_path / "raw" / "images" / "broken.bmp").write_bytes(b"BM not a picture")
    built = h5forge.build(_spec(tmp_path, max_rejected=1))  # one bad input allowed: the broken one
    assert _ids(built.path) == ["p0", "p1", "p2", "p3"]
    assert sorted(r.sample_id for r in built.rejections) == ["broken", "z0", "z1", "z2", "z3"]


def test_copies_of_a_bad_input_count_as_bad_inputs_each_with_its_reason(tmp_path):
    from h5forge.errors import TooManyRejected

    _pictures(tmp_path / "raw", {f"p{k}": k for k in range(8)})
    for name in ("a_broken", "b_broken"):  # two copies of one broken file, and two empty files
        (tmp_path / "raw" / "images" / f"{name}.bmp").write_bytes(b"BM not a picture")
    for name in ("c_empty", "d_empty"):
        (tmp_path / "raw" / "images" / f"{name}.bmp").write_bytes(b"")
    with pytest.raises(TooManyRejected, match="4 of 12 inputs rejected"):
        h5forge.build(_spec(tmp_path, max_rejected=3))
    built = h5forge.build(_spec(tmp_path, max_rejected=4))
    reasons = {r.sample_id: r.reason for r in built.rejections}
    assert reasons["b_broken"].startswith("duplicate: identical content is earlier in this build as 'a_broken'")
    assert not reasons["d_empty"].startswith("duplicate") and not reasons["c_empty"].startswith("duplicate")


def test_the_policy_is_no_field_rule_a_dataset_without_duplicates_is_unchanged_under_either(tmp_path):
    from h5forge._ingest.incremental.inputs import rules_hash

    _pictures(tmp_path / "raw", {f"p{k}": k for k in range(4)})
    assert rules_hash(_spec(tmp_path)) == rules_hash(_spec(tmp_path, duplicates="keep_all"))
    first = h5forge.build(_spec(tmp_path))
    again = h5forge.build(_spec(tmp_path, duplicates="keep_all"))
    assert again.unchanged and again.version == first.version


def test_a_rebuild_finds_a_new_copy_of_a_file_it_knows_from_its_hash_cache(tmp_path):
    """A rebuild compares files it knows (the hash cache) by their digests and reads only the new ones:
    a new copy of a known file is still a duplicate, whichever name sorts first, and a file changed
    to another's content is one too."""
    import time

    from h5forge._ingest.incremental.hash_cache import RACY_SECONDS

    _pictures(tmp_path / "raw", {f"p{k}": k for k in range(6)})
    time.sleep(RACY_SECONDS)  # settled files: the build records them in the hash cache
    spec = _spec(tmp_path, output={"dir": "out", "allow_removals": True})
    first = h5forge.build(spec)
    assert _ids(first.path) == ["p0", "p1", "p2", "p3", "p4", "p5"]
    images = tmp_path / "raw" / "images"
    shutil.copy(images / "p2.bmp", images / "z_copy.bmp")
    shutil.copy(images / "p4.bmp", images / "a_copy.bmp")
    (images / "p5.bmp").unlink()
    shutil.copy(images / "p0.bmp", images / "p5.bmp")  # p5 now holds p0's pixels
    second = h5forge.build(spec)
    assert second.timings["reused"] >= 4  # p0 to p3 at least, taken from v1 (their files known by the cache)
    assert _ids(second.path) == ["a_copy", "p0", "p1", "p2", "p3"]
    reasons = {r.sample_id: r.reason for r in second.rejections}
    assert set(reasons) == {"z_copy", "p4", "p5"}
    assert "as 'p2'" in reasons["z_copy"] and "as 'a_copy'" in reasons["p4"] and "as 'p0'" in reasons["p5"]


def test_a_copy_annotated_otherwise_says_so_in_its_reason(tmp_path):
    """The same picture under two labels: one is kept, and the copy's reason says which label is
    dropped with it, so the conflict is not lost in a list of duplicates."""
    _pictures(tmp_path / "raw", {f"p{k}": k for k in range(4)})
    shutil.copy(tmp_path / "raw" / "images" / "p2.bmp", tmp_path / "raw" / "images" / "a_copy.bmp")
    shutil.copy(tmp_path / "raw" / "images" / "p1.bmp", tmp_path / "raw" / "images" / "b_copy.bmp")
    labels = {"a_copy": "dog", "b_copy": "cat", "p0": "cat", "p1": "cat", "p2": "cat", "p3": "dog"}
    (tmp_path / "raw" / "labels.json").write_text(json.dumps([{"id": k, "label": v} for k, v in labels.items()]))
    spec = _spec(tmp_path, annotations={"file": "labels.json", "columns": {"label": "str"}})
    built = h5forge.build(spec)
    assert _ids(built.path) == ["a_copy", "b_copy", "p0", "p3"]
    reasons = {r.sample_id: r.reason for r in built.rejections}
    assert reasons == {
        "p2": "duplicate: identical content is earlier in this build as 'a_copy', annotated otherwise: label "
              "'dog' there, 'cat' here (the spec's duplicates: keep_all keeps both)",
        "p1": "duplicate: identical content is earlier in this build as 'b_copy' (the spec's duplicates: "
              "keep_all keeps both)",
    }

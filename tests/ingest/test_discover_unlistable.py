"""A folder below the source that the build's user may not list: its files are not seen, so
discovery says so, a rejection naming the folder, and never takes a sample whose file lies there
for one without it (a YOLO picture for a background under ``missing: empty``). Discovery runs as
an unprivileged user: in a child process that drops root's rights when the tests run as root."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.kinds.boxes.test_boxes import PICTURES, _spec, _yolo_folder, coco_folder  # noqa: F401

NOBODY = 65534
DISCOVER = """
import json, os, sys
from h5forge.spec import load_spec
from h5forge._ingest.discover import discover
spec = load_spec(sys.argv[1])  # everything imported while the interpreter's files may be read
if os.geteuid() == 0:
    os.setgid({uid}); os.setuid({uid})
inv = discover(spec)
print(json.dumps({{"samples": [s.id for s in inv.samples],
                  "files": {{s.id: s.files for s in inv.samples}},
                  "rejections": [[r.sample_id, list(r.paths), r.reason] for r in inv.rejections]}}))
"""


@pytest.fixture
def shared(tmp_path):
    """A folder every user may enter (pytest's own are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="h5forge-unlistable-"))
    folder.chmod(0o755)
    yield folder
    for p in folder.rglob("*"):
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(folder)


def _discover(spec_file: Path) -> dict:
    res = subprocess.run([sys.executable, "-c", DISCOVER.format(uid=NOBODY), str(spec_file)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def test_a_label_folder_the_user_may_not_list_makes_no_picture_a_background(coco_folder, tmp_path, shared):
    raw = _yolo_folder(coco_folder, tmp_path)
    raw = Path(shutil.copytree(raw, shared / "yolo"))
    for p in [raw, *raw.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    spec_file = shared / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(_spec(raw, shared / "out", {"files": "labels/*.txt", "missing": "empty"})))
    spec_file.chmod(0o644)

    seen = _discover(spec_file)
    assert sorted(seen["samples"]) == sorted(PICTURES) and seen["rejections"] == []
    assert all(files.get("boxes") == f"labels/{sid}.txt" for sid, files in seen["files"].items())

    (raw / "labels").chmod(0o300)  # entered, not listed: a folder this user may not read
    seen = _discover(spec_file)
    assert seen["samples"] == []  # no picture passes for a background while its label may lie there
    reasons = {tuple(paths): reason for _, paths, reason in seen["rejections"]}
    assert reasons[("labels",)] == "cannot list this folder (permission denied): the files in it are not seen"
    for sid in PICTURES:
        assert reasons[(f"images/{sid}.png",)].startswith("incomplete sample: no file for boxes"), sid

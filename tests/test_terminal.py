"""What a person sees of `h5forge verify`: on a real pseudo-terminal (screen rebuilt by a terminal
emulator) and piped, as real subprocesses on a version the pipeline built. (The flow runs' output:
tests/flows/test_terminal.py.)"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.data import demo_spec
from tests.helpers.terminal import in_terminal, user_env

H5FORGE = str(Path(sys.executable).parent / "h5forge")


@pytest.fixture(scope="module")
def published(raw_demo, tmp_path_factory):
    """A version built by the pipeline (no Prefect); its path through dataset_latest.h5."""
    import h5forge

    out = tmp_path_factory.mktemp("terminal") / "out"
    assert h5forge.build(demo_spec(raw_demo, out)).version == 1
    return out / "dataset_latest.h5"


def test_verify_on_a_terminal_is_a_table(published, tmp_path):
    code, raw, screen = in_terminal([H5FORGE, "verify", published], user_env(tmp_path / "home"))
    assert code == 0
    assert b"\x1b[" in raw  # coloured
    assert screen[0] == "dataset_latest.h5 → dataset_v0001.h5: HEALTHY"
    cells = [re.split(r"\s{2,}", line.strip()) for line in screen[1:]]
    rows = {c[0]: c[1] for c in cells if len(c) == 2}
    assert rows["checksums"] == "ok (40 samples)"
    assert rows["sources"] == "ok (16 samples re-derived from their sources and compared, 0 sources changed or gone)"
    assert re.fullmatch(r"\d+\.\d MB", rows["file size"])
    assert rows["samples"] == "train 30, val 4, test 6 (40 in all)"
    text = "\n".join(screen)
    assert "```" not in text and "| check |" not in text and "#" not in text  # no raw Markdown


def test_verify_json_is_for_scripts(published):
    r = subprocess.run([H5FORGE, "verify", published, "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] is True and report["errors"] == []
    assert report["checks"]["checksums"] == "ok (40 samples)"
    assert report["stats"]["counts"] == {"train": 30, "val": 4, "test": 6}
    assert report["stats"]["file_bytes"] == published.resolve().stat().st_size


def test_verify_of_a_broken_file_lists_the_reasons_plainly_when_piped(tmp_path):
    r = subprocess.run([H5FORGE, "verify", tmp_path / "nope.h5"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1
    assert r.stdout.splitlines()[0] == "nope.h5: BROKEN"
    assert "✗ " + str(tmp_path / "nope.h5") + ": no such file" in r.stdout
    assert "\x1b" not in r.stdout

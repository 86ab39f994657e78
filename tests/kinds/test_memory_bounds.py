"""Memory stays bounded on hostile inputs: files over the field's byte limit are rejected unread,
symlinks out of the source folder are rejected, pictures much larger than their target are
decoded into a bounded amount of memory. Each case runs in a fresh process whose peak RSS is
measured (psutil for the current RSS, /proc/self/status VmHWM for the peak)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.data import REPO

GIB = 1 << 30
MIB = 1 << 20

CLEAN = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import psutil
    import yaml
    from h5forge._ingest.clean import clean_batch
    from h5forge._ingest.discover import discover
    from h5forge.spec import parse_spec

    def peak():  # VmHWM: this process image's own peak (getrusage would count the forking parent's)
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))

    data = json.loads(sys.argv[1])
    spec = parse_spec(data, Path(data["source"]["root"]))
    base = psutil.Process().memory_info().rss
    inv = discover(spec)
    batch = clean_batch(spec, inv.root, inv.samples, encode=False)  # the arrays, not their chunks
    print(json.dumps({
        "taken": batch.ids,
        "shape": {k: list(getattr(v, "values", v).shape) for k, v in batch.arrays.items()  # ragged: its values
                  if hasattr(getattr(v, "values", v), "shape")},
        "rejected": [[r.sample_id, r.reason] for r in [*inv.rejections, *batch.rejections]],
        "base_rss": base, "rss": psutil.Process().memory_info().rss,
        "peak_rss": peak(),
    }))
""")


MAKE_HUGE = textwrap.dedent("""
    import sys
    import numpy as np
    from PIL import Image
    n = 7999
    ramp = (np.arange(n, dtype=np.uint32) * 255 // (n - 1)).astype(np.uint8)
    rgb = np.empty((n, n, 3), np.uint8)
    rgb[..., 0] = ramp[None, :]
    rgb[..., 1] = ramp[:, None]
    rgb[..., 2] = 90
    Image.fromarray(rgb).save(sys.argv[1], compress_level=1)
""")  # in its own process, so the test process never holds the 192 MB array


def image_spec(root: Path, size=(64, 64), **image) -> dict:
    return {"name": "bounds", "source": {"root": str(root)},
            "fields": {"images": {"kind": "image", "files": "images/*.png", "size": list(size), **image}},
            "output": {"dir": str(root.parent / "out")}}


def clean_in_a_fresh_process(spec: dict) -> dict:
    res = subprocess.run([sys.executable, "-c", CLEAN, json.dumps(spec)], capture_output=True, text=True,
                         timeout=900, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def small_png(path: Path, size=(40, 40)) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((*size, 3), 120, np.uint8)).save(path)


@pytest.fixture
def symlinked_giant(tmp_path):
    """A source folder with one good picture and a symlink to a 1 GiB sparse file outside it."""
    root = tmp_path / "raw"
    small_png(root / "images" / "good.png")
    giant = tmp_path / "elsewhere" / "giant.bin"
    giant.parent.mkdir()
    with open(giant, "wb") as fh:
        fh.truncate(GIB)  # sparse: costs no disk
    (root / "images" / "giant.png").symlink_to(giant)
    return root


def test_a_symlink_out_of_the_source_folder_is_rejected_without_reading_it(symlinked_giant):
    got = clean_in_a_fresh_process(image_spec(symlinked_giant))
    assert got["taken"] == ["good"]
    [(sid, reason)] = got["rejected"]
    assert sid == "giant"
    assert reason == (f"symlink leads outside the source folder (to {symlinked_giant.parent / 'elsewhere' / 'giant.bin'}); "
                      "set source.allow_symlinks_outside: true to take it")
    assert got["rss"] - got["base_rss"] < 64 * MIB
    assert got["peak_rss"] - got["base_rss"] < 32 * MIB, got  # measured: 67 MiB peak, 65 MiB after imports


def test_an_allowed_symlink_to_a_giant_file_is_rejected_by_size_unread(symlinked_giant):
    spec = image_spec(symlinked_giant)
    spec["source"]["allow_symlinks_outside"] = True
    got = clean_in_a_fresh_process(spec)
    assert got["taken"] == ["good"]
    [(sid, reason)] = got["rejected"]
    assert sid == "giant"
    assert reason == (f"file is {GIB:,} bytes, larger than the field's limit of {256 * MIB:,} (max_bytes)")
    assert got["peak_rss"] - got["base_rss"] < 32 * MIB, got  # measured: 67 MiB peak, 65 MiB after imports
    spec["fields"]["images"]["max_bytes"] = 1000  # the limit is the field's
    got = clean_in_a_fresh_process(spec)
    assert got["taken"] == ["good"]
    assert got["rejected"] == [["giant", f"file is {GIB:,} bytes, larger than the field's limit of 1,000 (max_bytes)"]]


@pytest.fixture(scope="module")
def huge_png(tmp_path_factory) -> Path:
    """A 7999 x 7999 RGB PNG (just under the default max_pixels of 64 M), smooth so it stays small."""
    root = tmp_path_factory.mktemp("huge") / "raw"
    (root / "images").mkdir(parents=True)
    subprocess.run([sys.executable, "-c", MAKE_HUGE, str(root / "images" / "huge.png")], check=True, timeout=900)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("larger", ["shrink", "crop"])
def test_a_7999_square_png_for_a_64_square_target_decodes_in_bounded_memory(huge_png, larger):
    got = clean_in_a_fresh_process(image_spec(huge_png, larger=larger))
    assert got["taken"] == ["huge"] and got["shape"]["images"] == [1, 3, 64, 64]
    # decoded RGB is 7999^2 x 4 bytes = 256 MB in Pillow; before, the conversions of the whole
    # picture took 0.8-3.2 GB. Measured here: 312 MiB peak for the whole process, 65 MiB after imports.
    print(f"peak RSS ({larger}): {got['peak_rss'] / MIB:.0f} MiB, base {got['base_rss'] / MIB:.0f} MiB")
    assert got["peak_rss"] - got["base_rss"] < 300 * MIB, got


def test_a_picture_too_large_to_decode_is_rejected_by_its_decoded_bytes(huge_png):
    got = clean_in_a_fresh_process(image_spec(huge_png, max_decoded_bytes=100 * MIB))
    assert got["taken"] == []
    [(sid, reason)] = got["rejected"]
    assert reason == (f"too large to decode: 7999x7999 RGB takes {7999 * 7999 * 4:,} bytes decoded, "
                      f"limit is {100 * MIB:,} (max_decoded_bytes)")
    assert got["peak_rss"] - got["base_rss"] < 64 * MIB, got

"""The read side in a training process: no picture decoder, dask or Prefect gets imported, and Pillow's own
decompression-bomb guard is left as it is."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_importing_the_readers_loads_no_picture_decoder_dask_or_prefect():
    loaded = _run("import sys, h5forge.read._reader, h5forge.read.torch, h5forge.read.jax, h5forge.read._sampler, "
                  "h5forge.read._collate\n"
                  "print(sorted(m for m in ('PIL', 'imagecodecs', 'simplejpeg', 'dask', 'distributed', 'prefect') "
                  "if m in sys.modules))")
    assert loaded == "[]"


def test_importing_the_readers_loads_no_field_kind():
    """The kinds' registry loads on first use (a version opened), not when the readers are imported:
    the readers load the kinds' contract (the core and its capabilities), no kind's own module."""
    loaded = _run("import sys, h5forge.read._reader, h5forge.read.torch, h5forge.read.jax\n"
                  "before = set(sys.modules)\n"
                  "from h5forge.kinds import REGISTRY\n"
                  "kinds = {REGISTRY[k].__module__ for k in REGISTRY}\n"
                  "print(sorted(kinds & before), len(kinds), kinds <= set(sys.modules))")
    assert loaded == "[] 9 True"  # h5forge's eight and the example package's vector


def test_the_write_side_keeps_pillows_bomb_guard():
    limit = _run("from PIL import Image; before = Image.MAX_IMAGE_PIXELS\n"
                 "import h5forge._ingest.clean, h5forge._ingest.writer, h5forge._store.verify\n"
                 "print(Image.MAX_IMAGE_PIXELS == before and before is not None)")
    assert limit == "True"

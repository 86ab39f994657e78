"""The build flow draws the published version's contact sheet and attaches it to its run."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image
from prefect.artifacts import Artifact

from h5forge._format import markdown
from tests.helpers.data import write_spec_file

pytestmark = pytest.mark.e2e  # the session's real Prefect server


def test_the_build_attaches_the_preview_as_an_embedded_png(prefect_server, raw_new, tmp_path):
    from h5forge.flows.build import build_dataset

    out = tmp_path / "out"
    build_dataset(str(write_spec_file(raw_new, out, tmp_path / "spec.yaml")))  # 72 good samples
    png = out / "reports" / "dataset_v0001.preview.png"
    with Image.open(png) as sheet:
        assert sheet.format == "PNG" and sheet.width == 4 * 192 + 3 * 10 + 2 * 10  # 16 samples, 4 columns
        full = np.asarray(sheet.convert("RGB"))
    md = Artifact.get("demo-preview")
    assert md.type == "markdown" and "dataset_v0001.h5" in md.data and markdown.text(png) in md.data
    uri = md.data.split("](", 1)[1].split(")", 1)[0]
    assert uri.startswith("data:image/jpeg;base64,")
    with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) as small:
        assert small.format == "JPEG" and max(small.size) == 960 >= small.width  # the sheet, shrunk for the artifact
        ratio = full.shape[1] / small.width
        assert small.height == round(full.shape[0] / ratio)

"""The ``max_rejected`` gate's "Most common reasons": reasons that differ only in the values they carry
are one kind, counted together, with one of them as an example."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from h5forge.errors import TooManyRejected
from h5forge._ingest.rejected import common_reasons, reason_kind
from h5forge._samples import Rejection
from h5forge.spec import parse_spec
from tests.ingest.test_inputs_trust import library_build, make_pairs, spec_data


@pytest.mark.parametrize("reason,kind", [
    ("values -3.5..2.5 are not int16 integers; set dtype: float32",
     "values … are not int16 integers; set dtype: float32"),
    ("case_7/slice_004.dcm: a slice has no valid Rows/Columns", "…: a slice has no valid Rows/Columns"),
    ("image is 300x400 (HxW), larger than the target 224x224 and the policy is 'reject'",
     "image is … (HxW), larger than the target … and the policy is …"),
    ("a 4-D NIfTI file (shape (2, 3)) holds no time point", "a 4-D NIfTI file (shape (…, …)) holds no time point"),
    ("empty file (0 bytes)", "empty file (… bytes)"),
])
def test_the_kind_of_a_reason_leaves_its_values_out(reason, kind):
    assert reason_kind(reason) == kind


def test_reasons_of_one_kind_are_counted_together_with_an_example():
    rejections = [Rejection(f"s{i}", (f"v{i}.dcm",), f"values {i}.5..{i + 3} are not int16 integers") for i in range(3)]
    rejections += [Rejection("e", ("e.png",), "empty file (0 bytes)", count=2)]
    assert common_reasons(rejections) == [
        ("values … are not int16 integers (e.g. values 0.5..3 are not int16 integers)", 3),
        ("empty file (0 bytes)", 2),  # one wording: itself
    ]


def test_a_refused_build_names_each_kind_of_reason_once(tmp_path):
    raw = tmp_path / "raw"
    make_pairs(raw, [f"ok{i}" for i in range(4)] + ["m7", "m9", "m128"])
    for sid, value in (("m7", 7), ("m9", 9), ("m128", 128)):  # a mask value no mask may hold, one per file
        mask = np.zeros((24, 24), np.uint8)
        mask[:4] = value
        Image.fromarray(mask).save(raw / "masks" / f"{sid}.png")
    (raw / "masks" / "ok0.png").write_bytes(b"")
    with pytest.raises(TooManyRejected) as err:
        library_build(parse_spec(spec_data(raw, tmp_path / "out", max_rejected=0), tmp_path))
    reasons = str(err.value).split("Most common reasons: ")[1].split("; see ")[0]
    assert reasons.startswith("3 x mask values […, …] not allowed: a mask must hold {…} or {…} (e.g. mask values [0, ")
    assert reasons.count(" x ") == 2 and "1 x empty file (0 bytes)" in reasons

"""``init`` on files whose headers hold nonsense: it writes a spec and the build rejects what is
broken with a reason, instead of a traceback."""

from __future__ import annotations

import pydicom

import h5forge
from h5forge._init import infer_spec
from h5forge.spec import load_spec
from tests.kinds.test_volume import write_series


def test_a_dicom_whose_rescale_slope_is_not_a_number(tmp_path):
    root = tmp_path / "raw"
    write_series(root / "cases" / "good", depth=4)
    write_series(root / "cases" / "bad", depth=4, seed=1)
    victim = sorted((root / "cases" / "bad").iterdir())[0]
    ds = pydicom.dcmread(victim)
    ds.RescaleSlope = "7.25"  # then the bytes of the value become "ab", as a broken writer leaves them
    ds.save_as(victim, enforce_file_format=True)
    data = victim.read_bytes()
    assert data.count(b"7.25") == 1
    victim.write_bytes(data.replace(b"7.25", b"ab  "))
    assert str(pydicom.dcmread(victim, stop_before_pixels=True)["RescaleSlope"].value).strip() == "ab"
    spec_path = tmp_path / "spec.yaml"
    inferred = infer_spec(root, spec_path)
    spec_path.write_text(inferred.text)
    assert not inferred.todo, inferred.todo
    spec = load_spec(spec_path, output=tmp_path / "out")
    spec = spec.model_copy(update={"max_rejected": 0.5})
    result = h5forge.build(spec)
    assert result.rejected == 1 and sum(result.counts.values()) == 1

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


def test_a_fifo_or_a_device_in_a_dicom_case_folder_is_not_opened_by_init(tmp_path):
    """A FIFO named like a slice (nothing ever writes to it) and a symlink to /dev/zero in DICOM case
    folders: ``init`` used to open them with pydicom and wait forever (or read zeros without end).
    It writes its spec at once, and the build rejects those cases naming the file."""
    import os
    import subprocess
    import sys
    import textwrap

    root = tmp_path / "raw"
    for name in ("good", "fifo", "zero"):
        write_series(root / "cases" / name, depth=4, seed=len(name))
    os.mkfifo(root / "cases" / "fifo" / "extra.dcm")
    os.symlink("/dev/zero", root / "cases" / "zero" / "IM9999")  # scanner-style: no suffix
    spec_path = tmp_path / "spec.yaml"
    script = textwrap.dedent(f"""
        from pathlib import Path
        from h5forge._init import infer_spec
        Path({str(spec_path)!r}).write_text(infer_spec(Path({str(root)!r}), Path({str(spec_path)!r})).text)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, env={**os.environ})
    spec = load_spec(spec_path, output=tmp_path / "out")
    assert spec.fields["ct"].files == "cases/*"
    result = h5forge.build(spec.model_copy(update={"max_rejected": 1.0}))
    reasons = {r.sample_id: (r.path, r.reason) for r in result.rejections}
    assert reasons == {"fifo": ("cases/fifo/extra.dcm", "not a regular file (a device, pipe or socket)"),
                       "zero": ("cases/zero", "symlink leads outside the source folder (to /dev/zero); set "
                                              "source.allow_symlinks_outside: true to take it")}
    assert sum(result.counts.values()) == 1

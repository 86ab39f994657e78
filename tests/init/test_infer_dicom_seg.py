"""``init`` on DICOM cases with SEG masks, written with highdicom: SEG files in masks/ (two
segments: ``classes: 3``), and a multi-frame case file with its SEG beside it in the case folder.
The inferred spec builds, and each case's stored mask equals the array the SEG was made from."""

from __future__ import annotations

import h5py
import numpy as np

import h5forge
from h5forge._format.layout import decode_str
from h5forge._init import infer_spec
from h5forge.spec import load_spec
from tests.kinds.test_volume_multiframe import ct_slices, enhanced_ct
from tests.kinds.test_volume_seg import by_position, two_regions, write_seg


def built_masks(raw, tmp_path) -> dict[str, np.ndarray]:
    spec_path = tmp_path / f"{raw.name}.yaml"
    inferred = infer_spec(raw, spec_path)
    spec_path.write_text(inferred.text)
    assert not inferred.todo, inferred.todo
    spec = load_spec(spec_path, output=tmp_path / f"out_{raw.name}")
    result = h5forge.build(spec)
    assert result.rejections == ()
    masks = {}
    with h5py.File(result.path, "r") as f:
        for split in f:
            g = f[split]
            if not isinstance(g, h5py.Group) or "ct_mask" not in g:
                continue
            ends = np.cumsum(g["ct_mask_lengths"][()])
            for sid, rows in zip(decode_str(g["ids"][()]), np.split(g["ct_mask"][()], ends[:-1])):
                masks[sid] = rows
    return masks, inferred.text


def test_seg_masks_in_a_masks_folder_and_beside_a_multiframe_case(tmp_path):
    raw, truth = tmp_path / "raw", {}
    for seed, case in enumerate(("a", "b", "c")):
        slices = by_position(ct_slices(raw / "cases" / case, seed=seed))
        truth[case] = two_regions(np.stack([s.pixel_array.astype(float) for s in slices]))
        write_seg(raw / "masks" / f"{case}.dcm", slices, truth[case])
    masks, text = built_masks(raw, tmp_path)
    assert "files: masks/*.dcm" in text and "classes: 3" in text
    assert masks.keys() == truth.keys() and all(np.array_equal(masks[c], truth[c]) for c in truth)

    raw, truth = tmp_path / "beside", {}
    for seed, case in enumerate(("a", "b")):
        slices = by_position(ct_slices(tmp_path / "slices" / case, seed=seed))
        (raw / "cases" / case).mkdir(parents=True)
        enhanced_ct(slices).save_as(raw / "cases" / case / "volume.dcm")
        truth[case] = (np.stack([s.pixel_array for s in slices]) > 1500).astype(np.uint8)
        write_seg(raw / "cases" / case / "seg.dcm", slices, truth[case])
    masks, text = built_masks(raw, tmp_path)
    assert "ct_mask:\n    kind: volume_mask" in text and "series: largest" not in text
    assert masks.keys() == truth.keys() and all(np.array_equal(masks[c], truth[c]) for c in truth)

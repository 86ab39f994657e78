"""The registry: every kind is reachable by its name, owns its layout, and nothing else branches."""

from __future__ import annotations

import re

import numpy as np
import pytest

from h5forge.kinds import REGISTRY, ReadOptions, decode_order, field_kinds, stored_kinds
from h5forge.kinds.doc import with_table
from tests.helpers.data import REPO, demo_spec

PACKAGE = REPO / "h5forge"


def test_registry_and_spec_union_agree(raw_demo, tmp_path):
    assert set(REGISTRY) == {"image", "mask", "label", "paired", "signal", "volume", "volume_mask"}
    spec = demo_spec(raw_demo, tmp_path)
    kinds = stored_kinds(spec)
    assert list(kinds) == ["images", "masks", "meta/label", "meta/num_cells", "meta/stain", "meta/focus_score"]
    assert [k.kind for k in field_kinds(spec).values()] == ["image", "mask"]
    assert [k.path for k in decode_order(kinds)][:2] == ["images", "masks"]  # the mask follows its image
    assert kinds["images"].stored().shape == (3, 224, 224) and kinds["masks"].stored().shape == (1, 224, 224)


def test_no_module_outside_the_kinds_names_a_kind():
    pattern = re.compile(r"""(isinstance\([^)]*(ImageField|MaskField|LabelField)|kind\s*==\s*["'](image|mask|label)["'])""")
    offenders = [str(p.relative_to(REPO)) for p in [*PACKAGE.rglob("*.py"), *(REPO / "flows").rglob("*.py"),
                                                    *(REPO / "tasks").rglob("*.py")]
                 if "kinds" not in p.parts and pattern.search(p.read_text())]
    assert offenders == []


def test_conversion_and_preview_hooks(raw_demo, tmp_path):
    kinds = stored_kinds(demo_spec(raw_demo, tmp_path))
    raw = np.arange(2 * 3 * 4 * 4, dtype=np.uint8).reshape(2, 3, 4, 4)
    out = np.empty(raw.shape, np.float32)
    kinds["images"].convert(raw, out, ReadOptions(), {})
    assert np.allclose(out, raw / 255)
    mask = np.zeros((1, 4, 4), np.uint8)
    mask[0, 1, 2] = 1
    tile = kinds["masks"].preview(mask)
    assert tile.shape == (4, 4, 3) and tile[1, 2].any() and not tile[0, 0].any()
    assert kinds["images"].preview(raw[0]).shape == (4, 4, 3)
    with pytest.raises(ValueError, match="mask_dtype"):
        kinds["masks"].output_dtype(ReadOptions(mask_dtype="float32"))


def test_format_doc_matches_the_code():
    doc = (REPO / "docs" / "format.md").read_text()
    assert doc == with_table(doc), "docs/format.md is out of date: run `make docs`"

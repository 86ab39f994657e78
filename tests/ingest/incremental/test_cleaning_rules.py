"""A release that changes what a kind accepts or the values it decodes to raises ``CLEANING_RULES``:
the next build of a dataset made before it is neither "unchanged" nor made of reused rows, so every
sample is cleaned under the rules that now hold (an input they refuse leaves latest with a reason)."""

from __future__ import annotations

import h5forge
from h5forge._ingest.incremental import inputs
from tests.helpers.data import demo_spec


def test_a_build_after_the_kinds_rules_change_cleans_every_sample_again(raw_copy, tmp_path, monkeypatch):
    spec = demo_spec(raw_copy, tmp_path / "out").model_copy(update={"max_rejected": 0.5})
    first = h5forge.build(spec)
    assert first.version == 1 and h5forge.build(spec).unchanged

    monkeypatch.setattr(inputs, "CLEANING_RULES", inputs.CLEANING_RULES + 1)  # what a release raises
    again = h5forge.build(spec)
    assert not again.unchanged and again.version == 2
    assert again.timings["reused"] == 0 and again.timings["cleaned"] == first.timings["cleaned"]
    assert h5forge.build(spec).unchanged  # and from then on, as before

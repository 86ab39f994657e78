"""What ``h5forge.build`` and ``h5forge.append`` return: an unchanged build gives latest's counts, and
a result's repr is one line however many inputs were rejected (the details are on attributes)."""

from __future__ import annotations

import h5forge
from tests.helpers.data import demo_spec, drop_samples


def test_an_unchanged_build_gives_the_counts_of_latest(raw_copy, tmp_path):
    spec = demo_spec(raw_copy, tmp_path / "out")
    first = h5forge.build(spec)
    again = h5forge.build(spec)
    assert again.unchanged and again.version == first.version == 1
    assert again.counts == first.counts and sum(first.counts.values()) == 40 == again.samples
    assert repr(again) == (
        f"<BuildResult demo: unchanged since v0001, 40 samples "
        f"(train {first.counts['train']}, val {first.counts['val']}, test {first.counts['test']}); {again.path}>"
    )


def test_the_repr_of_a_result_is_one_line_and_the_rejections_are_on_attributes(raw_copy, raw_new, tmp_path):
    spec = demo_spec(raw_copy, tmp_path / "out")
    result = h5forge.build(spec)
    assert result.rejected == 10 and len(result.rejections) >= 5  # the demo's defects
    shown = repr(result)
    assert "\n" not in shown and len(shown) - len(result.path) < 200
    assert shown == (
        f"<BuildResult demo: published v0001, 40 samples (train {result.counts['train']}, val {result.counts['val']}, "
        f"test {result.counts['test']}); 10 inputs rejected (.rejections); {result.path}>"
    )
    assert not any(r.reason in shown for r in result.rejections)

    inbox = tmp_path / "inbox"
    spec = spec.model_copy(update={"source": spec.source.model_copy(update={"inbox": inbox})})
    drop_samples(raw_new, inbox, ["cell_000000", "cell_000001"], rename="n_")
    from tests.helpers.data import age_files

    age_files(inbox)
    added = h5forge.append(spec)
    assert added.added == 2
    assert repr(added) == (
        f"<AppendResult demo: published v0002, 2 added ({', '.join(f'{k} {v}' for k, v in added.added_counts.items())}), "
        f"42 in all; {added.path}>"
    )
    nothing = h5forge.append(spec)
    assert repr(nothing) == "<AppendResult demo: nothing appended>"

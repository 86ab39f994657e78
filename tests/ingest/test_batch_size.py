"""Samples per dask task when the spec leaves ``compute.batch_size`` unset: as many as 2 MiB of stored
values hold (64 to 1024), 4 batches a worker at least; a spec's own number is kept. The batch size
changes how the work is cut, never the version."""

from __future__ import annotations

import h5forge
from h5forge._ingest.parallel import batch_samples, inline_limit, where_to_clean
from h5forge.spec import DatasetSpec
from tests.helpers.data import demo_spec
from tests.helpers.files import make_raw
from tests.helpers.version_identity import identity


def sized(spec: DatasetSpec, side: int, **compute) -> DatasetSpec:
    images = spec.fields["images"].model_copy(update={"size": (side, side)})
    return spec.model_copy(
        update={"fields": {**spec.fields, "images": images}, "compute": spec.compute.model_copy(update=compute)}
    )


def test_the_batch_holds_about_2_mib_of_small_samples_and_64_large_ones(tmp_path):
    spec = demo_spec(tmp_path, tmp_path / "out")
    # an image's 3 channels and its mask: 4 bytes a pixel
    assert [batch_samples(sized(spec, 32), 50_000), batch_samples(sized(spec, 64), 50_000)] == [512, 128]
    assert batch_samples(sized(spec, 16), 50_000) == 1024  # 2 MiB would hold 2,048
    assert batch_samples(sized(spec, 224), 50_000) == 64
    # each of the 2 workers gets 4 batches at least, never fewer than 64 samples in one
    assert [batch_samples(sized(spec, 32), n) for n in (300, 2_000, 4_096)] == [64, 128, 512]
    assert batch_samples(sized(spec, 32, batch_size=7), 50_000) == 7


def test_a_ragged_field_keeps_the_smallest_batch(tmp_path):
    from tests.kinds.test_signal_bounds import signal_spec

    (tmp_path / "raw").mkdir()
    spec = DatasetSpec.model_validate(signal_spec(tmp_path / "raw", "rec/*.edf", "ACC"))
    assert spec.compute.batch_size is None and batch_samples(spec, 50_000) == 64


def test_a_version_is_the_same_whatever_the_batch_size(tmp_path):
    raw = make_raw(tmp_path / "raw", n=600, seed=3)
    spec = sized(demo_spec(raw, tmp_path / "picked"), 32, workers=1, inline_below=10**6)
    assert batch_samples(spec, 600) == 128
    picked = h5forge.build(spec)
    small = h5forge.build(sized(demo_spec(raw, tmp_path / "small"), 32, workers=1, inline_below=10**6, batch_size=5))
    assert sum(picked.counts.values()) > 550
    assert identity(picked.path) == identity(small.path)


def test_small_samples_clean_in_process_up_to_4_mib_and_inline_below_0_always_starts_a_cluster(tmp_path):
    """Fewer samples than ``compute.inline_below`` clean in-process; when no field is ragged, so do as
    many as 4 MiB of stored values hold; ``inline_below: 0`` keeps every build on a cluster."""
    from tests.kinds.test_signal_bounds import signal_spec

    spec = demo_spec(tmp_path, tmp_path / "out")
    assert inline_limit(sized(spec, 32)) == 1024  # 4 bytes a pixel: 4 KiB a sample
    assert inline_limit(sized(spec, 224)) == 256  # compute.inline_below: 4 MiB holds 20
    assert [where_to_clean(sized(spec, 32), n) for n in (1023, 1024)] == ["inline", "local"]
    assert inline_limit(sized(spec, 32, inline_below=0)) == 0
    assert where_to_clean(sized(spec, 32, inline_below=0), 1) == "local"
    (tmp_path / "raw").mkdir()
    ragged = DatasetSpec.model_validate(signal_spec(tmp_path / "raw", "rec/*.edf", "ACC"))
    assert inline_limit(ragged) == ragged.compute.inline_below

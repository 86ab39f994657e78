"""A build with nothing to compare with reads each raw file once: the cleaning workers' hashes make
the sample keys and the input key, which must equal what hashing every file up front gives, for
every kind of raw input (pictures, paired pictures, DICOM case folders, EDF recordings), rejected
inputs included; the next rebuild of the same inputs then publishes nothing."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from h5forge._format.catalog import input_key, sample_keys
from h5forge._format.names import SPLITS
from h5forge._demo import KINDS
from h5forge._ingest.discover import discover
from h5forge._init import infer_spec
from h5forge._ingest.incremental.inputs import fingerprint, rules_hash
from h5forge._ingest.incremental.rebuild import inputs_of, unchanged_since
from h5forge.spec import load_spec, override
from tests.ingest.incremental.test_rebuild import build

SIZES = {"cells": 40, "classify": 40, "segment-multiclass": 40, "sr": 30, "ct": 12, "signals": 12}


def inferred_spec(kind: str, tmp: Path):
    generate, _ = KINDS[kind]
    raw = tmp / kind
    generate(raw, n=SIZES[kind], seed=5)
    spec_path = tmp / f"{kind}.yaml"
    spec_path.write_text(infer_spec(raw, spec_path).text)
    # the demo folders hold defects on purpose, at these sizes more than init's default share
    return override(load_spec(spec_path), output=tmp / "out").model_copy(update={"max_rejected": 1.0})


@pytest.mark.parametrize("kind", sorted(SIZES))
def test_keys_learnt_while_cleaning_equal_keys_hashed_up_front(kind, tmp_path):
    spec = inferred_spec(kind, tmp_path)
    inventory = discover(spec)
    deferred = inputs_of(spec, inventory)
    assert deferred.deferred and deferred.samples == {} and deferred.hash_seconds == 0

    path, summary = build(spec)  # the build makes these same deferred inputs
    assert summary.rejections, "the demo folders hold defects: rejected inputs must be keyed too"
    up_front = fingerprint(spec, discover(spec))
    with h5py.File(path, "r") as f:
        assert input_key(f) == (up_front.key, rules_hash(spec))
        for split in SPLITS:
            ids = [i.decode() for i in f[split]["ids"][()]]
            want = np.array([up_front.samples[i] for i in ids], dtype="S32")
            assert np.array_equal(sample_keys(f, split), want), split

    # now a version made under these rules exists: the inputs are hashed before cleaning, and
    # nothing changed, so nothing would be published
    again = inputs_of(spec, discover(spec))
    assert not again.deferred and again.key == up_front.key
    assert unchanged_since(spec.output.dir, again) == 1


def test_other_field_rules_leave_the_hashing_to_the_workers(tmp_path):
    spec = inferred_spec("cells", tmp_path)
    build(spec)
    other = spec.model_copy(update={"storage": spec.storage.model_copy(update={"codec": "gzip-1"})})
    inputs = inputs_of(other, discover(other))
    assert inputs.deferred, "a version made under other rules has nothing to take: no hashing up front"
    assert unchanged_since(other.output.dir, inputs) is None
    path, _ = build(other)  # the build makes these same inputs
    with h5py.File(path, "r") as f:
        assert input_key(f) == (fingerprint(other, discover(other)).key, rules_hash(other))

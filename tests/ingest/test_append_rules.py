"""An append adds rows made under its parent's rules: after the spec's rules for a sample's values
change, it refuses (nothing published, the inbox left as it is) and names what changed; a change of
how versions are stored only (codec, samples per chunk) appends as before."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
import yaml

import h5forge
from h5forge.errors import VersionError
from h5forge._store.verify import verify_file
from h5forge._store.versions import latest
from tests.helpers.data import age_files, drop_samples


def edited(spec_file, change) -> None:
    data = yaml.safe_load(spec_file.read_text())
    change(data)
    spec_file.write_text(yaml.safe_dump(data))


RULE_CHANGES = {
    "fields.images.fill": lambda d: d["fields"]["images"].update(fill=7),
    "fields.images.size": lambda d: d["fields"]["images"].update(size=[200, 200]),
    "annotations.index_by": lambda d: d["annotations"].update(index_by=["label"]),
    "splits.ratios": lambda d: d["splits"].update(ratios={"train": 0.6, "val": 0.2, "test": 0.2}),
}


@pytest.mark.parametrize("rule", sorted(RULE_CHANGES))
def test_an_append_under_changed_rules_is_refused_and_names_them(dataset, raw_new, rule):
    spec_file, out, inbox = dataset
    edited(spec_file, RULE_CHANGES[rule])
    drop_samples(raw_new, inbox, [f"cell_{i:06d}" for i in range(4)], rename="new_")
    age_files(inbox)
    waiting = sorted(p.name for p in (inbox / "images").iterdir())
    with pytest.raises(VersionError, match=rf"differ from those dataset_v0001.h5 was built with \({rule}.*h5forge build"):
        h5forge.append(spec_file)
    assert latest(out) == 1
    assert sorted(p.name for p in (inbox / "images").iterdir()) == waiting
    assert not (inbox / "processed").exists()


def test_an_append_after_a_storage_change_appends(dataset, raw_new):
    spec_file, out, inbox = dataset
    edited(spec_file, lambda d: d["storage"].update(codec="gzip-1", chunk_rows=4))
    ids = drop_samples(raw_new, inbox, [f"cell_{i:06d}" for i in range(6)], rename="new_")
    age_files(inbox)
    result = h5forge.append(spec_file)
    assert result.version == 2 and result.added == len(ids)
    # every check, the appended samples cleaned again from their sources among them
    report = verify_file(out / "dataset_latest.h5", resample=20)
    assert report.ok, report.errors
    with h5py.File(os.path.realpath(out / "dataset_v0001.h5"), "r") as v1, \
            h5py.File(os.path.realpath(out / "dataset_latest.h5"), "r") as v2:
        n = v1["train"].attrs["count"]
        assert np.array_equal(v2["train/images"][:n], v1["train/images"][()])

from pathlib import Path

import pytest
import yaml

from h5forge.kinds import field_kinds
from h5forge.spec import SpecError, load_spec, parse_spec

REPO = Path(__file__).resolve().parent.parent


def base() -> dict:
    return yaml.safe_load((REPO / "config" / "demo.yaml").read_text())


def test_demo_spec_loads_with_paths_relative_to_the_spec_file():
    spec = load_spec(REPO / "config" / "demo.yaml")
    assert spec.source.root == (REPO / "data" / "raw" / "demo").resolve()
    assert spec.output.dir == (REPO / "data" / "demo").resolve()
    kinds = field_kinds(spec)
    assert kinds["images"].stored().shape == (3, 224, 224)
    assert kinds["masks"].stored().shape == (1, 224, 224)


@pytest.mark.parametrize("mutate, key, words", [
    (lambda d: d.update(colour="red"), "colour", "unknown key"),
    (lambda d: d["fields"]["images"].update(sise=[1, 2]), "fields.images.image.sise", "unknown key"),
    (lambda d: d["storage"].update(codec="snappy"), "storage.codec", "unknown codec 'snappy'"),
    (lambda d: d["storage"].update(chunk_rows=0), "storage.chunk_rows", "greater than or equal to 1"),
    (lambda d: d["splits"].update(ratios={"train": 0.8, "val": 0.3}), "splits.ratios", "sum to 1"),
    (lambda d: d["fields"]["images"].update(size=[0, 224]), "fields.images.image.size", "positive"),
    (lambda d: d["fields"]["images"].update(larger="stretch"), "fields.images.image.larger", "'crop'"),
    (lambda d: d["fields"]["masks"].update(like="nothing"), "<root>", "fields.masks.like"),
    (lambda d: d["annotations"].update(index_by=["colour"]), "annotations", "column 'colour'"),
    (lambda d: d["fields"]["images"].update(fill=300), "fields.images.image.fill", "less than or equal to 255"),
    (lambda d: d.pop("output"), "output", "Field required"),
])
def test_bad_specs_name_the_offending_key(mutate, key, words):
    data = base()
    mutate(data)
    with pytest.raises(SpecError) as err:
        parse_spec(data, REPO / "config", "test.yaml")
    text = str(err.value)
    assert f"  {key}:" in text, text
    assert words in text, text


def test_missing_and_unparsable_spec_files(tmp_path):
    with pytest.raises(SpecError, match="spec file not found"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)
    top = tmp_path / "list.yaml"
    top.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="must be a mapping"):
        load_spec(top)


def test_cli_overrides_output_and_dask_address(tmp_path):
    spec = load_spec(REPO / "config" / "demo.yaml", output=tmp_path / "o", dask_address="tcp://10.0.0.1:8786")
    assert spec.output.dir == (tmp_path / "o").resolve()
    assert spec.compute.dask_address == "tcp://10.0.0.1:8786"


@pytest.mark.parametrize("text, key, line", [
    ("output: {dir: out}\noutput: {dir: elsewhere}\n", "output", "lines 6 and 7"),  # which folder was meant?
    ("output: {dir: out, keep: 2, keep: 9}\n", "keep", "line 6"),
    ("output: {dir: out}\nfields:\n  images: {kind: image, files: b/*.png, size: [8, 8]}\n", "fields", "lines 3 and 7"),
])
def test_a_key_given_twice_is_refused_with_its_line(tmp_path, text, key, line):
    """YAML readers keep the last of two equal keys; a spec holding both is refused, never half-read."""
    path = tmp_path / "spec.yaml"
    path.write_text("name: demo\nsource: {root: raw}\nfields:\n  images: {kind: image, files: a/*.png, size: [8, 8]}\n"
                    "annotations: {required: false}\n" + text)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert str(err.value) == f"spec {path} is not valid YAML: key {key!r} is given twice ({line})"


def test_a_field_given_twice_is_refused(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("name: demo\nsource: {root: raw}\nfields:\n"
                    "  images: {kind: image, files: a/*.png, size: [8, 8]}\n"
                    "  images: {kind: image, files: a/*.jpg, size: [8, 8]}\n"
                    "output: {dir: out}\n")
    with pytest.raises(SpecError, match=r"key 'images' is given twice \(lines 4 and 5\)$"):
        load_spec(path)


def test_merge_keys_may_be_overridden_by_the_mapping_that_merges_them(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("name: demo\nsource: {root: raw}\nfields:\n"
                    "  images: &pic {kind: image, files: a/*.png, size: [8, 8]}\n"
                    "  thumbs: {<<: *pic, files: b/*.png}\n"
                    "annotations: {required: false}\noutput: {dir: out}\n")
    spec = load_spec(path)
    assert spec.fields["thumbs"].files == "b/*.png" and spec.fields["thumbs"].size == (8, 8)


def test_a_path_starting_with_a_tilde_is_in_the_home_folder(tmp_path, monkeypatch):
    """Not a folder named '~' beside the spec (which a later `rm -rf ~` there would be a disaster for)."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    path = tmp_path / "spec.yaml"
    path.write_text("name: demo\nsource: {root: ~/raw, inbox: ~/inbox}\nfields:\n"
                    "  images: {kind: image, files: a/*.png, size: [8, 8]}\n"
                    "annotations: {required: false}\noutput: {dir: ~/out}\n")
    spec = load_spec(path)
    assert (spec.source.root, spec.source.inbox, spec.output.dir) == (home / "raw", home / "inbox", home / "out")
    assert load_spec(path, output="~/other", inbox="~/box").output.dir == home / "other"
    assert load_spec(path, output="~/other", inbox="~/box").source.inbox == home / "box"


@pytest.mark.parametrize("mutate, key", [
    (lambda d: d["output"].update(keep=True), "output.keep"),
    (lambda d: d["output"].update(retire_after_seconds=False), "output.retire_after_seconds"),
    (lambda d: d["storage"].update(chunk_rows=True), "storage.chunk_rows"),
    (lambda d: d.setdefault("verify", {}).update(resample=True), "verify.resample"),
    (lambda d: d["fields"]["images"].update(fill=False), "fields.images.image.fill"),
    (lambda d: d["fields"]["images"].update(size=[True, 224]), "fields.images.image.size"),
    (lambda d: d["splits"].update(ratios={"train": True, "val": 0.0, "test": 0.0}), "splits.ratios"),
    (lambda d: d.update(max_rejected=True), "max_rejected"),
])
def test_a_bool_where_a_number_belongs_is_refused_not_read_as_1(mutate, key):
    """pydantic's lax mode reads true as 1 and false as 0: `keep: true` would keep one version."""
    data = base()
    mutate(data)
    with pytest.raises(SpecError) as err:
        parse_spec(data, REPO / "config", "test.yaml")
    text = str(err.value)
    assert f"  {key}:" in text, text
    assert "true/false" in text, text


def test_every_shipped_spec_still_loads():
    for path in sorted((REPO / "config").glob("*.yaml")):
        load_spec(path)

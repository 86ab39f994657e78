"""What the deployments do when another run writes the output folder, and that their parameters,
prefect.yaml and the flows agree: the nightly waits, then fails; the inbox poll skips at once."""

from pathlib import Path

import pytest
import yaml

from h5forge.deployments.definitions import dataset_deployments
from h5forge._store.versions import output_lock
from tests.helpers.data import REPO, write_spec_file

BUSY = ("wait_for_lock", "skip_if_busy")


def busy_params(params: dict) -> dict:
    return {k: params[k] for k in BUSY}


def test_served_and_pool_deployments_say_the_same(tmp_path):
    served = {d.name: d for d in dataset_deployments(REPO / "config" / "demo.yaml")}
    assert busy_params(served["nightly"].parameters) == {"wait_for_lock": 3600, "skip_if_busy": False}
    assert busy_params(served["inbox"].parameters) == {"wait_for_lock": 0, "skip_if_busy": True}
    pool = {d["name"]: d["parameters"] for d in
            yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())["deployments"]}
    assert busy_params(pool["nightly-pool"]) == busy_params(served["nightly"].parameters)
    assert busy_params(pool["inbox-pool"]) == busy_params(served["inbox"].parameters)
    # the UI shows what each one means, next to its value
    schema = served["nightly"]._parameter_openapi_schema.properties
    assert "the run fails, unless ``skip_if_busy``" in schema["wait_for_lock"]["description"]
    assert schema["skip_if_busy"]["description"].startswith("when the folder is still busy after ``wait_for_lock``")


@pytest.mark.e2e
def test_nightly_parameters_wait_then_fail_and_inbox_parameters_skip(prefect_server, raw_demo, tmp_path):
    from h5forge.flows.append import append_samples
    from h5forge.flows.build import build_dataset

    spec = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml", inbox=tmp_path / "inbox")
    (tmp_path / "inbox").mkdir()
    served = {d.name: d.parameters for d in dataset_deployments(spec)}
    nightly = {**busy_params(served["nightly"]), "wait_for_lock": 1.5}  # an hour, shortened for the test
    with output_lock(tmp_path / "out", what="an append"):
        state = build_dataset(str(spec), **nightly, return_state=True)
        skipped = append_samples(str(spec), **busy_params(served["inbox"]))
    assert state.is_failed()
    message = str(state.result(raise_on_failure=False))
    assert "another h5forge run is writing to" in message and "after waiting 1.5 s" in message
    assert skipped.version is None and skipped.skipped.startswith("another h5forge run is writing to")
    assert not any(Path(tmp_path / "out").glob("dataset_v*.h5"))


def test_deployments_name_a_spec_under_the_home_folder_by_its_absolute_path(raw_demo, tmp_path, monkeypatch):
    """`h5forge serve "~/specs/demo.yaml"` (a tilde the shell left alone): load_spec reads it from the
    home folder, and so must every run, which starts in another working folder."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    (home / "specs").mkdir(parents=True)
    spec = write_spec_file(raw_demo, tmp_path / "out", home / "specs" / "demo.yaml")
    served = {d.name: d.parameters for d in dataset_deployments("~/specs/demo.yaml", "~/out")}
    assert {name: (p["spec_path"], p["output"]) for name, p in served.items()} == {
        name: (str(spec.resolve()), str((home / "out").resolve())) for name in served}

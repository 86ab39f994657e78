"""Every valid write route publishes the same version: where cleaning runs (this process, a
LocalCluster the build starts, an external scheduler), what the workers return (rows, chunk files,
row files), how the version is assembled (copy, mapped) and what it reuses (nothing, the latest
version's unchanged rows, a killed build's file taken over, a killed build's rows copied) give,
on the same real PNGs, the same samples: ids, every field's values, checksums, statistics and
indexes; and verify finds each HEALTHY. A combination that cannot work is refused by ``Route``."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from distributed import LocalCluster

import h5forge
from h5forge._ingest.build import ASSEMBLY, RETURNS, WHERE, Route, RouteRefused
from h5forge._ingest.incremental.rebuild import Reuse
from h5forge._ingest.incremental.reuse import Plan, Source, Taken
from h5forge._samples import SampleRef
from h5forge._store.verify import verify_file
from tests.helpers.files import make_raw, spec_for
from tests.ingest.incremental.test_rebuild import assert_same

REUSE = ("nothing", "unchanged", "take-over", "resume")
REPO = Path(__file__).resolve().parents[2]


def valid(where: str, returns: str, assembly: str, reuse: str) -> bool:
    if assembly == "mapped":
        return returns == "row_files" and reuse == "nothing"
    return returns != "row_files" and not (returns == "chunk_files" and where == "inline")


def _reuse(what: str) -> Reuse:
    """A plan that reuses ``what`` (no file behind it: ``Route`` judges the combination only)."""
    one = [SampleRef("a", "train", {}, {})] if what in ("unchanged", "resume") else []
    plan = Plan(one, [Taken(0, 0)] * len(one))
    return Reuse(
        plan,
        [],
        taken=object() if what == "take-over" else None,  # type: ignore[arg-type]
        resumed=Source(Path("killed.h5")) if what == "resume" else None,
    )


def test_a_route_that_cannot_work_is_refused_with_the_reason():
    combos = list(itertools.product(WHERE, RETURNS, ASSEMBLY, REUSE))
    for where, returns, assembly, reuse in combos:
        plan = _reuse(reuse)
        assert plan.what == reuse
        if valid(where, returns, assembly, reuse):
            assert str(Route(where, returns, assembly, plan)) == f"{where}/{returns}/{assembly}/{reuse}"
        else:
            with pytest.raises(RouteRefused, match=f"{where}/{returns}/{assembly}/{reuse}: "):
                Route(where, returns, assembly, plan)
    assert sum(valid(*c) for c in combos) == 23
    with pytest.raises(RouteRefused, match="no such route"):
        Route("elsewhere", "rows", "copy", _reuse("nothing"))


# ---- the builds -------------------------------------------------------------------------------


def _spec(raw: Path, out: Path, where: str, assembly: str, address: str | None):
    spec = spec_for(raw, out, assemble=assembly)
    compute = {"batch_size": 4, "workers": 2, "inline_below": 10**6 if where == "inline" else 0}
    if where == "external":
        compute["dask_address"] = address
    return spec.model_copy(update={"compute": spec.compute.model_copy(update=compute)})


@pytest.fixture(scope="module")
def raws(tmp_path_factory) -> dict[str, Path]:
    """``final``: 24 samples every build publishes; ``plus``: those and one that sorts first;
    ``before``: all but the last 4 of them."""
    root = tmp_path_factory.mktemp("matrix")
    plus = make_raw(root / "plus", n=25, seed=5)
    records = json.loads((plus / "annotations.json").read_text())
    out = {"plus": plus}
    for name, keep in (("final", records[1:]), ("before", records[1:-4])):
        shutil.copytree(plus, root / name)
        kept = {r["id"] for r in keep}
        for p in (root / name).glob("*/*.png"):
            if p.stem not in kept:
                p.unlink()
        (root / name / "annotations.json").write_text(json.dumps(keep))
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def reference(raws, tmp_path_factory) -> Path:
    """The version a plain build of ``final`` publishes: in this process, copied, reusing nothing."""
    out = tmp_path_factory.mktemp("reference") / "out"
    result = h5forge.build(_spec(raws["final"], out, "inline", "copy", None))
    assert result.timings["route"] == "inline/rows/copy/nothing"
    return Path(result.path)


@pytest.fixture(scope="module")
def external():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def _killed(raw: Path, out: Path) -> Path:
    """What a build of ``raw`` SIGKILLed after 80 % of its inputs leaves in ``out``."""
    code = (
        "import sys; from pathlib import Path; import h5forge; "
        "from tests.ingest.test_write_matrix import _spec; "
        "h5forge.build(_spec(Path(sys.argv[1]), Path(sys.argv[2]), 'inline', 'copy', None))"
    )
    child = subprocess.run(
        [sys.executable, "-c", code, str(raw), str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "H5FORGE_KILL_AT": "build:at-80%", "H5FORGE_CHECKPOINT_SECONDS": "0"},
    )
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    return out


def _state(reuse: str, raws: dict[str, Path], root: Path) -> Path | None:
    """The output folder each build of the scenario starts from (None: an empty one)."""
    out = root / "state"
    if reuse == "unchanged":
        h5forge.build(_spec(raws["before"], out, "inline", "copy", None))
    elif reuse == "take-over":
        _killed(raws["final"], out)
    elif reuse == "resume":  # its first sample is not in ``final``: its rows are no prefix, they are copied
        _killed(raws["plus"], out)
    else:
        return None
    return out


@pytest.mark.parametrize("reuse", REUSE)
def test_every_route_publishes_the_same_version(reuse, raws, reference, external, tmp_path, monkeypatch):
    from h5forge._ingest.incremental import take_over

    monkeypatch.setattr(take_over, "WORKER_ROWS", 1)  # a take-over with a cluster started ahead checks on it
    state = _state(reuse, raws, tmp_path)
    chosen = Route.choose
    ran = []
    for where, returns, assembly in itertools.product(WHERE, RETURNS, ASSEMBLY):
        if not valid(where, returns, assembly, reuse):
            continue
        route = f"{where}/{returns}/{assembly}/{reuse}"
        out = tmp_path / route.replace("/", "-")
        if state is not None:
            shutil.copytree(state, out, symlinks=True)
        # a build that reuses rows writes a copy whatever the spec asks: asked for mapped on a cluster
        asked = "mapped" if reuse != "nothing" and where == "external" else assembly
        spec = _spec(raws["final"], out, where, asked, external)
        with monkeypatch.context() as m:
            if returns == "rows" and where != "inline":  # workers that send their chunks
                m.setattr(Route, "choose", classmethod(lambda cls, s, r: replace(chosen(s, r), returns="rows")))
            result = h5forge.build(spec)
        t = result.timings
        assert t["route"] == route
        if returns != "row_files" and where != "inline":
            assert (t["batches_via_chunk_files"] > 0) == (returns == "chunk_files"), route
            assert (t["batches_sent_through_dask"] > 0) == (returns == "rows"), route
        if reuse == "take-over":  # the LocalCluster started ahead checks the kept rows; else this process
            assert t["take_over_processes"] == (2 if where == "local" else 1), route
        assert_same(Path(result.path), reference)
        report = verify_file(result.path)
        assert report.ok, (route, report.errors)  # HEALTHY
        ran.append(route)
    assert len(ran) == {"nothing": 8, "unchanged": 5, "take-over": 5, "resume": 5}[reuse]

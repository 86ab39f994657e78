"""A script that calls ``h5forge.build`` at its top level, with no ``if __name__ == "__main__":``
guard, builds on a LocalCluster: the worker processes a run starts do not run the script again."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.data import write_spec_file

pytestmark = pytest.mark.e2e  # dask worker processes, started by a script in a subprocess

UNGUARDED = textwrap.dedent(
    """\
    import h5forge

    result = h5forge.build("spec.yaml")
    print("built", result.version, sum(result.counts.values()), result.timings["cleaned_in"])
    """
)


@pytest.fixture(scope="module")
def raw_twenty(tmp_path_factory) -> Path:
    from h5forge._demo import generate

    root = tmp_path_factory.mktemp("raw20") / "demo"
    generate(root, n=20, seed=3, bad=False, workers=1)
    return root


def run_script(folder: Path, *command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(folder)}
    return subprocess.run(
        [sys.executable, *command], cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("how", ["script", "module"])
def test_an_unguarded_script_builds_on_worker_processes(raw_twenty, tmp_path, how):
    # every sample goes through the LocalCluster's spawned workers (inline_below: 0)
    write_spec_file(raw_twenty, tmp_path / "out", tmp_path / "spec.yaml", inline_below=0, workers=1, batch_size=4)
    (tmp_path / "make_dataset.py").write_text(UNGUARDED)
    command = ("make_dataset.py",) if how == "script" else ("-m", "make_dataset")
    done = run_script(tmp_path, *command)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "built 1 20 LocalCluster(1)"
    assert "Traceback" not in done.stderr and "OutputBusy" not in done.stderr
    assert (tmp_path / "out" / "dataset_latest.h5").resolve().name == "dataset_v0001.h5"


def test_the_script_keeps_its_main_module(tmp_path):
    # within a run the script's own code still sees its globals, and after it __main__ is its own again
    from h5forge._pipeline.main_module import main_module_hidden

    (tmp_path / "probe.py").write_text(
        textwrap.dedent(
            """\
            import multiprocessing, sys
            from h5forge._pipeline.main_module import main_module_hidden

            print("imported as", __name__, flush=True)


            def started_under(method):
                with main_module_hidden():
                    assert __file__.endswith("probe.py")  # this module's globals are untouched
                    process = multiprocessing.get_context(method).Process(target=print, args=("child",))
                    process.start()
                    process.join()
                    assert process.exitcode == 0
                assert sys.modules["__main__"].__file__ == __file__


            started_under("spawn")
            started_under("forkserver")
            """
        )
    )
    done = run_script(tmp_path, "probe.py")
    assert done.returncode == 0, done.stderr
    # the script ran once: neither child imported it again
    assert done.stdout.splitlines() == ["imported as __main__", "child", "child"]
    with main_module_hidden():  # under pytest too: a module run by name is hidden the same way
        assert not hasattr(sys.modules["__main__"], "__file__")

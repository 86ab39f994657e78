"""The public API is ``h5forge.__all__``: each name resolves to the object its module defines, and
importing h5forge loads none of the build side or torch until a name needs it."""

from __future__ import annotations

import importlib
import subprocess
import sys

import h5forge


def test_every_public_name_is_its_modules_object():
    for name in h5forge.__all__:
        if name == "__version__":
            continue
        module = importlib.import_module(h5forge._PUBLIC[name])
        assert getattr(h5forge, name) is getattr(module, name), name
        assert name in dir(h5forge)


def test_importing_h5forge_loads_neither_the_build_side_nor_torch():
    code = ("import sys, h5forge\n"
            "print(sorted(m for m in ('dask', 'distributed', 'prefect', 'PIL', 'torch', 'h5forge._pipeline') "
            "if m in sys.modules))\n"
            "h5forge.load_spec\n"
            "print('torch' in sys.modules, 'dask' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "False False"  # the spec model alone pulls in neither


def test_an_unknown_name_is_an_attribute_error():
    try:
        h5forge.not_a_name  # noqa: B018
    except AttributeError as e:
        assert "not_a_name" in str(e)
    else:
        raise AssertionError("h5forge.not_a_name resolved")


# The modules without an underscore in their path: the public API (docs/architecture.md, "The public
# API"). Under kinds/, flows/, tasks/ and deployments/ every module without one is public.
PUBLIC_MODULES = {"h5forge", "h5forge.spec", "h5forge.errors", "h5forge.samples", "h5forge.read",
                  "h5forge.read.torch", "h5forge.read.jax", "h5forge.read.tf", "h5forge.read.lightning"}
PUBLIC_PACKAGES = ("h5forge.kinds", "h5forge.flows", "h5forge.tasks", "h5forge.deployments")


def _modules() -> list[str]:
    import os
    from pathlib import Path

    root = Path(h5forge.__file__).parent
    found = []
    for top, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                parts = Path(top, f).relative_to(root).with_suffix("").parts
                found.append(".".join(("h5forge", *parts)).removesuffix(".__init__"))
    return found


def test_every_internal_module_has_an_underscore_in_its_path():
    modules = _modules()
    assert {"h5forge._ingest.clean", "h5forge.read._reader", "h5forge.kinds._registry"} <= set(modules)
    unmarked = [m for m in modules if m not in PUBLIC_MODULES and not m.startswith(PUBLIC_PACKAGES)
                and not any(p.startswith("_") and p != "__init__" for p in m.split("."))]
    assert unmarked == [], "a module outside the public API without a leading underscore"


def test_the_read_packages_names_and_the_samples_a_kind_imports():
    import h5forge.read
    import h5forge.samples
    from h5forge import _samples
    from h5forge._format import layout
    from h5forge.read import _collate, _reader

    assert h5forge.read.SplitReader is _reader.SplitReader
    assert h5forge.read.index_rows is layout.index_rows
    assert {n: getattr(h5forge.read, n) for n in ("VarlenCollate", "Padded", "pad_batch")} == {
        n: getattr(_collate, n) for n in ("VarlenCollate", "Padded", "pad_batch")}
    assert set(h5forge.read.__all__) <= set(dir(h5forge.read))
    assert (h5forge.samples.SampleRef, h5forge.samples.Reject) == (_samples.SampleRef, _samples.Reject)
    try:
        h5forge.read.not_a_name  # noqa: B018
    except AttributeError as e:
        assert "not_a_name" in str(e)
    else:
        raise AssertionError("h5forge.read.not_a_name resolved")

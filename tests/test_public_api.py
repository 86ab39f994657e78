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
            "print(sorted(m for m in ('dask', 'distributed', 'prefect', 'PIL', 'torch', 'h5forge.pipeline') "
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

"""The registry: every kind is reachable by its name, owns its layout, and nothing else branches; the
kinds come from entry points, and one that does not load is left out with a reason naming its package."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml
import pytest

from h5forge.errors import KindRegistryError
from h5forge.kinds import REGISTRY, KindNotLoaded, ReadOptions, decode_order, field_kinds, stored_kinds
from h5forge.kinds._column import ColumnKind
from h5forge.kinds._doc import with_table
from h5forge.kinds._registry import Registry
from tests.helpers.data import REPO, demo_spec

PACKAGE = REPO / "src" / "h5forge"
OWN = {"image", "mask", "label", "paired", "signal", "volume", "volume_mask", "boxes"}


def own_kinds() -> dict[str, type]:
    """h5forge's own kinds: those of other packages (tests/plugins) live outside its source."""
    return {name: kind for name, kind in REGISTRY.items() if kind.__module__.startswith("h5forge.")}


def test_registry_and_spec_union_agree(raw_demo, tmp_path):
    assert set(own_kinds()) == OWN
    spec = demo_spec(raw_demo, tmp_path)
    kinds = stored_kinds(spec)
    assert list(kinds) == ["images", "masks", "meta/label", "meta/num_cells", "meta/stain", "meta/focus_score"]
    assert [k.kind for k in field_kinds(spec).values()] == ["image", "mask"]
    assert [k.path for k in decode_order(kinds)][:2] == ["images", "masks"]  # the mask follows its image
    assert kinds["images"].stored().shape == (3, 224, 224) and kinds["masks"].stored().shape == (1, 224, 224)


def _plugin_modules() -> set[str]:
    """The modules the kinds register as their ``init`` detectors and demo generators, with the
    modules of the same package they import (their helpers): they are the kinds' own code in the
    layers above, where a kind's name is what they write (``kind: image`` in a spec)."""
    from h5forge.kinds import demos, detectors

    todo = [d.ref.partition(":")[0] for _, d in detectors()] + [d.ref.partition(":")[0] for d in demos().values()]
    found: set[str] = set()
    while todo:
        module = todo.pop()
        if module in found or not module.startswith("h5forge."):
            continue
        found.add(module)
        package = module.rpartition(".")[0]
        tree = ast.parse(_source(module).read_text())
        todo += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                 and n.module.startswith(package + ".")]
    return found


def _source(module: str) -> Path:
    parts = module.split(".")[1:]
    path = PACKAGE.joinpath(*parts)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _kind_names(path: Path, names: set[str], classes: set[str], modules: set[str]) -> list[str]:
    """Where the module at ``path`` names a kind: a string that is a kind's name (or ``kind: <name>``
    text), a kind's class or spec model, or an import of a kind's module."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    said = re.compile(r"\bkind:\s*(" + "|".join(map(re.escape, names)) + r")\b") if names else None
    hits = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings:
            if n.value in names or (said and said.search(n.value)):
                hits.append(f"{n.lineno}: {n.value!r}")
        elif isinstance(n, (ast.Name, ast.Attribute)) and (n.id if isinstance(n, ast.Name) else n.attr) in classes:
            hits.append(f"{n.lineno}: {n.id if isinstance(n, ast.Name) else n.attr}")
        elif isinstance(n, ast.ImportFrom) and n.module:
            imported = {n.module, *(f"{n.module}.{a.name}" for a in n.names)}
            hits += [f"{n.lineno}: import {m}" for m in sorted(imported & modules)]
        elif isinstance(n, ast.Import):
            hits += [f"{n.lineno}: import {a.name}" for a in n.names if a.name in modules]
    return hits


def test_no_module_outside_the_kinds_names_a_kind():
    """Outside ``h5forge/kinds/``, nothing names a kind's class or spec model or imports its module,
    and nothing but the kinds' registered ``init``/demo modules says a kind's name: the registry is
    the only way to a kind, so a new kind needs no edit elsewhere."""
    kinds = own_kinds()
    names = set(kinds)
    classes = {c.__name__ for c in kinds.values()} | {c.Spec.__name__ for c in kinds.values()}
    modules = {c.__module__ for c in kinds.values()} | {ColumnKind.__module__}
    allowed = _plugin_modules()
    offenders = {}
    for p in [*PACKAGE.rglob("*.py"), *(REPO / "flows").rglob("*.py"), *(REPO / "tasks").rglob("*.py"),
              *(REPO / "deployments").rglob("*.py")]:
        rel = p.relative_to(REPO)
        parts = rel.with_suffix("").parts[1:] if rel.parts[0] == "src" else rel.with_suffix("").parts
        module = ".".join(("h5forge", *parts[1:])) if parts[0] == "h5forge" else None
        if "kinds" in parts[:2]:
            continue
        # the kinds' own modules above them write the kinds' names, but reach a kind only through
        # the registry or the kind class they are given, like every other module
        hits = _kind_names(p, set() if module in allowed else names, classes, modules)
        if hits:
            offenders[str(rel)] = hits
    assert offenders == {}


def test_the_guard_sees_a_kind_named_outside_the_kinds(tmp_path):
    kinds = own_kinds()
    names, classes, modules = set(kinds), {c.__name__ for c in kinds.values()}, {c.__module__ for c in kinds.values()}
    for text in ('if kind == "volume_mask":\n    pass\n', 'x = "kind: signal"\n', "from h5forge.kinds.volume import read_case\n",
                 "from h5forge.kinds import image\n", "isinstance(k, ImageKind)\n"):
        bad = tmp_path / "bad.py"
        bad.write_text(text)
        assert _kind_names(bad, names, classes, modules), text
    bad.write_text('"""A docstring may say kind: image."""\nname = "images"\n')
    assert _kind_names(bad, names, classes, modules) == []


def test_conversion_and_preview_hooks(raw_demo, tmp_path):
    kinds = stored_kinds(demo_spec(raw_demo, tmp_path))
    raw = np.arange(2 * 3 * 4 * 4, dtype=np.uint8).reshape(2, 3, 4, 4)
    out = np.empty(raw.shape, np.float32)
    kinds["images"].convert(raw, out, ReadOptions(), {})
    assert np.allclose(out, raw / 255)
    mask = np.zeros((1, 4, 4), np.uint8)
    mask[0, 1, 2] = 1
    tile = kinds["masks"].preview(mask)
    assert tile.shape == (4, 4, 3) and tile[1, 2].any() and not tile[0, 0].any()
    assert kinds["images"].preview(raw[0]).shape == (4, 4, 3)
    with pytest.raises(ValueError, match="mask_dtype"):
        kinds["masks"].output_dtype(ReadOptions(mask_dtype="float32"))


def test_format_doc_matches_the_code():
    doc = (REPO / "docs" / "format.md").read_text()
    assert doc == with_table(doc), "docs/format.md is out of date: run `make docs`"


# ---- entry points ------------------------------------------------------------------------------

def installed(site: Path, dist: str, points: str, module: str | None = None) -> None:
    """A distribution ``dist`` 1.0 installed in the folder ``site`` (put on the path by the caller)
    with the entry points ``points`` of the group h5forge.kinds and, when given, the source of its
    module (named after it)."""
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[h5forge.kinds]\n{points}\n")
    if module is not None:
        (site / f"{dist.replace('-', '_')}.py").write_text(module)


HALF = "from h5forge.kinds.base import FieldKind\n\nclass Half(FieldKind):\n    kind = 'half'\n"
BROKEN = {  # a module, and what is said of it
    "import": ("import a_decoder_not_installed\n", "ModuleNotFoundError: No module named 'a_decoder_not_installed'"),
    "not-a-kind": ("Half = 3\n", "TypeError: 3 is not a FieldKind subclass"),
    "abstract": (HALF, "TypeError: Half lacks ['decode', 'stored']"),
    "named-otherwise": (HALF.replace("'half'", "'whole'") + "    stored = decode = None\n",
                        "TypeError: Half.kind is 'whole', not the entry point's name"),
    "no-spec": (HALF + "    stored = decode = None\n",
                'TypeError: Half.Spec must be a pydantic model with a field kind: Literal["half"]'),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_kind_that_does_not_load_is_left_out_with_a_warning_naming_its_package(case, tmp_path, monkeypatch):
    module, said = BROKEN[case]
    dist = f"h5forge-broken-{case}"
    installed(tmp_path, dist, f"half = {dist.replace('-', '_')}:Half", module)
    monkeypatch.syspath_prepend(tmp_path)
    registry = Registry()
    reason = f"the entry point half = {dist.replace('-', '_')}:Half of {dist} 1.0 did not load: {said}"
    with pytest.warns(KindNotLoaded) as caught:
        assert OWN <= set(registry) and "half" not in registry  # the other kinds still serve
    assert [str(w.message) for w in caught] == [f"{reason}; field kind 'half' is left out"]
    assert registry.broken == {"half": reason}


def test_two_kinds_of_one_name_are_an_error_naming_both(tmp_path, monkeypatch):
    installed(tmp_path, "h5forge-twin", "image = h5forge_twin:Image")
    monkeypatch.syspath_prepend(tmp_path)
    with pytest.raises(KindRegistryError) as err:
        len(Registry())
    assert str(err.value) == (
        "field kind 'image' is declared twice: by the entry point image = h5forge.kinds.image:ImageKind of "
        "h5forge 0.1.0 and by the entry point image = h5forge_twin:Image of h5forge-twin 1.0; uninstall one of them")


def test_without_h5forge_own_entry_points_the_error_says_to_install_it_again():
    with pytest.raises(KindRegistryError, match="h5forge's own field kinds are not among the 'h5forge.nothing' "
                                                r"entry points: .* install it again \(pip install -e \. in a clone\)"):
        list(Registry("h5forge.nothing"))


FRESH = Registry()  # the registry the module below asks while it is being loaded


def test_a_kind_module_that_asks_the_registry_as_it_loads_is_left_out_with_the_reason(tmp_path, monkeypatch):
    installed(tmp_path, "h5forge-asks", "asks = h5forge_asks:Asks",
              "from tests.kinds.test_registry import FRESH\nAsks = FRESH['image']\n")
    monkeypatch.syspath_prepend(tmp_path)
    with pytest.warns(KindNotLoaded, match="KindRegistryError: a field kind's module asks the registry while it "
                                           "is being imported"):
        assert "asks" not in FRESH and "image" in FRESH


def test_a_spec_naming_a_kind_that_did_not_load_says_why_and_the_cli_shows_no_traceback(tmp_path):
    """In a fresh process (the registry loads once): a spec that does not use the broken kind
    validates, one that does (written by hand, or stored in a dataset) is refused with the reason;
    ``h5forge build`` says it in one line. Two kinds of one name stop every command, in one line."""
    site = tmp_path / "site"
    installed(site, "h5forge-broken", "half = h5forge_broken:Half", BROKEN["import"][0])
    env = {**os.environ, "PYTHONPATH": str(site)}
    spec = {"name": "x", "source": {"root": str(tmp_path)}, "output": {"dir": str(tmp_path / "out")},
            "fields": {"images": {"kind": "image", "files": "*.png", "size": [8, 8]}}}
    half = {**spec, "fields": {**spec["fields"], "part": {"kind": "half", "files": "*.half"}}}
    script = (f"from pathlib import Path\nimport json\nfrom h5forge.spec import parse_spec, spec_from_json\n"
              f"parse_spec({spec!r}, Path('.'))\n"
              f"for load in (lambda: parse_spec({half!r}, Path('.')), lambda: spec_from_json(json.dumps({half!r}))):\n"
              "    try:\n        load()\n    except ValueError as err:\n        print(err)\n")
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    reason = ("fields.part: kind 'half': the entry point half = h5forge_broken:Half of h5forge-broken 1.0 did not "
              "load: ModuleNotFoundError: No module named 'a_decoder_not_installed'")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["invalid spec <dict>:", f"  {reason}",
                                       "invalid spec stored in the dataset:", f"  {reason}"]
    assert run.stderr.count("KindNotLoaded") == 1 and "Traceback" not in run.stderr
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(half))
    h5forge = Path(sys.executable).with_name("h5forge")
    build = subprocess.run([h5forge, "build", spec_path], env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 2 and reason in build.stderr and "Traceback" not in build.stderr, build.stderr
    installed(site, "h5forge-twin", "image = h5forge_twin:Image")
    twice = subprocess.run([h5forge, "versions", tmp_path], env=env, capture_output=True, text=True, timeout=300)
    assert twice.returncode == 1 and "Traceback" not in twice.stderr
    assert twice.stderr.startswith("error: field kind 'image' is declared twice"), twice.stderr

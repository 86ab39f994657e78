"""The registry: every kind is reachable by its name, owns its layout, and nothing else branches."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from h5forge.kinds import REGISTRY, ReadOptions, decode_order, field_kinds, stored_kinds
from h5forge.kinds.column import ColumnKind
from h5forge.kinds.doc import with_table
from tests.helpers.data import REPO, demo_spec

PACKAGE = REPO / "src" / "h5forge"


def test_registry_and_spec_union_agree(raw_demo, tmp_path):
    assert set(REGISTRY) == {"image", "mask", "label", "paired", "signal", "volume", "volume_mask", "boxes"}
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
    names = set(REGISTRY)
    classes = {c.__name__ for c in REGISTRY.values()} | {c.Spec.__name__ for c in REGISTRY.values()}
    modules = {c.__module__ for c in REGISTRY.values()} | {ColumnKind.__module__}
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
    names, classes, modules = set(REGISTRY), {c.__name__ for c in REGISTRY.values()}, \
        {c.__module__ for c in REGISTRY.values()}
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


def test_register_refuses_a_duplicate_or_an_incomplete_kind():
    from h5forge.kinds import FieldKind, register
    from h5forge.kinds.image import ImageKind

    with pytest.raises(ValueError, match="registered twice"):
        register(ImageKind)

    class Half(FieldKind):  # no stored() nor decode()
        kind = "half"

    with pytest.raises(TypeError, match="decode"):
        register(Half)
    assert "half" not in REGISTRY

"""The docs stay true to the code: docs/architecture.md lists every module, every code name the docs
cite in backticks exists, every ``h5forge`` command line they show parses, and they speak of the
project, never of its issue tracker."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

from tests.helpers.data import REPO

PRIMARY = ["src/h5forge", "flows", "tasks", "deployments"]  # flows/, tasks/, deployments/ install as h5forge.*
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
ROOTS = ("src/", "tests/", "benchmarks/", "docs/", "config/", "flows/", "tasks/", "deployments/")
FILE_SUFFIXES = {"py", "md", "json", "jsonl", "yaml", "toml", "h5", "log", "txt", "csv", "png", "npz", "lease", "gz"}
EXTERNAL_ALIASES = {"np", "tf"}  # libraries cited by their usual import alias
INSTANCES = {"ds": "H5Dataset"}  # the docs' name for an instance of a class


def python_files(folder: str) -> set[str]:
    """The .py files under a folder, relative to the repository (not through the package's symlinks)."""
    found = set()
    for top, dirs, files in os.walk(REPO / folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found |= {str((Path(top) / f).relative_to(REPO)) for f in files if f.endswith(".py")}
    return found


def tree_entries(doc: str) -> list[str]:
    """The paths docs/architecture.md's tree names: one entry a line, indented two spaces a level."""
    block = doc.split("## The tree", 1)[1].split("```")[1]
    paths, stack = [], []
    for line in block.splitlines()[1:]:
        name = line.split()[0]
        stack[(len(line) - len(line.lstrip())) // 2 :] = [name]
        paths.append("".join(stack))
    return paths


def test_the_architecture_tree_lists_every_module_and_only_modules_that_exist():
    entries = tree_entries((REPO / "docs" / "architecture.md").read_text())
    assert [p for p in entries if not (REPO / p).exists()] == [], "the tree names what does not exist"
    modules = {p for f in PRIMARY for p in python_files(f) if not p.endswith("__init__.py")}
    assert sorted(modules - set(entries)) == [], "docs/architecture.md's tree misses these modules"


@cache
def module_index() -> dict[str, ast.Module]:
    """Every module of the package by dotted name (flows/, tasks/, deployments/ as h5forge.*)."""
    index = {}
    for folder in PRIMARY:
        for rel in python_files(folder):
            parts = Path(rel).with_suffix("").parts
            parts = parts[2:] if parts[0] == "src" else parts
            name = ".".join(("h5forge", *parts)).removesuffix(".__init__")
            index[name] = ast.parse((REPO / rel).read_text())
    return index


def top_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.If):  # TYPE_CHECKING alternatives
            names |= top_names(ast.Module(body=node.body + node.orelse, type_ignores=[]))
    if "__getattr__" in names:  # a lazy module attribute is a string it answers to (h5forge.build)
        names |= {c.value for c in ast.walk(tree) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return names


@cache
def classes() -> dict[str, list[ast.ClassDef]]:
    found: dict[str, list[ast.ClassDef]] = {}
    for tree in module_index().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(node)
    return found


def members(cls: ast.ClassDef, seen: frozenset = frozenset()) -> set[str]:
    """A class's attributes: methods, class attributes and fields, ``self.x`` set in its methods,
    and those of its bases that are h5forge classes."""
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not cls:
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
    for base in cls.bases:
        base = base.value if isinstance(base, ast.Subscript) else base  # a generic's: FieldKind[ImageField]
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        for c in classes().get(name, []) if name not in seen else []:
            names |= members(c, seen | {cls.name})
    return names


def resolves_in_module(module: str, rest: list[str], strict: bool) -> bool:
    """``rest`` is a name in ``module``: a submodule, a top-level name, then a member of that class;
    or (unless ``strict``, for ``writer.add`` said of a writer) a member of a class the module defines."""
    if not rest:
        return True
    if f"{module}.{rest[0]}" in module_index():
        return resolves_in_module(f"{module}.{rest[0]}", rest[1:], strict)
    tree = module_index()[module]
    if rest[0] in top_names(tree):
        found = classes().get(rest[0])  # a name that is no class (a function, a constant) ends the path
        return len(rest) == 1 or not found or any(rest[1] in members(c) for c in found)
    return not strict and any(rest[0] in members(c) for c in tree.body if isinstance(c, ast.ClassDef))


def spec_key(parts: list[str]) -> bool | None:
    """``compute.inline_below``: a key of a spec section (None: ``parts[0]`` names no section)."""
    models = {n.name: n for n in module_index()["h5forge.spec"].body if isinstance(n, ast.ClassDef)}
    fields = {n.target.id: n.annotation for n in models["DatasetSpec"].body if isinstance(n, ast.AnnAssign)}
    section = fields.get(parts[0])
    if not isinstance(section, ast.Name) or section.id not in models:
        return None
    return parts[1] in members(models[section.id])


def code_name_exists(text: str) -> bool | None:
    """Whether a dotted name cited in the docs exists; None when it names nothing of h5forge's."""
    parts = text.split(".")
    parts[0] = INSTANCES.get(parts[0], parts[0])
    if parts[-1] in FILE_SUFFIXES:
        return None
    if parts[0] == "h5forge":
        module = max((m for m in module_index() if parts[: m.count(".") + 1] == m.split(".")), key=len)
        return resolves_in_module(module, parts[module.count(".") + 1 :], strict=True)
    if parts[0] in EXTERNAL_ALIASES or importlib.util.find_spec(parts[0]) is not None:
        return None
    verdicts = [
        resolves_in_module(m, parts[k:], strict=False)
        for m in module_index()
        for k in range(1, len(parts))
        if m.endswith("." + ".".join(parts[:k]))
    ]
    verdicts += [len(parts) == 1 or parts[1] in members(c) for c in classes().get(parts[0], [])]
    if (key := spec_key(parts)) is not None:
        verdicts.append(key)
    return any(verdicts) if verdicts else None


@cache
def repo_paths() -> set[str]:
    found = set()
    for top, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "build", "data")]
        rel = Path(top).relative_to(REPO)
        found |= {str(rel / n) for n in [*dirs, *files]}
    return found


def path_exists(text: str) -> bool:
    """A file or folder of the repository, by its path (``tests/...``), its path in the package
    (``read/_direct.py``) or the end of its path (``detect.py``); ``file.py::name`` defines name."""
    path, _, name = text.partition("::")
    path = path.rstrip("/")
    hits = [p for p in repo_paths() if p == path or (not path.startswith(ROOTS) and p.endswith("/" + path))]
    if name:
        return any(name in top_names(ast.parse((REPO / p).read_text())) for p in hits)
    return bool(hits)


def code_spans(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [s.strip() for s in re.findall(r"`([^`\n]+)`", text)]


def unresolved(span: str) -> bool:
    """A backticked span that cites a path or a code name that does not exist."""
    if re.fullmatch(r"[\w./-]+\.py(::\w+)?", span) or (span.startswith(ROOTS) and re.fullmatch(r"[\w./-]+", span)):
        return not path_exists(span)
    if command := re.fullmatch(r"python -m ([\w.]+)( .*)?", span):
        return not path_exists(command[1].replace(".", "/") + ".py")
    name = re.sub(r"(\(.*\)|: \S+)$", "", span)  # a call's arguments, a spec key's value
    if re.fullmatch(r"[A-Za-z_]\w*(\.\w+)+", name):
        return code_name_exists(name) is False
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_code_name_the_docs_cite_exists(doc):
    assert [s for s in code_spans(doc) if unresolved(s)] == []


def source_citations(path: Path) -> list[str]:
    """What a module's text cites: backticked spans, paths of .py files, h5forge's dotted names."""
    text = path.read_text()
    return [
        *re.findall(r"`+([^`\n]+?)`+", text),
        *re.findall(r"(?<![\w./-])(\w+/[\w/]+\.py)\b", text),
        *re.findall(r"(?<![\w.])h5forge(?:\.\w+)+", text),
    ]


@pytest.mark.parametrize("folder", PRIMARY)
def test_every_code_name_the_source_cites_exists(folder):
    assert [
        f"{p}: {s}" for p in sorted(python_files(folder)) for s in source_citations(REPO / p) if unresolved(s)
    ] == []


@cache
def cli() -> dict[str, set[str]]:
    """Every command of the CLI (``server status`` as one) and its options."""
    import typer.main

    from h5forge._cli import app

    found: dict[str, set[str]] = {}

    def walk(command, prefix: str) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            found[prefix + name] = {o for p in sub.params for o in [*p.opts, *p.secondary_opts]} | {"--help"}
            walk(sub, prefix + name + " ")

    walk(typer.main.get_command(app), "")
    return found


def command_lines(path: Path) -> list[str]:
    """The ``h5forge …`` command lines a doc shows, in backticks or in code blocks."""
    text = path.read_text()
    blocks = "\n".join(re.findall(r"```.*?```", text, flags=re.S))
    lines = [*code_spans(path), *(re.sub(r"^\$ ", "", ln.strip()) for ln in blocks.splitlines())]
    return [ln for ln in lines if re.match(r"h5forge [a-z]", ln)]


def bad_option(line: str) -> str | None:
    words = shlex.split(line.split("#")[0].split("|")[0].replace("…", ""), posix=True)[1:]
    command = next((c for c in sorted(cli(), key=len, reverse=True) if words[: c.count(" ") + 1] == c.split()), None)
    if command is None:
        return None if words[0].startswith("-") else f"no command {words[0]!r}"
    wrong = [w for w in words if w.startswith("--") and w.split("=")[0] not in cli()[command]]
    return f"{command}: no option {wrong}" if wrong else None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_line_the_docs_show_parses(doc):
    assert {ln: e for ln in command_lines(doc) if (e := bad_option(ln))} == {}


# an issue number, or "the issue": what a reader of the project has no access to
ISSUE = re.compile(r"\bissues?\s+(#?\d+|[A-Z]\b)|(?<![\w&/])#\d+\b|\bthe issue\b", re.I)


def test_the_docs_and_the_source_cite_no_issue():
    """The docs and comments speak of the project; an issue number means nothing to its reader."""
    texts = [*DOCS, *(REPO / p for f in PRIMARY for p in python_files(f))]
    hits = [f"{p.relative_to(REPO)}: {m[0]}" for p in texts for m in ISSUE.finditer(p.read_text())]
    assert hits == []


def test_the_checks_catch_what_they_guard_against():
    assert unresolved("h5forge.read._reader.SplitReader") is False
    assert unresolved("h5forge.read._reader.SplitReaderX") is True
    assert unresolved("_store.thin.export") is False and unresolved("_store.thin.exports") is True
    assert unresolved("Decoded.sha256") is False and unresolved("Decoded.sha") is True
    assert unresolved("compute.inline_below") is False and unresolved("compute.inline_above") is True
    assert unresolved("read/_direct.py") is False and unresolved("read/indirect.py") is True
    assert unresolved("tests/test_docs.py::test_the_checks_catch_what_they_guard_against") is False
    assert unresolved("tests/test_docs.py::test_nothing") is True
    assert unresolved("os.path.realpath") is False and unresolved("ds.loader()") is False
    assert unresolved("ds.loaders()") is True and unresolved("python -m benchmarks.nightlies --n 1") is True
    tree = "## The tree\n```\nsrc/h5forge/\n  read/     the readers\n    torch.py  H5Dataset\nflows/\n```"
    assert tree_entries(tree) == ["src/h5forge/", "src/h5forge/read/", "src/h5forge/read/torch.py", "flows/"]
    assert bad_option("h5forge build spec.yaml --output out") is None
    assert bad_option("h5forge build spec.yaml --out out") is not None
    assert ISSUE.search("as issue 27 asks") and ISSUE.search("see #27") and ISSUE.search("issue P")

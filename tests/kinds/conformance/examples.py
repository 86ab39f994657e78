"""A built example of each registered kind: the demo folder that shows it, the spec ``init``
infers for that folder, a version built from it and an inbox of new samples, by the plain pipeline.

A kind is shown by its own demo (``Plugins.demos``) when its demo's spec holds a field of the
kind, else by the first other kind's demo whose spec does (a mask volume is shown by the CT demo).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from h5forge.kinds import REGISTRY, FieldKind, demos, stored_kinds

GOOD = 8  # good samples of the built version (every split gets some at the default ratios)
NEW = 3  # good samples of the inbox an append takes


@dataclass
class Example:
    kind: str
    demo: str
    raw: Path
    spec_path: Path
    out: Path
    inbox: Path
    version: Path | None = None
    kinds: dict[str, FieldKind] = field(default_factory=dict)  # every stored dataset of the spec

    @property
    def paths(self) -> list[str]:
        """The stored datasets of the kind under test."""
        return [p for p, k in self.kinds.items() if k.kind == self.kind]


def _order(kind: str) -> list[str]:
    """Demo names to try for ``kind``: its own first, then every other one in registry order."""
    own = [d.name for d in vars(REGISTRY[kind]).get("demos", ())]
    return own + [name for name in demos() if name not in own]


class Examples:
    """Demo folders generated and specs inferred once per test session, built on first use."""

    def __init__(self, root: Path):
        self.root = root
        self._specs: dict[str, tuple[Path, Path, set[str]]] = {}
        self._built: dict[str, Example] = {}

    def _inferred(self, demo: str) -> tuple[Path, Path, set[str]]:
        if demo not in self._specs:
            from h5forge._init import infer_spec
            from h5forge.spec import load_spec

            raw = self.root / demo / "raw"
            demos()[demo].load()(raw, n=GOOD, seed=3, bad=False)
            spec_path = self.root / demo / "spec.yaml"
            spec_path.write_text(infer_spec(raw, spec_path).text)
            kinds = {k.kind for k in stored_kinds(load_spec(spec_path)).values()}
            self._specs[demo] = (raw, spec_path, kinds)
        return self._specs[demo]

    def demo_for(self, kind: str) -> str | None:
        return next((d for d in _order(kind) if kind in self._inferred(d)[2]), None)

    def built(self, kind: str) -> Example:
        """The example of ``kind``, its first version built with ``h5forge.build``."""
        import h5forge
        from h5forge.spec import load_spec

        if kind in self._built:
            return self._built[kind]
        demo = self.demo_for(kind)
        assert demo is not None, f"no demo folder shows a {kind!r} field: declare one in its demos"
        raw, spec_path, _ = self._inferred(demo)
        out, inbox = self.root / demo / "out", self.root / demo / "inbox"
        ex = Example(kind, demo, raw, spec_path, out, inbox, kinds=stored_kinds(load_spec(spec_path)))
        if not out.exists():
            result = h5forge.build(spec_path, output=out)
            assert result.version is not None, result
            demos()[demo].load()(inbox, n=NEW, seed=11, bad=False, **_new_prefix(demo))
            _age(inbox)
        ex.version = out / "dataset_v0001.h5"
        self._built[kind] = ex
        return ex

    def appended(self, kind: str) -> Path:
        """The version ``h5forge.append`` publishes from the example's inbox (once per demo)."""
        import h5forge

        ex = self.built(kind)
        second = ex.out / "dataset_v0002.h5"
        if not second.exists():
            result = h5forge.append(ex.spec_path, inbox=ex.inbox, output=ex.out)
            assert result.added == NEW, result
        return second


def _new_prefix(demo: str) -> dict[str, str]:
    """A prefix that makes the inbox's sample ids new and still matches the spec's globs (which may
    start with the demo's own prefix): the demo's prefix followed by ``new``."""
    import inspect

    own = inspect.signature(demos()[demo].load()).parameters["prefix"].default
    return {"prefix": f"{own}new"}


def _age(folder: Path, seconds: float = 60) -> None:
    """Files older than an append's settle time (it takes only files that stopped changing)."""
    then = time.time() - seconds
    for p in folder.rglob("*"):
        os.utime(p, (then, then))

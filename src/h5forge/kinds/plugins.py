"""What a kind declares for the layers above it: the ``init`` layouts that recognise it in a raw
folder (``detectors``) and the demo folders that show it (``demos``).

``kinds/`` may not import ``_init/`` or ``_demo/``, so detectors and generators are named by
``"module:function"`` and loaded when they run. Only a class's own declarations count (``vars``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any, Callable, ClassVar


def load_ref(ref: str) -> Any:
    """The object ``"package.module:name"`` names."""
    module, _, name = ref.partition(":")
    return getattr(import_module(module), name)


@dataclass(frozen=True)
class Detector:
    """An ``init`` layout: ``detect(kind, raw, notes, todo) -> Layout | None`` named as
    ``"module:function"``; lower ``priority`` runs first (the first layout found wins)."""

    ref: str
    priority: int
    expects: str  # what it recognises, for the CLI's help and the error when nothing matches

    def load(self) -> Callable[..., Any]:
        return load_ref(self.ref)


@dataclass(frozen=True)
class Layout:
    """What a detector found: the layout's name and the spec's ``fields:`` body (written into the
    ``SpecText`` ``init`` passes), with what the rest of the spec needs to know of it."""

    name: str
    body: Callable[[Any], None]
    ids: str | None = None  # ``ids: path`` when samples are named by their path (class folders)
    split_column: str | None = None
    batch_size: int | None = None  # samples per task, when they are large (volumes)


@dataclass(frozen=True)
class Demo:
    """A demo raw folder for ``h5forge demo-data --kind NAME``: ``generate(root, n, seed, bad,
    **options) -> {path: defect}`` named as ``"module:function"``."""

    name: str
    ref: str
    default_n: int  # enough good samples that the defects stay under a build's max_rejected
    about: str
    noun: str = "samples"  # what the CLI says it wrote
    marker: str | None = None  # a file whose presence means the folder holds this demo (else: any file)

    def load(self) -> Callable[..., dict]:
        return load_ref(self.ref)


class Plugins:
    """A kind that ``init`` recognises or ``demo-data`` shows."""

    detectors: ClassVar[tuple[Detector, ...]] = ()
    demos: ClassVar[tuple[Demo, ...]] = ()

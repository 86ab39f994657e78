"""The field kinds installed, by name: the entry points of the group ``h5forge.kinds``.

Every kind, h5forge's own included (pyproject.toml), is an entry point ``<kind> =
"package.module:KindClass"``, so a package adds a kind without an edit to h5forge. They are
loaded once, when the registry is first asked: importing the readers imports no kind.

An entry point that gives no complete kind is left out with a ``KindNotLoaded`` warning naming its
distribution, and a spec using it is refused with the same reason: a broken package stops only
the datasets that need it (make the warning an error to stop everything). Two entry points of one
name are an error naming both.
"""

from __future__ import annotations

import inspect
import threading
import warnings
from importlib.metadata import EntryPoint, entry_points
from typing import Iterator, Literal, Mapping

from pydantic import BaseModel

from h5forge.errors import KindRegistryError
from h5forge.kinds.base import FieldKind

GROUP = "h5forge.kinds"
OWN = "h5forge"  # its kinds come first; without them its installed metadata is out of date


class KindNotLoaded(UserWarning):
    """A field kind's entry point is left out; the message says which and why."""


def origin(point: EntryPoint) -> str:
    """The entry point as its distribution declares it, for messages."""
    dist = f"{point.dist.name} {point.dist.version}" if point.dist else "an unknown distribution"
    return f"entry point {point.name} = {point.value} of {dist}"


def check(name: str, kind: object) -> None:
    """Raise TypeError saying why ``kind`` is not a complete field kind named ``name``."""
    if not (isinstance(kind, type) and issubclass(kind, FieldKind)):
        raise TypeError(f"{kind!r} is not a FieldKind subclass")
    if inspect.isabstract(kind):
        raise TypeError(f"{kind.__name__} lacks {sorted(kind.__abstractmethods__)}")
    if getattr(kind, "kind", None) != name:
        raise TypeError(f"{kind.__name__}.kind is {getattr(kind, 'kind', None)!r}, not the entry point's name")
    spec = getattr(kind, "Spec", None)
    field = spec.model_fields.get("kind") if isinstance(spec, type) and issubclass(spec, BaseModel) else None
    if field is None or field.annotation != Literal[name]:  # the spec union's discriminator
        raise TypeError(f'{kind.__name__}.Spec must be a pydantic model with a field kind: Literal["{name}"]')


class Registry(Mapping[str, type[FieldKind]]):
    """The kinds of one entry-point group, by name, loaded on first use; ``broken`` says why each
    entry point left out was."""

    def __init__(self, group: str = GROUP):
        self.group = group
        self.broken: dict[str, str] = {}
        self._kinds: dict[str, type[FieldKind]] | None = None
        self._lock = threading.RLock()
        self._loading = False

    def __getitem__(self, name: str) -> type[FieldKind]:
        return self._loaded()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())

    def _loaded(self) -> dict[str, type[FieldKind]]:
        if self._kinds is None:
            with self._lock:  # one thread loads; the others wait for its result
                if self._kinds is None:
                    if self._loading:
                        raise KindRegistryError(
                            "a field kind's module asks the registry while it is being imported: "
                            "import the other kinds' modules it needs instead"
                        )
                    self._loading = True
                    try:
                        self._kinds = self._load()
                    finally:
                        self._loading = False
        return self._kinds

    def _load(self) -> dict[str, type[FieldKind]]:
        # h5forge's own first, then the other distributions by name: the same order on every machine
        points = sorted(
            entry_points(group=self.group), key=lambda p: (p.dist.name != OWN, p.dist.name) if p.dist else (True, "")
        )
        named: dict[str, EntryPoint] = {}
        for point in points:
            if point.name in named:
                raise KindRegistryError(
                    f"field kind {point.name!r} is declared twice: by the {origin(named[point.name])} and by "
                    f"the {origin(point)}; uninstall one of them"
                )
            named[point.name] = point
        if not any(p.dist and p.dist.name == OWN for p in points):
            raise KindRegistryError(
                f"h5forge's own field kinds are not among the {self.group!r} entry points: its installed "
                "metadata is missing or out of date; install it again (pip install -e . in a clone)"
            )
        kinds: dict[str, type[FieldKind]] = {}
        for name, point in named.items():
            try:
                kind = point.load()
                check(name, kind)
            except Exception as err:  # a package's bug leaves its kind out, not every other dataset
                self.broken[name] = f"the {origin(point)} did not load: {type(err).__name__}: {err}"
                warnings.warn(f"{self.broken[name]}; field kind {name!r} is left out", KindNotLoaded, stacklevel=2)
                continue
            kinds[name] = kind
        return kinds

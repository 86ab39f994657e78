"""The commented YAML ``init`` writes: scalars that read back as the value they stand for, and spec
lines whose comments line up, so a reviewer reads each value beside the reason it was chosen."""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

import yaml

_COMMENT_AT = 27
# what YAML reads as the end of a line (and the other control characters): a comment holding one
# would end there, and its rest be read as YAML
_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` for a comment: a line break or other control character written as its escape
    (``\\n``), as folder and file names may hold them."""
    return _BREAKS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def scalar(value: Any) -> str:
    """A YAML scalar that reads back as ``value`` (quoted when it would not, e.g. ``*/*.jpg``)."""
    text = str(value)
    try:
        if text and yaml.safe_load(f"[{text}]") == [value] and yaml.safe_load(f"{{{text}: 0}}") == {value: 0}:
            return text
    except yaml.YAMLError:
        pass
    return json.dumps(text)


def flow(values: Iterable[Any]) -> str:
    return "[" + ", ".join(scalar(v) for v in values) + "]"


def mapping(items: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{scalar(k)}: {v}" for k, v in items.items()) + "}"


def files_value(globs: list[str]) -> str:
    return scalar(globs[0]) if len(globs) == 1 else flow(globs)


class SpecText:
    """Spec lines with their comments aligned."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.placeholders: dict[int, str] = {}  # line -> what stands in for a TODO when validating

    def __call__(self, indent: int, text: str, comment: str | None = None) -> None:
        line = "  " * indent + text
        if comment:
            line = (line.ljust(_COMMENT_AT) if len(line) < _COMMENT_AT else line + " ") + "# " + one_line(comment)
        self.lines.append(line)

    def comment(self, indent: int, text: str) -> None:
        self.lines.append("  " * indent + "# " + one_line(text))

    def more(self, text: str) -> None:
        """A comment continued on the next line, in the comment column."""
        self.lines.append(" " * _COMMENT_AT + "# " + one_line(text))

    def todo(self, indent: int, key: str, placeholder: str, why: str) -> None:
        """A value the user must fill in, written as a ``# key: TODO`` comment (so the spec is
        incomplete, never silently wrong); ``placeholder`` stands in for it when the rest is checked."""
        self.placeholders[len(self.lines)] = "  " * indent + f"{key}: {placeholder}"
        self.comment(indent, f"{key}: TODO  <- {why}")

    def checked(self) -> str:
        """The text with the TODO lines filled by their placeholders, to validate the rest."""
        return "\n".join(self.placeholders.get(i, line) for i, line in enumerate(self.lines)) + "\n"

"""Text from users' files (ids, paths, labels, reasons) inside Markdown reports and artifacts.

A value is shown as text, whatever it holds: no character of it starts emphasis, code, a link,
an image, a table cell or HTML (the Prefect UI renders Markdown artifacts), and a line break or
another control character is written as its escape instead of ending a table row.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")
_MARKUP = re.compile(r"([\\`*_\[\]()!|~])")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def text(value: object) -> str:
    """``value`` as literal Markdown text, safe in a table cell."""
    s = _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", str(value))
    s = _MARKUP.sub(r"\\\1", s)
    return "".join(_HTML.get(c, c) for c in s)

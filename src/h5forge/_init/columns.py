"""The type of each column of an annotation file, from its values: JSON values carry their type,
CSV text is read as the narrowest type every value fits. A column that cannot be stored (lists,
objects, a name with ``/``) or that the folders already give is left out, with a note."""

from __future__ import annotations

import re
from typing import Any

from h5forge._ingest.discover import TEXT_FORMAT


def _text_type(values: list[str]) -> str:
    """The column type of CSV text values (all non-empty); leading zeros (00123) make codes, not numbers."""
    if any(re.fullmatch(r"[+-]?0\d+", v) for v in values):
        return "str"
    if all(re.fullmatch(r"[+-]?\d+", v) for v in values):
        return "int"
    try:
        for v in values:
            float(v)
        return "float"
    except ValueError:
        pass
    if all(v.lower() in ("true", "false", "yes", "no") for v in values):
        return "bool"
    return "str"


def _json_type(values: list[Any]) -> str | None:
    if any(isinstance(v, (list, dict)) for v in values):
        return None
    if all(isinstance(v, bool) for v in values):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "float"
    return "str"


def column_types(
    records: list[dict], id_key: str, text: bool, name: str, skip: set[str], notes: list[str]
) -> tuple[dict[str, str], dict[str, set]]:
    """{column: type} and {column: its distinct values} of the records (``text``: CSV), without the
    id column and the ``skip`` columns."""
    kinds: dict[str, str] = {}
    distinct: dict[str, set] = {}
    keys = sorted({k for r in records for k in r} - {id_key, TEXT_FORMAT})
    for key in keys:
        if key in skip:
            notes.append(
                f"{name}: column {key!r} is not declared (the folders give it); "
                "a record's value still takes precedence over the folder"
            )
            continue
        if "/" in key or not key.strip():
            notes.append(f"{name}: column {key!r} is not declared (a column name cannot hold '/' or be blank)")
            continue
        absent = sum(1 for r in records if r.get(key) is None)  # no value at all: rejected whatever the type
        present = [r[key] for r in records if r.get(key) is not None and not (text and str(r[key]).strip() == "")]
        if not present:
            continue
        if text:
            kind = _text_type([str(v).strip() for v in present])
            values = {str(v) if kind == "str" else str(v).strip() for v in present}  # str values stay as written
        else:
            json_kind = _json_type(present)
            if json_kind is None:
                notes.append(
                    f"{name}: column {key!r} holds lists or objects and is not declared "
                    "(only str, int, float and bool columns are stored)"
                )
                continue
            kind, values = json_kind, set(present)
        missing = len(records) - len(present) if kind != "str" else absent  # an empty text is a str
        if missing:
            notes.append(
                f"{name}: column {key!r} is missing in {missing} of {len(records)} records; "
                "those samples will be rejected (drop the column from columns if it is optional)"
            )
        kinds[key] = kind
        distinct[key] = values
    return kinds, distinct

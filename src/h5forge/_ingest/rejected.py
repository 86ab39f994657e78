"""The ``max_rejected`` gate: a build that rejected more of its inputs than the spec allows
publishes nothing, and says how many and why.

An input is one sample the build saw (complete or not) or one annotation record without files:
each rejection stands for ``count`` of them. Duplicates (``_ingest.duplicates``) are reported but
not counted against the limit: their content is in the version. Append does not apply the gate: its rejected inputs
are moved to ``<inbox>/quarantine/`` with a ``.reason`` file each, where the user dropped them,
and refusing the whole batch would leave them in the inbox to fail again on every round.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable

from h5forge.errors import TooManyRejected
from h5forge._format.names import QUARANTINE_DIR, version_tag
from h5forge._format.summary import WriteSummary
from h5forge._ingest.discover import Inventory
from h5forge._samples import Rejection, encodable
from h5forge.spec import DatasetSpec
from h5forge._store.versions import Candidate

COMMON_REASONS = 3


def inputs_seen(inventory: Inventory) -> int:
    """Every sample discovery paired plus every input it rejected."""
    return len(inventory.samples) + inventory.rejected


def kept_duplicates(inventory: Inventory, rejections: Iterable[Rejection]) -> int:
    """The duplicates whose kept copy was not rejected: no bad inputs, their content is in the version."""
    refused = {r.sample_id for r in rejections if r.sample_id not in inventory.duplicate_of}
    return sum(1 for dup, kept in inventory.duplicate_of.items() if kept not in refused)


# a word of a reason that carries a value: a number (``-3.5..2.5``, ``300x400``), a path
# (``case_7/slice_004.dcm``, not ``Rows/Columns``) or a quoted name; a dtype (``int16``) or a dimension (``4-D``) names the kind of the reason instead
_VALUE = re.compile(r"""^[-+]?\.?\d|^/|/.*[\d._*]|[\d._*].*/|^['"]""")
_KIND_WORD = re.compile(r"^(u?int|float|complex)\d+$|^\d-D$")
_EDGES = "([{,;:.)]}"


def reason_kind(reason: str) -> str:
    """``reason`` with the words that carry values written as ``…``: reasons that differ only in
    their values (``values -3.5..2.5 are not int16 integers``, ``values 0.5..7 are not ...``) are
    one kind."""
    words: list[str] = []
    for word in reason.split():
        bare = word.strip(_EDGES)
        if bare and _VALUE.search(bare) and not _KIND_WORD.match(bare):
            word = word.replace(bare, "…")
            if words and words[-1].strip(_EDGES) == "…" and words[-1].endswith("…"):
                continue  # one mark for a run of values
        words.append(word)
    return " ".join(words)


def common_reasons(rejections: Iterable[Rejection], n: int = COMMON_REASONS) -> list[tuple[str, int]]:
    """The ``n`` most common kinds of reason (``reason_kind``) with their counts, most inputs first
    (ties: first seen first). A kind seen with one wording is that wording; with several, its
    wording with the values left out and the first reason as an example."""
    counts: Counter = Counter()
    wordings: dict[str, dict[str, None]] = {}
    for r in rejections:
        kind = reason_kind(r.reason)
        counts[kind] += r.count
        wordings.setdefault(kind, {})[r.reason] = None
    return [(_described(kind, list(wordings[kind])), count) for kind, count in counts.most_common(n)]


def _described(kind: str, wordings: list[str]) -> str:
    return wordings[0] if len(wordings) == 1 else f"{kind} (e.g. {wordings[0]})"


def check_rejected(spec: DatasetSpec, inventory: Inventory, summary: WriteSummary, candidate: Candidate) -> None:
    """Raise ``TooManyRejected`` (after discarding the candidate) when the build rejected more
    inputs than ``max_rejected`` allows; the quarantine report is already written."""
    seen = inputs_seen(inventory)
    rejected = summary.rejected - kept_duplicates(inventory, summary.rejections)
    limit = spec.rejected_limit(seen)
    if rejected <= limit:
        return
    candidate.discard()
    allowed = f"{spec.max_rejected * 100:g} % = {limit}" if isinstance(spec.max_rejected, float) else str(limit)
    reasons = encodable("; ".join(f"{n} x {reason}" for reason, n in common_reasons(summary.rejections)))
    share = f"{100 * rejected / seen:.0f} %" if seen else "all"
    report = f"{candidate.out / QUARANTINE_DIR / version_tag(candidate.number)}.rejections.md"
    raise TooManyRejected(
        f"{rejected} of {seen} inputs rejected ({share}), above max_rejected ({allowed}); "
        f"nothing published. Most common reasons: {reasons}; see {report} "
        "(raise max_rejected in the spec to publish anyway)"
    )

"""What flows between discovery, cleaning and the writer: a sample to clean, and a rejected input."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable


@dataclass(frozen=True)
class SampleRef:
    """One sample to clean: its id, split, raw files (relative to the source root), columns."""

    id: str
    split: str
    files: dict[str, str]
    columns: dict[str, Any]
    extra_files: tuple[str, ...] = ()  # e.g. an annotation sidecar that travels with the sample
    # the end of the id that names the part of its files the sample is (a time point of a 4-D
    # volume: ``@t0003``); empty when the sample is its files whole
    part: str = ""
    # by field name, what the field takes for this sample from a file many samples share (the
    # sample's part of a COCO file), read by discovery so that a cleaning worker need not read it
    shared: dict[str, Any] = field(default_factory=dict, compare=False)

    def file_of(self, name: str) -> str:
        """The raw file of field ``name``; ``""`` when the sample has none (an optional file it lacks:
        ``h5forge.kinds.optional``)."""
        return self.files.get(name, "")

    @property
    def input_id(self) -> str:
        """The id of the input the sample comes from (its annotation record's, its split's)."""
        return self.id[: len(self.id) - len(self.part)]


def encodable(text: str) -> str:
    """``text`` as UTF-8 can store it: a file name's undecodable bytes (held as surrogates) as
    ``\\xe9``, any other lone surrogate as ``\\ud800``. HDF5 strings, reports and terminals refuse
    a surrogate, and a rejection that cannot be written would take the whole run down."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no undecodable byte stands for (a JSON "\\ud800")
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True)
class Rejection:
    """A raw input that did not become a sample, and why. ``paths`` are relative to the source."""

    sample_id: str
    paths: tuple[str, ...]
    reason: str
    stage: str = "discover"
    waitable: bool = False  # in an inbox, the missing part may still arrive
    count: int = 1  # inputs this entry stands for: more than 1 summarises many alike, not listed one by one
    # the sample's other files (another field's, its sidecar): not what the reason is about, but
    # refused with it, so an inbox moves them to quarantine/ together
    others: tuple[str, ...] = field(default=(), compare=False)

    @property
    def path(self) -> str:
        """The paths as one line, for reports (never split again: ``paths`` is the data)."""
        return ", ".join(self.paths)

    def as_dict(self) -> dict[str, str]:
        reason = self.reason if self.count == 1 else f"{self.reason}: {self.count} more, not listed one by one"
        # every table, report and artifact of rejections is made of these rows: each value encodable
        return {
            "sample_id": encodable(self.sample_id),
            "path": encodable(self.path),
            "reason": encodable(reason),
            "stage": self.stage,
        }


def rejected_count(rejections: Iterable["Rejection"]) -> int:
    """The inputs a list of rejections stands for: every figure of rejected inputs is this one
    (an entry may summarise many inputs alike, so the number of entries is not it)."""
    return sum(r.count for r in rejections)


class Reject(Exception):
    """Raised while cleaning one sample; becomes a Rejection of that sample."""

    def __init__(self, path: str, reason: str):
        super().__init__(reason)
        self.path = path
        self.reason = reason

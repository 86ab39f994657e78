"""What the flows return (and the CLI prints): small records, never arrays.

Their repr is a line (a notebook shows a result whole): what happened and the figures; the lists
behind the figures (``rejections``, ``health``, ``timings``) are on the attributes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from h5forge._samples import Rejection, rejected_count


def _splits(counts: dict[str, int]) -> str:
    return ", ".join(f"{split} {n}" for split, n in counts.items())


def _rejected(n: int) -> str:
    return f"; {n} input{'s' if n != 1 else ''} rejected (.rejections)" if n else ""


def _warned(warnings: tuple[str, ...]) -> str:
    n = len(warnings)
    return f"; {n} warning{'s' if n != 1 else ''} (.warnings)" if n else ""


@dataclass(frozen=True, repr=False)
class BuildResult:
    name: str
    version: int | None = None  # None: skipped, nothing built
    path: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    rejected: int = 0  # rejected inputs (an entry of ``rejections`` may summarise several)
    compression_ratio: float = 1.0
    timings: dict = field(default_factory=dict)
    health: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    skipped: str | None = None  # why the run did not build
    unchanged: bool = False  # nothing published: ``version`` was built from the same inputs and rules
    left_latest: list[str] = field(default_factory=list)  # ids the previous latest held and this version does not
    unclaimed: int = 0  # files under the source root that no glob of the spec takes
    rejections: tuple[Rejection, ...] = ()  # each input turned away, with its stage and reason
    warnings: tuple[str, ...] = ()  # the health report's (a raw input shared across splits, ...)

    @property
    def samples(self) -> int:
        """Samples the published version holds (latest's, when the build was ``unchanged``)."""
        return sum(self.counts.values())

    def __repr__(self) -> str:
        if self.skipped:
            return f"<BuildResult {self.name}: skipped, {self.skipped}>"
        what = f"unchanged since v{self.version:04d}" if self.unchanged else f"published v{self.version:04d}"
        return (
            f"<BuildResult {self.name}: {what}, {self.samples} samples ({_splits(self.counts)})"
            f"{_rejected(self.rejected)}{_warned(self.warnings)}; {self.path}>"
        )


@dataclass(frozen=True, repr=False)
class AppendResult:
    name: str
    version: int | None = None  # None: nothing appended
    path: str | None = None
    added: int = 0
    added_counts: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    waiting: int = 0  # samples waiting for a missing part or for their files to settle
    rejections: tuple[Rejection, ...] = ()
    skipped: str | None = None
    chain: int = 0  # appends' delta files the new version reads (_store.thin.MAX_THIN_CHAIN)
    warnings: tuple[str, ...] = ()  # the health report's (a new raw input shared across splits, ...)

    @property
    def rejected(self) -> int:
        return rejected_count(self.rejections)

    def __repr__(self) -> str:
        if self.skipped:
            return f"<AppendResult {self.name}: skipped, {self.skipped}>"
        waiting = f"; {self.waiting} waiting" if self.waiting else ""
        if self.version is None:
            return f"<AppendResult {self.name}: nothing appended{waiting}{_rejected(self.rejected)}>"
        return (
            f"<AppendResult {self.name}: published v{self.version:04d}, {self.added} added "
            f"({_splits(self.added_counts)}), {sum(self.counts.values())} in all{waiting}"
            f"{_rejected(self.rejected)}{_warned(self.warnings)}; {self.path}>"
        )

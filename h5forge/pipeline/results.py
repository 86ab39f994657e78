"""What the flows return (and the CLI prints): small records, never arrays."""

from __future__ import annotations

from dataclasses import dataclass, field

from h5forge.samples import Rejection, rejected_count


@dataclass(frozen=True)
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

    @property
    def samples(self) -> int:
        """Samples the published version holds."""
        return sum(self.counts.values())


@dataclass(frozen=True)
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
    chain: int = 0  # appends' delta files the new version reads (store.thin.MAX_THIN_CHAIN)

    @property
    def rejected(self) -> int:
        return rejected_count(self.rejections)

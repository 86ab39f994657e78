"""Inputs shared by many samples: files a field reads for every sample (a COCO instances file),
which belong to the dataset though to no one sample.

A kind that reads such files is a ``SharedInputs``; discovery, incremental builds and append ask
``isinstance(kind, SharedInputs)`` (``sharing``). In an inbox, shared files are found whatever
they are called, and split between the samples an append takes (to processed/), refuses (to
quarantine/) and leaves waiting.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Mapping

from h5forge._samples import SampleRef


class SharedInputs(ABC):
    """A field that reads files shared by many samples."""

    name: str

    @abstractmethod
    def shared_files(self) -> tuple[str, ...]:
        """Files (relative to the source root) the field reads for many samples, such as a COCO
        annotation file: they belong to the dataset, though to no one sample."""

    @abstractmethod
    def shared_entry(self, root: Path, ref: SampleRef) -> Any:
        """What ``decode`` needs of the ``shared_files`` for ``ref`` alone, or None. Discovery puts
        it in ``SampleRef.shared``, so each cleaning worker gets its samples' entries rather than
        parsing the whole file; ``decode`` reads the files itself when the entry is not there (a
        sample ``verify`` re-derives)."""

    @abstractmethod
    def input_digest(self, root: Path, ref: SampleRef) -> str | None:
        """sha256 of what decides this field's value besides its own files and the sample's
        annotation record (its entry in the shared files), or None. It is part of the sample's
        input key, so an incremental build cleans the sample again when that entry changes."""

    @abstractmethod
    def shared_files_in(self, folder: Path) -> tuple[str, ...]:
        """The files of ``folder`` (an inbox) that hold this field's records of many samples,
        whatever their names there, relative to it."""

    @abstractmethod
    def reading(self, shared: tuple[str, ...]) -> dict[str, Any]:
        """The values of the field's spec that make it read the shared files ``shared``."""

    @abstractmethod
    def shared_files_of(self, root: Path, ref: SampleRef) -> tuple[str, ...] | None:
        """The shared files that hold this field's record of ``ref`` (empty: none does yet), or
        None when the field reads no shared file."""

    @abstractmethod
    def shared_subset(
        self, root: Path, shared: tuple[str, ...], files: set[str], complement: bool = False
    ) -> str | None:
        """One file in the format of ``shared`` holding what they say of the samples whose files
        are ``files`` (``complement``: of every other sample), or None when that is nothing."""


def sharing(kinds: Mapping[str, object]) -> dict[str, SharedInputs]:
    """The kinds of ``kinds`` that read shared files, by the same keys."""
    return {key: kind for key, kind in kinds.items() if isinstance(kind, SharedInputs)}

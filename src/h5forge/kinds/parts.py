"""Inputs that hold several samples (the time points of a 4-D volume): discovery makes a sample
of each part, in the split of the input's own id, with ``SampleRef.part`` set.

A kind whose inputs may hold several samples is a ``SampleParts``; discovery, the duplicates rule
and incremental builds ask ``isinstance(kind, SampleParts)`` (``sample_digest``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from h5forge._samples import SampleRef


class SampleParts(ABC):
    """A field whose raw input may hold several samples, each with its own raw digest."""

    @abstractmethod
    def samples_in(self, root: Path, rel: str) -> tuple[str, ...] | None:
        """The samples one raw input holds, as the ends of their ids (``@t0000``, ...), or None: the
        input is one sample. Asked of every input at discovery, so it reads no more than a header;
        Reject for an input it cannot count."""

    @abstractmethod
    def sample_digest(self, file_digest: str, ref: SampleRef) -> str:
        """The raw digest of this field of ``ref`` (``Decoded.sha256``) from its input's
        ``source_digest``: each sample of an input has its own, so that the exactly-once check and
        the input keys tell them apart."""


def sample_digest(kind: object, file_digest: str, ref: SampleRef) -> str:
    """The raw digest of ``kind``'s field of ``ref``: its input's own, unless the input may hold
    several samples (``SampleParts``)."""
    return kind.sample_digest(file_digest, ref) if isinstance(kind, SampleParts) else file_digest

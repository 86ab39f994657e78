"""Files a sample may go without: a field whose raw file is optional, such as a YOLO picture's
label file under ``missing: empty`` (a picture without one is a background picture, no boxes).

A kind whose file may be missing is an ``OptionalFile``; discovery asks ``may_lack_file`` before it
calls a sample incomplete. A sample without the file has no entry for the field in
``SampleRef.files`` (``SampleRef.file_of`` gives ``""``), its stored source path and raw digest are
empty, and the kind's ``decode`` gives the value of no file. A file that appears later changes the
sample's input key (its path and digest), so a rebuild cleans it again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class OptionalFile(ABC):
    """A field whose raw file a sample may lack, when its spec says so."""

    @property
    @abstractmethod
    def file_optional(self) -> bool:
        """Whether a sample without this field's file is complete (``decode`` then reads no file)."""


def may_lack_file(kind: object) -> bool:
    """Whether a sample may lack ``kind``'s file (``OptionalFile.file_optional``)."""
    return isinstance(kind, OptionalFile) and kind.file_optional

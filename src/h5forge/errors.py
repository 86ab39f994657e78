"""Every error h5forge raises on purpose derives from ``H5forgeError``.

Each class also derives from the built-in exception it corresponds to, so ``except ValueError``
or ``except FileNotFoundError`` in user code keeps working. ``exit_code`` is what the CLI exits
with: 2 for bad usage or a bad spec, 1 for a run that failed. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations


class H5forgeError(Exception):
    """Base of h5forge's errors; the message is one line that says what and where."""

    exit_code = 1


class UsageError(H5forgeError, ValueError):
    """A command or argument that cannot work as given."""

    exit_code = 2


class SpecError(UsageError):
    """A spec that cannot be used; the message names the offending key."""


class KindRegistryError(H5forgeError, RuntimeError):
    """The field kinds installed cannot be registered: two packages declare one kind name, or
    h5forge's own are missing from its installed metadata."""


class VersionError(UsageError):
    """A version that does not exist or cannot be used."""


class SourceMissing(H5forgeError, FileNotFoundError):
    """A file or folder the run needs does not exist."""


class OutputBusy(H5forgeError, RuntimeError):
    """Another h5forge run is writing into the same output folder."""


class NothingToBuild(H5forgeError, RuntimeError):
    """The source holds no usable sample."""


class NoBaseVersion(H5forgeError, RuntimeError):
    """Append needs a published version to extend."""


class VerificationFailed(H5forgeError, RuntimeError):
    """A candidate version failed verification; latest was not moved."""

    def __init__(self, errors: list[str]):
        super().__init__("verification failed: " + "; ".join(errors[:5]))
        self.errors = errors


class DatasetBroken(VerificationFailed):
    """A published version failed verification."""


class SchedulerUnreachable(H5forgeError, ConnectionError):
    """No dask scheduler answers at the given address."""


class ReadError(H5forgeError, ValueError):
    """A file, split or field cannot be read as asked; the message names what and where."""


class DiskFull(H5forgeError, OSError):
    """The disk (or quota) filled while writing; the partial file is gone and nothing was published."""


class TooManyOpenFiles(H5forgeError, OSError):
    """The process ran out of file descriptors (``ulimit -n``) opening a file a run needs."""


class TooManyRejected(H5forgeError, RuntimeError):
    """More inputs were rejected than the spec's ``max_rejected`` allows; nothing was published."""


class SamplesRemoved(H5forgeError, RuntimeError):
    """A build would drop samples latest holds and the spec does not allow removals; nothing was published."""


class LatestBroken(H5forgeError, RuntimeError):
    """``dataset_latest.h5`` does not resolve, inside its output folder, to a published version."""


class OutputTaken(UsageError):
    """The output folder holds another dataset's versions."""


class InboxMoveFailed(H5forgeError, OSError):
    """A version was published, but some inbox files could not be sorted; a rerun finishes it."""


class NoDaskWorkers(H5forgeError, RuntimeError):
    """The dask scheduler has no workers to clean on."""


class DaskWorkersLost(H5forgeError, RuntimeError):
    """Every dask worker was lost while a run cleaned on them."""

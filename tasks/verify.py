"""Task of the verify flow: full verification of the latest version."""

from __future__ import annotations

from pathlib import Path

from h5forge.errors import NoBaseVersion
from h5forge.format.names import version_name
from h5forge.store.reports import write_health
from h5forge.store.verify import HealthReport, verify_file
from h5forge.store.versions import latest
from h5forge.tasks import step
from h5forge.tasks.artifacts import log_report


@step(name="verify-latest")
def verify_latest(out: Path) -> HealthReport:
    number = latest(out)
    if number is None:
        raise NoBaseVersion(f"no published version in {out}")
    # the version latest points at, by its own name: the report names what it verified
    report = verify_file(out / version_name(number))
    write_health(out, number, report, run="weekly")
    return log_report(report)

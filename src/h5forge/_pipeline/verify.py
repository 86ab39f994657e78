"""verify: full verification of the latest version (every checksum, every file it reads)."""

from __future__ import annotations

from pathlib import Path

from h5forge.errors import DatasetBroken, NoBaseVersion
from h5forge._format.names import version_name
from h5forge._pipeline.main_module import leaves_main_alone
from h5forge._pipeline.reports import artifact_key, log_report
from h5forge._pipeline.runner import PLAIN, Runner
from h5forge._store.reports import write_health
from h5forge._store.verify import HealthReport, verify_file
from h5forge._store.versions import latest


@leaves_main_alone
def verify(out: str | Path, *, name: str = "", runner: Runner = PLAIN) -> HealthReport:
    """Recompute every checksum of the version latest points at; raises DatasetBroken when it is broken."""
    out = Path(out)
    report = runner.step("verify-latest", verify_latest, out)
    runner.markdown(
        artifact_key(name or out.name, "verify"),
        report.to_markdown(),
        f"full verification of {Path(report.path).name} ({name or out.name})",
    )
    if not report.ok:
        raise DatasetBroken(report.errors)
    return report


def verify_latest(out: Path) -> HealthReport:
    number = latest(out)
    if number is None:
        raise NoBaseVersion(f"no published version in {out}")
    # the version latest points at, by its own name: the report names what it verified
    report = verify_file(out / version_name(number))
    write_health(out, number, report, run="weekly")
    return log_report(report)

"""Task of the verify flow: full verification of the latest version."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from h5forge.store.reports import write_health
from h5forge.store.verify import HealthReport, verify_file
from h5forge.store.versions import LATEST, latest, version_name
from h5forge.tasks.artifacts import log_report


@task(name="verify-latest", cache_policy=NONE, persist_result=False)
def verify_latest(out: Path) -> HealthReport:
    number = latest(out)
    if number is None:
        raise FileNotFoundError(f"no published version in {out}")
    report = verify_file(out / LATEST)
    write_health(out, version_name(number).removesuffix(".h5") + (".weekly" if report.ok else ".weekly.failed"),
                 report)
    log_report(report)
    return report

"""verify-dataset: full verification of the latest version (every checksum, every file it reads)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from h5forge.reports import write_health
from h5forge.spec import load_spec
from h5forge.verify import HealthReport, verify_file
from h5forge.versions import LATEST, latest, version_name
from tasks.artifacts import artifact_key


class DatasetBroken(RuntimeError):
    """The latest version failed verification."""


@task(name="verify-latest", cache_policy=NONE, persist_result=False)
def verify_latest(out: Path) -> HealthReport:
    number = latest(out)
    if number is None:
        raise FileNotFoundError(f"no published version in {out}")
    report = verify_file(out / LATEST)
    write_health(out, version_name(number).removesuffix(".h5") + (".weekly" if report.ok else ".weekly.failed"),
                 report)
    logger = get_run_logger()
    for check, result in report.checks.items():
        logger.info("%s: %s", check, result)
    for e in report.errors:
        logger.error("%s", e)
    return report


@flow(name="verify-dataset")
def verify_dataset(spec_path: str, output: str | None = None) -> dict:
    """Recompute every checksum of the latest version; the run fails if the dataset is broken."""
    from prefect.artifacts import create_markdown_artifact

    spec = load_spec(spec_path, output=output)
    report = verify_latest(Path(spec.output.dir))
    create_markdown_artifact(key=artifact_key(spec.name, "verify"), markdown=report.to_markdown(),
                             description=f"full verification of {spec.name}")
    if not report.ok:
        raise DatasetBroken("; ".join(report.errors[:5]))
    return {"ok": report.ok, "checks": report.checks, "stats": report.stats}

"""verify-dataset: full verification of the latest version (every checksum, every file it reads)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from h5forge.errors import DatasetBroken
from h5forge.spec import load_spec
from h5forge.store.verify import HealthReport
from h5forge.tasks.artifacts import artifact_key
from h5forge.tasks.verify import verify_latest


@flow(name="verify-dataset")
def verify_dataset(spec_path: str, output: str | None = None) -> HealthReport:
    """Recompute every checksum of the latest version; the run fails if the dataset is broken."""
    spec = load_spec(spec_path, output=output)
    report = verify_latest(Path(spec.output.dir))
    create_markdown_artifact(key=artifact_key(spec.name, "verify"), markdown=report.to_markdown(),
                             description=f"full verification of {Path(report.path).name} ({spec.name})")
    if not report.ok:
        raise DatasetBroken(report.errors)
    return report

"""Re-runs the short benchmarks at their committed sizes and names every committed figure off by more than 25 %.

    python -m benchmarks.check [--only second_build,row_hash] [--tolerance 0.25]

Which benchmarks, and why: benchmarks/README.md, section "check".
"""

import argparse
import contextlib
import importlib
import io
import json
import os
import shlex
import subprocess
import sys
import tempfile
from unittest import mock
from pathlib import Path

from benchmarks.common import CACHE, PARSE_ONLY, REPO, RESULTS, log

# Each finishes in a few minutes on 2 cores at the size its committed results file was run at.
SHORT = ("second_build", "kinds_ct", "row_hash", "segments", "decode")


def band(committed: float, spread, tolerance: float) -> tuple[float, float]:
    """The re-run values that agree with ``committed``: ±``tolerance`` around it, widened to the spread
    (the least and the greatest of the rounds) the results file states for the figure."""
    lo, hi = (min(spread), max(spread)) if spread else (committed, committed)
    lo, hi = min(lo, committed), max(hi, committed)
    return lo - tolerance * abs(lo), hi + tolerance * abs(hi)


def compare(committed: dict, rerun: dict, tolerance: float = 0.25) -> list[dict]:
    """One row per figure of the committed file's ``ratios``: its value, the re-run's, and whether the
    re-run lands inside the band (a flag must be equal; text is not a figure and is left out)."""
    spreads, rows = committed.get("spread", {}), []
    for name, value in committed.get("ratios", {}).items():
        new = rerun.get("ratios", {}).get(name)
        if isinstance(value, bool) or value is None or isinstance(new, bool):
            verdict = "within" if new == value else "off"
        elif isinstance(value, (int, float)):
            lo, hi = band(value, spreads.get(name), tolerance)
            verdict = "within" if isinstance(new, (int, float)) and lo <= new <= hi else "off"
        else:
            continue
        rows.append({"figure": name, "committed": value, "rerun": new, "verdict": verdict})
    return rows


def line(benchmark: str, row: dict) -> str:
    return f"{benchmark}: {row['figure']}: committed {row['committed']}, re-run {row['rerun']}: {row['verdict']}"


def rerun(name: str, out: Path) -> dict:
    """The committed file's own command again, its results written under ``out``, never over the committed ones."""
    committed = json.loads((RESULTS / f"{name}.json").read_text())
    argv = shlex.split(committed["command"])[1:]  # "python -m benchmarks.x ..." -> "-m benchmarks.x ..."
    log(f"re-running {committed['command']}")
    env = {**os.environ, "H5FORGE_BENCH_RESULTS": str(out)}
    subprocess.run([sys.executable, *argv], cwd=REPO, env=env, check=True)
    return json.loads((out / f"{name}.json").read_text())


def stale_commands() -> list[str]:
    """The committed results whose command today's benchmark refuses: figures nobody can re-run.
    Each benchmark's ``main`` parses the command's flags here and stops (``common.PARSE_ONLY``)."""
    stale = []
    for path in sorted(RESULTS.glob("*.json")):
        command = json.loads(path.read_text())["command"]
        _, _, module, *flags = shlex.split(command)  # python -m benchmarks.x --flag ...
        said, code = io.StringIO(), 0
        with mock.patch.dict(os.environ, {PARSE_ONLY: "1"}), mock.patch.object(sys, "argv", [module, *flags]):
            try:
                with contextlib.redirect_stderr(said):
                    importlib.import_module(module).main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
        if code:
            stale.append(f"{path.name}: {command}: {(said.getvalue().strip().splitlines() or [f'exit {code}'])[-1]}")
    return stale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(SHORT))
    ap.add_argument("--tolerance", type=float, default=0.25)
    args = ap.parse_args()
    out, off, stale = Path(tempfile.mkdtemp(prefix="check-", dir=CACHE)), [], stale_commands()
    lines = []
    for name in args.only.split(","):
        committed = json.loads((RESULTS / f"{name}.json").read_text())
        try:
            rows = compare(committed, rerun(name, out), args.tolerance)
        except subprocess.CalledProcessError as e:
            rows = [
                {"figure": "(the command)", "committed": "exit 0", "rerun": f"exit {e.returncode}", "verdict": "off"}
            ]
        lines += [line(name, r) for r in rows]
        off += [line(name, r) for r in rows if r["verdict"] == "off"]
    print(
        "\n".join(
            [
                "",
                *lines,
                *(f"no longer runs: {s}" for s in stale),
                "",
                f"{len(off)} of {len(lines)} figures off by more than {args.tolerance:.0%}; "
                f"{len(stale)} committed commands no longer run",
            ]
        )
    )
    sys.exit(1 if off or stale else 0)


if __name__ == "__main__":
    main()

"""Two `h5forge build` commands in a row with nothing running before the first, as a user types them:
the first starts the local Prefect server (h5forge/_cli/local_server.py), the second reuses it.
Method: benchmarks/README.md, "second_build".
"""

import re
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from benchmarks.common import BIN, CACHE, REPO, cli, log, make_spec, med, prefect_env, raw_folder, sampled, save
from benchmarks.common import write_spec

WORK = CACHE / "second_build"
LINE = re.compile(r"^(\d\d:\d\d:\d\d\.\d{3}) \| \w+ +\| (Flow run|Task run) '([^']+)' - (.*)$")


def _clock(stamp: str, day: datetime) -> float:
    t = datetime.strptime(stamp, "%H:%M:%S.%f").replace(year=day.year, month=day.month, day=day.day)
    return t.timestamp()


def run_build(spec: Path, home: Path, which: str, **env: str) -> dict:
    """``h5forge build SPEC`` (``which`` build, for the log): wall, CPU, where the time went."""
    started = time.time()
    with sampled() as usage:
        r = subprocess.run(
            [str(BIN / "h5forge"), "build", str(spec)],
            capture_output=True,
            text=True,
            env=prefect_env(home, **env),
            cwd=REPO,
            timeout=1800,
        )
    ended = time.time()
    if r.returncode != 0:
        raise RuntimeError(f"build failed:\n{r.stdout}\n{r.stderr}")
    day, begin, end, steps, last = datetime.fromtimestamp(started), None, None, {}, None
    for line in (r.stdout + "\n" + r.stderr).splitlines():
        m = LINE.match(line)
        if not m:
            continue
        t = _clock(m[1], day)
        if m[2] == "Flow run" and m[4].startswith("Beginning flow run"):
            begin = last = t
        elif m[2] == "Flow run" and m[4].startswith("Finished in state"):
            end = t
        elif m[2] == "Task run" and m[4].startswith("Finished in state") and last is not None:
            step = m[3].rsplit("-", 1)[0]
            steps[step] = round(steps.get(step, 0) + t - last, 3)
            last = t
    wall = ended - started
    log(f"{which} build: {wall:.2f} s wall, {usage['cpu_seconds']} s CPU")
    return {
        "wall_seconds": round(wall, 2),
        "cpu_seconds": usage["cpu_seconds"],
        "started_server": "started a local Prefect server" in r.stderr,
        "unchanged": "unchanged since" in r.stdout,
        "before_flow_seconds": round(begin - started, 2) if begin else None,
        "flow_seconds": round(end - begin, 2) if begin and end else None,
        "after_flow_seconds": round(ended - end, 2) if end else None,
        "flow_steps_seconds": steps,
    }


def import_seconds() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import h5forge._cli, h5forge.flows.build"], check=True)
    return round(time.perf_counter() - t0, 2)


def main() -> None:
    args = cli(__doc__, smoke={"n": 20, "reps": 1}, n=100, reps=3)
    raw = raw_folder(args.n)
    shutil.rmtree(WORK, ignore_errors=True)
    home = WORK / "prefect-home"
    # the first build, --reps second builds (each into a folder of its own), the temporary-server one
    specs = [write_spec(make_spec(raw, WORK / f"out{i}"), WORK / f"spec{i}.yaml") for i in range(args.reps + 2)]
    result: dict = {"n": args.n}
    try:
        result["first"] = run_build(specs[0], home, "first")
        rounds = [run_build(spec, home, "second") for spec in specs[1 : args.reps + 1]]
        result["second_rounds"] = rounds
        result["second"] = sorted(rounds, key=lambda r: r["wall_seconds"])[len(rounds) // 2]  # the median round
        result["unchanged"] = run_build(specs[args.reps], home, "unchanged")
        result["import_seconds"] = import_seconds()
    finally:
        subprocess.run([str(BIN / "h5forge"), "server", "stop"], env=prefect_env(home), capture_output=True)
    # the same full build on Prefect's temporary server (the database exists already): what each
    # command paid before the local server
    result["temporary_server"] = run_build(specs[-1], home, "temporary-server", H5FORGE_LOCAL_SERVER="0")
    assert result["first"]["started_server"] and not any(r["started_server"] for r in rounds)
    temp = result["temporary_server"]
    wall, cpu = med(r["wall_seconds"] for r in rounds), med(r["cpu_seconds"] for r in rounds)
    result["ratios"] = {
        "second_build_wall_seconds": wall,
        "second_build_cpu_seconds": cpu,
        "second_over_temporary_server_wall": round(wall / temp["wall_seconds"], 3),
        "second_over_temporary_server_cpu": round(cpu / temp["cpu_seconds"], 3),
    }
    spread = {k: [r[f"{k}_seconds"] for r in rounds] for k in ("wall", "cpu")}
    result["spread"] = {f"second_build_{k}_seconds": [min(v), max(v)] for k, v in spread.items()}
    save("second_build", result)


if __name__ == "__main__":
    main()

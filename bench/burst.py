"""Time bursting on the lab: from a job sent to the elastic pool (srun, then sbatch) to it
running on a fresh container, and from the node going idle to its container removed, with the
phases (the resume program, the container's start to slurmd's registration). Median of --runs.
Also the time `provision image build` takes to make the pool's image again.

Run as root with podman. It applies its own cluster (burstbench: examples/lab-burst.yaml on
10.73.0.0/24 with suspend_time 30), measures, and destroys it; about 10 minutes.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "burstbench"
NODES = ["burst001", "burst002", "burst003", "burst004"]


def provision(work: Path, *args: str, timeout: float = 1200) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "provision", *args],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if r.returncode != 0:
        raise SystemExit(f"provision {' '.join(args)} failed: {r.stdout[-1500:]} {r.stderr}")
    return r.stdout


def head(work: Path, spec: Path, command: str, timeout: float = 300) -> str:
    return provision(work, "ssh", "-f", str(spec), "head001", "--", command, timeout=timeout)


def container_exists(node: str) -> bool:
    r = subprocess.run(["podman", "container", "exists", f"provision-{NAME}-{node}"], check=False)
    return r.returncode == 0


def stamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def wait_powered_down(work: Path, spec: Path, node: str) -> None:
    deadline = time.monotonic() + 300
    while f"{node} idle~" not in head(work, spec, f"sinfo -h -N -n {node} -o '%N %T'"):
        if time.monotonic() > deadline:
            raise SystemExit(f"{node} did not power down")
        time.sleep(2)


def one_run(work: Path, spec: Path, node: str) -> dict[str, float]:
    wait_powered_down(work, spec, node)  # a fresh node for every job
    out = head(
        work,
        spec,
        f"s=$(date +%s.%N); srun -p burst -w {node} -N1 hostname >/dev/null; e=$(date +%s.%N); "
        f"echo $s $e; grep ' {node} resume ok' /var/log/provision/burst-{NAME}.log | tail -1; "
        f"grep 'Node {node} now responding' /var/log/slurm/slurmctld.log | tail -1",
    ).splitlines()
    sent, ran = (float(x) for x in out[0].split())
    resume_s = float(re.search(r"resume ok \(burst, ([0-9.]+)s\)", out[1]).group(1))  # type: ignore[union-attr]
    registered = stamp(re.search(r"^\[([^\]]+)\]", out[2]).group(1))  # type: ignore[union-attr]
    idle_since = time.monotonic()
    while container_exists(node):
        time.sleep(0.5)
    removed = time.monotonic() - idle_since
    return {
        "srun to running": ran - sent,
        "resume program": resume_s,
        "to slurmd registered": registered - sent,
        "idle to removed": removed,
        "sbatch to running": batch_wait(work, spec, node),
    }


def batch_wait(work: Path, spec: Path, node: str) -> float:
    """The same node powered down again, a batch job sent to it: its StartTime less its
    SubmitTime (Slurm resets the start once the node is up; whole seconds)."""
    wait_powered_down(work, spec, node)
    job = head(work, spec, f"sbatch --parsable -p burst -w {node} -o /dev/null --wrap true").strip()
    while head(work, spec, f"squeue -h -j {job} -o %T").strip():
        time.sleep(1)
    shown = head(work, spec, f"scontrol show job {job}")
    submit = stamp(re.search(r"SubmitTime=(\S+)", shown).group(1))  # type: ignore[union-attr]
    start = stamp(re.search(r"StartTime=(\S+)", shown).group(1))  # type: ignore[union-attr]
    return start - submit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="burstbench-"))
    spec = work / "lab-burst.yaml"
    spec.write_text(
        (ROOT / "examples" / "lab-burst.yaml")
        .read_text()
        .replace("name: labburst", f"name: {NAME}")
        .replace("10.78.0.", "10.73.0.")
        .replace("suspend_time: 90", "suspend_time: 30")
    )
    provision(work, "destroy", str(spec), "--yes")
    started = time.monotonic()
    provision(work, "apply", str(spec))
    print(f"cold apply with the pool's image: {time.monotonic() - started:.0f}s")
    try:
        started = time.monotonic()
        provision(work, "image", "build", "burst", "-f", str(spec))
        took = time.monotonic() - started
        print(f"provision image build burst (the pool's image made again): {took:.0f}s")
        runs = [one_run(work, spec, NODES[i % len(NODES)]) for i in range(args.runs)]
    finally:
        provision(work, "destroy", str(spec), "--yes")
    print(f"burst on the lab, median of {len(runs)} (min-max), suspend_time 30 s:")
    for key in runs[0]:
        values = [r[key] for r in runs]
        print(
            f"  {key:22s} {statistics.median(values):6.1f} s  ({min(values):.1f}-{max(values):.1f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

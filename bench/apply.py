"""Time `provision apply` on the lab: cold (nodes created, image already built) and a no-op
re-apply, split by phase, with this project's Ansible tuning and without it, on 3 and 12 nodes.

Run as root with podman (make bench). It creates and destroys its own clusters (bench3,
bench12) on 10.75.0.0/24 and 10.74.0.0/24; it takes about 15 minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What "untuned" means: Ansible's defaults for each knob ansible.cfg sets.
UNTUNED = {
    "ANSIBLE_PIPELINING": "False",
    "ANSIBLE_SSH_ARGS": "-o ControlMaster=no",
    "ANSIBLE_GATHER_SUBSET": "all",
    "ANSIBLE_GATHERING": "implicit",
    "ANSIBLE_FORKS": "5",
    "ANSIBLE_CACHE_PLUGIN": "memory",
}


def spec(work: Path, name: str, prefix: str, computes: int) -> Path:
    text = (ROOT / "examples" / "lab.yaml").read_text()
    text = text.replace("name: lab", f"name: {name}").replace("10.77.0.", prefix)
    text = text.replace("    count: 2\n", f"    count: {computes}\n")
    path = work / f"{name}.yaml"
    path.write_text(text)
    return path


def provision(args: list[str], work: Path, env: dict[str, str]) -> tuple[float, dict]:  # type: ignore[type-arg]
    started = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "provision", *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - started
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr, file=sys.stderr)
        raise SystemExit(f"provision {' '.join(args)} failed")
    report_path = work / ".provision"
    reports = list(report_path.glob("*/last-apply.json")) if report_path.exists() else []
    report = json.loads(reports[0].read_text()) if reports and args[0] == "apply" else {}
    return wall, report


def run(label: str, spec_path: Path, work: Path, tuned: bool) -> list[tuple[str, float, dict]]:  # type: ignore[type-arg]
    env = dict(os.environ)
    if not tuned:
        env.update(UNTUNED)
    provision(["destroy", str(spec_path), "--yes"], work, env)
    rows = []
    for kind in ("cold", "no-op"):
        wall, report = provision(["apply", str(spec_path)], work, env)
        changed = sum(h["changed"] for h in report["hosts"].values())
        rows.append((f"{label} {kind}", wall, {**report["phases"], "changed": changed}))
        print(f"  {label} {kind}: {wall:.1f}s {report['phases']} changed={changed}", flush=True)
    provision(["destroy", str(spec_path), "--yes"], work, env)
    return rows


def main() -> int:
    if os.geteuid() != 0:
        raise SystemExit("bench/apply.py needs root (the lab provider does)")
    work = Path(tempfile.mkdtemp(prefix="provision-bench-apply-"))
    rows = []
    three = spec(work, "bench3", "10.75.0.", 2)
    twelve = spec(work, "bench12", "10.74.0.", 11)
    rows += run("3 nodes, tuned", three, work, tuned=True)
    rows += run("3 nodes, untuned", three, work, tuned=False)
    rows += run("12 nodes, tuned", twelve, work, tuned=True)
    print()
    print(
        f"{'run':<28} {'total':>7} {'nodes':>7} {'preflt':>7} {'ansible':>8} {'verify':>7}"
        f" {'changed':>8}"
    )
    for label, wall, p in rows:
        print(
            f"{label:<28} {wall:>6.1f}s {p.get('nodes', 0):>6.1f}s {p.get('preflight', 0):>6.1f}s"
            f" {p.get('ansible', 0):>7.1f}s {p.get('verify', 0):>6.1f}s {p['changed']:>8}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

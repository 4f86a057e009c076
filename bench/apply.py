"""Time `provision apply` on the lab, 3 and 12 nodes (image already built): a cold apply, a
no-op re-apply (every node probed and skipped), a no-op with --full (the roles run on every
node and change nothing), and a change to one pool (a port opened on the head pool: its node
converges, the others are probed and skipped), with Mitogen's strategy (the default) and
Ansible's own `linear`. `bench/apply.py mitogen` leaves out the linear runs.

For each run: wall time, Ansible's share, workstation CPU seconds per node (user + system of
provision and everything it ran; Ansible's processes alone in brackets), and for the --full
no-op the tasks per node and the ten tasks that took longest (their time summed over nodes).

Run as root with podman (make bench). It creates and destroys its own clusters (bench3,
bench12) on 10.75.0.0/24 and 10.74.0.0/24; it takes about 15 minutes.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from provision.converged import read_events

ROOT = Path(__file__).resolve().parent.parent


def spec(work: Path, name: str, prefix: str, computes: int) -> Path:
    text = (ROOT / "examples" / "lab.yaml").read_text()
    text = text.replace("name: lab", f"name: {name}").replace("10.77.0.", prefix)
    text = text.replace("    count: 2\n", f"    count: {computes}\n")
    path = work / f"{name}.yaml"
    path.write_text(text)
    return path


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def provision(
    args: list[str], work: Path, env: dict[str, str], cpu: list[float] | None = None
) -> tuple[float, dict]:  # type: ignore[type-arg]
    """Run provision; its wall time and, for apply, its report. cpu: gets the CPU seconds of
    provision and everything it ran."""
    started, before = time.monotonic(), _children_cpu()
    r = subprocess.run(
        [sys.executable, "-m", "provision", *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - started
    if cpu is not None:
        cpu.append(_children_cpu() - before)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr, file=sys.stderr)
        raise SystemExit(f"provision {' '.join(args)} failed")
    report_path = work / ".provision"
    reports = list(report_path.glob("*/last-apply.json")) if report_path.exists() else []
    report = json.loads(reports[0].read_text()) if reports and args[0] == "apply" else {}
    return wall, report


def top_tasks(log_dir: str, count: int = 10) -> tuple[dict[str, int], list[tuple[str, float]]]:
    """Tasks run per host (ok, changed or skipped), and the tasks that took longest."""
    per_host: Counter[str] = Counter()
    took: dict[str, float] = defaultdict(float)
    for event in read_events(Path(log_dir)):
        data = event.get("event_data") or {}
        if event.get("event") not in ("runner_on_ok", "runner_on_skipped"):
            continue
        per_host[data.get("host", "?")] += 1
        role = f"{data['role']} : " if data.get("role") else ""
        took[f"{role}{data.get('task', '?')}"] += float(data.get("duration") or 0)
    return dict(per_host), sorted(took.items(), key=lambda kv: -kv[1])[:count]


def run(label: str, spec_path: Path, work: Path, nodes: int, strategy: str) -> list[str]:
    env = dict(os.environ)
    if strategy != "mitogen":
        env["ANSIBLE_STRATEGY"] = strategy
    provision(["destroy", str(spec_path), "--yes"], work, env)
    rows = []
    plain = spec_path.read_text()
    opened = plain.replace(
        "security:\n",
        "security:\n  firewall_rules: [{name: bench, port: 8888, sources: [admin], "
        "pools: [head]}]\n",
    )
    for kind, extra in (
        ("cold", []),
        ("no-op", []),
        ("no-op --full", ["--full"]),
        ("one pool", []),
    ):
        spec_path.write_text(opened if kind == "one pool" else plain)
        cpu: list[float] = []
        wall, report = provision(["apply", str(spec_path), *extra], work, env, cpu)
        phases = report["phases"]
        changed = sum(h["changed"] for h in report["hosts"].values())
        ansible_cpu = report.get("ansible_cpu_seconds", 0.0)
        row = (
            f"{label:<26} {kind:<13} {wall:>6.1f}s {phases.get('ansible', 0):>7.1f}s"
            f" {cpu[0] / nodes:>6.2f} ({ansible_cpu / nodes:.2f}) {changed:>8}"
            f" {len(report['hosts']):>10}"
        )
        rows.append(row)
        print(row, flush=True)
        if kind == "no-op --full" and report.get("log_dir"):
            per_host, top = top_tasks(report["log_dir"])
            print(f"  tasks per node: {dict(sorted(per_host.items()))}")
            for name, seconds in top:
                print(f"  {seconds:6.2f}s  {name}")
    provision(["destroy", str(spec_path), "--yes"], work, env)
    spec_path.write_text(plain)
    return rows


def main() -> int:
    if os.geteuid() != 0:
        raise SystemExit("bench/apply.py needs root (the lab provider does)")
    work = Path(tempfile.mkdtemp(prefix="provision-bench-apply-"))
    three = spec(work, "bench3", "10.75.0.", 2)
    twelve = spec(work, "bench12", "10.74.0.", 11)
    header = (
        f"{'cluster, strategy':<26} {'apply':<13} {'total':>7} {'Ansible':>8}"
        f" {'CPU s/node (Ansible)':>20} {'changed':>8} {'converged':>10}"
    )
    print(header)
    rows = run("3 nodes, mitogen", three, work, 3, "mitogen")
    if sys.argv[1:] != ["mitogen"]:
        rows += run("3 nodes, linear", three, work, 3, "linear")
    rows += run("12 nodes, mitogen", twelve, work, 12, "mitogen")
    print()
    print(header)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

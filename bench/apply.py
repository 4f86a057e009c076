"""Time `provision apply` on the lab at 3, 12 and 40 nodes (image already built), push and pull.

For each size, one cluster: a cold apply (push), a no-op re-apply (every node probed and
skipped), a no-op with --full (the roles run on every node and change nothing) pushed, then the
same pulled (the head pushed, the compute nodes converging themselves), a change to the head
pool (a port opened there: its node converges by push, the others are probed and skipped), and
a change to the compute pool (another port: its nodes converge) pushed, then pulled. At 12
nodes, a second cluster's cold apply pulled.

For each run: wall time, Ansible's share, this workstation's CPU seconds per node of the
cluster (user + system of provision and everything it ran; Ansible's processes alone in
brackets), the whole machine's CPU seconds per node (the lab's nodes are containers on this
machine: in pull mode their own Ansible is here too), changes and nodes converged; and for the
--full push, the tasks per node and the ten tasks that took longest (their time summed over
nodes).

`bench/apply.py 3 12` runs those sizes alone; `ANSIBLE_STRATEGY=linear` compares Ansible's own
strategy. Run as root with podman (make bench). It creates and destroys its own clusters
(bench3, bench12, bench40, bench12p) on 10.75-10.72.0.0/24; it takes about 50 minutes.
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


def _machine_cpu() -> float:
    """CPU seconds this whole machine has spent so far (every container's too)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _port(text: str, port: int, pool: str) -> str:
    rule = f"{{name: p{port}, port: {port}, sources: [admin], pools: [{pool}]}}"
    if "  firewall_rules: [" in text:
        return text.replace("  firewall_rules: [", f"  firewall_rules: [{rule}, ", 1)
    return text.replace("security:\n", f"security:\n  firewall_rules: [{rule}]\n", 1)


RUNS = (
    ("cold", [], None),
    ("no-op", [], None),
    ("no-op --full", ["--full", "--mode", "push"], None),
    ("no-op --full, pull", ["--full", "--mode", "pull"], None),
    ("head pool", [], (8801, "head")),
    ("compute pool", ["--mode", "push"], (8802, "compute")),
    ("compute pool, pull", ["--mode", "pull"], (8803, "compute")),
)


def run(label: str, spec_path: Path, work: Path, nodes: int, runs: tuple = RUNS) -> list[str]:  # type: ignore[type-arg]
    env = dict(os.environ)
    provision(["destroy", str(spec_path), "--yes"], work, env)
    rows = []
    plain = spec_path.read_text()
    for kind, extra, change in runs:
        if change is not None:
            spec_path.write_text(_port(spec_path.read_text(), *change))
        cpu: list[float] = []
        machine = _machine_cpu()
        wall, report = provision(["apply", str(spec_path), *extra], work, env, cpu)
        machine = _machine_cpu() - machine
        phases = report["phases"]
        changed = sum(h["changed"] for h in report["hosts"].values())
        ansible_cpu = report.get("ansible_cpu_seconds", 0.0)
        row = (
            f"{label:<10} {kind:<20} {wall:>6.1f}s {phases.get('ansible', 0):>7.1f}s"
            f" {cpu[0] / nodes:>6.2f} ({ansible_cpu / nodes:.2f}) {machine / nodes:>8.2f}"
            f" {changed:>8} {len(report['hosts']):>10}"
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
    sizes = [int(a) for a in sys.argv[1:]] or [3, 12, 40]
    work = Path(tempfile.mkdtemp(prefix="provision-bench-apply-"))
    header = (
        f"{'cluster':<10} {'apply':<20} {'total':>7} {'Ansible':>8}"
        f" {'CPU s/node (Ansible)':>20} {'machine':>8} {'changed':>8} {'converged':>10}"
    )
    print(header)
    rows = []
    prefixes = {3: "10.75.0.", 12: "10.74.0.", 40: "10.73.0."}
    for size in sizes:
        path = spec(work, f"bench{size}", prefixes.get(size, "10.72.0."), size - 1)
        rows += run(f"{size} nodes", path, work, size)
        if size == 12:
            pulled = spec(work, "bench12p", "10.72.0.", size - 1)
            cold = (("cold, pull", ["--mode", "pull"], None),)
            rows += run(f"{size} nodes", pulled, work, size, cold)
    print()
    print(header)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

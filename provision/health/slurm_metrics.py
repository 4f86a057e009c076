"""provision-slurm-metrics: what Slurm says of its nodes and jobs, for the node exporter's
textfile collector on the head nodes (a systemd timer runs it; Debian has no Slurm exporter).

    slurm_controller_up 1                       sinfo got an answer from slurmctld
    slurm_node_state{slurm_node="gpu001", state="drained"} 1   one series per node: its state
    slurm_nodes{state="idle"} 6                 nodes per state
    slurm_jobs{state="pending"} 3               jobs per state
    slurm_jobs_pending_on_resources 1           pending for Resources or Priority (they wait for
                                                nodes, not for a dependency, a hold or a limit)

slurm_node is the Slurm node's own name; the monitoring scrape makes it the node label of the
series from a head alone (a metric_relabel_config), so an alert on a node's Slurm state names
that node, and no other node's exporter can speak for one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from provision.health import label_value, shell, write_textfile
from provision.parsers.slurm import parse_sinfo_nodes, without_flags

FILE = "provision-slurm.prom"


def metrics(sinfo: tuple[int, str], squeue: tuple[int, str], now: float) -> str:
    up = sinfo[0] == 0
    lines = [
        "# HELP slurm_controller_up 1 when slurmctld answered sinfo",
        "# TYPE slurm_controller_up gauge",
        f"slurm_controller_up {int(up)}",
        "# HELP slurm_metrics_timestamp_seconds when these Slurm metrics were taken",
        "# TYPE slurm_metrics_timestamp_seconds gauge",
        f"slurm_metrics_timestamp_seconds {now:.0f}",
    ]
    if not up:
        return "\n".join(lines) + "\n"
    states = {n: without_flags(s) for n, s in parse_sinfo_nodes(sinfo[1]).items()}
    lines += ["# HELP slurm_node_state the node's state now", "# TYPE slurm_node_state gauge"]
    counts: dict[str, int] = {}
    for node, state in sorted(states.items()):
        lines.append(
            f'slurm_node_state{{slurm_node="{label_value(node)}",state="{label_value(state)}"}} 1'
        )
        counts[state] = counts.get(state, 0) + 1
    lines += ["# HELP slurm_nodes nodes per state", "# TYPE slurm_nodes gauge"]
    lines += [f'slurm_nodes{{state="{label_value(s)}"}} {c}' for s, c in sorted(counts.items())]
    jobs: dict[str, int] = {}
    waiting = 0
    if squeue[0] == 0:
        for line in squeue[1].splitlines():
            state, _, reason = line.strip().partition("|")
            if not state:
                continue
            jobs[state.lower()] = jobs.get(state.lower(), 0) + 1
            if state == "PENDING" and reason in ("Resources", "Priority"):
                waiting += 1
    lines += ["# HELP slurm_jobs jobs per state", "# TYPE slurm_jobs gauge"]
    for state in ("pending", "running"):
        jobs.setdefault(state, 0)
    lines += [f'slurm_jobs{{state="{label_value(s)}"}} {c}' for s, c in sorted(jobs.items())]
    lines += [
        "# HELP slurm_jobs_pending_on_resources jobs pending for Resources or Priority",
        "# TYPE slurm_jobs_pending_on_resources gauge",
        f"slurm_jobs_pending_on_resources {waiting}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="provision-slurm-metrics", description=__doc__)
    parser.add_argument(
        "--textfile-dir", type=Path, default=Path("/var/lib/prometheus/node-exporter")
    )
    args = parser.parse_args(argv)
    text = metrics(
        shell("sinfo -h -N -o '%N %T'", timeout=30),
        shell("squeue -h -o '%T|%r'", timeout=30),
        time.time(),
    )
    write_textfile(args.textfile_dir, FILE, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Scale a running lab cluster: 4 nodes (a head, 3 compute) to 6 and back, then one
`scontrol reconfigure` change. Prints each apply's wall time and phases, and how many hosts
Ansible changed something on (the goal: only the ones that needed it).

Run as root with podman (make bench). It makes and destroys its own cluster (benchscale, on
10.72.0.0/24); about 8 minutes.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import provision, spec


def show(label: str, wall: float, report: dict) -> None:  # type: ignore[type-arg]
    hosts = report.get("hosts", {})
    changed = sorted(h for h, counts in hosts.items() if counts.get("changed"))
    phases = ", ".join(f"{k} {v:.0f}s" for k, v in report.get("phases", {}).items())
    print(
        f"{label}: {wall:.0f}s ({phases}); Ansible on {len(hosts)} hosts, changed on "
        f"{len(changed)}: {', '.join(changed) or 'none'}"
    )


def main() -> int:
    import os

    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        six = spec(work, "benchscale", "10.72.0.", 5).rename(work / "six.yaml")
        four = spec(work, "benchscale", "10.72.0.", 3)
        sched = work / "sched.yaml"
        sched.write_text(
            four.read_text().replace(
                "    TaskPlugin: task/affinity\n",
                "    TaskPlugin: task/affinity\n    SchedulerParameters: bf_continue\n",
            )
        )
        steps = [
            ("cold apply, 4 nodes", four),
            ("no-op re-apply", four),
            ("scale up 4 -> 6", six),
            ("scale down 6 -> 4", four),
            ("a reconfigure change", sched),
        ]
        try:
            for label, path in steps:
                show(label, *provision(["apply", str(path), "--no-verify"], work, env))
        finally:
            provision(["destroy", str(four), "--yes"], work, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())

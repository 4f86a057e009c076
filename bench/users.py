"""The cost of a cluster's users on a running lab (a head, 2 compute): applying 100 users in
10 groups with 20 Slurm accounts and 4 QoS, then a change (10 users taken out and locked out,
5 accounts changed, 2 removed), then a no-op (every node probed and skipped) and a no-op with
--full (the roles run and change nothing). Prints each apply's wall time, phases and the
workstation's CPU, and the users' tasks that took longest.

Run as root with podman (make bench). It makes and destroys its own cluster (benchusers, on
10.73.0.0/24); about 8 minutes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import provision, spec, top_tasks

USERS, GROUPS, ACCOUNTS = 100, 10, 20


def people(keys: list[str], dropped: int = 0) -> str:
    """groups and users as spec text: user i in group i % GROUPS; the first `dropped` left
    out."""
    lines = ["groups:"]
    lines += [f"  - {{name: team{g:02d}, gid: {3000 + g}}}" for g in range(GROUPS)]
    lines.append("users:")
    for i in range(dropped, USERS):
        lines.append(
            f"  - {{name: user{i:03d}, uid: {2000 + i}, groups: [team{i % GROUPS:02d}], "
            f'ssh_keys: ["{keys[i]}"]}}'
        )
    return "\n".join(lines) + "\n"


def accounts(dropped: int = 0, changed: int = 0) -> str:
    """slurm's QoS and accounts as spec text: user i in account i % ACCOUNTS; with `changed`,
    that many accounts get another fair share and the last two go (their users to the first)."""
    count = ACCOUNTS - (2 if changed else 0)
    lines = ["  qos:"]
    lines += [
        f"    - {{name: q{q}, priority: {q * 10}, grp_tres: {{node: {q + 1}}}}}" for q in range(4)
    ]
    lines += ["  accounts:", "    - {name: lab, fairshare: 100}"]
    for a in range(count):
        members = [
            f"user{i:03d}"
            for i in range(dropped, USERS)
            if i % ACCOUNTS == a or (a == 0 and i % ACCOUNTS >= count)
        ]
        share = 20 if a < changed else 10
        lines.append(
            f"    - {{name: acct{a:02d}, parent: lab, fairshare: {share}, "
            f"users: [{', '.join(members)}], qos: [normal, q{a % 4}]}}"
        )
    return "\n".join(lines) + "\n"


def show(label: str, wall: float, cpu: float, report: dict, log: str | None) -> None:  # type: ignore[type-arg]
    phases = ", ".join(f"{k} {v:.0f}s" for k, v in report.get("phases", {}).items())
    hosts = report.get("hosts", {})
    changed = sum(h.get("changed", 0) for h in hosts.values())
    print(f"{label}: {wall:.0f}s ({phases}); workstation CPU {cpu:.1f}s; {changed} changed")
    if log:
        _, slow = top_tasks(log, 5)
        for task, took in slow:
            print(f"    {took:6.1f}s  {task}")


def main() -> int:
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        keys = []
        for i in range(USERS):
            key = work / f"k{i}"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                           check=True)  # fmt: skip
            keys.append(key.with_suffix(".pub").read_text().strip())
        base = spec(work, "benchusers", "10.73.0.", 2)
        plain = base.read_text()
        accounting = "  accounting: true\n"

        def write(dropped: int = 0, changed: int = 0) -> Path:
            text = plain.replace(accounting, accounting + accounts(dropped, changed))
            base.write_text(text + people(keys, dropped))
            return base

        base.write_text(plain)
        provision(["destroy", str(base), "--yes"], work, env)
        try:
            cpu: list[float] = []
            wall, report = provision(["apply", str(base)], work, env, cpu)
            show("cold apply, no users", wall, cpu[-1], report, None)
            for label, (dropped, changed), extra in (
                (f"{USERS} users, {GROUPS} groups, {ACCOUNTS} accounts, 4 QoS", (0, 0), []),
                ("no-op", (0, 0), []),
                ("no-op --full", (0, 0), ["--full"]),
                ("10 users out, 5 accounts changed, 2 removed", (10, 5), []),
            ):
                path = write(dropped, changed)  # the spec as this apply is to see it
                wall, report = provision(["apply", str(path), *extra], work, env, cpu)
                show(label, wall, cpu[-1], report, report.get("log_dir"))
        finally:
            provision(["destroy", str(base), "--yes"], work, env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the burst programs ask of Slurm: node states, and taking nodes out with a reason."""

from __future__ import annotations

import re
import subprocess
import time

from provision.burst.hostlist import compress

SCONTROL = "scontrol"


def mark_down(nodes: list[str], reason: str) -> None:
    """DOWN with a reason: Slurm requeues the jobs that were waiting for these nodes, and
    `sinfo -R` says why. An operator (or the cooldown) returns them with State=RESUME."""
    if not nodes:
        return
    one_line = " ".join(reason.split())[:200]
    subprocess.run(
        [SCONTROL, "update", f"NodeName={compress(nodes)}", "State=DOWN", f"Reason={one_line}"],
        capture_output=True,
        timeout=30,
        check=False,
    )


def parse_node_states(text: str) -> dict[str, set[str]]:
    """`scontrol show node -o` -> node name -> its state flags (IDLE, CLOUD, POWERED_DOWN...)."""
    states: dict[str, set[str]] = {}
    for line in text.splitlines():
        fields = dict(token.split("=", 1) for token in line.split() if token.find("=") > 0)
        name, state = fields.get("NodeName"), fields.get("State")
        if name and state:
            states[name] = set(state.split("+"))
    return states


def parse_addresses(text: str) -> dict[str, str]:
    """`scontrol show node -o` -> node name -> its NodeAddr (the node's name until resume set
    the address its cloud gave it)."""
    found = {}
    for line in text.splitlines():
        fields = dict(token.split("=", 1) for token in line.split() if token.find("=") > 0)
        name, address = fields.get("NodeName"), fields.get("NodeAddr")
        if name and address:
            found[name] = address
    return found


# "Reason=burst resume failed: ... [root@2026-11-30T17:16:44]": the text, who, and when (the
# head's local time)
_REASON = re.compile(r"\bReason=(.*?) \[([^@\]]*)@([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8})\]")


def parse_reasons(text: str) -> dict[str, tuple[str, float]]:
    """`scontrol show node -o` -> node name -> (reason, when it was set, epoch seconds)."""
    found = {}
    for line in text.splitlines():
        name = re.match(r"NodeName=(\S+)", line)
        reason = _REASON.search(line)
        if name and reason:
            when = time.mktime(time.strptime(reason.group(3), "%Y-%m-%dT%H:%M:%S"))
            found[name.group(1)] = (reason.group(1), when)
    return found


def set_addresses(addresses: dict[str, str]) -> None:
    """Where slurmctld reaches nodes whose address the cloud chose: one call for all."""
    if addresses:
        names = sorted(addresses)
        subprocess.run(
            [
                SCONTROL,
                "update",
                f"NodeName={','.join(names)}",
                f"NodeAddr={','.join(addresses[n] for n in names)}",
            ],
            capture_output=True,
            timeout=30,
            check=False,
        )


# `scontrol ping`: "Slurmctld(primary) at head001 is UP", "Slurmctld(backup) at head002 is DOWN"
_PING = re.compile(r"^Slurmctld\((primary|backup\d*)\) at (\S+) is (UP|DOWN)", re.MULTILINE)


def parse_ping(text: str) -> list[tuple[str, bool]]:
    """`scontrol ping` -> each controller's host name and whether it answers, in order."""
    return [(host, state == "UP") for _, host, state in _PING.findall(text)]


def in_control(text: str) -> str | None:
    """The controller in charge: the first one up (a backup gives control back to the primary
    once it answers again), or None when none answers."""
    return next((host for host, up in parse_ping(text) if up), None)


def ping() -> str:
    done = subprocess.run(
        [SCONTROL, "ping"], capture_output=True, text=True, timeout=30, check=False
    )
    return done.stdout


def show_nodes(nodes: list[str]) -> str:
    done = subprocess.run(
        [SCONTROL, "show", "node", "-o", compress(nodes)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout


def power_down(nodes: list[str]) -> None:
    """Back to idle~ (powered down, available): Slurm runs the suspend program and, after
    SuspendTimeout, may start the nodes again. Clears DOWN and its reason."""
    if nodes:
        subprocess.run(
            [SCONTROL, "update", f"NodeName={compress(nodes)}", "State=POWER_DOWN_FORCE"],
            capture_output=True,
            timeout=30,
            check=False,
        )


# A start that failed for want of capacity: the pool is out for the cooldown from then
CAPACITY_REASON = "burst resume failed: capacity:"
# Nodes not even asked for because their pool is out
POOL_OUT_REASON = "burst pool out"
# A node whose spot instance the cloud took back (programs.reconcile: "burst: node vanished
# (spot ...)"): its instance is gone for good, so the name returns to the pool
SPOT_REASON = "burst: node vanished (spot "
# ... or its node marked itself down on the cloud's advance notice (notice.py)
NOTICE_REASON = "burst: spot notice"
# Reasons the burst programs give a node they took out; after the cooldown it is returned.
COOLDOWN_REASONS = (
    "burst resume failed",
    "burst: no slurmd registration",
    POOL_OUT_REASON,
    SPOT_REASON,
    NOTICE_REASON,
)


# A node Slurm counts on being there: neither powered down nor on its way up or down.
TRANSIENT = {"POWERED_DOWN", "POWERING_UP", "POWERING_DOWN", "POWER_DOWN"}


def expected_up(flags: set[str]) -> bool:
    return not flags & TRANSIENT


def powered_down(flags: set[str]) -> bool:
    return "POWERED_DOWN" in flags and "POWERING_UP" not in flags

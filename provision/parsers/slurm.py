"""Parsers of what Slurm says (sinfo, srun, sacct, scontrol): pure functions, tested on recorded
output in tests/data/."""

from __future__ import annotations

# the flags sinfo appends to a state (%T): * not responding, ~ powered off, # powering up...
STATE_FLAGS = "*~#!%$@^-"


def without_flags(state: str) -> str:
    """'idle~' -> 'idle', 'drained*' -> 'drained': the state without sinfo's flag characters."""
    return state.rstrip(STATE_FLAGS)


def parse_sinfo_nodes(text: str) -> dict[str, str]:
    """`sinfo -h -N -o '%N %T'` -> {node: state}; a node in two partitions appears once."""
    states: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            states[parts[0]] = parts[1].lower()
    return states


def parse_srun_hosts(text: str) -> tuple[str | None, list[str]]:
    """Lines of '<jobid> <hostname>' (or '<jobid> <hostname> <user>') from srun -> (job id,
    sorted host names)."""
    job = None
    hosts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) in (2, 3) and parts[0].isdigit():
            job = parts[0]
            hosts.append(parts[1])
    return job, sorted(hosts)


def parse_srun_users(text: str) -> set[str]:
    """Lines of '<jobid> <hostname> <user>' from srun -> the users the tasks ran as."""
    return {
        parts[2]
        for parts in (line.split() for line in text.splitlines())
        if len(parts) == 3 and parts[0].isdigit()
    }


def parse_sacct_steps(text: str) -> dict[str, tuple[str, int]]:
    """`sacct -n -P -o JobID,State,NNodes` (steps too) -> {job or step id: (state, nodes)}."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 3 and parts[0] and parts[2].isdigit():
            out[parts[0]] = ((parts[1].split() or [""])[0], int(parts[2]))
    return out


def parse_drained(text: str) -> list[str]:
    """`scontrol -o show node` -> the nodes drained or draining (State=IDLE+DRAIN), sorted."""
    found = []
    for line in text.splitlines():
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "DRAIN" in fields.get("State", "").split("+") and fields.get("NodeName"):
            found.append(fields["NodeName"])
    return sorted(found)

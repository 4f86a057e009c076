"""Parsers of what Slurm says (sinfo, srun, sacct): pure functions, tested on recorded output
in tests/data/."""

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
    """Lines of '<jobid> <hostname>' from srun -> (job id, sorted host names)."""
    job = None
    hosts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            job = parts[0]
            hosts.append(parts[1])
    return job, sorted(hosts)


def parse_sacct_states(text: str) -> dict[str, str]:
    """`sacct -n -X -P -o JobID,State` -> {job id: state}."""
    out = {}
    for line in text.splitlines():
        job, sep, state = line.strip().partition("|")
        if sep:
            out[job] = state.split()[0] if state else ""
    return out

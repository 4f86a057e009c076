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


def allreduce_problem(text: str, nodes: list[str]) -> str | None:
    """The MPI all-reduce program's lines ('<rank> <size> <sum> <host>', one per rank, one rank
    per node) -> what is wrong with them, or None when every rank of one job of len(nodes)
    ranks got the sum 1 + 2 + ... + size, each on its own node of `nodes`."""
    ranks = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and all(p.isdigit() for p in parts[:3]):
            ranks[int(parts[0])] = (int(parts[1]), int(parts[2]), parts[3])
    size = len(nodes)
    if sorted(ranks) != list(range(size)):
        return f"ranks {sorted(ranks) or 'none'} answered, not 0-{size - 1}"
    want = size * (size + 1) // 2
    wrong = sorted(r for r, (n, total, _) in ranks.items() if n != size or total != want)
    if wrong:
        got_size, got_sum, _ = ranks[wrong[0]]
        return f"rank {wrong[0]} got sum {got_sum} of {got_size} ranks, not {want}"
    hosts = sorted(host for _, _, host in ranks.values())
    if hosts != sorted(nodes):
        return f"ranks ran on {', '.join(hosts)}, not {', '.join(sorted(nodes))}"
    return None


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

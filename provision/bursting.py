"""`provision burst status`: each elastic pool as its head's Slurm sees it (nodes up, powering
up, powered down, down with the reason) and what the nodes up cost per hour at list price,
with the last lines of the burst programs' log."""

from __future__ import annotations

from dataclasses import dataclass, field

from provision.burst.config import LOG_DIR
from provision.cluster import Cluster
from provision.drain import as_admin
from provision.errors import OperationError
from provision.head import Head

LOG_LINES = 10


@dataclass
class PoolStatus:
    pool: str
    nodes: int
    up: list[str] = field(default_factory=list)
    powering_up: list[str] = field(default_factory=list)
    powering_down: list[str] = field(default_factory=list)
    powered_down: list[str] = field(default_factory=list)
    down: dict[str, str] = field(default_factory=dict)  # node -> reason
    usd_per_node_hour: float | None = None

    @property
    def usd_per_hour(self) -> float | None:
        if self.usd_per_node_hour is None:
            return None
        return self.usd_per_node_hour * (len(self.up) + len(self.powering_up))


def parse_sinfo(text: str, cluster: Cluster) -> list[PoolStatus]:
    """`sinfo -h -N -o '%N|%P|%T|%E'` -> one status per elastic pool. sinfo's state suffixes:
    ~ powered down, # powering up, % powering down; DOWN and DRAIN carry a reason."""
    pools = {
        v.name: PoolStatus(
            v.name,
            len(v.nodes),
            usd_per_node_hour=v.profile.price.usd_per_hour if v.profile.price else None,
        )
        for v in cluster.pools
        if v.pool.elastic
    }
    owner = {n.name: n.pool for n in cluster.nodes if n.elastic}
    seen: set[str] = set()
    for line in text.splitlines():
        parts = line.strip().split("|", 3)
        if len(parts) != 4 or parts[0] not in owner or parts[0] in seen:
            continue  # a node in two partitions is listed twice
        node, _, state, reason = parts
        seen.add(node)
        status = pools[owner[node]]
        base = state.rstrip("~#%*$@!^-")
        if base.startswith(("down", "drain", "fail")):
            status.down[node] = reason if reason and reason != "none" else state
        elif state.endswith("~"):
            status.powered_down.append(node)
        elif state.endswith("#"):
            status.powering_up.append(node)
        elif state.endswith("%"):
            status.powering_down.append(node)
        else:
            status.up.append(node)
    return list(pools.values())


def burst_status(head: Head) -> tuple[list[PoolStatus], list[str]]:
    """The elastic pools' status and the burst log's last lines, read on the first head."""
    if not any(n.elastic for n in head.cluster.nodes):
        raise OperationError(f"{head.spec_path}: no elastic pool (pools[].elastic)")
    log = LOG_DIR / f"burst-{head.spec.name}.log"
    # the log is root's (the burst programs run as slurm's SlurmUser, root here) and is not
    # there until the first resume or suspend: no log is no line, not a failure
    command = (
        f"sinfo -h -N -o '%N|%P|%T|%E' && echo --- && "
        f"{{ {as_admin(head)}tail -n {LOG_LINES} {log} 2>/dev/null || true; }}"
    )
    try:
        output = head.on_head(command)
    except OperationError as exc:
        raise OperationError(f"cannot read Slurm's state {exc}") from None
    sinfo, _, tail = output.partition("---\n")
    return parse_sinfo(sinfo, head.cluster), [line for line in tail.splitlines() if line.strip()]

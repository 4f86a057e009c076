"""/etc/nccl.conf per GPU pool, from the spec's fabric and the pool's adapters."""

from __future__ import annotations

from provision.render.context import Cluster, PoolView


def nccl_conf(cluster: Cluster, view: PoolView) -> str:
    """NCCL reads /etc/nccl.conf before the job's environment, so jobs can still override."""
    fabric = cluster.spec.network.fabric.kind
    kinds = {h.kind for h in view.profile.hcas if h.purpose == "compute"}
    lines = [f"# {cluster.header}", f"# pool {view.name}: {view.profile.description}"]
    # Bootstrap and socket traffic over the host's real interfaces, never loopback or the
    # bridges of container engines.
    lines.append("NCCL_SOCKET_IFNAME=^lo,docker,podman,virbr,veth")
    if "efa" in kinds:
        lines.append("# EFA: the aws-ofi-nccl plugin carries the traffic; keep NCCL off verbs")
        lines.append("NCCL_IB_DISABLE=1")
    elif fabric in ("infiniband", "roce") and kinds & {"infiniband", "roce"}:
        lines.append("NCCL_IB_DISABLE=0")
        if fabric == "roce":
            # RoCE v2 over IPv4 is GID index 3 on ConnectX with the default GID table
            lines.append("NCCL_IB_GID_INDEX=3")
    else:
        lines.append("NCCL_IB_DISABLE=1")
    return "\n".join(lines) + "\n"

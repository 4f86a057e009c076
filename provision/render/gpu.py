"""/etc/nccl.conf per GPU pool, from the spec's fabric and the pool's adapters: the one place
the fabric's NCCL settings are written. The nccl role installs it; NCCL reads it in every job
(variables a job sets still win)."""

from __future__ import annotations

from provision.cluster import Cluster, PoolView
from provision.spec.fabric import cloud_infiniband, efa_count, rails

# Bootstrap and socket traffic over the host's real interfaces, never loopback or the
# bridges of container engines.
ANY_REAL_INTERFACE = "^lo,docker,podman,virbr,veth"


def nccl_settings(cluster: Cluster, view: PoolView) -> list[tuple[str, str, str]]:
    """(variable, value, why) in the order they are written."""
    fabric = cluster.spec.network.fabric
    kinds = {h.kind for h in view.profile.hcas if h.purpose == "compute"}
    out = [
        (
            "NCCL_SOCKET_IFNAME",
            fabric.bootstrap_interface or ANY_REAL_INTERFACE,
            "bootstrap and socket traffic",
        )
    ]
    pool_rails = rails(view.profile, fabric.kind)
    if "efa" in kinds:
        out.append(
            (
                "NCCL_IB_DISABLE",
                "1",
                "EFA: NCCL's own InfiniBand transport off; the aws-ofi-nccl plugin (the efa "
                "role) carries the traffic over libfabric's efa provider",
            )
        )
    elif cloud_infiniband(view.profile):
        out.append(
            (
                "NCCL_IB_DISABLE",
                "0",
                f"the cloud's InfiniBand, {cloud_infiniband(view.profile)} adapters: the "
                "pool's machines (lasting and burst) share one availability set, so one "
                "partition",
            )
        )
    elif pool_rails:
        out.append(("NCCL_IB_DISABLE", "0", f"{len(pool_rails)} {fabric.kind} adapters"))
        devices = [r.device for r in pool_rails if r.device]
        if devices:
            # '=' : exactly these devices (no prefix match: mlx5_1 must not take mlx5_10)
            out.append(("NCCL_IB_HCA", "=" + ",".join(devices), "the compute rails only"))
        if fabric.kind == "roce" and all(r.soft for r in pool_rails):
            # rdma_rxe speaks RoCE v2 alone: its IPv4 GID follows the link-local one
            out.append(("NCCL_IB_GID_INDEX", "1", "RoCE v2 over IPv4 (soft RoCE's table)"))
        elif fabric.kind == "roce":
            # RoCE v2 over IPv4 is GID index 3 on ConnectX with the default GID table
            out.append(("NCCL_IB_GID_INDEX", "3", "RoCE v2 over IPv4"))
        if fabric.kind == "roce":
            out.append(
                (
                    "NCCL_IB_TC",
                    str(fabric.roce.traffic_class),
                    f"DSCP {fabric.roce.traffic_class >> 2}, the lossless class",
                )
            )
    else:
        out.append(("NCCL_IB_DISABLE", "1", "no RDMA adapters on this pool's fabric"))
    return out


def nccl_transport(cluster: Cluster, view: PoolView) -> str:
    """What NCCL's traffic between this pool's nodes runs over, as the rendered file makes it,
    in words for plan."""
    value, why = next((v, w) for k, v, w in nccl_settings(cluster, view) if k == "NCCL_IB_DISABLE")
    if value == "0":
        return f"InfiniBand ({why})" if cloud_infiniband(view.profile) else f"RDMA ({why})"
    efa = efa_count(view.profile)
    if efa:
        return f"EFA ({efa} interfaces) through aws-ofi-nccl and libfabric, from AWS's installer"
    if any(h.model == "gVNIC" for h in view.profile.hcas):
        return "TCP sockets on the gVNICs: GPUDirect-TCPX is not installed"
    return f"TCP sockets ({why})"


def nccl_conf(cluster: Cluster, view: PoolView) -> str:
    lines = [f"# {cluster.header}", f"# pool {view.name}: {view.profile.description}"]
    for key, value, why in nccl_settings(cluster, view):
        lines.append(f"# {why}")
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"

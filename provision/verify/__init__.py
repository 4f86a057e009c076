"""Live acceptance checks, run after apply and on demand: one result per check and node, with
the evidence. Parsers of command output are pure functions in provision/parsers/; the checks'
parts in base.py, each area's checks in its own module."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from provision.cluster import Cluster
from provision.spec.fabric import cloud_infiniband, efa_count, rails
from provision.state import State
from provision.verify import fabric, gpu, kubernetes, slurm, tunnel
from provision.verify.base import CheckResult, VerifyContext, connect_all, run_node_checks
from provision.verify.common import ADMIN_KEYS_DIR, COMMON_CHECKS, check_admin_users

__all__ = [
    "ADMIN_KEYS_DIR",
    "CheckResult",
    "VerifyContext",
    "check_admin_users",
    "connect_all",
    "json_lines",
    "verify_cluster",
]


def verify_cluster(
    cluster: Cluster,
    state: State,
    key_file: Path | None,
    maintenance: bool = False,
    wait_s: float = 3600.0,
    say: Callable[[str], None] = lambda _: None,
) -> list[CheckResult]:
    """Every check, on a cluster that may be running jobs. Under Slurm the nodes to load-test
    (NCCL, ib_write_bw, the test job) are held in a reservation verify makes and removes: the
    idle ones, or with `maintenance` all of them once their jobs end (up to `wait_s`)."""
    nodes = [n for n in cluster.lasting_nodes if n.address is not None]
    rendered = state.build / "files" / "hosts"
    ctx = VerifyContext(cluster, state, rendered.read_text() if rendered.exists() else "")
    remotes, results = connect_all(cluster, state, key_file, nodes)
    node_checks = list(COMMON_CHECKS)
    if cluster.has_gpus:
        node_checks.append(gpu.check_gpus)
    on_fabric = any(rails(v.profile, cluster.spec.network.fabric.kind) for v in cluster.pools)
    if on_fabric or any(cloud_infiniband(v.profile) for v in cluster.pools):
        node_checks.append(fabric.check_fabric)
    if any(efa_count(v.profile) for v in cluster.pools):
        node_checks.append(fabric.check_efa)
    on_slurm = cluster.spec.scheduler == "slurm"
    if on_slurm:
        node_checks.append(slurm.check_munge_key)
    hold = None
    try:
        if on_slurm:
            hold = slurm.hold_nodes(ctx, remotes, maintenance, wait_s, say)
            results += hold.results
            ctx.quiet = frozenset(hold.quiet) | {
                n.name for n in cluster.lasting_nodes if n.role != "compute"
            }
        results += run_node_checks(ctx, remotes, nodes, node_checks)
        results += tunnel.check_tunnel(ctx, remotes)
        if on_fabric:
            results += fabric.check_fabric_bandwidth(
                ctx, remotes, [n for n in nodes if ctx.may_load(n)]
            )
        if cluster.spec.scheduler == "kubernetes":
            results += kubernetes.check_kubernetes(ctx, remotes)
            results += kubernetes.check_kubernetes_ports(ctx)
        if hold is not None:
            results += slurm.check_munge_same_key(ctx, remotes, nodes)
            results += slurm.check_scheduler(ctx, remotes, hold)
            results += slurm.check_ports(ctx, remotes)
    finally:
        if hold is not None:
            results += slurm.release(remotes, ctx, hold)
        for remote in remotes.values():
            remote.close()
    return results


def json_lines(results: Sequence[CheckResult]) -> str:
    """One JSON object per check, a line each: check, target, passed, evidence."""
    return "".join(
        json.dumps(
            {"check": r.check, "target": r.target, "passed": r.passed, "evidence": r.evidence}
        )
        + "\n"
        for r in results
    )

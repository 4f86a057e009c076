"""GPU acceptance on GPU nodes: the GPUs the profile promises, healthy, linked as expected, and
an NCCL all_reduce on all of a node's GPUs at the profile's bus bandwidth; and an all_reduce
across two nodes of a pool, at half the line rate of the adapters NCCL drives between them (so
NCCL falling back to TCP sockets on an RDMA or EFA pool fails it)."""

from __future__ import annotations

from provision.cluster import Cluster, PoolView
from provision.parsers.gpu import (
    ALL_REDUCE,
    ALL_REDUCE_OUT,
    DRIVER_STATE,
    DRIVER_STATE_COMMAND,
    QUERY_GPU,
    findings_from,
    gpu_commands,
    parse_all_reduce,
)
from provision.render.health import gpu_expect
from provision.spec.fabric import cloud_infiniband, efa_count, rails
from provision.spec.nodes import Node
from provision.verify.base import CheckResult, VerifyContext
from provision.verify.remote import Remote

ALL_REDUCE_TIMEOUT_S = 600.0


def check_gpus(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    view = next(v for v in ctx.cluster.pools if v.name == node.pool)
    want = gpu_expect(view, ctx.cluster.spec.software.nvidia_driver)
    if want is None:
        return []
    if node.provider == "lab":
        return [CheckResult("gpu", node.name, True, "lab container: no GPU to check")]
    nccl = ctx.cluster.spec.nvidia.nccl_tests
    load = ctx.may_load(node)
    commands = gpu_commands(want, ALL_REDUCE if nccl and load else None)
    outputs = {}
    for name, command in commands.items():
        timeout = ALL_REDUCE_TIMEOUT_S if name == ALL_REDUCE_OUT else 60.0
        out = remote.run(command, timeout=timeout)
        outputs[name] = (out.rc, out.stdout if out.rc == 0 else out.stdout + out.stderr)
        if name == QUERY_GPU and out.rc != 0:  # nothing else can answer: why, said once
            why = remote.run(DRIVER_STATE_COMMAND, timeout=60.0)
            outputs[DRIVER_STATE] = (why.rc, why.stdout)
            break
    results = [CheckResult(c, node.name, ok, ev) for c, ok, ev in findings_from(want, outputs)]
    if nccl and want.mig:
        results.append(
            CheckResult(
                "nccl.all_reduce",
                node.name,
                True,
                "not run: the GPUs are split into MIG instances (one per process, no NVLink)",
            )
        )
    elif nccl and not load:
        results.append(
            CheckResult(
                "nccl.all_reduce",
                node.name,
                True,
                "not run: the node runs jobs (verify --maintenance runs it once they end)",
            )
        )
    return results


# an all_reduce across nodes over RDMA reaches most of the adapters' line rate; over TCP sockets
# a tenth of it: half the line rate tells the two apart
NETWORK_SHARE = 0.5
NETWORK_SECONDS = 900


def network_threshold(cluster: Cluster, view: PoolView) -> tuple[float | None, str]:
    """The bus bandwidth an all_reduce across two of the pool's nodes must reach (GB/s), and
    whence: half the line rate of the adapters NCCL drives between nodes (the site's rails, a
    cloud's InfiniBand, EFA); None where NCCL runs over TCP sockets."""
    profile = view.profile
    kind = cluster.spec.network.fabric.kind
    adapters = [h for h in profile.hcas if h.purpose == "compute"]
    if efa_count(profile):
        used = [h for h in adapters if h.kind == "efa"]
    elif cloud_infiniband(profile):
        used = [h for h in adapters if h.kind == "infiniband"]
    elif rails(profile, kind):
        used = [h for h in adapters if h.kind == kind]
    else:
        return None, "TCP sockets between the nodes: no threshold"
    gbps = sum(h.count * h.rate_gbps for h in used)
    line = ", ".join(f"{h.count} x {h.rate_gbps} Gb/s {h.model}" for h in used)
    return round(gbps / 8 * NETWORK_SHARE, 1), f"half the line rate of {line}"


def network_command(reservation: str, pool: str, nodes: list[str], gpus: int) -> str:
    """all_reduce_perf on every GPU of two nodes, one rank per GPU, through Slurm and PMIx."""
    return (
        f"timeout {NETWORK_SECONDS} srun --reservation={reservation} -p {pool} -N2 "
        f"-w {','.join(nodes)} --ntasks-per-node={gpus} --gpus-per-node={gpus} --mpi=pmix "
        f"--time={NETWORK_SECONDS // 60} {ALL_REDUCE} -b 1G -e 8G -f 2 -g 1"
    )


def network_finding(
    nodes: list[str], rc: int, output: str, threshold: float | None, whence: str
) -> CheckResult:
    """The all_reduce across two nodes, against the threshold where there is one."""
    where = f"{nodes[0]}+{nodes[1]}"
    result = parse_all_reduce(output) if rc == 0 else None
    if result is None:
        tail = " ".join(output.split())[-160:] or f"exit {rc}"
        return CheckResult("nccl.all_reduce.network", where, False, f"no result: {tail}")
    size = f"{result.largest_bytes / 2**30:g} GiB"
    if result.wrong:
        return CheckResult("nccl.all_reduce.network", where, False, f"{result.wrong} wrong values")
    if threshold is None:
        return CheckResult(
            "nccl.all_reduce.network",
            where,
            True,
            f"busbw {result.busbw_gbs:.1f} GB/s at {size} ({whence})",
        )
    return CheckResult(
        "nccl.all_reduce.network",
        where,
        result.busbw_gbs >= threshold,
        f"busbw {result.busbw_gbs:.1f} GB/s at {size}, threshold {threshold:g} ({whence})",
    )

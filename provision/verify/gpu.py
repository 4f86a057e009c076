"""GPU acceptance on GPU nodes: the GPUs the profile promises, healthy, linked as expected, and
an NCCL all_reduce on all of a node's GPUs at the profile's bus bandwidth."""

from __future__ import annotations

import shlex

from provision.render.context import PoolView
from provision.spec.nodes import Node
from provision.verify import CheckResult, VerifyContext
from provision.verify.gpu_parsers import (
    GPU_QUERY,
    REMAPPED_QUERY,
    GpuExpect,
    all_reduce_finding,
    gpu_findings,
    parse_all_reduce,
    parse_gpu_query,
    parse_nvlink_status,
    parse_remapped_rows,
)
from provision.verify.remote import Remote

ALL_REDUCE = "/opt/nccl-tests/build/all_reduce_perf"
ALL_REDUCE_TIMEOUT_S = 600.0


def expectation(ctx: VerifyContext, view: PoolView) -> GpuExpect | None:
    gpu = view.profile.gpu
    if gpu is None:
        return None
    return GpuExpect(
        count=gpu.count,
        family=gpu.slurm_type,
        memory_gib=gpu.memory_gib,
        driver=ctx.cluster.spec.software.nvidia_driver,
        nvlink_links=gpu.nvlink_links,
        pcie_gen=gpu.pcie_gen,
        pcie_width=gpu.pcie_width,
        nvswitch=gpu.nvswitch,
        busbw_gbs=gpu.nccl_busbw_gbs,
    )


def all_reduce_command(gpus: int) -> str:
    """One process driving all of the node's GPUs, 1 to 8 GiB messages."""
    return f"{ALL_REDUCE} -b 1G -e 8G -f 2 -g {gpus}"


def check_gpus(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    view = next(v for v in ctx.cluster.pools if v.name == node.pool)
    want = expectation(ctx, view)
    if want is None:
        return []
    if node.provider == "lab":
        return [CheckResult("gpu", node.name, True, "lab container: no GPU to check")]

    def found(check: str, passed: bool, evidence: str) -> CheckResult:
        return CheckResult(check, node.name, passed, evidence)

    query = remote.run(f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits")
    if query.rc != 0:
        first = (query.stdout + query.stderr).strip().splitlines()[:1]
        return [found("gpu.count", False, f"nvidia-smi failed: {first[0] if first else query.rc}")]
    remapped = remote.run(
        f"nvidia-smi --query-remapped-rows={REMAPPED_QUERY} --format=csv,noheader"
    )
    nvlink = remote.run("nvidia-smi nvlink --status") if want.nvlink_links else None
    gpus = parse_gpu_query(query.stdout)
    results = [
        found(*f)
        for f in gpu_findings(
            want,
            gpus,
            parse_remapped_rows(remapped.stdout if remapped.rc == 0 else ""),
            parse_nvlink_status(nvlink.stdout) if nvlink else {},
        )
    ]
    if want.nvswitch:
        fm = remote.run("systemctl is-active nvidia-fabricmanager")
        results.append(found("gpu.fabricmanager", fm.stdout.strip() == "active", fm.stdout.strip()))
    if ctx.cluster.spec.nvidia.nccl_tests:
        run = remote.run(
            f"test -x {shlex.quote(ALL_REDUCE)} && {all_reduce_command(want.count)}",
            timeout=ALL_REDUCE_TIMEOUT_S,
        )
        if run.rc != 0 and "#" not in run.stdout:
            results.append(
                found("nccl.all_reduce", False, f"{ALL_REDUCE} did not run (rc {run.rc})")
            )
        else:
            results.append(found(*all_reduce_finding(want, parse_all_reduce(run.stdout))))
    return results

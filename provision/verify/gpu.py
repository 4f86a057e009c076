"""GPU acceptance on GPU nodes: the GPUs the profile promises, healthy, linked as expected, and
an NCCL all_reduce on all of a node's GPUs at the profile's bus bandwidth."""

from __future__ import annotations

from provision.parsers.gpu import (
    ALL_REDUCE,
    ALL_REDUCE_OUT,
    QUERY_GPU,
    findings_from,
    gpu_commands,
)
from provision.render.health import gpu_expect
from provision.spec.nodes import Node
from provision.verify import CheckResult, VerifyContext
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
        if name == QUERY_GPU and out.rc != 0:
            break  # nvidia-smi cannot reach the GPUs: nothing else can answer
    results = [CheckResult(c, node.name, ok, ev) for c, ok, ev in findings_from(want, outputs)]
    if nccl and not load:
        results.append(
            CheckResult(
                "nccl.all_reduce",
                node.name,
                True,
                "not run: the node runs jobs (verify --maintenance runs it once they end)",
            )
        )
    return results

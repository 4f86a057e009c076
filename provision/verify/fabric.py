"""Fabric acceptance on the nodes of an InfiniBand or RoCE fabric: every adapter the profile
lists is up at its rate, the subnet manager answers, links do not flap, and node pairs reach
the ib_write_bw threshold on every rail (with GPUDirect where perftest is built for CUDA)."""

from __future__ import annotations

import shlex
import threading
import time

from provision.cluster import PoolView
from provision.parsers import fabric as fp
from provision.spec.fabric import Rail, cloud_infiniband, efa_count, rails
from provision.spec.nodes import Node, lab_container
from provision.verify.base import CheckResult, VerifyContext, in_parallel
from provision.verify.remote import Remote

WRITE_BW_SECONDS = 5
WRITE_BW_PORT = 18515  # perftest's default; one port per rail from here on


def _view(ctx: VerifyContext, node: Node) -> PoolView:
    return next(v for v in ctx.cluster.pools if v.name == node.pool)


def _rails(ctx: VerifyContext, view: PoolView) -> list[Rail]:
    return rails(view.profile, ctx.cluster.spec.network.fabric.kind)


def check_fabric(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    view = _view(ctx, node)
    node_rails = _rails(ctx, view)
    if cloud_infiniband(view.profile) and node.provider != "lab":
        return _check_cloud_infiniband(node, remote, view)
    if not node_rails:
        return []
    if lab_container(view.pool):
        return [CheckResult("fabric", node.name, True, "lab container: no RDMA adapter to check")]
    fabric = ctx.cluster.spec.network.fabric
    infiniband = fabric.kind == "infiniband"
    found: list[tuple[str, bool, str]] = []
    out = remote.run("ibstat", timeout=60)
    cas = fp.parse_ibstat(out.stdout) if out.rc == 0 else []
    devices = [r.device for r in node_rails if r.device]
    layer = "InfiniBand" if infiniband else "Ethernet"
    found += fp.hca_findings(cas, devices, len(node_rails), node_rails[0].rate_gbps, layer)
    names = fp.fabric_devices(cas, devices, layer)
    if infiniband:
        sm = remote.run("sminfo", timeout=30)
        found.append(fp.sm_finding(fp.parse_sminfo(sm.stdout), sm.stdout + sm.stderr))
    for device in names:
        if infiniband:
            pq = remote.run(f"perfquery -C {shlex.quote(device)} -P 1", timeout=30)
            counters = fp.parse_perfquery(pq.stdout)
        else:  # no MADs on Ethernet: the kernel keeps the same counter in sysfs (an adapter's
            # in counters/, soft RoCE's among its hw_counters/)
            port = f"/sys/class/infiniband/{device}/ports/1"
            paths = [f"{port}/counters/link_downed", f"{port}/hw_counters/link_downed"]
            read = " || ".join(f"cat {shlex.quote(p)} 2>/dev/null" for p in paths)
            raw = remote.run(read, timeout=30).stdout.strip()
            counters = {"LinkDownedCounter": int(raw)} if raw.isdigit() else {}
        found.append(fp.link_flap_finding(device, counters, fabric.link_downed_limit))
    return [CheckResult(c, node.name, ok, ev) for c, ok, ev in found]


def _check_cloud_infiniband(node: Node, remote: Remote, view: PoolView) -> list[CheckResult]:
    """A cloud's InfiniBand (Azure ND): every adapter up at its rate. The cloud runs the subnet
    manager, and a virtual function's counters are the cloud's: neither is asked."""
    hcas = [h for h in view.profile.hcas if h.kind == "infiniband" and h.purpose == "compute"]
    out = remote.run("ibstat", timeout=60)
    cas = fp.parse_ibstat(out.stdout) if out.rc == 0 else []
    found = fp.hca_findings(
        cas, [], cloud_infiniband(view.profile), hcas[0].rate_gbps, "InfiniBand"
    )
    return [CheckResult(c, node.name, ok, ev) for c, ok, ev in found]


def pairs(nodes: list[Node]) -> list[tuple[Node, Node]]:
    """Neighbours in order: (1, 2), (3, 4), ...; an odd last node pairs with the first."""
    out = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2 and len(nodes) > 1:
        out.append((nodes[-1], nodes[0]))
    return out


def write_bw_command(
    device: str, port: int, gpu: int | None, server: str | None, dmabuf: bool = False
) -> str:
    """ib_write_bw on one rail; with `gpu`, its buffer in that GPU's memory (GPUDirect RDMA),
    registered through DMA-BUF where the kernel has no peer-memory API for nvidia-peermem."""
    args = [
        "ib_write_bw",
        "-d",
        device,
        "--report_gbits",
        "-F",
        "-D",
        str(WRITE_BW_SECONDS),
        "-p",
        str(port),
    ]
    if gpu is not None:
        args.append(f"--use_cuda={gpu}")
        if dmabuf:  # perftest takes it only after --use_cuda
            args.append("--use_cuda_dmabuf")
    if server:
        args.append(server)
    return "timeout 120 " + shlex.join(args)


def gpudirect_through_dmabuf(os_name: str, rdma: str) -> bool:
    """Whether GPUDirect RDMA registers GPU memory through DMA-BUF: on inbox stacks whose kernel
    has no peer-memory API for nvidia-peermem (Debian's, Rocky's), as the rdma role decides."""
    return rdma == "inbox" and not os_name.startswith("ubuntu")


def check_fabric_bandwidth(
    ctx: VerifyContext, remotes: dict[str, Remote], nodes: list[Node]
) -> list[CheckResult]:
    """Pairwise ib_write_bw per rail, pairs in parallel, a pool's rails one after another."""
    fabric = ctx.cluster.spec.network.fabric
    # GPU memory reaches the adapter through nvidia-peermem where the kernel has the peer-memory
    # API (DOCA, Ubuntu's kernels), through DMA-BUF elsewhere (the rdma role loads no peermem)
    dmabuf = gpudirect_through_dmabuf(ctx.cluster.spec.os, fabric.rdma)
    jobs: list[tuple[PoolView, Node, Node]] = []
    for view in ctx.cluster.pools:
        members = [n for n in nodes if n.pool == view.name and n.name in remotes]
        if _rails(ctx, view) and members and not lab_container(view.pool):
            jobs += [(view, a, b) for a, b in pairs(members)]

    def one(job: tuple[PoolView, Node, Node]) -> list[CheckResult]:
        view, client, server = job
        name = f"{client.name}->{server.name}"
        cuda = view.profile.gpu is not None and "use_cuda" in (
            remotes[client.name].run("ib_write_bw --help 2>&1", timeout=30).stdout
        )
        results = []
        for rail in _rails(ctx, view):
            device = rail.device or f"mlx5_{rail.index}"
            gpu = (
                rail.index
                if cuda and view.profile.gpu and rail.index < view.profile.gpu.count
                else None
            )
            port = WRITE_BW_PORT + rail.index
            served: dict[str, str] = {}

            def serve(
                device: str = device,
                port: int = port,
                gpu: int | None = gpu,
                served: dict[str, str] = served,
            ) -> None:
                out = remotes[server.name].run(
                    write_bw_command(device, port, gpu, None, dmabuf), timeout=150
                )
                served["out"] = out.stdout + out.stderr

            thread = threading.Thread(target=serve, daemon=True)
            thread.start()
            time.sleep(1.0)  # the server listens before the client connects
            out = remotes[client.name].run(
                write_bw_command(device, port, gpu, str(server.address), dmabuf), timeout=150
            )
            thread.join(timeout=150)
            threshold = fp.write_bw_threshold(rail.rate_gbps, fabric.ib_write_bw_gbps)
            check, ok, evidence = fp.write_bw_finding(
                name,
                device,
                fp.parse_ib_write_bw(out.stdout),
                out.stdout + out.stderr + served.get("out", ""),
                threshold,
            )
            mode = "GPUDirect" if gpu is not None else "host memory"
            results.append(CheckResult(check, client.name, ok, f"{evidence}, {mode}"))
        return results

    return in_parallel(one, jobs, most=16)


def check_efa(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    """AWS nodes with EFA: libfabric sees every interface, and NCCL will load aws-ofi-nccl."""
    count = efa_count(_view(ctx, node).profile)
    if not count:
        return []
    if node.provider == "lab":
        return [CheckResult("efa", node.name, True, "lab container: no EFA to check")]
    info = remote.run(f"{fp.FI_INFO} -p efa -t FI_EP_RDM", timeout=60)
    cache = remote.run("ldconfig -p", timeout=30)
    found = fp.efa_findings(info.rc, info.stdout + info.stderr, count, cache.stdout)
    return [CheckResult(c, node.name, ok, ev) for c, ok, ev in found]

"""Live acceptance checks, run after apply and on demand: one result per check and node, with
the evidence. Parsers of command output are pure functions in provision/parsers/"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from rich.console import Console

from provision.cluster import Cluster
from provision.parsers import node as parsers
from provision.spec.fabric import cloud_infiniband, efa_count, rails
from provision.spec.nodes import Node, login_user
from provision.state import State
from provision.verify.remote import Remote


@dataclass(frozen=True)
class CheckResult:
    check: str
    target: str
    passed: bool
    evidence: str


@dataclass
class VerifyContext:
    cluster: Cluster
    state: State
    rendered_hosts: str
    # nodes that may be load-tested (NCCL, ib_write_bw): no job runs there and none can start
    # meanwhile; None: every node (no scheduler holds them)
    quiet: frozenset[str] | None = None

    def may_load(self, node: Node) -> bool:
        return self.quiet is None or node.name in self.quiet


T = TypeVar("T")
# where sshd reads the admins' keys: root's files, written by the common role (_common_keys_dir)
ADMIN_KEYS_DIR = "/etc/ssh/provision-keys"
NodeCheck = Callable[[VerifyContext, Node, Remote], list[CheckResult]]


def connect_all(
    cluster: Cluster, state: State, key_file: Path | None, nodes: list[Node]
) -> tuple[dict[str, Remote], list[CheckResult]]:
    """Open one SSH session per node, in parallel; unreachable nodes become failed results."""
    spec = cluster.spec

    def attempt(node: Node) -> tuple[Node, Remote | None, CheckResult]:
        user = login_user(spec, node.provider)
        remote = Remote(
            node.name, str(node.login_address), user, spec.ssh.port, key_file, state.known_hosts
        )
        try:
            remote.connect()
        except Exception as exc:  # any failure to reach a node is a finding, not a crash
            return (
                node,
                None,
                CheckResult(
                    "ssh",
                    node.name,
                    False,
                    f"{node.login_address}:{spec.ssh.port}: {_one_line(exc)}",
                ),
            )
        return (
            node,
            remote,
            CheckResult(
                "ssh",
                node.name,
                True,
                f"{user}@{node.login_address} in {remote.connect_seconds:.2f}s",
            ),
        )

    remotes: dict[str, Remote] = {}
    results = []
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(nodes)))) as pool:
        for node, remote, result in pool.map(attempt, nodes):
            results.append(result)
            if remote is not None:
                remotes[node.name] = remote
    return remotes, results


def run_node_checks(
    ctx: VerifyContext, remotes: dict[str, Remote], nodes: list[Node], checks: list[NodeCheck]
) -> list[CheckResult]:
    def one(node: Node) -> list[CheckResult]:
        remote = remotes.get(node.name)
        if remote is None:
            return []
        out: list[CheckResult] = []
        for check in checks:
            try:
                out.extend(check(ctx, node, remote))
            except Exception as exc:  # a broken session fails this node's check, not the run
                out.append(
                    CheckResult(
                        check.__name__.removeprefix("check_"), node.name, False, _one_line(exc)
                    )
                )
        return out

    return in_parallel(one, nodes)


def in_parallel(
    fn: Callable[[T], list[CheckResult]], items: list[T], most: int = 32
) -> list[CheckResult]:
    """`fn` on every item, `most` at a time; the results in the items' order."""
    results: list[CheckResult] = []
    with ThreadPoolExecutor(max_workers=min(most, max(1, len(items)))) as pool:
        for batch in pool.map(fn, items):
            results.extend(batch)
    return results


def tcp_state(address: str, port: int, timeout: float = 1.5) -> str:
    """open, refused (nothing listens: the firewall let it through), filtered (dropped), or
    unreachable, for a TCP connection from this machine."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "filtered"
    except OSError as exc:
        return f"unreachable ({exc.strerror or exc})"


def probe_ports(probes: list[tuple[Node, int]]) -> dict[tuple[Node, int], str]:
    """Each (node, port)'s tcp_state from this machine, all at once: a filtered port costs a
    whole timeout."""
    with ThreadPoolExecutor(max_workers=min(64, len(probes) or 1)) as pool:
        states = pool.map(lambda probe: tcp_state(str(probe[0].login_address), probe[1]), probes)
        return dict(zip(probes, states, strict=True))


def closed_ports(
    check: str, node: Node, states: dict[tuple[Node, int], str], ports: list[int]
) -> CheckResult:
    """Passes when none of the node's `ports` answered open from this machine."""
    found = {p: states[(node, p)] for p in ports}
    leaks = [p for p, state in found.items() if state == "open"]
    evidence = ", ".join(f"{p} {state}" for p, state in found.items())
    return CheckResult(
        check, node.name, not leaks, ("closed: " if not leaks else "OPEN: ") + evidence
    )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


# --- checks of the common role ---------------------------------------------------------------


def check_hostname(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    out = remote.run("hostname")
    got = out.stdout.strip()
    return [CheckResult("hostname", node.name, got == node.name, f"hostname is {got!r}")]


def check_hosts_file(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    out = remote.run("cat /etc/hosts")
    missing = parsers.missing_host_lines(ctx.rendered_hosts, out.stdout)
    evidence = (
        f"all {len(parsers.host_entries(ctx.rendered_hosts))} cluster entries present"
        if not missing
        else f"missing: {'; '.join(missing[:3])}"
    )
    return [CheckResult("/etc/hosts", node.name, not missing, evidence)]


def check_time_sync(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    service = "chronyd" if ctx.cluster.spec.os == "rocky9" else "chrony"
    out = remote.run(f"systemctl is-active {service}")
    state = out.stdout.strip() or out.stderr.strip()
    return [CheckResult("time sync", node.name, state == "active", f"{service} is {state}")]


def check_admin_users(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    """Each admin exists (with the spec's uid, where it pins one) and sshd's file of its keys
    (root's, in ADMIN_KEYS_DIR: the common role's) holds every key of the spec."""
    results = []
    for admin in ctx.cluster.spec.security.admins:
        check = f"admin {admin.name}"
        out = remote.run(
            f"getent passwd {admin.name} && cat {ADMIN_KEYS_DIR}/{admin.name}", sudo=True
        )
        if out.rc != 0:
            gone = f"user or {ADMIN_KEYS_DIR}/{admin.name} missing"
            results.append(CheckResult(check, node.name, False, gone))
            continue
        entry, _, keys = out.stdout.partition("\n")
        fields = entry.split(":")
        if admin.uid is not None and (len(fields) < 3 or fields[2] != str(admin.uid)):
            got = fields[2] if len(fields) >= 3 else "?"
            results.append(CheckResult(check, node.name, False, f"uid {got}, not {admin.uid}"))
            continue
        missing = parsers.missing_keys(list(admin.ssh_keys), keys)
        results.append(
            CheckResult(
                check,
                node.name,
                not missing,
                f"{len(admin.ssh_keys)} key(s) authorized"
                if not missing
                else f"{len(missing)} key(s) not authorized",
            )
        )
    return results


COMMON_CHECKS: list[NodeCheck] = [
    check_hostname,
    check_hosts_file,
    check_time_sync,
    check_admin_users,
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
    from provision.verify import fabric, gpu, kubernetes, slurm, tunnel

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


def print_checks(results: Sequence[CheckResult], console: Console) -> int:
    """One line per check, PASS or FAIL with its evidence, then the count; returns the failed."""
    failed = 0
    for r in results:
        mark = "[green]PASS[/green]" if r.passed else "[red]FAIL[/red]"
        failed += not r.passed
        console.print(f"{mark} {r.check} {r.target}: ", end="")
        console.print(r.evidence, markup=False)
    console.print(f"verify: {len(results) - failed} passed, {failed} failed")
    return failed

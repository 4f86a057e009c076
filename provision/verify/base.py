"""What every check is made of: its result, the context it reads, the SSH sessions to the
nodes, and the helpers the checks share (in parallel, TCP probes)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from provision.cluster import Cluster
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

"""Preflight: before Ansible runs, check every node the way Ansible will reach it.

Reachable over SSH with the cluster's key, python3 present, root or passwordless sudo, the OS
the spec says, this machine inside the admin networks (or the firewall the roles install
would lock it out), and, before this state's first apply, no munge key on the node other than
this state's (a running cluster whose state is elsewhere). Every failure names the node and
the cause.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from provision.cluster import Cluster
from provision.parsers.node import os_matches, parse_os_release
from provision.secrets import MUNGE_KEY
from provision.spec.nodes import Node
from provision.state import State
from provision.verify import CheckResult, connect_all
from provision.verify.remote import Remote

DRIFT = "unchanged"  # not a failure: the node converges
SECRETS = "cluster secrets"
NODE_MUNGE_KEY = "/etc/munge/munge.key"
PROBE = (
    "command -v python3 >/dev/null && echo python=yes || echo python=no; "
    "id -u; "
    "sudo -n true 2>/dev/null && echo sudo=yes || echo sudo=no; "
    'echo "client=${SSH_CLIENT%% *}"; '
    "cat /etc/os-release"
)


def preflight(
    cluster: Cluster,
    state: State,
    key: Path | None,
    drift: Mapping[str, str] | None = None,
    only: list[str] | None = None,
) -> list[CheckResult]:
    """drift: a node's drift probe (provision/converged.py), run in the same session; its
    result is the check DRIFT, passed when the node is as the last converge left it. only:
    these nodes alone (None: every node with an address)."""
    nodes = [
        n
        for n in cluster.lasting_nodes
        if n.address is not None and (only is None or n.name in only)
    ]
    remotes, results = connect_all(cluster, state, key, nodes)
    admin = cluster.spec.security.admin_cidrs
    ours = _munge_digest(state) if cluster.spec.scheduler == "slurm" else None

    def check(node: Node) -> list[CheckResult]:
        remote = remotes[node.name]
        try:
            found = probe(node, remote, cluster.spec.os, admin)
            if ours is not None and all(c.passed for c in found):
                found.append(_same_munge_key(node, remote, ours, state))
            if drift and node.name in drift and all(c.passed for c in found):
                out = remote.run(drift[node.name], sudo=True, timeout=60)
                said = " ".join((out.stdout + out.stderr).split())[:200]
                evidence = "files and services as the last converge left them"
                found.append(CheckResult(DRIFT, node.name, out.rc == 0, said or evidence))
            return found
        finally:
            remote.close()

    reached = [n for n in nodes if n.name in remotes]
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(reached)))) as pool:
        for batch in pool.map(check, reached):
            results.extend(batch)
    return results


def probe(
    node: Node, remote: Remote, spec_os: str, admin: list[ipaddress.IPv4Network]
) -> list[CheckResult]:
    out = remote.run(PROBE, timeout=30)
    lines = out.stdout.splitlines()
    facts = dict(line.split("=", 1) for line in lines[:5] if "=" in line and " " not in line)
    uid = lines[1].strip() if len(lines) > 1 else "?"
    sudo = "" if uid == "0" else f", passwordless sudo {facts.get('sudo')}"
    results = [
        CheckResult(
            "python3",
            node.name,
            facts.get("python") == "yes",
            "present" if facts.get("python") == "yes" else "missing: install python3",
        ),
        CheckResult(
            "root or sudo",
            node.name,
            uid == "0" or facts.get("sudo") == "yes",
            f"uid {uid}{sudo}",
        ),
    ]
    os_id, version = parse_os_release("\n".join(lines))
    results.append(
        CheckResult(
            "os",
            node.name,
            os_matches(spec_os, os_id, version),
            f"{os_id} {version} (spec: {spec_os})",
        )
    )
    client = facts.get("client", "")
    try:
        inside = any(ipaddress.IPv4Address(client) in net for net in admin)
    except ValueError:
        inside = False
    results.append(
        CheckResult(
            "admin network",
            node.name,
            inside,
            f"this machine reaches it from {client or '?'}"
            + (
                ""
                if inside
                else ": add it to security.admin_cidrs, or the firewall will lock it out"
            ),
        )
    )
    return results


def _munge_digest(state: State) -> str | None:
    """The SHA-256 of this state's munge key, when no apply from this state has succeeded yet
    (a state that has applied is the cluster's; one that has not may be a new state beside a
    running cluster)."""
    key = state.secrets / MUNGE_KEY
    if state.applied.exists() or not key.exists():
        return None
    return hashlib.sha256(key.read_bytes()).hexdigest()


def _same_munge_key(node: Node, remote: Remote, ours: str, state: State) -> CheckResult:
    """A node that already has a munge key other than this state's belongs to a running
    cluster whose state is elsewhere: an apply from this one would replace its keys and
    secrets."""
    out = remote.run(f"sha256sum {NODE_MUNGE_KEY} 2>/dev/null || true", sudo=True, timeout=30)
    theirs = out.stdout.split()[0] if out.stdout.split() else ""
    if not theirs or theirs == ours:
        return CheckResult(SECRETS, node.name, True, "no munge key yet, or this state's")
    return CheckResult(
        SECRETS,
        node.name,
        False,
        f"{NODE_MUNGE_KEY} is not the key of this state ({state.dir}): the node runs in a "
        "cluster whose state is elsewhere; pass that state with --state-dir (its keys and "
        "secrets), or, to take the host into this cluster, remove its munge key first",
    )

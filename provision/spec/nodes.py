"""Expand a spec's pools into Node records: names, roles and, where known, addresses."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace

from provision.spec.models import Pool, PoolRole, ProviderKind, Spec

# Lab nodes get addresses from the management network starting at this host offset; the
# workstation owns the gateway (.1) and the low addresses stay free for it and the user.
LAB_FIRST_HOST_OFFSET = 11

Loc = tuple[str | int, ...]

# The user each OS's official AWS image lets in with the instance's key pair (cloud-init's
# default user); root logs in on none of them
AWS_LOGIN = {
    "ubuntu22.04": "ubuntu",
    "ubuntu24.04": "ubuntu",
    "debian12": "admin",
    "rocky9": "rocky",
}
# The account the cluster's stack makes on Azure and GCP VMs when ssh.user is root: Azure
# refuses root as a VM's administrator, and Google's images refuse root over SSH
CLOUD_ADMIN = {"azure": "azureuser", "gcp": "provision"}


def login_user(spec: Spec, provider: str) -> str:
    """The user Ansible, verify and `provision ssh` log in as on a node of this provider:
    ssh.user, except where the cloud's image decides (AWS) or refuses root (Azure, GCP). Not
    root means sudo."""
    if provider == "aws":
        return AWS_LOGIN[spec.os]
    if provider in CLOUD_ADMIN and spec.ssh.user == "root":
        return CLOUD_ADMIN[provider]
    return spec.ssh.user


def node_network(spec: Spec, pool_name: str) -> ipaddress.IPv4Network:
    """The network a pool's nodes have their addresses in: its remote network, or the
    management network."""
    pool = next(p for p in spec.pools if p.name == pool_name)
    for remote in spec.network.remote:
        if remote.name == pool.network:
            return remote.cidr
    return spec.network.management.cidr


@dataclass(frozen=True)
class Node:
    name: str
    pool: str
    role: PoolRole
    provider: ProviderKind
    address: ipaddress.IPv4Address | None
    bmc_address: ipaddress.IPv4Address | None
    elastic: bool
    loc: Loc  # where in the spec this node comes from (for error messages)
    # where this machine reaches it, where that is not its address: a cloud node's public one
    login: ipaddress.IPv4Address | None = None

    @property
    def login_address(self) -> ipaddress.IPv4Address | None:
        """The address Ansible, verify and `provision ssh` connect to from this machine."""
        return self.login or self.address

    @property
    def reach(self) -> str:
        """How other nodes reach it: its address where known, else its name (a cloud node
        before it exists has only its name, which /etc/hosts resolves once it does)."""
        return str(self.address) if self.address is not None else self.name


# the metal lab's BMCs (emulators) listen on this machine's loopback
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")


def metal_lab_pools(spec: Spec) -> list[str]:
    """The pools of the metal lab: lab pools that boot from the network, whose nodes are QEMU
    machines without a disk, each with a Redfish BMC (providers/lab/metal.py)."""
    return [p.name for p in spec.pools if p.provider == "lab" and p.boot == "network"]


def lab_container(pool: Pool) -> bool:
    """A lab container shares this machine's kernel: no RDMA device or GPU of its own. A metal
    lab machine has a kernel of its own (its soft RoCE is checked as a card is)."""
    return pool.provider == "lab" and pool.boot != "network"


def lab_mac(address: ipaddress.IPv4Address) -> str:
    """A metal lab machine's MAC address: QEMU's prefix and its address's last three bytes."""
    return "52:54:00:" + ":".join(f"{b:02x}" for b in address.packed[1:])


def expand_nodes(spec: Spec) -> list[Node]:
    nodes, _ = expand_nodes_checked(spec)
    return nodes


def expand_nodes_checked(spec: Spec) -> tuple[list[Node], list[tuple[Loc, str]]]:
    """Nodes in spec order, and the problems met while naming and addressing them."""
    problems: list[tuple[Loc, str]] = []
    nodes: list[Node] = []
    for p_idx, pool in enumerate(spec.pools):
        if pool.hosts is not None:
            for h_idx, host in enumerate(pool.hosts):
                nodes.append(
                    Node(
                        host.name,
                        pool.name,
                        pool.role,
                        pool.provider,
                        host.address,
                        host.bmc_address,
                        pool.elastic,
                        ("pools", p_idx, "hosts", h_idx),
                    )
                )
            continue
        if pool.count is None:
            continue  # reported by the checks: a pool needs count or hosts
        prefix = pool.hostname_prefix or pool.name
        if len(str(pool.count)) > pool.index_width:
            problems.append(
                (
                    ("pools", p_idx, "index_width"),
                    f"{pool.count} nodes need {len(str(pool.count))} digits: raise index_width",
                )
            )
        for i in range(pool.count):
            address = _nth(
                pool.first_address,
                i,
                node_network(spec, pool.name),
                ("pools", p_idx, "first_address"),
                problems,
                pool.count,
            )
            bmc_cidr = spec.network.bmc.cidr if spec.network.bmc else None
            bmc = _nth(
                pool.first_bmc_address,
                i,
                bmc_cidr,
                ("pools", p_idx, "first_bmc_address"),
                problems,
                pool.count,
            )
            nodes.append(
                Node(
                    f"{prefix}{i + 1:0{pool.index_width}d}",
                    pool.name,
                    pool.role,
                    pool.provider,
                    address,
                    bmc,
                    pool.elastic,
                    ("pools", p_idx),
                )
            )
    return _assign_lab_addresses(spec, nodes, problems), problems


def _nth(
    first: ipaddress.IPv4Address | None,
    i: int,
    cidr: ipaddress.IPv4Network | None,
    loc: Loc,
    problems: list[tuple[Loc, str]],
    count: int,
) -> ipaddress.IPv4Address | None:
    if first is None:
        return None
    if int(first) + count - 1 > int(ipaddress.IPv4Address("255.255.255.255")):
        if i == 0:
            problems.append((loc, f"{count} addresses from {first} run past 255.255.255.255"))
        return None
    address = first + i
    if cidr is not None and address not in cidr and i == count - 1:
        problems.append((loc, f"{count} addresses from {first} run past the end of {cidr}"))
    return address


def _assign_lab_addresses(
    spec: Spec, nodes: list[Node], problems: list[tuple[Loc, str]]
) -> list[Node]:
    mgmt = spec.network.management.cidr
    used = {n.address for n in nodes if n.address is not None}
    if spec.scheduler == "kubernetes" and spec.kubernetes.api_address is not None:
        used.add(spec.kubernetes.api_address)  # the control plane's virtual address
    candidates = (
        mgmt.network_address + k for k in range(LAB_FIRST_HOST_OFFSET, mgmt.num_addresses)
    )
    out = []
    for node in nodes:
        if node.provider == "lab" and node.address is None:
            address = next(
                (a for a in candidates if a not in used and a != mgmt.broadcast_address), None
            )
            if address is None:
                problems.append(
                    (
                        ("network", "management", "cidr"),
                        f"{mgmt} has no free address left for lab node {node.name}: "
                        "use a larger network",
                    )
                )
            else:
                used.add(address)
                node = replace(node, address=address)
        out.append(node)
    return out

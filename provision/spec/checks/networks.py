"""The networks' checks: the management and remote networks, the tunnel, the fabric and IPoIB."""

from __future__ import annotations

import difflib
import ipaddress
import re

from provision.burst.tunnel import SECRET_LIMIT, secret_size
from provision.spec.checks.base import Problem
from provision.spec.fabric import fabric_addresses, fabric_hcas
from provision.spec.models import CLOUD_PROVIDERS, Spec
from provision.spec.nodes import Loc, Node, lab_container
from provision.spec.profiles import load_profiles


def check_networks(spec: Spec) -> list[Problem]:
    nets: list[tuple[Loc, ipaddress.IPv4Network]] = [
        (("network", "management", "cidr"), spec.network.management.cidr)
    ]
    if spec.network.bmc:
        nets.append((("network", "bmc", "cidr"), spec.network.bmc.cidr))
    if spec.network.fabric.subnet:
        nets.append((("network", "fabric", "subnet"), spec.network.fabric.subnet))
    if spec.scheduler == "kubernetes":
        nets.append((("kubernetes", "pod_cidr"), spec.kubernetes.pod_cidr))
        nets.append((("kubernetes", "service_cidr"), spec.kubernetes.service_cidr))
    for i, remote in enumerate(spec.network.remote):
        nets.append((("network", "remote", i, "cidr"), remote.cidr))
    problems: list[Problem] = []
    for a in range(len(nets)):
        for b in range(a):
            if nets[a][1].overlaps(nets[b][1]):
                other = ".".join(str(p) for p in nets[b][0])
                why = (
                    "a remote network needs its own range, or no route can tell the two apart"
                    if nets[a][0][1] == "remote"
                    else "give each network its own range"
                )
                problems.append(
                    (nets[a][0], f"{nets[a][1]} overlaps {other} ({nets[b][1]}): {why}")
                )
    problems += _check_remote(spec)
    if spec.network.fabric.kind != "ethernet" and spec.network.fabric.subnet is None:
        problems.append(
            (
                ("network", "fabric"),
                f"a {spec.network.fabric.kind} fabric needs 'subnet' for its IP addresses",
            )
        )
    return problems


def _check_remote(spec: Spec) -> list[Problem]:
    """Remote networks: each named once and used; pools name one that exists; a cloud's pools
    share one, which no other provider uses; what the tunnel cannot carry yet is refused."""
    problems: list[Problem] = []
    heads = sum(p.size for p in spec.pools if p.role == "head")
    names: dict[str, int] = {}
    for i, remote in enumerate(spec.network.remote):
        if remote.name in names:
            problems.append(
                (("network", "remote", i, "name"), f"'{remote.name}' is used twice: rename one")
            )
        names.setdefault(remote.name, i)
    used_by: dict[str, str] = {}  # remote network -> the cloud on it
    cloud_net: dict[str, str] = {}  # cloud -> its remote network
    # heads in a cloud: that cloud's network is the management network (unbuilt.py refuses
    # the pools elsewhere, which the tunnel would have to carry)
    home = next((p.provider for p in spec.pools if p.role == "head"), None)
    for i, pool in enumerate(spec.pools):
        at: Loc = ("pools", i, "network")
        if pool.network is None:
            if pool.provider in CLOUD_PROVIDERS and pool.provider != home:
                problems.append(
                    (
                        at,
                        f"pools on {pool.provider} need a remote network: the cloud's own "
                        "address range (network.remote), which its nodes reach the head "
                        f"from through the tunnel (or the heads on {pool.provider} too)",
                    )
                )
            continue
        if pool.network not in names:
            known = ", ".join(names) or "none"
            problems.append((at, f"no remote network '{pool.network}' (network.remote: {known})"))
            continue
        if pool.role != "compute":
            problems.append(
                (at, f"{pool.role} pools on a remote network: not supported yet (compute only)")
            )
        elif pool.provider == "lab":
            problems.append((at, "lab pools on a remote network: not supported yet"))
        elif pool.provider in CLOUD_PROVIDERS:
            cloud = used_by.setdefault(pool.network, pool.provider)
            mine = cloud_net.setdefault(pool.provider, pool.network)
            if cloud != pool.provider:
                problems.append(
                    (at, f"'{pool.network}' is {cloud}'s network: give {pool.provider} its own")
                )
            elif mine != pool.network:
                problems.append(
                    (
                        at,
                        f"the {pool.provider} pools share one network ('{mine}'): one per "
                        "cloud and cluster",
                    )
                )
        if pool.elastic and pool.provider in SECRET_LIMIT and pool.count:
            prefix = pool.hostname_prefix or pool.name
            burst = [f"{prefix}{n + 1:0{pool.index_width}d}" for n in range(pool.count)]
            size = secret_size(pool.provider, burst, max(1, heads))
            limit = SECRET_LIMIT[pool.provider]
            if size > limit:
                problems.append(
                    (
                        ("pools", i, "count"),
                        f"{pool.count} burst nodes' tunnel keys take {size} bytes, more than "
                        f"one {pool.provider} secret holds ({limit}): split the pool in two",
                    )
                )
    on_remote = {p.network for p in spec.pools if p.network is not None}
    for i, remote in enumerate(spec.network.remote):
        if remote.name not in on_remote:
            problems.append(
                (("network", "remote", i), f"no pool is on '{remote.name}': remove it or use it")
            )
    tunnel = spec.network.tunnel
    if on_remote:
        if heads > 1 and tunnel.endpoint is not None:
            problems.append(
                (
                    ("network", "tunnel", "endpoint"),
                    f"{heads} heads: each is a hub of the tunnel: name each one's in "
                    "network.tunnel.endpoints, in the heads' order",
                )
            )
        if tunnel.endpoints and len(tunnel.endpoints) != heads:
            problems.append(
                (
                    ("network", "tunnel", "endpoints"),
                    f"{len(tunnel.endpoints)} endpoints for {heads} head(s): one per head, in "
                    "the heads' order"
                    + (" (one head: network.tunnel.endpoint)" if heads == 1 else ""),
                )
            )
        if spec.scheduler == "kubernetes":
            problems.append(
                (("network", "remote"), "remote networks under Kubernetes: not supported yet")
            )
    elif spec.network.tunnel.model_fields_set:
        problems.append((("network", "tunnel"), "no pool is on a remote network: remove it"))
    return problems


def check_fabric(spec: Spec) -> list[Problem]:
    fabric = spec.network.fabric
    loc = ("network", "fabric")
    problems: list[Problem] = []
    if fabric.rdma == "doca" and spec.software.doca is None:
        problems.append(
            ((*loc, "rdma"), "DOCA-OFED needs its release: set software.doca (like 2.9.1)")
        )
    if fabric.rdma == "doca" and fabric.doca_key_fingerprint is None:
        problems.append(
            (
                (*loc, "rdma"),
                "DOCA-OFED needs the full fingerprint of its signing key: set "
                "network.fabric.doca_key_fingerprint (gpg --show-keys --with-colons "
                "GPG-KEY-Mellanox.pub; Mellanox's ends in A024F6F0E6D6A281)",
            )
        )
    if fabric.kind == "ethernet":
        for key in (
            "subnet_managers",
            "bootstrap_interface",
            "rdma",
            "doca_mirror_url",
            "doca_key_fingerprint",
            "roce",
        ):
            if key in fabric.model_fields_set:
                problems.append(
                    ((*loc, key), f"'{key}' needs an infiniband or roce fabric, not ethernet")
                )
    if fabric.kind == "roce" and fabric.subnet_managers:
        problems.append(
            (
                (*loc, "subnet_managers"),
                "RoCE runs over Ethernet switches and needs no subnet manager: remove the list",
            )
        )
    if fabric.kind == "infiniband" and "roce" in fabric.model_fields_set:
        problems.append(((*loc, "roce"), "RoCE settings need a roce fabric, not infiniband"))
    if fabric.kind == "infiniband":
        problems.extend(_check_ipoib(spec))
    if fabric.kind == "roce":
        profiles = load_profiles(spec.profiles)
        for i, pool in enumerate(spec.pools):
            profile = profiles.get(pool.profile)
            if profile is None:
                continue
            soft = any(h.soft for h in fabric_hcas(profile, "roce"))
            if soft and not all(h.soft for h in fabric_hcas(profile, "roce")):
                problems.append(
                    (
                        ("pools", i, "profile"),
                        f"profile {pool.profile} mixes soft RoCE with RoCE adapters: not "
                        "supported yet (their GID tables differ, and NCCL takes one index)",
                    )
                )
            if soft and lab_container(pool):
                problems.append(
                    (
                        ("pools", i, "profile"),
                        f"profile {pool.profile} has soft RoCE, which a lab container cannot "
                        "make (it shares this machine's kernel): give it to a metal lab pool "
                        "(boot: network), whose machines have kernels of their own",
                    )
                )
            if fabric.subnet is None:
                continue
            if any(not h.netdevs for h in fabric_hcas(profile, "roce")):
                problems.append(
                    (
                        ("pools", i, "profile"),
                        f"profile {pool.profile}'s RoCE adapters name no netdevs, so their "
                        "fabric addresses have nowhere to go: add netdevs to the profile",
                    )
                )
    return problems


# IPoIB's datagram mode carries at most the IB MTU less its 4-byte header
IPOIB_DATAGRAM_MTU = 4092
_CONNECTX = re.compile(r"ConnectX-(\d+)", re.IGNORECASE)


def _enhanced_ipoib(model: str) -> bool:
    """ConnectX-4 and later run Enhanced IPoIB (mlx5), which has no connected mode."""
    found = _CONNECTX.search(model)
    return found is not None and int(found.group(1)) >= 4


def _check_ipoib(spec: Spec) -> list[Problem]:
    fabric = spec.network.fabric
    loc = ("network", "fabric")
    problems: list[Problem] = []
    if fabric.ipoib_mode == "connected":
        profiles = load_profiles(spec.profiles)
        models = sorted(
            {
                h.model
                for pool in spec.pools
                if (profile := profiles.get(pool.profile)) is not None
                for h in fabric_hcas(profile, "infiniband")
                if _enhanced_ipoib(h.model)
            }
        )
        if models:
            problems.append(
                (
                    (*loc, "ipoib_mode"),
                    f"{', '.join(models)} run Enhanced IPoIB, which has datagram mode only "
                    "(ConnectX-4 and later): remove ipoib_mode connected",
                )
            )
    elif fabric.mtu is not None and fabric.mtu > IPOIB_DATAGRAM_MTU:
        problems.append(
            (
                (*loc, "mtu"),
                f"IPoIB in datagram mode carries at most {IPOIB_DATAGRAM_MTU} bytes, not "
                f"{fabric.mtu}: lower mtu or leave it unset",
            )
        )
    return problems


def check_fabric_nodes(spec: Spec, nodes: list[Node]) -> list[Problem]:
    fabric = spec.network.fabric
    profiles = load_profiles(spec.profiles)
    by_name = {n.name: n for n in nodes}
    pools = {p.name: p for p in spec.pools}
    problems: list[Problem] = []
    for i, name in enumerate(fabric.subnet_managers):
        loc = ("network", "fabric", "subnet_managers", i)
        node = by_name.get(name)
        if node is None:
            close = difflib.get_close_matches(name, sorted(by_name), n=1)
            hint = f": did you mean '{close[0]}'?" if close else ""
            problems.append((loc, f"'{name}' is not a node of this cluster{hint}"))
        elif node.elastic:
            problems.append((loc, f"{name} is an elastic node: a subnet manager must stay up"))
        elif fabric.subnet_managers.index(name) != i:
            problems.append((loc, f"{name} is named twice"))
        elif not fabric_hcas(profiles[pools[node.pool].profile], "infiniband"):
            problems.append(
                (
                    loc,
                    f"{name} has no InfiniBand adapter (profile {pools[node.pool].profile}): "
                    "the subnet manager must run on a node on the fabric",
                )
            )
    if len(fabric.subnet_managers) > 16:
        problems.append(
            (("network", "fabric", "subnet_managers"), "opensm has 16 priorities: name at most 16")
        )
    _, address_problems = fabric_addresses(spec, profiles, nodes, addresses=False)
    return problems + address_problems

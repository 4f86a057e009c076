"""The high-speed fabric laid out from the spec: which adapters carry it (the rails), and each
node's address on every rail. Pure functions, shared by the checks, the renderer and verify.

Addressing is deterministic and stable: the fabric subnet is split into one equal block per
rail (a power of two of them), and a node's address on every rail has the same host offset as
its management address. Adding, removing or reordering pools never moves another node.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

from provision.spec.models import CLOUD_PROVIDERS, HcaSpec, Profile, Spec
from provision.spec.nodes import Loc, Node


@dataclass(frozen=True)
class Rail:
    index: int
    netdev: str | None  # interface name; None: RoCE adapter without netdevs in its profile
    device: str | None  # RDMA device (mlx5_0); None: not named by the profile
    rate_gbps: int
    soft: bool = False  # software RoCE (rdma_rxe) over the netdev, made by the rdma role


def cloud_only(profile: Profile) -> bool:
    """A cloud's machine type: its adapters are on that cloud's own fabric, not the site's."""
    return set(profile.providers) <= set(CLOUD_PROVIDERS)


def fabric_hcas(profile: Profile, kind: str) -> list[HcaSpec]:
    """The profile's compute adapters that speak the site fabric's link layer."""
    if kind not in ("infiniband", "roce") or cloud_only(profile):
        return []
    return [h for h in profile.hcas if h.purpose == "compute" and h.kind == kind]


def cloud_infiniband(profile: Profile) -> int:
    """A cloud machine's InfiniBand adapters (Azure's ND series): the cloud runs that fabric
    and its subnet manager, and lets a pool's machines reach each other when they share one
    availability set."""
    if not cloud_only(profile):
        return 0
    return sum(h.count for h in profile.hcas if h.purpose == "compute" and h.kind == "infiniband")


def efa_count(profile: Profile) -> int:
    """The profile's EFA interfaces (AWS): a cloud's own fabric, whatever the spec's is."""
    return sum(h.count for h in profile.hcas if h.kind == "efa" and h.purpose == "compute")


def rails(profile: Profile, kind: str) -> list[Rail]:
    out: list[Rail] = []
    for hca in fabric_hcas(profile, kind):
        for i in range(hca.count):
            n = len(out)
            netdev = hca.netdevs[i] if hca.netdevs else (f"ib{n}" if kind == "infiniband" else None)
            device = hca.devices[i] if hca.devices else None
            out.append(Rail(n, netdev, device, hca.rate_gbps, hca.soft))
    return out


def rail_subnets(subnet: ipaddress.IPv4Network, count: int) -> list[ipaddress.IPv4Network]:
    """`count` equal blocks of the subnet, one per rail, in order."""
    if count <= 1:
        return [subnet]
    bits = math.ceil(math.log2(count))
    if subnet.prefixlen + bits > 30:
        return []
    return list(subnet.subnets(prefixlen_diff=bits))[:count]


def _dotted(n: int) -> str:
    return f"{n >> 24}.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


def fabric_addresses(
    spec: Spec, profiles: dict[str, Profile], nodes: list[Node], *, addresses: bool = True
) -> tuple[dict[str, list[str]], list[tuple[Loc, str]]]:
    """Node name -> its address on each rail ("10.22.32.21/19"), and the problems that stop an
    address being given. `addresses=False` only checks (no strings: 10,000 nodes x 8 rails)."""
    fabric = spec.network.fabric
    out: dict[str, list[str]] = {}
    problems: list[tuple[Loc, str]] = []
    if fabric.subnet is None or fabric.kind not in ("infiniband", "roce"):
        return out, problems
    pools = {p.name: p for p in spec.pools}
    rails_of = {name: len(rails(profiles[p.profile], fabric.kind)) for name, p in pools.items()}
    most = max(rails_of.values(), default=0)
    if most == 0:
        return out, problems
    blocks = rail_subnets(fabric.subnet, most)
    if not blocks:
        problems.append(
            (
                ("network", "fabric", "subnet"),
                f"{fabric.subnet} is too small to split into {most} rails: use a larger subnet",
            )
        )
        return out, problems
    mgmt = spec.network.management.cidr
    first, last = int(mgmt.network_address), int(mgmt.broadcast_address)
    bases = [int(b.network_address) for b in blocks]
    size, prefix = blocks[0].num_addresses, blocks[0].prefixlen
    for node in nodes:
        count = rails_of[node.pool]
        if not count or node.address is None:
            continue
        offset = int(node.address) - first
        if not 0 < offset <= last - first:
            continue  # outside the management network: reported by the node checks
        if offset >= size - 1:
            problems.append(
                (
                    ("network", "fabric", "subnet"),
                    f"{node.name} is host {offset} of {mgmt}, but each of the {len(blocks)} "
                    f"rails of {fabric.subnet} holds {size - 2} hosts: use a larger fabric subnet",
                )
            )
            return out, problems
        if addresses:
            out[node.name] = [f"{_dotted(base + offset)}/{prefix}" for base in bases[:count]]
    return out, problems

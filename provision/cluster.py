"""The expanded cluster: the spec, its profiles and its nodes, grouped once. Render, providers,
verify and plan all read it."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from functools import cached_property

import hostlist

from provision.burst.hostlist import expand
from provision.errors import UsageError
from provision.spec.models import Pool, Profile, Spec
from provision.spec.nodes import Node, expand_nodes
from provision.spec.profiles import load_profiles

HEADER = "Rendered by provision for cluster {name}; do not edit: change the spec and re-render."


def compress(names: list[str]) -> str:
    """Slurm-style hostlist: ['gpu001', 'gpu002'] -> 'gpu[001-002]'."""
    return str(hostlist.collect_hostlist(names))


@dataclass(frozen=True)
class PoolView:
    pool: Pool
    profile: Profile
    nodes: tuple[Node, ...]

    @property
    def name(self) -> str:
        return self.pool.name

    @property
    def hostlist(self) -> str:
        return compress([n.name for n in self.nodes])


class Cluster:
    """A spec with its nodes; `addresses` fills in what providers report (cloud nodes: their
    private addresses, the cluster's), `logins` where this machine reaches a node instead (a
    cloud node's public address)."""

    def __init__(
        self,
        spec: Spec,
        addresses: dict[str, ipaddress.IPv4Address] | None = None,
        logins: dict[str, ipaddress.IPv4Address] | None = None,
    ) -> None:
        self.spec = spec
        self.profiles = load_profiles(spec.profiles)
        nodes = expand_nodes(spec)
        addresses, logins = addresses or {}, logins or {}
        nodes = [
            replace(n, address=addresses.get(n.name, n.address), login=logins.get(n.name))
            for n in nodes
        ]
        self.nodes = nodes

    @property
    def header(self) -> str:
        return HEADER.format(name=self.spec.name)

    @cached_property
    def pools(self) -> list[PoolView]:
        by_pool: dict[str, list[Node]] = {p.name: [] for p in self.spec.pools}
        for node in self.nodes:
            by_pool[node.pool].append(node)
        return [
            PoolView(p, self.profiles[p.profile], tuple(by_pool[p.name])) for p in self.spec.pools
        ]

    def pools_with_role(self, role: str) -> list[PoolView]:
        return [p for p in self.pools if p.pool.role == role]

    @cached_property
    def user_doors(self) -> list[str]:
        """The pools the users log in to: the login pools, or the heads where there is none."""
        doors = self.pools_with_role("login") or self.pools_with_role("head")
        return [view.name for view in doors]

    @cached_property
    def head_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "head"]

    @cached_property
    def has_gpus(self) -> bool:
        """A pool's profile has GPUs."""
        return any(view.profile.gpu is not None for view in self.pools)

    @cached_property
    def lasting_nodes(self) -> list[Node]:
        """Nodes that live as long as the cluster: everything but elastic burst nodes."""
        return [n for n in self.nodes if not n.elastic]

    @cached_property
    def monitoring_node(self) -> Node | None:
        """The node running Prometheus and Alertmanager: the first of the monitoring pool."""
        pool = self.spec.monitoring_pool
        return next((n for n in self.nodes if n.pool == pool and not n.elastic), None)

    def describe(self) -> str:
        """One line: what the cluster is (validate prints it, plan heads with it)."""
        s = self.spec
        roles: dict[str, int] = {}
        for n in self.nodes:
            roles[n.role] = roles.get(n.role, 0) + 1
        role_text = ", ".join(f"{c} {r}" for r, c in roles.items())
        gpus = sum((v.profile.gpu.count if v.profile.gpu else 0) * len(v.nodes) for v in self.pools)
        providers = ", ".join(sorted({p.provider for p in s.pools}))
        elastic = sum(1 for n in self.nodes if n.elastic)
        extra = f", {elastic} of them elastic" if elastic else ""
        return (
            f"cluster '{s.name}': {s.scheduler} on {s.os}, {len(self.nodes)} nodes "
            f"({role_text}{extra}) in {len(s.pools)} pools on {providers}, {gpus} GPUs, "
            f"{s.network.fabric.kind} fabric"
        )


def pick_nodes(
    cluster: Cluster, names: str, source: object, roles: tuple[str, ...] = ("compute",)
) -> list[str]:
    """A pool name or a hostlist -> the lasting nodes of these roles it names, in the spec's
    order; a name that is none of them: exit 2, naming `source` (the spec's path)."""
    lasting = [n.name for n in cluster.lasting_nodes if n.role in roles]
    pools = {v.name: [n.name for n in v.nodes if n.name in lasting] for v in cluster.pools}
    if pools.get(names):
        return pools[names]
    try:
        wanted = expand(names)
    except ValueError as exc:
        raise UsageError(f"{names!r}: {exc}") from None
    unknown = [n for n in wanted if n not in lasting]
    if unknown:
        what = "/".join(roles)
        raise UsageError(
            f"{source}: {compress(unknown)} is not a lasting {what} node of cluster "
            f"'{cluster.spec.name}' (they are: {compress(lasting) or 'none'}; or a pool name)"
        )
    return [n for n in lasting if n in set(wanted)]

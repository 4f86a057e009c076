"""What `apply` would do: nodes per provider, groups, changed files, peak power and cost."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from provision.providers import ProviderPlan, get_provider
from provision.render import read_render, render
from provision.render.context import Cluster, compress
from provision.render.firewall import OpenRule, internet_rules
from provision.spec.models import PROVIDER_ORDER
from provision.state import State

HOURS_PER_MONTH = 730  # the cloud providers' own convention


@dataclass(frozen=True)
class PoolPower:
    pool: str
    profile: str
    nodes: int
    kw_per_node: float
    elastic: bool

    @property
    def kw(self) -> float:
        return self.nodes * self.kw_per_node


@dataclass(frozen=True)
class PoolCost:
    pool: str
    provider: str
    instance_type: str
    nodes: int
    usd_per_node_hour: float
    elastic: bool
    price_as_of: str
    price_region: str

    @property
    def usd_per_hour(self) -> float:
        return self.nodes * self.usd_per_node_hour

    @property
    def usd_per_month(self) -> float:
        return self.usd_per_hour * HOURS_PER_MONTH


@dataclass(frozen=True)
class FileChange:
    path: str
    kind: str  # added, changed, removed
    diff: str = ""


@dataclass
class Plan:
    providers: list[ProviderPlan]
    groups: dict[str, str]  # Ansible group -> compressed host list
    changes: list[FileChange]
    unchanged: int
    first_apply: bool
    power: list[PoolPower]
    cost: list[PoolCost] = field(default_factory=list)
    exposed: list[OpenRule] = field(default_factory=list)  # rules open to public addresses

    @property
    def total_kw(self) -> float:
        return sum(p.kw for p in self.power)

    @property
    def lasting_kw(self) -> float:
        return sum(p.kw for p in self.power if not p.elastic)


def make_plan(cluster: Cluster, state: State) -> Plan:
    providers = []
    used = {p.pool.provider for p in cluster.pools}
    for kind in (k for k in PROVIDER_ORDER if k in used):
        nodes = [n for n in cluster.nodes if n.provider == kind]
        providers.append(get_provider(kind, cluster.spec).plan(nodes, state))

    groups: dict[str, str] = {}
    for role in ("head", "login", "compute", "storage"):
        names = [n.name for n in cluster.lasting_nodes if n.role == role]
        if names:
            groups[role] = compress(names)
    for view in cluster.pools:
        groups[f"pool_{view.name}"] = view.hostlist + (" (elastic)" if view.pool.elastic else "")

    new = render(cluster)
    old = read_render(state.applied)
    changes = []
    for path in sorted(set(new) | set(old)):
        if path not in old:
            changes.append(FileChange(path, "added", _diff(path, "", new[path])))
        elif path not in new:
            changes.append(FileChange(path, "removed", _diff(path, old[path], "")))
        elif old[path] != new[path]:
            changes.append(FileChange(path, "changed", _diff(path, old[path], new[path])))
    unchanged = len(set(new) & set(old)) - sum(c.kind == "changed" for c in changes)

    power = [
        PoolPower(
            v.name, v.pool.profile, len(v.nodes), v.profile.max_power_w / 1000, v.pool.elastic
        )
        for v in cluster.pools
    ]
    cost = [
        PoolCost(
            v.name,
            v.pool.provider,
            v.profile.instance_type or v.pool.profile,
            len(v.nodes),
            v.profile.price.usd_per_hour,
            v.pool.elastic,
            v.profile.price.as_of.isoformat(),
            v.profile.price.region,
        )
        for v in cluster.pools
        if v.profile.price is not None
    ]
    return Plan(
        providers, groups, changes, unchanged, not old, power, cost, internet_rules(cluster)
    )


def _diff(path: str, old: str, new: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"applied/{path}",
            tofile=f"build/{path}",
        )
    )

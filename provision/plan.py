"""What `apply` would do: nodes per provider, groups, changed files, peak power and cost."""

from __future__ import annotations

import dataclasses
import difflib
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from provision import converged
from provision.changes import Changes, changes
from provision.cluster import Cluster, compress
from provision.errors import ProvisionError
from provision.providers import ProviderPlan, get_provider
from provision.render import read_render, render
from provision.render.firewall import OpenRule, Reach, admin_reach, internet_rules
from provision.render.netboot import boot_server, booted_nodes
from provision.run import pull
from provision.spec.models import PROVIDER_ORDER
from provision.state import State

HOURS_PER_MONTH = 730  # the cloud providers' own convention
# nodes -> the jobs on them, one "jobid user nodes" line each (drain.running_jobs over SSH)
JobsOn = Callable[[list[str]], list[str]]


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
    # spot: the market's price, which the on-demand list price bounds (EC2 charges no more)
    spot: bool = False

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
    running: Changes | None = None  # what changes on the running cluster; None before apply
    # the jobs on the compute nodes that leave, as squeue shows them ("jobid user nodes"),
    # or why they could not be asked (None: not asked, or no compute node leaves)
    leaving_jobs: list[str] | str | None = None
    # the nodes apply probes for drift and skips if as the last converge left them, and why
    # the others converge
    probed: list[str] = field(default_factory=list)
    converge_why: str = ""
    # the others: node -> the roles that would run there (None: all of them)
    roles: dict[str, list[str] | None] = field(default_factory=dict)
    # converge.mode: push, or pull with the nodes that would converge themselves
    mode: str = "push"
    pulled: list[str] = field(default_factory=list)
    reach: list[Reach] = field(default_factory=list)  # who reaches SSH and the monitoring
    boot: str = ""  # the nodes that boot from the network, and what apply does for them

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
    file_changes = []
    for path in sorted(set(new) | set(old)):
        if path not in old:
            file_changes.append(FileChange(path, "added", _diff(path, "", new[path])))
        elif path not in new:
            file_changes.append(FileChange(path, "removed", _diff(path, old[path], "")))
        elif old[path] != new[path]:
            file_changes.append(FileChange(path, "changed", _diff(path, old[path], new[path])))
    unchanged = len(set(new) & set(old)) - sum(c.kind == "changed" for c in file_changes)

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
            v.pool.capacity == "spot",
        )
        for v in cluster.pools
        if v.profile.price is not None
    ]
    decision = _decide(cluster, state, new)
    mode = pull.converge_mode(cluster.spec)
    pulled = pull.pulled(cluster.nodes, [n.name for n in cluster.lasting_nodes])
    return Plan(
        providers,
        groups,
        file_changes,
        unchanged,
        not old,
        power,
        cost,
        internet_rules(cluster),
        changes(old, new) if old else None,
        probed=sorted(h for h, roles in decision.roles.items() if roles == ()),
        converge_why=decision.why,
        roles={h: None if r is None else list(r) for h, r in decision.roles.items() if r != ()},
        mode=mode,
        pulled=pulled if mode == "pull" else [],
        reach=admin_reach(cluster),
        boot=_boot(cluster),
    )


def _boot(cluster: Cluster) -> str:
    """What apply does for the nodes of the pools that boot from the network (boot.py)."""
    server = boot_server(cluster)
    if server is None:
        return ""
    names = compress([n.name for n in booted_nodes(cluster)])
    gpus = [v.name for v in cluster.pools if v.pool.boot == "network" and v.profile.gpu]
    driver = (
        f"; in that of pool(s) {compress(gpus)} the NVIDIA driver, its module built for the "
        "image's kernel"
        if gpus
        else ""
    )
    return (
        f"{names} boot from the network, served by {server.name} (DHCP for their MAC addresses, "
        "iPXE, their pool's image run from memory); apply builds the image (with the packages "
        f"its roles install{driver}), converges "
        f"{server.name} and powers each of them that does not answer SSH through its BMC (next "
        "boot from the network, then on, or a cycle where it is on), then waits for it; a "
        "running node on an older image than its pool's keeps it, and apply --batch N boots it "
        "into the new one in its drained batch"
    )


def _decide(cluster: Cluster, state: State, rendered: dict[str, str]) -> converged.Decision:
    """What a plain apply would run on each node (converged.py), and why: the pools' images
    as the last converge served them (apply knows whether it makes new ones once it made them:
    it says so)."""
    return converged.decide(
        state,
        converged.prints(rendered, state.secrets, converged.recorded_given(state)),
        [n.name for n in cluster.lasting_nodes],
        any(n.elastic for n in cluster.nodes),
    )


def plan_json(plan: Plan, cluster: Cluster) -> dict[str, Any]:
    """The plan for automation (`plan --json`): the same content as the tables."""
    doc = {
        "cluster": cluster.spec.name,
        "first_apply": plan.first_apply,
        "providers": [dataclasses.asdict(p) for p in plan.providers],
        "groups": plan.groups,
        "files": [{"path": c.path, "change": c.kind} for c in plan.changes],
        "files_unchanged": plan.unchanged,
        "converge": {
            "probed": plan.probed,
            "others_because": plan.converge_why,
            "roles": {h: r if r is not None else "all" for h, r in plan.roles.items()},
            "mode": plan.mode,
            "converge_themselves": plan.pulled,
        },
        "running_cluster": {
            **plan.running.to_json(),
            "jobs_on_nodes_removed": plan.leaving_jobs,
        }
        if plan.running
        else None,
        "open_to_internet": [
            {
                "pool": o.pool,
                "enforced_by": o.where,
                "service": o.rule.service,
                "protocol": o.rule.protocol,
                "ports": o.rule.ports,
                "sources": list(o.cidrs),
                "public_addresses": o.public,
            }
            for o in plan.exposed
        ],
        "who_reaches": [dataclasses.asdict(r) for r in plan.reach],
        "network_boot": plan.boot or None,
        "power_kw": {"total": round(plan.total_kw, 3), "lasting": round(plan.lasting_kw, 3)},
        "pools_power": [
            {"pool": p.pool, "nodes": p.nodes, "kw": round(p.kw, 3), "elastic": p.elastic}
            for p in plan.power
        ],
        "cost_usd_per_hour": [
            {
                "pool": c.pool,
                "provider": c.provider,
                "instance_type": c.instance_type,
                "nodes": c.nodes,
                "usd_per_hour": round(c.usd_per_hour, 2),
                "elastic": c.elastic,
                "spot": c.spot,
                "price_as_of": c.price_as_of,
            }
            for c in plan.cost
        ],
    }
    return doc


def ask_leaving_jobs(plan: Plan, jobs: JobsOn) -> None:
    """Fill in the jobs running now on the compute nodes that leave (where the head answers)."""
    if plan.running is None:
        return
    nodes = plan.running.nodes
    leaving = [n for n in plan.running.removed if n in nodes and nodes[n].role == "compute"]
    if not leaving:
        return
    try:
        plan.leaving_jobs = jobs(leaving)
    except (ProvisionError, OSError, subprocess.TimeoutExpired) as exc:
        plan.leaving_jobs = f"the head did not answer: {exc}"


def _diff(path: str, old: str, new: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"applied/{path}",
            tofile=f"build/{path}",
        )
    )

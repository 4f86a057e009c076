"""What `apply` would do: nodes per provider, groups, changed files, peak power and cost."""

from __future__ import annotations

import dataclasses
import difflib
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from provision import converged
from provision.changes import Changes, changes
from provision.cluster import Cluster, compress
from provision.errors import ProvisionError
from provision.providers import ProviderPlan, get_provider
from provision.render import read_render, render
from provision.render.firewall import OpenRule, Reach, admin_reach, internet_rules
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
    reach: list[Reach] = field(default_factory=list)  # who reaches SSH and the monitoring

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
        )
        for v in cluster.pools
        if v.profile.price is not None
    ]
    probed, why = _skippable(cluster, state, new)
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
        probed=probed,
        converge_why=why,
        reach=admin_reach(cluster),
    )


def _skippable(cluster: Cluster, state: State, rendered: dict[str, str]) -> tuple[list[str], str]:
    """The nodes a plain apply would probe and skip when as left (converged.py); why the
    others converge."""
    left, why = converged.skippable(
        state,
        converged.fingerprint(rendered, state.secrets),
        [n.name for n in cluster.lasting_nodes],
        any(n.elastic for n in cluster.nodes),
    )
    return sorted(left), why


def plan_json(plan: Plan, cluster: Cluster) -> dict[str, Any]:
    """The plan for automation (`plan --json`): the same content as the tables."""
    doc = {
        "cluster": cluster.spec.name,
        "first_apply": plan.first_apply,
        "providers": [dataclasses.asdict(p) for p in plan.providers],
        "groups": plan.groups,
        "files": [{"path": c.path, "change": c.kind} for c in plan.changes],
        "files_unchanged": plan.unchanged,
        "converge": {"probed": plan.probed, "others_because": plan.converge_why},
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
                "price_as_of": c.price_as_of,
            }
            for c in plan.cost
        ],
    }
    return doc


def _running(plan: Plan, cluster: Cluster, console: Console) -> None:
    """What apply would do to the running cluster (nodes joining and leaving, daemons)."""
    run = plan.running
    if run is None:
        console.print("running cluster: none yet (first apply)")
        return
    if run.added:
        console.print(f"running cluster: nodes joining: {compress(list(run.added))}")
    if run.removed:
        console.print(
            f"running cluster: nodes leaving: {compress(list(run.removed))} (apply drains "
            "them first and waits for their jobs; lab containers are removed, static hosts "
            "left alone)"
        )
        jobs = plan.leaving_jobs
        if isinstance(jobs, str):
            console.print(f"  jobs on them: unknown ({jobs})", markup=False)
        elif jobs is not None:
            console.print(f"  jobs on them now: {len(jobs) or 'none'}", markup=False)
            for line in jobs[:20]:
                console.print(f"    {line}", markup=False)
            if len(jobs) > 20:
                console.print(f"    ... and {len(jobs) - 20} more", markup=False)
    heads = compress([n.name for n in cluster.head_nodes])
    computes = [n.name for n in cluster.lasting_nodes if n.role == "compute"]
    what = {
        "none": "slurm: no change to the daemons",
        "new": "slurm: the daemons start",
        "reconfigure": "slurm: `scontrol reconfigure` (no daemon restarts, running jobs go on)",
        "restart": f"slurm: restart slurmctld on {heads} and slurmd on "
        f"{compress(computes) if computes else 'no node'} (running jobs go on)",
    }[run.slurm.action]
    if cluster.spec.scheduler == "slurm":
        console.print(f"running cluster: {what}", markup=False)
        for why in run.slurm.why:
            console.print(f"  {why}", markup=False)
    upgrade = run.kubernetes
    if upgrade is not None:
        workers = compress(list(upgrade.workers)) if upgrade.workers else ""
        console.print(
            f"running cluster: Kubernetes {upgrade.before} -> {upgrade.after}: the control "
            f"plane first, on {compress(list(upgrade.heads)) or 'no head'} one at a time "
            "(kubeadm upgrade apply on the first, upgrade node on the others, then each "
            "drained, its kubelet moved and uncordoned)"
            + (
                f"; then {workers}: each drained, upgraded and given back, a batch at a time "
                f"with apply --batch N (a plain apply leaves their kubelets at "
                f"{upgrade.before}, which the control plane still serves)"
                if workers
                else ""
            ),
            markup=False,
        )
    driver = run.driver
    if driver is not None:
        nodes = compress(list(driver.nodes))
        if driver.reboot:
            then = (
                f"rebooted (nvidia.reboot): with apply --batch N each batch is drained, "
                f"rebooted and resumed; a plain apply installs it and leaves {nodes} for that"
            )
        else:
            then = "not rebooted (nvidia.reboot false): the new module loads at their next boot"
        console.print(f"running cluster: NVIDIA driver changes on {nodes}: {then}", markup=False)
        for why in driver.why:
            console.print(f"  {why}", markup=False)
    storage = run.storage
    if storage is not None:
        if storage.servers:
            console.print(
                f"running cluster: NFS exports change on {compress(list(storage.servers))}: "
                "nfs-ganesha restarts there (mounted clients wait out its grace period, 90 s, "
                "and go on)",
                markup=False,
            )
        if storage.left_serving:
            console.print(
                f"running cluster: {compress(list(storage.left_serving))} export nothing now, "
                "but apply does not stop nfs-ganesha there: it serves its last exports until "
                "stopped by hand (systemctl disable --now nfs-ganesha)",
                markup=False,
            )
        for points, nodes in _by_points(storage.mounted):
            console.print(f"running cluster: {points} mounted on {nodes}", markup=False)
        for points, nodes in _by_points(storage.unmounted):
            console.print(
                f"running cluster: {points} left the spec and stays mounted on {nodes} (apply "
                "never unmounts: umount it and remove its /etc/fstab line when no job uses it)",
                markup=False,
            )


def _by_points(found: dict[str, tuple[str, ...]]) -> list[tuple[str, str]]:
    """node -> mount points, as (points, hostlist) lines grouping the nodes that share them."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for node, points in found.items():
        groups.setdefault(points, []).append(node)
    return [(", ".join(points), compress(nodes)) for points, nodes in sorted(groups.items())]


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


def print_plan(plan: Plan, cluster: Cluster, console: Console, diff: bool = False) -> None:
    """The plan as `provision plan` shows it: tables of nodes, groups, files, exposure, power
    and cost; with `diff`, the unified diff of every changed file."""
    nodes = Table(title="Nodes")
    for col in ("provider", "create", "existing", "on demand (elastic)"):
        nodes.add_column(col)
    for pp in plan.providers:
        nodes.add_row(
            pp.provider,
            f"{len(pp.create)} {pp.what}(s) {compress(pp.create)}" if pp.create else "-",
            f"{len(pp.existing)} {compress(pp.existing)}" if pp.existing else "-",
            f"up to {len(pp.on_demand)} {compress(pp.on_demand)}" if pp.on_demand else "-",
        )
    console.print(nodes)
    for pp in plan.providers:
        for line in pp.resources:
            console.print(f"{'lab' if pp.provider == 'lab' else 'cloud'}: {line}", markup=False)

    groups = Table(title="Ansible groups")
    groups.add_column("group")
    groups.add_column("hosts")
    for group, hosts in plan.groups.items():
        groups.add_row(group, hosts)
    console.print(groups)

    base = "the last apply" if not plan.first_apply else "nothing (first apply)"
    files = Table(title=f"Rendered files compared with {base}")
    files.add_column("file")
    files.add_column("change")
    for change in plan.changes:
        files.add_row(change.path, change.kind)
    console.print(files)
    console.print(f"{len(plan.changes)} file(s) would change, {plan.unchanged} unchanged")
    if diff:
        for change in plan.changes:
            console.print(change.diff, markup=False, end="")
    if plan.probed:
        console.print(
            f"converge: {compress(plan.probed)} probed for drift and skipped if their files and "
            "services are as the last apply left them (apply --full converges them)"
            + (f"; the others converge: {plan.converge_why}" if plan.converge_why else ""),
            markup=False,
        )
    else:
        console.print(f"converge: every node ({plan.converge_why})", markup=False)
    _running(plan, cluster, console)

    if plan.exposed:
        exposed = Table(title="Open to the internet (sources beyond private address space)")
        for col in ("pool", "enforced by", "service", "port", "sources", "public addresses"):
            exposed.add_column(col)
        for o in plan.exposed:
            exposed.add_row(
                o.pool,
                o.where,
                o.rule.service,
                f"{o.rule.protocol} {o.rule.ports}",
                ", ".join(o.cidrs),
                f"{o.public:,}",
            )
        console.print(exposed)
    else:
        console.print("open to the internet: nothing (every source is private address space)")

    reach = Table(title="Who reaches what changes the cluster or its alerts")
    for col in ("service", "on", "port", "reached from"):
        reach.add_column(col)
    for r in plan.reach:
        reach.add_row(*(Text(cell) for cell in (r.service, r.where, r.port, r.who)))
    console.print(reach)

    power = Table(title="Peak power")
    for col in ("pool", "profile", "nodes", "kW/node", "kW"):
        power.add_column(col, justify="right" if col != "pool" else "left")
    for pw in plan.power:
        power.add_row(
            pw.pool + (" (elastic, at most)" if pw.elastic else ""),
            pw.profile,
            str(pw.nodes),
            f"{pw.kw_per_node:.2f}",
            f"{pw.kw:.2f}",
        )
    power.add_row("total", "", "", "", f"{plan.total_kw:.2f}", style="bold")
    console.print(power)

    if plan.cost:
        cost = Table(title=f"Cloud cost at on-demand list prices ({HOURS_PER_MONTH} h/month)")
        for col in ("pool", "instance", "nodes", "USD/node-h", "USD/h", "USD/month", "price"):
            cost.add_column(col)
        for c in plan.cost:
            cost.add_row(
                c.pool + (" (elastic, at most)" if c.elastic else ""),
                c.instance_type,
                str(c.nodes),
                f"{c.usd_per_node_hour:,.2f}",
                f"{c.usd_per_hour:,.2f}",
                f"{c.usd_per_month:,.0f}",
                f"{c.price_region}, {c.price_as_of}",
            )
        total_h = sum(c.usd_per_hour for c in plan.cost)
        cost.add_row(
            "total",
            "",
            "",
            "",
            f"{total_h:,.2f}",
            f"{total_h * HOURS_PER_MONTH:,.0f}",
            "",
            style="bold",
        )
        console.print(cost)

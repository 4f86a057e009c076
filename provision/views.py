"""What the CLI shows: the library's data and reports drawn on a terminal (rich) or as plain
lines (logs, CI). Nothing else in the package prints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from provision.changes import Changes
from provision.cluster import Cluster, compress
from provision.plan import HOURS_PER_MONTH, Plan
from provision.run.ansible import HostResult, RunResult, failure_message
from provision.run.report import PlayEnded, PlayEvent, PlayStarted, Report
from provision.verify import CheckResult


class Reports:
    """The reporter the CLI gives the long verbs: each message a line, each run of Ansible its
    per-host progress and then its summary table."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress: HostProgress | None = None

    def __call__(self, report: Report) -> None:
        if isinstance(report, str):
            self.console.print(report, markup=False)
        elif isinstance(report, PlayStarted):
            self.console.print(
                f"ansible: playbooks/{report.playbook} on {len(report.hosts)} host(s)"
            )
            self.progress = HostProgress(self.console, report.hosts).__enter__()
        elif isinstance(report, PlayEvent):
            if self.progress is not None:
                self.progress(report.event)
        elif isinstance(report, PlayEnded):
            self.close()
            self.console.print(summary_table(report.result))

    def close(self) -> None:
        """End a progress display a failure left open (the run raised before its end)."""
        if self.progress is not None:
            self.progress.__exit__(None, None, None)
            self.progress = None


class HostProgress:
    """A live table (one row per host) on a terminal; plain lines otherwise (logs, CI)."""

    def __init__(self, console: Console, hosts: list[str]) -> None:
        self.console = console
        self.rows: dict[str, dict[str, Any]] = {
            h: {"done": 0, "changed": 0, "state": "waiting", "task": ""} for h in hosts
        }
        self.task = ""
        self.live: Live | None = None

    def __enter__(self) -> HostProgress:
        if self.console.is_terminal:
            self.live = Live(self._table(), console=self.console, refresh_per_second=4)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self._table())
            self.live.__exit__(None, None, None)

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        if kind == "playbook_on_task_start":
            task = data.get("task", "")
            if self.live is None and task != self.task:
                self.console.print(f"  task: {task}", highlight=False)
            self.task = task
            return
        host = data.get("host")
        if not host or not kind.startswith("runner_on_") or kind == "runner_on_start":
            return
        row = self.rows.setdefault(host, {"done": 0, "changed": 0, "state": "", "task": ""})
        row["done"] += 1
        row["task"] = data.get("task", "")
        outcome = kind.removeprefix("runner_on_")
        if outcome == "ok" and (data.get("res") or {}).get("changed"):
            row["changed"] += 1
            outcome = "changed"
        if outcome in ("failed", "unreachable") and not data.get("ignore_errors"):
            row["state"] = outcome
            if self.live is None:
                self.console.print(
                    f"    {host}: {outcome.upper()} {failure_message(data)}", highlight=False
                )
        elif row["state"] not in ("failed", "unreachable"):
            row["state"] = "running"
            if self.live is None and outcome == "changed":
                self.console.print(f"    {host}: changed", highlight=False)
        if self.live is not None:
            self.live.update(self._table())

    def _table(self) -> Table:
        table = Table(title=f"task: {self.task}" if self.task else None, expand=False)
        for col in ("host", "tasks", "changed", "state", "last task"):
            table.add_column(col)
        for host, row in sorted(self.rows.items()):
            style = {"failed": "red", "unreachable": "red"}.get(row["state"], "")
            table.add_row(
                host,
                str(row["done"]),
                str(row["changed"]),
                row["state"],
                row["task"][:50],
                style=style,
            )
        return table


def summary_table(result: RunResult) -> Table:
    table = Table(title=f"Ansible: {result.status} in {result.seconds:.1f}s")
    for col in ("host", "ok", "changed", "failed", "unreachable", "skipped", "result"):
        table.add_column(col)
    for host, r in sorted(result.hosts.items()):
        table.add_row(
            host,
            str(r.ok),
            str(r.changed),
            str(r.failed),
            str(r.unreachable),
            str(r.skipped),
            _result(r),
            style="red" if r.status != "ok" else "",
        )
    return table


def _result(r: HostResult) -> str:
    return r.failure[:80] if r.status != "ok" else "ok"


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
            console.print(f"{pp.resources_label}: {line}", markup=False)

    groups = Table(title="Ansible groups")
    groups.add_column("group")
    groups.add_column("hosts")
    for group, hosts in plan.groups.items():
        groups.add_row(group, hosts)
    console.print(groups)
    if plan.boot:
        console.print(f"boot: {plan.boot}", markup=False)

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
    elif any(roles is not None for roles in plan.roles.values()):
        console.print(f"converge: {plan.converge_why}", markup=False)
    else:
        console.print(f"converge: every node ({plan.converge_why})", markup=False)
    if plan.pulled:
        console.print(
            f"converge mode: pull: {compress(plan.pulled)} run the roles themselves, the others "
            "first by push",
            markup=False,
        )
    else:
        console.print("converge mode: push: this machine runs every node's tasks", markup=False)
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
                c.pool
                + (" (elastic, at most)" if c.elastic and not c.spot else "")
                + (" (elastic, spot: the market's price, at most)" if c.spot else ""),
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
    _users(run, console)
    _accounts(run, console)


def _users(run: Changes, console: Console) -> None:
    users = run.users
    if users is None:
        return
    if users.added:
        console.print(f"running cluster: users added: {', '.join(users.added)}", markup=False)
    if users.locked:
        console.print(
            f"running cluster: users locked out: {', '.join(users.locked)} (gone from the "
            "spec: account expired and no shell on every node, keys removed; homes and files "
            "kept, their uids not reused)",
            markup=False,
        )
    for line in users.changed:
        console.print(f"running cluster: user {line}", markup=False)


def _accounts(run: Changes, console: Console) -> None:
    accounts = run.accounts
    if accounts is None:
        return
    say = "running cluster: slurmdbd: "
    if accounts.added:
        console.print(say + f"added {', '.join(accounts.added)}", markup=False)
    if accounts.removed:
        console.print(
            say + f"removed {', '.join(accounts.removed)} (their users' associations go "
            "with them; slurmdbd refuses while a job runs or waits under one: apply stops "
            "there, saying which, and finishes once they end)",
            markup=False,
        )
    for line in accounts.changed:
        console.print(say + line, markup=False)


def _by_points(found: dict[str, tuple[str, ...]]) -> list[tuple[str, str]]:
    """node -> mount points, as (points, hostlist) lines grouping the nodes that share them."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for node, points in found.items():
        groups.setdefault(points, []).append(node)
    return [(", ".join(points), compress(nodes)) for points, nodes in sorted(groups.items())]


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

"""The lifecycle verbs as library calls: the CLI only parses arguments and prints."""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from provision import boot, converged, drain
from provision.changes import (
    INVENTORY,
    ROLE_GROUPS,
    SLURM_ACTION,
    InventoryNode,
    inventory_nodes,
    kubernetes_upgrade,
    refuse_unsupported_changes,
    slurm_change,
)
from provision.cluster import Cluster, compress, pick_nodes
from provision.errors import OperationError, UsageError
from provision.head import Handle, open_cluster
from provision.pki import cluster_certificates, tunnel_keys
from provision.preflight import DRIFT, preflight
from provision.providers import get_provider
from provision.providers.base import ImageBuilds
from provision.providers.cloud import refuse_api_address, refuse_recarve
from provision.render import read_render, render, write_render
from provision.render.netboot import boot_server
from provision.render.tunnel import members
from provision.rolling import batch_size, roll
from provision.run import pull
from provision.run.ansible import HostResult, RunResult, playbook_tags, run_playbook
from provision.run.report import PlayEnded, PlayEvent, PlayStarted, Reporter, quiet
from provision.run.wheel import build_wheel
from provision.secrets import directory_secrets, ensure_cluster_secrets, monitoring_secrets
from provision.spec import Spec
from provision.spec.checks.identity import ca_file_problem
from provision.spec.models import PROVIDER_ORDER
from provision.spec.nodes import login_user
from provision.sshkeys import private_key
from provision.state import State, command_line
from provision.verify import CheckResult, verify_cluster
from provision.verify.remote import Remote

REPORT = "last-apply.json"


@dataclass
class ApplyReport:
    phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    run: RunResult | None = None
    checks: list[CheckResult] = field(default_factory=list)

    def to_json(self) -> str:
        hosts = {}
        if self.run is not None:
            hosts = {h: asdict(r) for h, r in sorted(self.run.hosts.items())}
        return (
            json.dumps(
                {
                    "phases": {k: round(v, 2) for k, v in self.phases.items()},
                    "status": self.run.status if self.run else "not run",
                    "ansible_cpu_seconds": round(self.run.cpu_seconds, 2) if self.run else 0.0,
                    # pull mode: the nodes' own, where they have a cgroup v2 to read it from
                    "node_cpu_seconds": round(self.run.node_cpu_seconds, 2) if self.run else 0.0,
                    "log_dir": str(self.run.log_dir.resolve())
                    if self.run and self.run.log_dir
                    else "",
                    "hosts": hosts,
                    "checks": {
                        "passed": sum(c.passed for c in self.checks),
                        "failed": sum(not c.passed for c in self.checks),
                    },
                },
                indent=1,
                sort_keys=True,
            )
            + "\n"
        )


class _Phase:
    def __init__(self, report: ApplyReport, name: str) -> None:
        self.report, self.name = report, name

    def __enter__(self) -> None:
        self.started = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        took = time.monotonic() - self.started  # a phase run twice counts both
        self.report.phases[self.name] = self.report.phases.get(self.name, 0.0) + took


def _providers_in(cluster: Cluster) -> list[str]:
    kinds = {n.provider for n in cluster.nodes}
    return [k for k in PROVIDER_ORDER if k in kinds]


def create_nodes(cluster: Cluster, state: State, say: Reporter = quiet) -> Cluster:
    """Ask each provider to make its nodes exist; return the cluster with their addresses."""
    addresses: dict[str, ipaddress.IPv4Address] = {}
    logins: dict[str, ipaddress.IPv4Address] = {}
    providers = [get_provider(kind, cluster.spec, log=say) for kind in _providers_in(cluster)]
    for provider in providers:  # every one ready before any node of any provider is made
        try:
            provider.prepare(cluster)
        except OperationError as exc:
            raise OperationError(f"{exc}; nothing was created") from None
    for provider in providers:
        nodes = provider.chosen(cluster)
        if not nodes:
            continue
        say(f"nodes: {provider.kind}: {len(nodes)} node(s)")
        addresses.update(provider.create(nodes, state))
        logins.update(provider.login_addresses(state))
    return Cluster(cluster.spec, addresses, logins) if addresses else cluster


@dataclass(frozen=True)
class Scope:
    """Which part of the cluster an apply changes, and how (all of it, at once, by default)."""

    limit: str | None = None  # a hostlist or pool name: Ansible runs on these nodes only
    tags: str | None = None  # Ansible's tags: only these roles' tasks
    batch: str | None = None  # roll through the compute nodes: a count or a percentage
    full: bool = False  # converge every node, even those nothing changed for (converged.py)
    mode: str | None = None  # push or pull, over the spec's converge.mode (run/pull.py)

    @property
    def partial(self) -> bool:
        """Part of the cluster or of the roles: not a render every node has."""
        return self.limit is not None or self.tags is not None


@dataclass(frozen=True)
class Leaving:
    """Nodes of the last apply that the spec no longer has: drained before they go."""

    timeout: float = 24 * 3600  # seconds to wait for their jobs
    force: bool = False  # requeue their jobs instead of waiting; go on if the head is gone


def apply(
    spec_path: Path,
    state_root: Path,
    say: Reporter = quiet,
    verify: bool = True,
    leaving: Leaving = Leaving(),
    scope: Scope = Scope(),
) -> ApplyReport:
    """Apply the spec, phase by phase: the leaving nodes drained, the nodes made and the files
    rendered, preflight, the converge (or a rolling change), verify. Every phase reports
    through `say`; the report of what ran is also left in the state as last-apply.json."""
    spec, cluster, state = open_cluster(spec_path, state_root)
    hosts = [n.name for n in cluster.lasting_nodes]
    if scope.limit is not None:
        hosts = pick_nodes(cluster, scope.limit, spec_path, ROLE_GROUPS)
    if scope.batch is not None:  # a bad --batch or --tags is refused before anything happens
        batch_size(scope.batch, 1)
    if scope.tags is not None:
        known = playbook_tags("site.yml")
        unknown = [t for t in scope.tags.split(",") if t.strip() not in known]
        if unknown or not scope.tags.strip():
            raise UsageError(
                f"--tags {scope.tags!r}: {', '.join(map(repr, unknown)) or 'empty'} is no tag of "
                f"the roles (they are: {', '.join(known)})"
            )
    if scope.mode == "pull" and (why := pull.refusal(spec)) is not None:
        raise UsageError(f"--mode pull: {why}")
    head = Handle(spec_path, spec, cluster, state)  # the scheduler's commands run there
    with state.locked(command_line()):
        report = ApplyReport()
        try:
            # the render of the last successful apply: what leaves, what the daemons must do
            applied = read_render(state.applied)
            refuse_unsupported_changes(spec_path, applied, cluster)
            refuse_api_address(spec_path, cluster)
            refuse_recarve(spec_path, state, cluster)
            run = _Run(head, say, report, leaving, scope, hosts)
            gone = _drain_leaving(run, applied)
            _apply(cluster, applied, run, verify)
            _release(cluster, state, gone, say)
            return report
        finally:
            (state.dir / REPORT).write_text(report.to_json())


@dataclass
class _Run:
    """One apply's choices, the cluster it reaches and where it reports."""

    head: Handle
    say: Reporter
    report: ApplyReport
    leaving: Leaving
    scope: Scope
    hosts: list[str]  # the lasting nodes Ansible runs on

    @property
    def state(self) -> State:
        return self.head.state


def _drain_leaving(run: _Run, applied: dict[str, str]) -> dict[str, InventoryNode]:
    """Drain the compute nodes of the last apply that the spec no longer has, before anything
    changes (a cloud stack would destroy them): jobs end, or with force are requeued. The
    nodes that leave."""
    cluster, leaving, say = run.head.cluster, run.leaving, run.say
    keep = {n.name for n in cluster.nodes}
    gone = {
        name: node
        for name, node in inventory_nodes(applied.get(INVENTORY, "")).items()
        if name not in keep
    }
    kubernetes = cluster.spec.scheduler == "kubernetes"
    # Kubernetes runs pods on login nodes too: every worker is drained
    workers = ("compute", "login") if kubernetes else ("compute",)
    computes = sorted(name for name, node in gone.items() if node.role in workers)
    if not computes:
        return gone
    # the verb layer's drain reaches the head as `provision drain` does
    say(f"drain: {compress(computes)} leave the spec: drained before they go")
    with _Phase(run.report, "drain"):
        try:
            if kubernetes:
                drain.drain_kubernetes_nodes(
                    run.head, computes, leaving.timeout, say, force=leaving.force
                )
            else:
                drain.drain_nodes(
                    run.head,
                    computes,
                    "provision apply: leaving the cluster",
                    True,
                    leaving.timeout,
                    say,
                    requeue=leaving.force,
                )
        except OperationError as exc:
            if not leaving.force:
                what = (
                    "let their pods move (a disruption budget may hold them), or run apply "
                    "--force to delete them"
                    if kubernetes
                    else "let their jobs end, or run apply --force to requeue them"
                )
                raise OperationError(f"{exc}; nothing else was changed: {what}") from None
            say(f"drain: {exc}; --force: they go anyway")
    return gone


def _release(cluster: Cluster, state: State, gone: dict[str, InventoryNode], say: Reporter) -> None:
    """What becomes of the nodes that left, as each one's provider says (its own containers
    removed, a cloud's stack has destroyed its instances, static hosts are the site's)."""
    for kind in sorted({node.provider for node in gone.values()}):
        names = sorted(name for name, node in gone.items() if node.provider == kind)
        say(get_provider(kind, cluster.spec).release(names, state))


def _monitoring_secrets(directory: Path, spec: Spec) -> None:
    monitoring = spec.monitoring
    if monitoring is None:
        return
    relays = [
        (r.name, r.email.password_file, f"monitoring.receivers[{i}].email.password_file")
        for i, r in enumerate(monitoring.receivers)
        if r.email is not None and r.email.password_file is not None
    ]
    monitoring_secrets(directory, monitoring.grafana is not None, relays)


def _directory_secrets(directory: Path, spec: Spec) -> None:
    identity = spec.identity
    if identity is None:
        directory_secrets(directory, None, None)
        return
    ca = Path(identity.ca_file)  # absolute: the spec resolved it (spec/paths.py)
    problem = ca_file_problem(ca)  # it may have changed since the spec was read
    if problem:
        raise UsageError(f"identity.ca_file: {problem}")
    directory_secrets(directory, identity.bind_password_file, ca.read_bytes())


@dataclass(frozen=True)
class _Made:
    """What the nodes phase leaves: the nodes with their addresses, the render, the secrets."""

    cluster: Cluster
    files: dict[str, str]
    secrets_dir: Path


def _apply(cluster: Cluster, applied: dict[str, str], run: _Run, verify: bool) -> None:
    state, scope = run.state, run.scope
    made = _nodes_phase(cluster, run)
    key = private_key(cluster.spec, state)
    # the nodes the last converge left, when nothing Ansible gives them changed since:
    # preflight probes them, and Ansible runs only where something drifted
    known = inventory_nodes(applied.get(INVENTORY, ""))
    rolling = scope.batch is not None and bool(known)
    # what the roles are given, the pools' images with it (made here): a new image is the boot
    # server's to serve, whatever else changed
    extra_vars, new_nodes, action = _converge_vars(made, applied, known, rolling, run)
    server = boot_server(made.cluster)
    given = converged.given_digests(extra_vars, server.pool if server is not None else None)
    stamp = converged.prints(made.files, made.secrets_dir, given)
    decision = converged.Decision({}, dict.fromkeys(run.hosts), "")
    if not (scope.partial or rolling or scope.full):
        elastic = any(n.elastic for n in made.cluster.nodes)
        decision = converged.decide(state, stamp, run.hosts, elastic)
    booted = _boot_phase(made, key, run, extra_vars)
    # each a new machine, idle: added to the very list extra_vars hands the roles as
    # provision_new_nodes and provision_drained
    new_nodes += [h for h in booted if h not in new_nodes]
    drift = _preflight_phase(made.cluster, key, decision.left, run)
    older = _older_images(made, run, extra_vars, booted, rolling)
    for c in drift.values():
        if not c.passed:
            run.say(f"drift: {c.target}: {c.evidence}")
    # a node that drifted runs every role, and one booted now; one as left runs the roles whose
    # inputs changed
    roles: dict[str, tuple[str, ...] | None] = {
        h: decision.roles[h] if h in drift and drift[h].passed and h not in booted else None
        for h in run.hosts
    }
    as_left = [h for h in run.hosts if roles[h] == ()]
    if as_left:
        run.say(
            f"converge: {compress(as_left)} as the last apply left them (nothing Ansible gives "
            "them changed; their files and services as left): skipped; --full converges them"
            + (f"; the others converge: {decision.why}" if decision.why else "")
        )
    elif decision.why and any(roles.values()):
        run.say(f"converge: {decision.why}")
    if rolling:
        converged.forget(state)
        _roll(made.cluster, key, run, extra_vars, new_nodes, action, older)
    elif len(as_left) < len(run.hosts):
        everything = not as_left and all(r is None for r in roles.values())
        runs = _runs(made.cluster, roles, everything)
        _converge_and_record(made.cluster, key, run, extra_vars, runs, stamp)
    if scope.partial:
        run.say(
            "apply: a partial apply (--limit/--tags) is not recorded as the last apply: plan "
            "still compares with the one before, and a full apply finishes the job"
        )
    else:
        state.record_applied()
    if verify and (scope.partial or rolling):
        run.say(
            "verify: skipped after a partial or rolling apply (it needs every compute node "
            "idle): run provision verify when the cluster is"
        )
    elif verify:
        _verify_phase(made.cluster, key, run)
        # the nodes some or all roles skipped
        skipped = [h for h in run.hosts if roles.get(h) is not None]
        if skipped and any(not c.passed for c in run.report.checks):
            # a skip is trusted only as far as verify agrees: what the probe cannot see
            run.say(
                f"verify: checks failed with roles skipped on {compress(skipped)}: every role "
                "runs there too"
            )
            _converge_and_record(made.cluster, key, run, extra_vars, [(skipped, None)], stamp)
            _verify_phase(made.cluster, key, run)


def _nodes_phase(cluster: Cluster, run: _Run) -> _Made:
    """The cluster's secrets, its nodes made where the spec says, and every file rendered."""
    state, spec, say = run.state, cluster.spec, run.say
    with _Phase(run.report, "nodes"):
        # secrets first: a relay password file others can read stops the run before any node
        secrets_dir = ensure_cluster_secrets(state, spec.scheduler)
        _monitoring_secrets(secrets_dir, spec)
        _directory_secrets(secrets_dir, spec)
        # the hub's and the burst nodes' keys before the nodes: a cloud's stack puts a remote
        # elastic pool's keys in its secret store (providers/cloud/joining.py)
        made = tunnel_keys(secrets_dir, members(cluster))
        cluster = create_nodes(cluster, state, say)
        cluster_certificates(secrets_dir, cluster)  # they name the nodes' addresses
        made += tunnel_keys(secrets_dir, members(cluster))
        if made:
            say(f"tunnel: WireGuard keys made for {compress(made)}")
        files = render(cluster)
        changed = write_render(files, state.build)
    say(f"render: {state.build} ({len(changed)} file(s) changed)")
    return _Made(cluster, files, secrets_dir)


def _boot_phase(
    made: _Made, key: Path | None, run: _Run, extra_vars: dict[str, object]
) -> list[str]:
    """The nodes of the pools that boot from the network that do not answer SSH: the boot
    server converged, each powered on from the network and waited for (boot.py). Their
    names; OperationError naming those that did not come up."""
    cluster = made.cluster
    server = boot_server(cluster)
    nodes = boot.silent(cluster, run.hosts) if server is not None else []
    if server is None or not nodes:
        return []

    def serve() -> None:  # the boot server, checked as preflight checks any node, converged
        _preflight_phase(cluster, key, {}, run, only=[server.name])
        _play(key, run, [server.name], extra_vars)

    with _Phase(run.report, "boot"):
        boot.boot(cluster, run.state, nodes, _reach(run), run.say, serve)
    return [n.name for n in nodes]


def _ssh(run: _Run) -> Callable[[str, list[str]], list[str]]:
    """The ssh command line that runs a command on a node, asking nothing and giving up soon
    (a new node's host key learned)."""

    def argv(name: str, command: list[str]) -> list[str]:
        line = run.head.argv(name, command)
        line[1:1] = ["-oBatchMode=yes", "-oConnectTimeout=5"]
        return line

    return argv


def _reach(run: _Run) -> Callable[[str], list[str]]:
    """The ssh command line that runs `true` on a node: whether it answers (boot.py)."""
    ssh = _ssh(run)
    return lambda name: ssh(name, ["true"])


def _older_images(
    made: _Made, run: _Run, extra_vars: dict[str, object], booted: list[str], rolling: bool
) -> list[str]:
    """The nodes that boot from the network and run an older image than their pool's (not
    those booted now), said; a rolling apply boots them into it (_roll), a plain one leaves
    them running."""
    images = extra_vars.get("netboot_images")
    if not isinstance(images, dict) or not images:
        return []
    hosts = [h for h in run.hosts if h not in booted]
    older = boot.older(made.cluster, hosts, images, _ssh(run))
    if older and not rolling:
        run.say(
            f"boot: {compress(list(older))}: an older image than the pool's runs there until "
            "the node boots again; provision apply --batch N boots drained batches into the "
            "new one"
        )
    return list(older)


def _preflight_phase(
    cluster: Cluster,
    key: Path | None,
    left: dict[str, converged.Left],
    run: _Run,
    only: list[str] | None = None,
) -> dict[str, CheckResult]:
    """Every node (or `only` these) reachable and fit before any is changed (OperationError
    naming the ones that are not); the nodes probed for drift, by name."""
    with _Phase(run.report, "preflight"):
        probes = {h: v.probe() for h, v in left.items()}
        checks = preflight(cluster, run.state, key, probes, only)
    drift = {c.target: c for c in checks if c.check == DRIFT}
    checks = [c for c in checks if c.check != DRIFT]
    bad = [c for c in checks if not c.passed]
    for c in bad:
        run.say(f"preflight FAIL {c.check} {c.target}: {c.evidence}")
    if bad:
        names = ", ".join(sorted({c.target for c in bad}))
        raise OperationError(f"preflight failed on: {names}; nothing was changed on any node")
    run.say(f"preflight: {len(checks)} checks passed")
    return drift


def _converge_vars(
    made: _Made,
    applied: dict[str, str],
    known: dict[str, InventoryNode],
    rolling: bool,
    run: _Run,
) -> tuple[dict[str, object], list[str], str]:
    """What the roles are told of this change (the daemons' action, the nodes no job runs on,
    the wheel), said as it is decided; with the new nodes and Slurm's action."""
    cluster, say = made.cluster, run.say
    extra_vars: dict[str, object] = {"provision_secrets_dir": str(made.secrets_dir.resolve())}
    slurm = slurm_change(applied, made.files)
    # the daemons do what the change since the last apply needs: the files on the nodes may
    # be newer than that apply (one that failed), never older
    extra_vars["slurm_config_change"] = SLURM_ACTION[slurm.action]
    if slurm.action in ("reconfigure", "restart"):
        say(f"slurm: {slurm.action}: {'; '.join(slurm.why)}")
    upgrade = kubernetes_upgrade(applied, made.files)
    if upgrade is not None:
        waiting = [w for w in upgrade.workers if w in run.hosts]
        say(
            f"kubernetes: {upgrade.before} -> {upgrade.after}: the control plane first, one "
            "head at a time"
            + (
                "; then the workers, a drained batch at a time"
                if rolling
                else f"; the kubelets of {compress(waiting)} stay at {upgrade.before} until "
                "apply --batch N drains and upgrades them (verify names them until then)"
                if waiting
                else ""
            )
        )
    # nodes no job can be running on, which a role may reboot (the NVIDIA driver's): new ones
    # here; in a rolling change, each batch once drained
    new_nodes = [h for h in run.hosts if h not in known]
    extra_vars["provision_drained"] = new_nodes
    # and their first converge: the later roles' packages in one transaction (site.yml)
    extra_vars["provision_new_nodes"] = new_nodes
    images: dict[str, str] = {}
    if boot_server(cluster) is not None:
        with _Phase(run.report, "images"):  # the boot server's, every converge
            images = boot.images(cluster, run.state, say)
    if images:
        extra_vars["netboot_images"] = images
    wanted = (cluster.spec.health, cluster.spec.monitoring)  # the nodes' programs run from it
    if any(n.elastic for n in cluster.nodes) or any(w is not None for w in wanted):
        extra_vars["provision_wheel"] = str(build_wheel(run.state.dir / "wheel").resolve())
    if run.scope.batch is not None and not known:
        say("rolling: first apply, no job runs yet: all nodes at once")
    return extra_vars, new_nodes, slurm.action


def _verify_phase(cluster: Cluster, key: Path | None, run: _Run) -> None:
    with _Phase(run.report, "verify"):
        run.report.checks = verify_cluster(cluster, run.state, key)


# the order a change reaches nodes in when it runs in several parts: the servers first (the
# controller before the slurmds, the NFS servers before their mounts)
_ORDER = ("head", "storage", "login", "compute")


def _runs(
    cluster: Cluster, roles: dict[str, tuple[str, ...] | None], everything: bool
) -> list[tuple[list[str] | None, tuple[str, ...] | None]]:
    """The converge's runs: (these nodes (None: all), these roles (None: all)) for each set
    of roles some nodes need, the servers' first."""
    if everything:
        return [(None, None)]
    kind = {n.name: n.role for n in cluster.lasting_nodes}
    groups: dict[tuple[str, ...] | None, list[str]] = {}
    for host, wanted in roles.items():
        if wanted != ():
            groups.setdefault(wanted, []).append(host)

    def first(item: tuple[tuple[str, ...] | None, list[str]]) -> tuple[int, int]:
        wanted, hosts = item
        rank = min(_ORDER.index(kind[h]) if kind.get(h) in _ORDER else len(_ORDER) for h in hosts)
        return rank, 0 if wanted is None else 1

    return [(hosts, wanted) for wanted, hosts in sorted(groups.items(), key=first)]


def _converge_and_record(
    cluster: Cluster,
    key: Path | None,
    run: _Run,
    extra_vars: dict[str, object],
    runs: list[tuple[list[str] | None, tuple[str, ...] | None]],
    stamp: converged.Prints,
) -> None:
    """Converge, run by run (these nodes, or all; these roles, or all), then record what each
    node was left with: the nodes not converged keep the record's entries while nothing they
    are given changed, those that ran some roles keep what the others left; none counts as
    converged meanwhile."""
    state = run.state
    before = converged.load(state)
    converged.forget(state)
    logs = []
    for hosts, roles in runs:
        if roles is not None:
            run.say(f"converge: {compress(hosts or [])}: roles {', '.join(roles)}")
        logs += _converge(cluster, key, run, extra_vars, hosts, roles)
    if run.scope.partial or run.report.run is None:
        return
    events = [event for log_dir in dict.fromkeys(logs) for event in converged.read_events(log_dir)]
    now = converged.from_events(events)
    some = [h for hosts, roles in runs if roles is not None for h in hosts or []]
    converged.save(state, converged.after(before, stamp, now, some))


def _play(
    key: Path | None,
    run: _Run,
    limit: list[str] | None,
    extra_vars: dict[str, object],
    builds: list[ImageBuilds] | None = None,
    tags: str | None = None,
) -> RunResult:
    """One run of playbooks/site.yml, its progress and summary reported; OperationError if it
    failed. limit: these hosts only (None: all); tags: these roles only (None: the apply's)."""
    hosts = limit if limit is not None else run.hosts
    builders = [host for made in builds or [] for host in made.hosts]
    run.say(PlayStarted("site.yml", [*hosts, *builders]))
    result = run_playbook(
        "site.yml",
        run.state,
        key,
        on_event=lambda event: run.say(PlayEvent(event)),
        limit=",".join(limit) if limit is not None else None,
        tags=tags or run.scope.tags,
        extra_vars=extra_vars,
        extra_inventory=[made.inventory for made in builds or []] or None,
    )
    return _ran(run, result)


def _ran(run: _Run, result: RunResult) -> RunResult:
    """A run reported and added to the apply's; OperationError if it failed."""
    run.say(PlayEnded(result))
    run.report.run = result if run.report.run is None else _merged(run.report.run, result)
    if result.rc != 0:
        failed = ", ".join(result.failed_hosts) or "see the log"
        # what stopped the first of them, which on a cluster is usually what stopped them all
        why = next((result.hosts[h].failure for h in result.failed_hosts), "")
        raise OperationError(
            f"apply failed on: {failed}{f' ({why})' if why else ''} (log: {result.log_dir}); "
            "fix the cause and run apply again, it continues where it stopped"
        )
    return result


def _merged(a: RunResult, b: RunResult) -> RunResult:
    """Two runs as one: each host's counts added up, the worse outcome."""
    hosts = dict(a.hosts)
    for host, r in b.hosts.items():
        if host in hosts:
            o = hosts[host]
            r = HostResult(
                o.ok + r.ok,
                o.changed + r.changed,
                o.failed + r.failed,
                o.unreachable + r.unreachable,
                o.skipped + r.skipped,
                r.failure or o.failure,
            )
        hosts[host] = r
    worst = b if b.rc != 0 else a
    return RunResult(
        worst.rc,
        worst.status,
        hosts,
        a.seconds + b.seconds,
        b.log_dir,
        a.cpu_seconds + b.cpu_seconds,
        a.node_cpu_seconds + b.node_cpu_seconds,
    )


def _converge(
    cluster: Cluster,
    key: Path | None,
    run: _Run,
    extra_vars: dict[str, object],
    only: list[str] | None = None,
    roles: tuple[str, ...] | None = None,
) -> list[Path]:
    """All the chosen nodes at once (and the elastic pools' images, in a full apply); only:
    these of them (the others are as the last converge left them); roles: these roles alone
    (their tags), where nothing else changed. The runs' log folders."""
    state = run.state
    tags = ",".join(roles) if roles is not None else None
    builds = [] if run.scope.partial or tags else _start_image_builds(cluster, state, run.say)
    limit = run.hosts if run.scope.limit is not None else only
    hosts = limit if limit is not None else run.hosts
    selves = []
    if pull.converge_mode(cluster.spec, run.scope.mode) == "pull":
        selves = pull.pulled(cluster.nodes, hosts)
    ok = False
    logs: list[Path | None] = []
    try:
        with _Phase(run.report, "ansible"):
            if not selves:
                logs.append(_play(key, run, limit, extra_vars, builds, tags).log_dir)
            else:
                pushed = [h for h in hosts if h not in selves]
                run.say(
                    f"converge: pull: {compress(selves)} converge themselves"
                    + (f", after {compress(pushed)} by push" if pushed else "")
                )
                log_dir = None
                if pushed or builds:
                    builders = [h for made in builds for h in made.hosts]
                    log_dir = _play(key, run, pushed + builders, extra_vars, builds, tags).log_dir
                logs.append(_pull(cluster, key, run, selves, extra_vars, log_dir, tags).log_dir)
        ok = True
    finally:
        _finish_builds(run, builds, ok)
    return [log for log in logs if log is not None]


def _pull(
    cluster: Cluster,
    key: Path | None,
    run: _Run,
    hosts: list[str],
    extra_vars: dict[str, object],
    log_dir: Path | None,
    tags: str | None = None,
) -> RunResult:
    """These nodes converge themselves (run/pull.py); their events join the push run's log
    folder where there was one. OperationError if any failed."""
    spec, state = cluster.spec, run.state
    if log_dir is None:
        log_dir = state.logs / (time.strftime("%Y%m%d-%H%M%S") + "-site-pull")
    nodes = [
        pull.Node(n.name, str(n.login_address), login_user(spec, n.provider))
        for n in cluster.nodes
        if n.name in hosts
    ]

    def connect(node: pull.Node) -> Remote:
        remote = Remote(node.name, node.address, node.user, spec.ssh.port, key, state.known_hosts)
        remote.connect()
        return remote

    run.say(PlayStarted("site.yml (pull)", hosts))
    result = pull.pull(
        nodes,
        state,
        connect,
        Path(str(extra_vars["provision_secrets_dir"])),
        extra_vars,
        log_dir,
        on_event=lambda event: run.say(PlayEvent(event)),
        tags=tags or run.scope.tags,
    )
    return _ran(run, result)


def _finish_builds(run: _Run, builds: list[ImageBuilds], ok: bool) -> None:
    """Each image sealed and kept when the run went well; the builders removed either way."""
    if not builds:
        return
    with _Phase(run.report, "images"):
        for made in builds:
            made.finish(run.state, ok)
    if ok:
        images = [image for made in builds for image in made.images]
        run.say(f"images: {', '.join(images)} made")


def _roll(
    cluster: Cluster,
    key: Path | None,
    run: _Run,
    extra_vars: dict[str, object],
    new_nodes: list[str],
    action: str,
    older: list[str],
) -> None:
    """A rolling change: first the nodes no job runs on (heads, logins: the controller goes
    before the slurmds, as a Slurm upgrade needs; nodes new to the cluster), then the compute
    nodes the cluster already had, a batch at a time (provision/rolling.py). Under Kubernetes
    the heads go first (the control plane before any kubelet, as kubeadm's upgrade needs), then
    the workers, compute and login, in drained batches. A node of a batch that runs an older
    image than its pool's (`older`) is booted into the new one once drained, then converged as
    a new machine; one outside the batches (no drain protects its users) is left running it."""
    roles = {n.name: n.role for n in cluster.lasting_nodes}
    kubernetes = cluster.spec.scheduler == "kubernetes"
    # Kubernetes runs pods on the login nodes too (the workers' play)
    batched = ("compute", "login") if kubernetes else ("compute",)
    rolled = [h for h in run.hosts if roles[h] in batched and h not in new_nodes]
    first = [h for h in run.hosts if h not in rolled]
    size = batch_size(run.scope.batch or "1", len(rolled))
    # a reconfigure is made once every node has the new files, not before the batches
    reconfigure = action == "reconfigure" and not kubernetes
    if reconfigure:
        extra_vars = {**extra_vars, "slurm_config_change": "none"}

    say = run.say
    if left := [h for h in older if h not in rolled]:
        say(
            f"boot: {compress(left)}: an older image than the pool's runs there, and no batch "
            "drains it: left so (power the node off and apply to boot it into the new one)"
        )
    nodes = {n.name: n for n in cluster.nodes}

    def change(batch: list[str]) -> None:
        due = [h for h in batch if h in older]
        if due:  # a machine from its image: every role, as a new one
            say(f"boot: {compress(due)}: drained, booted into the pool's new image")
            again = [nodes[h] for h in due]
            boot.power_up(cluster, run.state, again, _reach(run), say, then="", running=True)
        drained = {"provision_drained": batch, "provision_new_nodes": [*new_nodes, *due]}
        _play(key, run, batch, {**extra_vars, **drained})

    with _Phase(run.report, "ansible"):
        if first:
            _play(key, run, first, extra_vars)
        if rolled:
            say(f"rolling: {compress(rolled)} in batches of {size}")
            steps: drain.SlurmBatchSteps | drain.KubernetesBatchSteps
            if kubernetes:
                steps = drain.KubernetesBatchSteps(
                    run.head,
                    change,
                    say,
                    cluster.spec.kubernetes.version,
                    drain_timeout=run.leaving.timeout,
                    force=run.leaving.force,
                )
            else:
                steps = drain.SlurmBatchSteps(
                    run.head,
                    change,
                    say,
                    drain_timeout=run.leaving.timeout,
                    requeue=run.leaving.force,
                )
            roll(rolled, size, steps, say)
    if reconfigure:
        run.head.on_head(f"{drain.scontrol(run.head)} reconfigure")
        say("slurm: scontrol reconfigure (every node has the new files)")


def _start_image_builds(
    cluster: Cluster, state: State, say: Reporter, pools: list[str] | None = None
) -> list[ImageBuilds]:
    """The images the elastic pools start from that are missing or stale (or those of
    `pools`), each provider's. A provider that fails to start its builders has removed them;
    the builders the others started are removed too."""
    started: list[ImageBuilds] = []
    try:
        for kind in _providers_in(cluster):
            provider = get_provider(kind, cluster.spec, log=say)
            builds = provider.image_builds(cluster, state, pools)
            if builds is not None:
                say(f"images: making {', '.join(builds.images)} (the compute roles applied)")
                started.append(builds)
    except BaseException:
        for made in started:
            made.finish(state, False)
        raise
    return started


def build_images(
    spec_path: Path,
    state_root: Path,
    pools: list[str] | None = None,
    say: Reporter = quiet,
) -> list[str]:
    """`provision image build`: the elastic pools' images that are missing or stale (or those
    of `pools`, whatever theirs), made now by a converge of their builders alone, from the
    render of the last apply. What was made."""
    spec, cluster, state = open_cluster(spec_path, state_root)
    elastic = [v.name for v in cluster.pools if v.pool.elastic]
    if not elastic:
        raise UsageError(
            f"{spec_path}: cluster '{spec.name}' has no elastic pool: no image to build"
        )
    unknown = [p for p in pools or [] if p not in elastic]
    if unknown:
        raise UsageError(
            f"{spec_path}: {unknown[0]!r} is no elastic pool of cluster '{spec.name}' (they "
            f"are: {', '.join(elastic)})"
        )
    if not (state.build / "files" / "hosts").exists():
        raise UsageError(
            f"cluster '{spec.name}' has no render in {state.dir}: run apply first (an image is "
            "made from the cluster's render, and a cloud pool's builder from its template)"
        )
    head = Handle(spec_path, spec, cluster, state)
    with state.locked(command_line()):
        run = _Run(head, say, ApplyReport(), Leaving(), Scope(), [])
        builds = _start_image_builds(cluster, state, say, pools)
        if not builds:
            say("images: every elastic pool's image is current (name a pool to make it again)")
            return []
        builders = [host for made in builds for host in made.hosts]
        extra_vars: dict[str, object] = {
            "provision_secrets_dir": str(ensure_cluster_secrets(state, spec.scheduler).resolve()),
            "slurm_config_change": "none",
            "provision_drained": builders,  # no job runs on a builder: a role may reboot it
            "provision_new_nodes": builders,  # made now: its first converge
            "provision_wheel": str(build_wheel(state.dir / "wheel").resolve()),
        }
        ok = False
        try:
            with _Phase(run.report, "ansible"):
                _play(private_key(spec, state), run, builders, extra_vars, builds)
            ok = True
        finally:
            _finish_builds(run, builds, ok)
        return [image for made in builds for image in made.images]


def verify(
    spec_path: Path,
    state_root: Path,
    maintenance: bool = False,
    wait_s: float = 3600.0,
    say: Callable[[str], None] = lambda _: None,
) -> list[CheckResult]:
    spec, cluster, state = open_cluster(spec_path, state_root)
    if not (state.build / "files" / "hosts").exists():
        raise UsageError(f"cluster '{spec.name}' has no render in {state.dir}: run apply first")
    # one verify (or apply) of this state at a time: verify's reservation is the state's own
    with state.locked(command_line()):
        return verify_cluster(cluster, state, private_key(spec, state), maintenance, wait_s, say)


def destroy(
    spec_path: Path, state_root: Path, say: Callable[[str], None] = lambda _: None
) -> list[str]:
    spec, cluster, state = open_cluster(spec_path, state_root)
    removed: list[str] = []
    with state.locked(command_line()):
        for kind in _providers_in(cluster):
            nodes = [n for n in cluster.nodes if n.provider == kind]
            provider = get_provider(kind, spec)
            removed += provider.destroy(nodes, state)
            if provider.destroy_note is not None:
                say(provider.destroy_note)
        if any(p.boot == "network" for p in spec.pools):
            removed += boot.remove_images(cluster, state)
        state.remove()
    return removed

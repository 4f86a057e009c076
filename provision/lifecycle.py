"""The lifecycle verbs as library calls: the CLI only parses arguments and prints."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from provision.errors import OperationError, UsageError
from provision.providers import get_provider
from provision.render import render, write_render
from provision.render.context import Cluster
from provision.run.ansible import RunResult, run_playbook
from provision.run.progress import HostProgress, summary_table
from provision.spec import Spec, load_spec
from provision.state import State
from provision.verify import CheckResult, verify_cluster


@dataclass
class ApplyReport:
    run: RunResult
    checks: list[CheckResult]


def open_cluster(spec_path: Path, state_root: Path) -> tuple[Spec, Cluster, State]:
    spec = load_spec(spec_path)
    return spec, Cluster(spec), State(state_root, spec.name)


def private_key(spec: Spec, state: State) -> Path | None:
    if spec.ssh.private_key_file:
        key = Path(spec.ssh.private_key_file).expanduser()
        if not key.exists():
            raise UsageError(f"ssh.private_key_file: {key} does not exist")
        return key
    return None


def _providers_in(cluster: Cluster) -> list[str]:
    return sorted({n.provider for n in cluster.nodes})


def create_nodes(cluster: Cluster, state: State, console: Console) -> Cluster:
    """Ask each provider to make its nodes exist; return the cluster with their addresses."""
    addresses: dict[str, ipaddress.IPv4Address] = {}
    for kind in _providers_in(cluster):
        nodes = [n for n in cluster.lasting_nodes if n.provider == kind]
        if not nodes:
            continue
        provider = get_provider(kind)
        console.print(f"nodes: {kind}: {len(nodes)} node(s)")
        addresses.update(provider.create(nodes, state))
    return Cluster(cluster.spec, addresses) if addresses else cluster


def apply(spec_path: Path, state_root: Path, console: Console, verify: bool = True) -> ApplyReport:
    spec, cluster, state = open_cluster(spec_path, state_root)
    state.ensure()
    cluster = create_nodes(cluster, state, console)
    changed = write_render(render(cluster), state.build)
    console.print(f"render: {state.build} ({len(changed)} file(s) changed)")
    key = private_key(spec, state)
    hosts = [n.name for n in cluster.lasting_nodes]
    console.print(f"ansible: playbooks/site.yml on {len(hosts)} host(s)")
    with HostProgress(console, hosts) as progress:
        result = run_playbook("site.yml", state, key, on_event=progress)
    console.print(summary_table(result))
    if result.rc != 0:
        failed = ", ".join(result.failed_hosts) or "see the log"
        raise OperationError(
            f"apply failed on: {failed} (log: {result.log_dir}); "
            "fix the cause and run apply again, it continues where it stopped"
        )
    state.record_applied()
    checks: list[CheckResult] = []
    if verify:
        checks = verify_cluster(cluster, state, key)
    return ApplyReport(result, checks)


def verify(spec_path: Path, state_root: Path) -> list[CheckResult]:
    spec, cluster, state = open_cluster(spec_path, state_root)
    if not (state.build / "files" / "hosts").exists():
        raise UsageError(f"cluster '{spec.name}' has no render in {state.dir}: run apply first")
    return verify_cluster(cluster, state, private_key(spec, state))


def destroy(spec_path: Path, state_root: Path, console: Console) -> list[str]:
    _spec, cluster, state = open_cluster(spec_path, state_root)
    removed: list[str] = []
    for kind in _providers_in(cluster):
        nodes = [n for n in cluster.nodes if n.provider == kind]
        removed += get_provider(kind).destroy(nodes, state)
    if any(n.provider == "static" for n in cluster.nodes):
        console.print("static hosts are left as they are: destroy only forgets them")
    state.remove()
    return removed

"""What the last full converge left on each node, to skip the converge of nodes nothing changed.

A converge that changes nothing still costs Ansible a second or more per task on every node. So
after a full apply succeeds, provision records one fingerprint of everything Ansible was given
(the rendered files, this package with its roles and the nodes' programs, the cluster's
secrets) and, per node, what the roles left there: the checksum of each file they copied or
templated, and each service they started. The next apply with the same fingerprint probes the
nodes instead (preflight's SSH session: sha1sum and systemctl, milliseconds) and runs Ansible
only on a node whose files or services drifted; `apply --full` converges every node anyway.

What the probe does not see (a package removed by hand, a user, a line in /etc/hosts, rules
flushed with nft) is put right by the next full converge, or by any change of the spec.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision import __version__, assets
from provision.cluster import compress
from provision.state import State

RECORD = "converged.json"
_FILE_ACTIONS = ("ansible.builtin.copy", "ansible.builtin.template")
_SERVICE_ACTIONS = ("ansible.builtin.systemd_service", "ansible.builtin.systemd")


@dataclass
class Left:
    """What the roles left on one node: files (path -> sha1) and started services."""

    files: dict[str, str] = field(default_factory=dict)
    services: list[str] = field(default_factory=list)

    def probe(self) -> str:
        """One shell command: exit 0 when every file has its checksum and every service runs.
        Paths and names are quoted: they come from the roles' results, which spec values reach."""
        lines = "".join(f"{sha}  {path}\n" for path, sha in sorted(self.files.items()))
        script = ["drift=0"]
        if self.files:
            script.append(
                f"printf %s {shlex.quote(lines)} | sha1sum --quiet --strict -c - 2>&1 || drift=1"
            )
        if self.services:
            names = " ".join(shlex.quote(s) for s in sorted(self.services))
            script.append(
                f'for s in {names}; do systemctl is-active --quiet -- "$s" || '
                '{ echo "$s: not running"; drift=1; }; done'
            )
        return "; ".join([*script, "exit $drift"])


def fingerprint(rendered: Mapping[str, str], secrets: Path) -> str:
    """One digest of all Ansible is given: the render, this package (roles, playbooks, the
    programs the nodes run) and the secrets the roles copy (their digest only is kept)."""
    h = hashlib.sha256(f"provision {__version__}\n".encode())
    for name in sorted(rendered):
        h.update(f"render {name} {len(rendered[name])}\n".encode())
        h.update(rendered[name].encode())
    package = assets.package_dir()
    for path in sorted(p for p in package.rglob("*") if p.is_file() and _counted(p)):
        h.update(f"package {path.relative_to(package)}\n".encode())
        h.update(path.read_bytes())
    # every file, in subdirectories too (the tunnel's keys: a rotated one must converge again)
    for path in sorted(p for p in secrets.rglob("*") if p.is_file()) if secrets.is_dir() else []:
        h.update(f"secret {path.relative_to(secrets)}\n".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _counted(path: Path) -> bool:
    return "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo")


def from_events(events: Iterable[Mapping[str, Any]]) -> dict[str, Left]:
    """What a run's results say it left on each host (censored results are not read)."""
    left: dict[str, Left] = {}
    for event in events:
        if event.get("event") != "runner_on_ok":
            continue
        data = event.get("event_data") or {}
        host, action = data.get("host"), data.get("resolved_action") or data.get("task_action")
        res = data.get("res") or {}
        if not host or res.get("censored") or action not in (*_FILE_ACTIONS, *_SERVICE_ACTIONS):
            continue
        entry = left.setdefault(host, Left())
        for item in res.get("results") or [res]:
            if not isinstance(item, dict) or item.get("skipped") or item.get("failed"):
                continue
            if action in _FILE_ACTIONS and item.get("checksum") and item.get("dest"):
                entry.files[str(item["dest"])] = str(item["checksum"])
            elif action in _SERVICE_ACTIONS and item.get("state") == "started":
                name = str(item.get("name") or "")
                if name and name not in entry.services:
                    entry.services.append(name)
    return left


def read_events(log_dir: Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted((log_dir / "job_events").glob("*.json")):
        try:
            events.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # a partly written event says nothing of what was left
    return events


@dataclass
class Record:
    fingerprint: str
    hosts: dict[str, Left]


def load(state: State) -> Record | None:
    path = state.dir / RECORD
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        hosts = {h: Left(dict(v["files"]), list(v["services"])) for h, v in data["hosts"].items()}
        return Record(str(data["fingerprint"]), hosts)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def save(state: State, record: Record) -> None:
    path = state.dir / RECORD
    tmp = path.with_name(f".{RECORD}.new")
    hosts = {h: {"files": v.files, "services": v.services} for h, v in sorted(record.hosts.items())}
    tmp.write_text(
        json.dumps({"fingerprint": record.fingerprint, "hosts": hosts}, indent=1, sort_keys=True)
        + "\n",
        encoding="utf-8",
    )
    tmp.replace(path)


def forget(state: State) -> None:
    """Before any converge: until it succeeds, no node counts as converged."""
    (state.dir / RECORD).unlink(missing_ok=True)


def unchanged(record: Record | None, print_: str, hosts: Iterable[str]) -> dict[str, Left]:
    """The hosts the last full converge left, when nothing Ansible is given changed since."""
    if record is None or record.fingerprint != print_:
        return {}
    return {h: record.hosts[h] for h in hosts if h in record.hosts}


def skippable(
    state: State, stamp: str, hosts: list[str], elastic: bool
) -> tuple[dict[str, Left], str]:
    """The hosts a plain apply probes and skips when as left, and why the others converge
    (apply and plan both ask here)."""
    if elastic:
        return {}, "elastic pools: their images are made in the converge"
    record = load(state)
    if record is None:
        return {}, "no converge recorded (a first apply, or the last one failed or was partial)"
    left = unchanged(record, stamp, hosts)
    if not left:
        return {}, "the render, the roles or the secrets changed since the last converge"
    new = [h for h in hosts if h not in left]
    return left, f"new since the last converge: {compress(new)}" if new else ""

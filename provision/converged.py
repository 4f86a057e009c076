"""What the last converge left on each node, to skip the converge of nodes nothing changed for.

A converge that changes nothing still costs Ansible a second or more per task on every node. So
after a converge succeeds, provision records for each node it converged a fingerprint of what
Ansible gave that node, and what the roles left there: the checksum of each file they copied or
templated, and each service they started. A fingerprint has two parts (`prints`):

- what every node is given: this package with its roles and the nodes' programs, the cluster's
  secrets, every rendered file not named for one pool or node (slurm.conf, the hosts file, the
  firewall's address sets...), the inventory's groups with their members and addresses and the
  cluster-wide variables (group_vars/all.yml, `all`'s own);
- what the node's pool is given: the pool group's variables, its nodes' host variables, and the
  rendered files the roles read by the pool's name (its nftables rules, health file, NCCL and
  containerd configuration) or by one of its nodes' (etcd's environment).

The next apply converges the nodes whose fingerprint changed (a change to one pool's variables
or files: that pool's nodes; any other change: every node) and probes the others instead
(preflight's SSH session: sha1sum and systemctl, milliseconds), running Ansible on one of them
only if its files or services drifted; `apply --full` converges every node anyway. A role that
read another pool's variables would break this: tests/test_converged.py holds the roles to
reading other nodes' variables in the places it names alone.

What the probe does not see (a package removed by hand, a user, a line in /etc/hosts, rules
flushed with nft) is put right by the next full converge, or by any change that reaches the node.
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
from provision.changes import INVENTORY, inventory_document
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


# The rendered files the roles read by a pool's name (firewall_rules_file, health_config_src,
# nccl_conf_src, containerd_config_src in their defaults) and by a node's (etcd_env_src): the
# pool's, in its nodes' fingerprints alone. Every other rendered file is every node's.
POOL_FILES = (
    "files/nftables/{}.nft",
    "files/health/{}.json",
    "files/nccl/{}.conf",
    "files/kubernetes/containerd/{}.toml",
)
HOST_FILES = ("files/kubernetes/etcd/{}.env",)
_POOL_GROUP = "pool_"


@dataclass(frozen=True)
class Prints:
    """Each node's fingerprint and pool, and the digests of the parts they are made of: what
    every node is given (`shared`) and what each pool is (`pools`), by name (a rendered file's
    path, or what else it is), so that plan can say what changed."""

    shared: dict[str, str]
    pools: dict[str, dict[str, str]]
    nodes: dict[str, str]
    pool_of: dict[str, str]


# the parts that are not rendered files, by the name plan gives them
INVENTORY_PART = "the inventory's groups, members, addresses or cluster-wide variables"
PACKAGE_PART = "provision, its roles or the nodes' programs"
SECRETS_PART = "the cluster's secrets"
POOL_VARS_PART = "the pool's variables"
HOST_VARS_PART = "its nodes' host variables"


def prints(rendered: Mapping[str, str], secrets: Path) -> Prints:
    """The fingerprint of what Ansible gives each node of the render (the module's docstring):
    the render, this package, the secrets (their digest only is kept)."""
    doc = inventory_document(rendered.get(INVENTORY, ""))
    top: dict[str, Any] = _mapping(doc.get("all"))
    children = _mapping(top.get("children"))
    groups = {g: body if isinstance(body, dict) else {} for g, body in children.items()}
    nested = any("children" in body for body in groups.values())
    pool_of: dict[str, str] = {}
    for group, body in groups.items():
        if group.startswith(_POOL_GROUP):
            for host in body.get("hosts") or {}:
                pool_of.setdefault(str(host), group[len(_POOL_GROUP) :])
    scoped: dict[str, dict[str, str]] = {}  # pool -> its files
    if not nested:
        for pool in set(pool_of.values()):
            for pattern in POOL_FILES:
                _claim(scoped, pool, pattern.format(pool), rendered)
        for host, pool in pool_of.items():
            for pattern in HOST_FILES:
                _claim(scoped, pool, pattern.format(host), rendered)
    claimed = {name for files in scoped.values() for name in files}

    shared = {
        name: _digest(text.encode())
        for name, text in rendered.items()
        # the inventory below when it can be split: its shape and `all`'s variables here, the
        # pools' in their parts
        if name not in claimed and not (name == INVENTORY and not nested)
    }
    if not nested:
        shape = {
            # everything but the groups' bodies: `all`'s variables (and hosts, were any there)
            "doc": {k: v for k, v in doc.items() if k != "all"},
            "all": {k: v for k, v in top.items() if k != "children"},
            "groups": {
                g: {
                    "vars": None if g.startswith(_POOL_GROUP) else body.get("vars"),
                    "hosts": {
                        str(host): (hv or {}).get("ansible_host") if isinstance(hv, dict) else None
                        for host, hv in (body.get("hosts") or {}).items()
                    },
                }
                for g, body in groups.items()
            },
        }
        shared[INVENTORY_PART] = _digest(_json(shape))
    package = assets.package_dir()
    h = hashlib.sha256(f"provision {__version__}\n".encode())
    for path in sorted(p for p in package.rglob("*") if p.is_file() and _counted(p)):
        _add(h, f"package {path.relative_to(package)}", path.read_bytes())
    shared[PACKAGE_PART] = h.hexdigest()
    # every file, in subdirectories too (the tunnel's keys: a rotated one must converge again)
    h = hashlib.sha256()
    for path in sorted(p for p in secrets.rglob("*") if p.is_file()) if secrets.is_dir() else []:
        _add(h, f"secret {path.relative_to(secrets)}", path.read_bytes())
    shared[SECRETS_PART] = h.hexdigest()
    everyone = _digest(_json(shared))

    pools: dict[str, dict[str, str]] = {}
    for pool in sorted(set(pool_of.values())):
        members = sorted(host for host, p in pool_of.items() if p == pool)
        # each member's host variables, wherever they are written (a role may read its pool
        # peers': keepalived on the heads)
        host_vars = {
            host: [
                [g, (body.get("hosts") or {}).get(host)]
                for g, body in groups.items()
                if host in (body.get("hosts") or {})
            ]
            for host in members
        }
        pools[pool] = {
            POOL_VARS_PART: _digest(_json(groups[_POOL_GROUP + pool].get("vars"))),
            HOST_VARS_PART: _digest(_json(host_vars)),
            **{name: _digest(text.encode()) for name, text in scoped.get(pool, {}).items()},
        }
    by_pool = {pool: _digest(_json([everyone, pool, parts])) for pool, parts in pools.items()}
    nodes = {host: by_pool[pool] for host, pool in pool_of.items()}
    return Prints(shared, pools, nodes, dict(pool_of))


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, default=str).encode()


def changed_parts(before: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The parts whose digest differs, or that one side has alone, by name."""
    return sorted(k for k in {*before, *now} if before.get(k) != now.get(k))


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _claim(
    scoped: dict[str, dict[str, str]], pool: str, name: str, rendered: Mapping[str, str]
) -> None:
    if name in rendered:
        scoped.setdefault(pool, {})[name] = rendered[name]


def _add(h: Any, label: str, data: bytes) -> None:
    h.update(f"{label} {len(data)}\n".encode())
    h.update(data)


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
    """What the last converges left: the parts every node was given and each pool's, by name
    with their digests, each node's fingerprint, and what the roles left on each node."""

    shared: dict[str, str]
    pools: dict[str, dict[str, str]]
    prints: dict[str, str]
    hosts: dict[str, Left]


def load(state: State) -> Record | None:
    path = state.dir / RECORD
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        hosts = {h: Left(dict(v["files"]), list(v["services"])) for h, v in data["hosts"].items()}
        prints = {h: str(v["print"]) for h, v in data["hosts"].items()}
        pools = {p: {str(k): str(d) for k, d in v.items()} for p, v in data["pools"].items()}
        shared = {str(k): str(d) for k, d in data["shared"].items()}
        return Record(shared, pools, prints, hosts)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # an older record (one fingerprint for all) too: every node converges


def save(state: State, record: Record) -> None:
    path = state.dir / RECORD
    tmp = path.with_name(f".{RECORD}.new")
    hosts = {
        h: {"print": record.prints[h], "files": v.files, "services": v.services}
        for h, v in sorted(record.hosts.items())
        if h in record.prints
    }
    data = {"shared": record.shared, "pools": record.pools, "hosts": hosts}
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def forget(state: State) -> None:
    """Before any converge: until it succeeds, no node counts as converged."""
    (state.dir / RECORD).unlink(missing_ok=True)


def unchanged(record: Record | None, now: Prints, hosts: Iterable[str]) -> dict[str, Left]:
    """The hosts whose last converge is recorded with the fingerprint they have now."""
    if record is None:
        return {}
    return {
        h: record.hosts[h]
        for h in hosts
        if h in record.hosts and h in now.nodes and record.prints.get(h) == now.nodes[h]
    }


def after(before: Record | None, now: Prints, ran: dict[str, Left]) -> Record:
    """The record after a converge: the nodes it converged as they were left, and the
    record's other nodes as it says while their fingerprint is unchanged."""
    same = unchanged(before, now, before.hosts) if before is not None else {}
    hosts = {**same, **{h: v for h, v in ran.items() if h in now.nodes}}
    return Record(now.shared, now.pools, {h: now.nodes[h] for h in hosts}, hosts)


def skippable(
    state: State, now: Prints, hosts: list[str], elastic: bool
) -> tuple[dict[str, Left], str]:
    """The hosts a plain apply probes and skips when as left, and why the others converge,
    naming what changed (apply and plan both ask here)."""
    if elastic:
        return {}, "elastic pools: their images are made in the converge"
    record = load(state)
    if record is None:
        return {}, "no converge recorded (a first apply, or the last one failed or was partial)"
    if record.shared != now.shared:
        return {}, (
            "what every node is given changed since the last converge ("
            + _names(changed_parts(record.shared, now.shared))
            + ")"
        )
    left = unchanged(record, now, hosts)
    changed: dict[str, list[str]] = {}
    for h in hosts:
        if h not in left and h in record.hosts:
            changed.setdefault(now.pool_of.get(h, ""), []).append(h)
    why = [
        f"pool {pool}: "
        + _names(changed_parts(record.pools.get(pool, {}), now.pools.get(pool, {})))
        + f" changed since the last converge: {compress(names)}"
        if pool
        else f"in no pool: {compress(names)}"
        for pool, names in sorted(changed.items())
    ]
    new = [h for h in hosts if h not in left and h not in record.hosts]
    if new:
        why.append(f"new since the last converge: {compress(new)}")
    return left, "; ".join(why)


def _names(parts: list[str], most: int = 3) -> str:
    shown = ", ".join(parts[:most])
    return shown + (f" and {len(parts) - most} more" if len(parts) > most else "")

"""What the last converge left on each node, to run on each node only the roles a change reaches.

A converge that changes nothing still costs Ansible a second or more per task on every node. So
after a converge succeeds, provision records what each role of each node was given and what the
roles left there: the checksum of each file they copied or templated, and each service they
started. What a role is given (roleinputs.py reads it from the role's own text) is kept as
parts, by name, so that plan can say what changed:

- what every role on every node is given (`shared`): provision's version, playbooks and plugins,
  and a rendered file or a secret no role claims;
- what each role is given as a pool's nodes see it (`pools`): the role's files, the inventory's
  variables it names (from group_vars/all.yml, `all` and every group a node of the pool is in),
  the rendered files it reads (its pool's, its nodes', the shared ones), its secrets, this
  package where it installs the wheel, the groups it reads (members and addresses), and what
  apply gives it beside the render that it reads (GIVEN: the images the boot server serves);
- each node's own host variables and groups (`hosts`): every role's on that node.

The next apply probes each recorded node (preflight's SSH session: sha1sum and systemctl,
milliseconds) and runs on it the roles whose parts changed (by their tags), every role where
the node is new, its own variables changed or it drifted, and nothing where nothing changed;
`apply --full` converges every node anyway. A role that read another pool's variables would
break this: tests/test_converged.py holds the roles to reading other nodes' variables in the
places it names alone.

What the probe does not see (a package removed by hand, a user, a line in /etc/hosts, rules
flushed with nft) is put right by the next full converge, or by any change that reaches the
role that made it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision import __version__, assets, roleinputs
from provision.changes import GROUP_VARS, INVENTORY, inventory_document
from provision.cluster import compress
from provision.state import State

RECORD = "converged.json"
_FILE_ACTIONS = ("ansible.builtin.copy", "ansible.builtin.template")
_FILES_MODULE = "gpu_provision.cluster.files"  # a list of files in one result: res["paths"]
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


_POOL_GROUP = "pool_"


@dataclass(frozen=True)
class Prints:
    """The fingerprints of what each node's roles are given, by part (a digest by name: a
    rendered file's path, "var NAME", ...) so that plan can say what changed:

    - `shared`: what every role on every node is given (this package's playbooks and plugins,
      a rendered file or a secret no role claims, an inventory it cannot split);
    - `pools`: pool -> role -> that role's parts as the pool's nodes see them (the roles that
      run on none of its nodes are not there);
    - `hosts`: node -> the digest of its own host variables and the groups it is in: when it
      changes, every role runs on that node."""

    shared: dict[str, str]
    pools: dict[str, dict[str, dict[str, str]]]
    hosts: dict[str, str]
    pool_of: dict[str, str]

    @property
    def nodes(self) -> dict[str, str]:
        """Each node's fingerprint, all of it in one digest."""
        everyone = _digest(_json(self.shared))
        pools = {p: _digest(_json(roles)) for p, roles in self.pools.items()}
        return {
            h: _digest(_json([everyone, self.hosts[h], pools.get(p, "")]))
            for h, p in self.pool_of.items()
        }


# the parts that are not rendered files or variables, by the name plan gives them
PLAYBOOK_PART = "provision's version, playbooks or plugins"
INVENTORY_PART = "the inventory (it cannot be split by pool)"
ROLE_PART = "the role's files"
WHEEL_PART = "the nodes' programs (this package)"
GROUPS_PART = "the inventory's groups it reads"
PEERS_PART = "its pool's host variables"
HOST_PART = "its host variables or groups"


# What apply gives the roles beside the render that follows from more than the render: the
# images of the pools that boot from the network (their packages, made by apply), for the boot
# server to serve. Each is a part ("var NAME") of the roles that read it on the pool of the
# nodes it is given to, so that a new image reaches the boot server at the next apply even when
# nothing else of the head changed.
GIVEN = ("netboot_images",)
Given = Mapping[str, Mapping[str, str]]  # pool -> name -> digest


def given_digests(extra_vars: Mapping[str, object], pool: str | None) -> dict[str, dict[str, str]]:
    """The digests of what apply gives the roles of `pool`'s nodes beside the render (GIVEN)."""
    digests = {name: _digest(_json(extra_vars[name])) for name in GIVEN if name in extra_vars}
    return {pool: digests} if pool is not None and digests else {}


def recorded_given(state: State) -> dict[str, dict[str, str]]:
    """What the last converge recorded of GIVEN (plan: only apply knows whether it makes a new
    image, once it made it)."""
    record = load(state)
    found: dict[str, dict[str, str]] = {}
    for pool, roles in (record.pools if record is not None else {}).items():
        for parts in roles.values():
            for name in GIVEN:
                if f"var {name}" in parts:
                    found.setdefault(pool, {})[name] = parts[f"var {name}"]
    return found


def prints(rendered: Mapping[str, str], secrets: Path, given: Given | None = None) -> Prints:
    """The fingerprint of what Ansible gives each node's roles of the render (the module's
    docstring): the render, this package, the secrets (their digests only are kept), and the
    digests of what apply gives them beside it (`given`: GIVEN, by pool and name)."""
    doc = inventory_document(rendered.get(INVENTORY, ""))
    top: dict[str, Any] = _mapping(doc.get("all"))
    children = _mapping(top.get("children"))
    groups = {g: body if isinstance(body, dict) else {} for g, body in children.items()}
    nested = any("children" in body for body in groups.values())
    members = {g: [str(h) for h in body.get("hosts") or {}] for g, body in groups.items()}
    everyone = sorted({h for hosts in members.values() for h in hosts})
    pool_of: dict[str, str] = {}
    for group, hosts in members.items():
        if group.startswith(_POOL_GROUP):
            for host in hosts:
                pool_of.setdefault(host, group[len(_POOL_GROUP) :])
    in_groups: dict[str, list[str]] = {}
    for group, hosts in members.items():
        for host in hosts:
            in_groups.setdefault(host, []).append(group)
    catalog = roleinputs.catalog()

    shared: dict[str, str] = {}
    root = assets.collection_dir()
    h = hashlib.sha256(f"provision {__version__}\n".encode())
    for path in [assets.ansible_cfg(), *_files(root / "playbooks"), *_files(root / "plugins")]:
        _add(h, f"{path.relative_to(path.parents[1])}", path.read_bytes())
    shared[PLAYBOOK_PART] = h.hexdigest()
    secret_digests = {
        str(path.relative_to(secrets)): _digest(path.read_bytes())
        # every file, in subdirectories too (the tunnel's keys: a rotated one converges again)
        for path in (_files(secrets) if secrets.is_dir() else [])
    }
    for name, digest in secret_digests.items():
        if not any(role.reads_secret(name) for role in catalog.values()):
            shared[f"secret {name}"] = digest
    files = {
        name: _digest(text.encode())
        for name, text in rendered.items()
        if name not in (INVENTORY, GROUP_VARS)
    }
    for name, digest in files.items():
        if not any(role.claims_file(name) for role in catalog.values()):
            shared[name] = digest
    if nested:  # which nodes a group's variables reach is Ansible's to say: everyone's
        shared[INVENTORY_PART] = _digest(_json([doc, rendered.get(GROUP_VARS, "")]))
        shared[ROLE_PART] = _digest(_json({r.name: r.digest for r in catalog.values()}))
        pool_of = {host: pool_of.get(host, "") for host in everyone}

    host_vars = {
        host: _digest(
            _json(
                [
                    sorted(in_groups.get(host, [])),
                    [
                        [g, (groups[g].get("hosts") or {}).get(host)]
                        for g in in_groups.get(host, [])
                    ],
                ]
            )
        )
        for host in everyone
    }
    group_prints = {
        g: _digest(
            _json(
                {
                    str(host): (hv or {}).get("ansible_host") if isinstance(hv, dict) else None
                    for host, hv in (body.get("hosts") or {}).items()
                }
            )
        )
        for g, body in groups.items()
    }
    all_vars = {k: v for k, v in top.items() if k != "children"}
    common = [
        ("group_vars/all.yml", inventory_document(rendered.get(GROUP_VARS, ""))),
        ("all", _mapping(all_vars.get("vars"))),
        ("all (other keys)", {k: v for k, v in all_vars.items() if k != "vars"}),
    ]

    pools: dict[str, dict[str, dict[str, str]]] = {}
    for pool in sorted(set(pool_of.values())):
        pool_hosts = sorted(h for h, p in pool_of.items() if p == pool)
        reached = sorted({g for host in pool_hosts for g in in_groups.get(host, [])})
        sources = [*common, *((g, _mapping(groups[g].get("vars"))) for g in reached)]
        defined: set[str] = set().union(*(src.keys() for _, src in sources))
        var_digests: dict[str, str] = {}
        roles: dict[str, dict[str, str]] = {}
        for role in catalog.values():
            if not any(
                roleinputs.hosts_in(pattern, members, everyone) & set(pool_hosts)
                for pattern in role.hosts
            ):
                continue
            parts = {ROLE_PART: role.digest}
            # and Ansible's own (how it reaches the node: every role's)
            wanted = set(role.words & defined) | {n for n in defined if n.startswith("ansible_")}
            todo = list(wanted)
            while todo:  # a variable's template reads others
                name = todo.pop()
                for _, src in sources:
                    if name in src:
                        for more in roleinputs.value_words(src[name]) & defined - wanted:
                            wanted.add(more)
                            todo.append(more)
            for name in sorted(wanted):
                if name not in var_digests:
                    var_digests[name] = _digest(
                        _json([[label, src[name]] for label, src in sources if name in src])
                    )
                parts[f"var {name}"] = var_digests[name]
            for name, digest in files.items():
                if role.reads_file(name, pool, pool_hosts):
                    parts[name] = digest
            for name, digest in secret_digests.items():
                if role.reads_secret(name):
                    parts[f"secret {name}"] = digest
            if role.wheel:
                parts[WHEEL_PART] = _package_digest()
            for name, digest in (given or {}).get(pool, {}).items():
                if name in role.words:
                    parts[f"var {name}"] = digest
            if role.inventory:
                named = {g for g in groups if g in role.words}
                named |= {
                    w
                    for name in wanted
                    for _, src in sources
                    if name in src
                    for w in roleinputs.words(_json(src[name]).decode())
                    if w in groups
                }
                for pattern in role.hosts:
                    named |= {t.lstrip("&!") for t in pattern.split(":")} & set(groups)
                if role.everyone:
                    named = set(groups)
                parts[GROUPS_PART] = _digest(_json({g: group_prints[g] for g in sorted(named)}))
                if "hostvars" in role.words:
                    parts[PEERS_PART] = _digest(_json([host_vars[h] for h in pool_hosts]))
            roles[role.name] = parts
        pools[pool] = roles
    return Prints(shared, pools, host_vars, dict(pool_of))


@functools.lru_cache(maxsize=1)
def _package_digest() -> str:
    """This package's code, which the wheel the nodes' programs come from is built of."""
    package = assets.package_dir()
    h = hashlib.sha256(f"provision {__version__}\n".encode())
    for path in _files(package):
        if "ansible_collections" not in path.parts:
            _add(h, f"package {path.relative_to(package)}", path.read_bytes())
    return h.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and _counted(p))


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, default=str).encode()


def changed_parts(before: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The parts whose digest differs, or that one side has alone, by name."""
    return sorted(k for k in {*before, *now} if before.get(k) != now.get(k))


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


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
        actions = (*_FILE_ACTIONS, _FILES_MODULE, *_SERVICE_ACTIONS)
        if not host or res.get("censored") or action not in actions:
            continue
        entry = left.setdefault(host, Left())
        if action == _FILES_MODULE:
            for item in res.get("paths") or []:
                if isinstance(item, dict) and item.get("checksum") and item.get("path"):
                    entry.files[str(item["path"])] = str(item["checksum"])
            continue
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


VERSION = 2  # of the record: one before (a fingerprint per node, not per role) converges all


@dataclass
class Record:
    """What the last converges left: the parts every node and each pool's roles were given,
    each node's host fingerprint and pool, and what the roles left on each node."""

    shared: dict[str, str]
    pools: dict[str, dict[str, dict[str, str]]]
    prints: dict[str, str]  # node -> its host variables' and groups' digest
    hosts: dict[str, Left]
    pool_of: dict[str, str]


def load(state: State) -> Record | None:
    path = state.dir / RECORD
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data["version"] != VERSION:
            return None
        hosts = {h: Left(dict(v["files"]), list(v["services"])) for h, v in data["hosts"].items()}
        prints = {h: str(v["print"]) for h, v in data["hosts"].items()}
        pool_of = {h: str(v["pool"]) for h, v in data["hosts"].items()}
        pools = {
            p: {r: {str(k): str(d) for k, d in parts.items()} for r, parts in roles.items()}
            for p, roles in data["pools"].items()
        }
        shared = {str(k): str(d) for k, d in data["shared"].items()}
        return Record(shared, pools, prints, hosts, pool_of)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # an older or broken record: every node converges


def save(state: State, record: Record) -> None:
    path = state.dir / RECORD
    tmp = path.with_name(f".{RECORD}.new")
    hosts = {
        h: {
            "print": record.prints[h],
            "pool": record.pool_of[h],
            "files": v.files,
            "services": v.services,
        }
        for h, v in sorted(record.hosts.items())
        if h in record.prints
    }
    data = {"version": VERSION, "shared": record.shared, "pools": record.pools, "hosts": hosts}
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def forget(state: State) -> None:
    """Before any converge: until it succeeds, no node counts as converged."""
    (state.dir / RECORD).unlink(missing_ok=True)


def _as_recorded(record: Record, now: Prints, host: str) -> bool:
    """Whether the node's host print and pool are those the record has (its roles' may not)."""
    return (
        host in record.hosts
        and host in now.hosts
        and record.prints.get(host) == now.hosts[host]
        and record.pool_of.get(host) == now.pool_of.get(host)
    )


def changed_roles(record: Record, now: Prints, pool: str) -> list[str]:
    """The roles of a pool's nodes whose parts changed since the record, or are new there."""
    before, after_ = record.pools.get(pool, {}), now.pools.get(pool, {})
    return [role for role in after_ if before.get(role) != after_[role]]


def after(
    before: Record | None,
    now: Prints,
    ran: dict[str, Left],
    some: Iterable[str] = (),
) -> Record:
    """The record after a converge: the nodes it converged as they were left (those in
    `some` ran only the roles that changed: what the others left is kept), and the record's
    other nodes as it says while nothing they are given changed."""
    hosts: dict[str, Left] = {}
    if before is not None and before.shared == now.shared:
        for h, left in before.hosts.items():
            if _as_recorded(before, now, h) and not changed_roles(before, now, now.pool_of[h]):
                hosts[h] = left
    for h in some:
        if before is not None and h in ran and h in before.hosts:
            old, new = before.hosts[h], ran[h]
            services = old.services + [s for s in new.services if s not in old.services]
            hosts[h] = Left({**old.files, **new.files}, services)
    hosts.update({h: v for h, v in ran.items() if h in now.hosts and h not in set(some)})
    return Record(
        now.shared,
        now.pools,
        {h: now.hosts[h] for h in hosts},
        hosts,
        {h: now.pool_of[h] for h in hosts},
    )


@dataclass(frozen=True)
class Decision:
    """What a plain apply does with each node: it probes the `left` ones (what the record says
    the roles left there), then runs on each node the roles `roles` names: all of them (None)
    where the node is new, its own variables changed, or it drifted; those whose parts changed
    where it did not ((): none, the node is skipped)."""

    left: dict[str, Left]
    roles: dict[str, tuple[str, ...] | None]
    why: str


def decide(state: State, now: Prints, hosts: list[str], elastic: bool) -> Decision:
    """Which roles a plain apply runs on each node, and why (apply and plan both ask here)."""
    if elastic:
        return Decision(
            {}, dict.fromkeys(hosts), "elastic pools: their images are made in the converge"
        )
    record = load(state)
    if record is None:
        return Decision(
            {},
            dict.fromkeys(hosts),
            "no converge recorded (a first apply, the last one failed or was partial, or it "
            "was recorded by an older provision)",
        )
    if record.shared != now.shared:
        return Decision(
            {},
            dict.fromkeys(hosts),
            "what every node is given changed since the last converge ("
            + _names(changed_parts(record.shared, now.shared))
            + ")",
        )
    left: dict[str, Left] = {}
    roles: dict[str, tuple[str, ...] | None] = {}
    new, moved = [], []
    said: dict[str, list[str]] = {}  # why -> the nodes it is said of
    by_pool: dict[str, list[str]] = {}  # pool -> its changed roles
    for h in hosts:
        if h not in record.hosts:
            roles[h] = None
            new.append(h)
            continue
        if not _as_recorded(record, now, h):
            roles[h] = None
            moved.append(h)
            continue
        left[h] = record.hosts[h]  # probed: one that drifted runs every role
        pool = now.pool_of[h]
        if pool not in by_pool:  # once a pool, not once a node
            by_pool[pool] = changed_roles(record, now, pool)
        changed = by_pool[pool]
        if changed and set(changed) == set(now.pools[pool]):
            roles[h] = None  # all of them: no tags to filter by
            said.setdefault(_why(record, now, pool, changed) + ": every role runs", []).append(h)
        elif changed:
            roles[h] = tuple(changed)
            alone = "that role alone runs" if len(changed) == 1 else "those roles alone run"
            said.setdefault(f"{_why(record, now, pool, changed)}: {alone}", []).append(h)
        else:
            roles[h] = ()
    why = [f"{compress(names)}: {text}" for text, names in said.items()]
    if moved:
        why.append(f"{compress(moved)}: {HOST_PART} changed: every role runs")
    if new:
        why.append(f"new since the last converge: {compress(new)}")
    return Decision(left, roles, "; ".join(why))


def _why(record: Record, now: Prints, pool: str, changed: list[str]) -> str:
    """The roles that changed for a pool's nodes, each with what changed (three at most)."""
    before = record.pools.get(pool, {})
    said = [
        f"{role} ({_names(changed_parts(before.get(role, {}), now.pools[pool][role]))})"
        for role in changed[:3]
    ]
    more = f" and {len(changed) - 3} more role(s)" if len(changed) > 3 else ""
    return f"{', '.join(said)}{more} changed since the last converge"


def _names(parts: list[str], most: int = 3) -> str:
    shown = ", ".join(parts[:most])
    return shown + (f" and {len(parts) - most} more" if len(parts) > most else "")

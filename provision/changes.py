"""What a new render changes on a running cluster, from the render of the last apply: nodes
that join or leave, what the Slurm daemons must do for the new configuration (nothing,
re-read it with `scontrol reconfigure`, or restart), and a Kubernetes release that moves. Plan
reports it; apply acts on it.

Conservative by design: a slurm.conf change is a reconfigure only when every changed key is on
the RECONFIGURE list (keys slurm.conf(5) of Slurm 21.08 to 24.05 applies on `scontrol
reconfigure`) and the node set is the same; anything else, a key set through slurm.config
included, restarts slurmctld and every slurmd (running jobs survive both: their steps are
separate processes and slurmctld saves its state).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from provision.burst.hostlist import expand
from provision.cluster import compress
from provision.errors import SpecError
from provision.spec.validation import issue_at
from provision.spec.yamlfile import read_yaml

if TYPE_CHECKING:
    from provision.cluster import Cluster

SLURM_FILES = ("files/slurm/slurm.conf", "files/slurm/gres.conf", "files/slurm/cgroup.conf")
INVENTORY = "inventory/hosts.yml"
GROUP_VARS = "inventory/group_vars/all.yml"
# the rendered variable that holds kubernetes.version
RELEASE = "kubernetes_packages_version"
# what makes the NVIDIA driver's role install another kernel module (a reboot to load it)
DRIVER_VARS = ("nvidia_driver_version", "nvidia_driver_modules", "provision_nvidia_source")
ROLE_GROUPS = ("head", "login", "compute", "storage")

# Keys `scontrol reconfigure` applies without a restart: timers, limits, power saving, the
# scheduler's parameters, prolog and epilog, health checks
RECONFIGURE = frozenset(
    {
        "ReturnToService",
        "SlurmctldTimeout",
        "SlurmdTimeout",
        "InactiveLimit",
        "MinJobAge",
        "KillWait",
        "Waittime",
        "MessageTimeout",
        "BatchStartTimeout",
        "UnkillableStepTimeout",
        "ResumeProgram",
        "SuspendProgram",
        "ResumeFailProgram",
        "SuspendTime",
        "SuspendTimeout",
        "ResumeTimeout",
        "ResumeRate",
        "SuspendRate",
        "SuspendExcNodes",
        "SuspendExcParts",
        "PrivateData",
        "SchedulerParameters",
        "DefMemPerCPU",
        "DefMemPerNode",
        "MaxMemPerCPU",
        "MaxMemPerNode",
        "MaxJobCount",
        "MaxArraySize",
        "Prolog",
        "Epilog",
        "PrologSlurmctld",
        "EpilogSlurmctld",
        "HealthCheckProgram",
        "HealthCheckInterval",
        "HealthCheckNodeState",
        "SlurmctldDebug",
        "SlurmdDebug",
        "DebugFlags",
        "PriorityWeightAge",
        "PriorityWeightFairshare",
        "PriorityWeightJobSize",
        "PriorityWeightPartition",
        "PriorityWeightQOS",
    }
)
# Node attributes that reconfigure applies; any other change of a node line restarts
NODE_RECONFIGURE = frozenset({"Weight", "Feature", "Features", "State"})

Action = Literal["new", "none", "reconfigure", "restart"]
# the slurm role's slurm_config_change for each: on a first apply it restarts what changed
SLURM_ACTION: dict[Action, str] = {
    "new": "auto",
    "none": "none",
    "reconfigure": "reconfigure",
    "restart": "restart",
}


@dataclass(frozen=True)
class SlurmChange:
    action: Action  # new: no earlier apply (the daemons start for the first time)
    why: tuple[str, ...] = ()


@dataclass(frozen=True)
class InventoryNode:
    pool: str
    role: str  # head, login, compute, storage
    provider: str  # static, lab, aws, gcp, azure
    gpu: bool = False  # in the gpu group: the NVIDIA roles run there


@dataclass(frozen=True)
class DriverChange:
    """The NVIDIA driver changes on GPU nodes the cluster already has."""

    why: tuple[str, ...]  # variable: before -> after
    nodes: tuple[str, ...]
    reboot: bool  # nvidia.reboot: the role reboots them (drained ones: see lifecycle)


@dataclass(frozen=True)
class StorageChange:
    """NFS exports and mounts that change on nodes the cluster already has."""

    servers: tuple[str, ...]  # nodes whose export list changes: nfs-ganesha restarts there
    mounted: dict[str, tuple[str, ...]]  # node -> mount points added
    unmounted: dict[str, tuple[str, ...]]  # node -> mount points gone from the spec (kept)
    left_serving: tuple[str, ...] = ()  # nodes with no exports now: nfs-ganesha goes on serving

    def to_json(self) -> dict[str, Any]:
        return {
            "nfs_server_restarts": list(self.servers),
            "mounts_added": {k: list(v) for k, v in self.mounted.items()},
            "mounts_left_mounted": {k: list(v) for k, v in self.unmounted.items()},
            "nfs_servers_left_serving": list(self.left_serving),
        }


@dataclass(frozen=True)
class KubernetesUpgrade:
    """kubernetes.version moves on a running cluster: the heads upgrade the control plane one at
    a time (kubeadm upgrade apply on the first, upgrade node on the others), then each worker
    upgrades once drained (provision apply --batch N)."""

    before: str
    after: str
    heads: tuple[str, ...]
    workers: tuple[str, ...]  # those the cluster had; new ones join at the release

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.before,
            "to": self.after,
            "heads": list(self.heads),
            "workers": list(self.workers),
        }


@dataclass(frozen=True)
class UsersChange:
    """The spec's users that come, go (locked out on every node, their homes kept) or change."""

    added: tuple[str, ...]
    locked: tuple[str, ...]
    changed: tuple[str, ...]  # "name: what changed"

    def to_json(self) -> dict[str, Any]:
        return {
            "added": list(self.added),
            "locked_out": list(self.locked),
            "changed": list(self.changed),
        }


@dataclass(frozen=True)
class AccountsChange:
    """slurmdbd's accounts and QoS that the spec adds, removes or changes: "kind name" for
    each added or removed, "kind name: what changed" for the others."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "added": list(self.added),
            "removed": list(self.removed),
            "changed": list(self.changed),
        }


@dataclass(frozen=True)
class Changes:
    added: tuple[str, ...]  # lasting nodes that join
    removed: tuple[str, ...]  # lasting nodes that leave
    slurm: SlurmChange
    # every node of either render, as the newer one has it
    nodes: dict[str, InventoryNode] = field(default_factory=dict)
    driver: DriverChange | None = None
    storage: StorageChange | None = None
    kubernetes: KubernetesUpgrade | None = None
    users: UsersChange | None = None
    accounts: AccountsChange | None = None

    def to_json(self) -> dict[str, Any]:
        driver = self.driver
        return {
            "slurm_accounts": self.accounts.to_json() if self.accounts else None,
            "users": self.users.to_json() if self.users else None,
            "kubernetes_upgrade": self.kubernetes.to_json() if self.kubernetes else None,
            "storage": self.storage.to_json() if self.storage else None,
            "nodes_added": list(self.added),
            "nodes_removed": list(self.removed),
            "slurm": {"action": self.slurm.action, "why": list(self.slurm.why)},
            "nvidia_driver": {
                "why": list(driver.why),
                "nodes": list(driver.nodes),
                "reboot": driver.reboot,
            }
            if driver
            else None,
        }


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The rendered inventory: its `!unsafe` strings read as plain strings (libyaml's parser
    where PyYAML has it: a 10,000-node inventory in well under a second instead of seconds)."""


def _unsafe(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    assert isinstance(node, yaml.ScalarNode)
    return str(loader.construct_scalar(node))


_Loader.add_constructor("!unsafe", _unsafe)


@functools.lru_cache(maxsize=4)
def inventory_document(text: str) -> dict[str, Any]:
    """A rendered inventory/hosts.yml as data (its `!unsafe` strings plain). Read once per
    text (plan reads the old and the new render's several times, apply and the fingerprints
    again: a 10,000-node inventory takes a second or more): callers read it, never change it."""
    return dict(yaml.load(text, Loader=_Loader) or {})


def inventory_nodes(text: str) -> dict[str, InventoryNode]:
    """Lasting node -> its pool, role and provider, from a rendered inventory/hosts.yml."""
    return dict(_inventory_nodes(text))


@functools.lru_cache(maxsize=4)
def _inventory_nodes(text: str) -> dict[str, InventoryNode]:
    doc = inventory_document(text)
    children = (doc.get("all") or {}).get("children") or {}

    def members(prefix: str) -> dict[str, str]:
        return {
            host: group[len(prefix) :]
            for group, body in children.items()
            if group.startswith(prefix)
            for host in (body or {}).get("hosts") or {}
        }

    pools, providers = members("pool_"), members("provider_")
    roles = {
        host: group
        for group in ROLE_GROUPS
        for host in ((children.get(group) or {}).get("hosts")) or {}
    }
    gpus = set(((children.get("gpu") or {}).get("hosts")) or {})
    return {
        host: InventoryNode(pools.get(host, ""), role, providers.get(host, ""), host in gpus)
        for host, role in roles.items()
    }


def _group_vars(files: dict[str, str]) -> dict[str, Any]:
    """The cluster-wide variables of a render (inventory/group_vars/all.yml); {} without one."""
    return dict(yaml.load(files.get(GROUP_VARS, ""), Loader=_Loader) or {})


def driver_change(old: dict[str, str], new: dict[str, str]) -> DriverChange | None:
    """The driver settings that changed, and the GPU nodes of both renders they reach."""
    before, after = _group_vars(old), _group_vars(new)
    why = tuple(
        f"{key}: {before.get(key, '(unset)')} -> {after.get(key, '(unset)')}"
        for key in DRIVER_VARS
        if before.get(key) != after.get(key)
    )
    old_nodes = inventory_nodes(old.get(INVENTORY, ""))
    nodes = tuple(
        sorted(
            name
            for name, node in inventory_nodes(new.get(INVENTORY, "")).items()
            if node.gpu and name in old_nodes
        )
    )
    if not why or not nodes:
        return None
    return DriverChange(why, nodes, bool(after.get("nvidia_driver_reboot")))


def users_change(old: dict[str, str], new: dict[str, str]) -> UsersChange | None:
    """The users the new render adds, drops (the role locks them out) or changes."""
    before = {u["name"]: u for u in _group_vars(old).get("common_users") or []}
    after = {u["name"]: u for u in _group_vars(new).get("common_users") or []}
    changed = []
    for name in sorted(set(before) & set(after)):
        was, now = before[name], after[name]
        what = []
        if was.get("uid") != now.get("uid"):
            what.append(f"uid {was.get('uid')} -> {now.get('uid')}")
        if was.get("groups") != now.get("groups"):
            listed = [",".join(u.get("groups") or []) or "-" for u in (was, now)]
            what.append(f"groups {listed[0]} -> {listed[1]}")
        if was.get("ssh_keys") != now.get("ssh_keys"):
            what.append("ssh keys")
        if what:
            changed.append(f"{name}: {'; '.join(what)}")
    added = tuple(sorted(set(after) - set(before)))
    locked = tuple(sorted(set(before) - set(after)))
    if not (added or locked or changed):
        return None
    return UsersChange(added, locked, tuple(changed))


def accounts_change(old: dict[str, str], new: dict[str, str]) -> AccountsChange | None:
    """The QoS and accounts the new render adds, removes or changes in slurmdbd."""
    added: list[str] = []
    removed: list[str] = []
    changed: list[str] = []
    for kind, var in (("qos", "slurm_qos"), ("account", "slurm_accounts")):
        before = {x["name"]: x for x in _group_vars(old).get(var) or []}
        after = {x["name"]: x for x in _group_vars(new).get(var) or []}
        added += [f"{kind} {name}" for name in after if name not in before]
        removed += [f"{kind} {name}" for name in before if name not in after]
        for name in (n for n in after if n in before):
            what = [
                f"{key} {_shown(before[name].get(key))} -> {_shown(after[name].get(key))}"
                for key in after[name]
                if before[name].get(key) != after[name].get(key)
            ]
            if what:
                changed.append(f"{kind} {name}: {'; '.join(what)}")
    if not (added or removed or changed):
        return None
    return AccountsChange(tuple(added), tuple(removed), tuple(changed))


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return "-" if value is None else str(value)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def kubernetes_upgrade(old: dict[str, str], new: dict[str, str]) -> KubernetesUpgrade | None:
    """The Kubernetes release the last apply left and the one the spec asks for, where they
    differ, with the nodes of both renders that move."""
    before = _group_vars(old).get(RELEASE)
    after = _group_vars(new).get(RELEASE)
    if not before or not after or before == after:
        return None
    old_nodes = inventory_nodes(old.get(INVENTORY, ""))
    staying = {
        name: node
        for name, node in inventory_nodes(new.get(INVENTORY, "")).items()
        if name in old_nodes
    }
    heads = tuple(sorted(n for n, node in staying.items() if node.role == "head"))
    workers = tuple(sorted(n for n, node in staying.items() if node.role in ("compute", "login")))
    return KubernetesUpgrade(str(before), str(after), heads, workers)


def refuse_unsupported_changes(spec_path: Path, old: dict[str, str], cluster: Cluster) -> None:
    """SpecError (exit 2, each at its key) where the spec asks a running Kubernetes cluster for
    what apply cannot do to it: a release kubeadm cannot upgrade it to, or heads that join or
    leave its control plane. Before anything is changed."""
    spec = cluster.spec
    if spec.scheduler != "kubernetes" or INVENTORY not in old:
        return
    problems: list[tuple[list[str | int], str]] = []
    before = _group_vars(old).get(RELEASE)
    if before:
        why = upgrade_refusal(str(before), spec.kubernetes.version)
        if why is not None:
            problems.append((["kubernetes", "version"], why))
    had = sorted(n for n, node in inventory_nodes(old[INVENTORY]).items() if node.role == "head")
    heads = sorted(n.name for n in cluster.head_nodes)
    if had and had != heads:
        pool = next(i for i, p in enumerate(spec.pools) if p.role == "head")
        problems.append(
            (
                ["pools", pool],
                f"not supported yet: heads joining or leaving a running Kubernetes control "
                f"plane ({compress(had)} -> {compress(heads)}): the API servers' certificates"
                + (" and the external etcd's members" if spec.kubernetes.etcd == "external" else "")
                + " would not follow; keep the heads as they are",
            )
        )
    if problems:
        doc = read_yaml(spec_path)
        raise SpecError([issue_at(doc, str(spec_path), key, why) for key, why in problems])


def upgrade_refusal(running: str, wanted: str) -> str | None:
    """Why kubeadm cannot take the cluster from the release it runs to the one wanted, or None:
    it goes forward only, one minor release at a time (patch releases within a minor freely)."""
    before, after = _release(running), _release(wanted)
    if after < before:
        return (
            f"the cluster runs {running}: kubeadm cannot go back to {wanted} "
            "(restore etcd from a backup taken at that release instead)"
        )
    if after[1] > before[1] + 1:
        step = f"{before[0]}.{before[1] + 1}"
        return (
            f"the cluster runs {running}: kubeadm upgrades one minor release at a time, "
            f"apply a {step} release first, then {wanted}"
        )
    return None


def _pool_vars(text: str) -> dict[str, dict[str, Any]]:
    """pool -> its group variables, from a rendered inventory/hosts.yml."""
    doc = yaml.load(text, Loader=_Loader) or {}
    children = (doc.get("all") or {}).get("children") or {}
    return {
        group.removeprefix("pool_"): dict((body or {}).get("vars") or {})
        for group, body in children.items()
        if group.startswith("pool_")
    }


def _mount_points(pool_vars: dict[str, Any], node: str) -> set[str]:
    return {
        m["path"] for m in pool_vars.get("mounts_filesystems") or [] if m.get("skip_on") != node
    }


def storage_change(old: dict[str, str], new: dict[str, str]) -> StorageChange | None:
    """Exports and mounts that change on the nodes both renders have (new nodes just get
    theirs). The mounts role never unmounts: a mount gone from the spec stays, and plan says so."""
    before, after = _pool_vars(old.get(INVENTORY, "")), _pool_vars(new.get(INVENTORY, ""))
    old_nodes = inventory_nodes(old.get(INVENTORY, ""))
    staying = {
        name: node
        for name, node in inventory_nodes(new.get(INVENTORY, "")).items()
        if name in old_nodes
    }
    servers, left, mounted, unmounted = [], [], {}, {}
    for name, node in sorted(staying.items()):
        was, now = before.get(old_nodes[name].pool, {}), after.get(node.pool, {})
        exports = was.get("nfs_server_exports"), now.get("nfs_server_exports")
        if exports[0] and exports[1] and exports[0] != exports[1]:
            servers.append(name)
        elif exports[0] and not exports[1]:
            left.append(name)  # the role runs only where there are exports to serve
        added = _mount_points(now, name) - _mount_points(was, name)
        gone = _mount_points(was, name) - _mount_points(now, name)
        if added:
            mounted[name] = tuple(sorted(added))
        if gone:
            unmounted[name] = tuple(sorted(gone))
    if not (servers or left or mounted or unmounted):
        return None
    return StorageChange(tuple(servers), mounted, unmounted, tuple(left))


def _settings(conf: str) -> tuple[dict[str, str], dict[str, dict[str, str]], dict[str, str]]:
    """slurm.conf -> (Key=Value settings, node -> its attributes, partition -> its line)."""
    settings: dict[str, str] = {}
    nodes: dict[str, dict[str, str]] = {}
    partitions: dict[str, str] = {}
    for raw in conf.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or "=" not in line:
            continue
        words = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if line.startswith("NodeName="):
            names = words.pop("NodeName")
            for name in expand(names):
                nodes[name] = words
        elif line.startswith("PartitionName="):
            partitions[words["PartitionName"]] = line
        else:
            key, _, value = line.partition("=")
            settings[key] = value
    return settings, nodes, partitions


def slurm_change(old: dict[str, str], new: dict[str, str]) -> SlurmChange:
    """What the Slurm daemons must do to move from the old render's files to the new one's."""
    if SLURM_FILES[0] not in old:
        return SlurmChange("new") if SLURM_FILES[0] in new else SlurmChange("none")
    if SLURM_FILES[0] not in new:
        return SlurmChange("none")
    why: list[str] = []
    restart = False
    versions = [_group_vars(files).get("slurm_version") for files in (old, new)]
    if versions[0] != versions[1]:
        before, after = (v or "the source's newest" for v in versions)
        why.append(f"software.slurm: {before} -> {after} (the packages change: a restart)")
        restart = True
    for path in SLURM_FILES[1:]:
        if old.get(path) != new.get(path):
            why.append(f"{path.rpartition('/')[2]} changed (slurmd reads it at start)")
            restart = True
    old_set, old_nodes, old_parts = _settings(old[SLURM_FILES[0]])
    new_set, new_nodes, new_parts = _settings(new[SLURM_FILES[0]])
    for key in sorted(set(old_set) | set(new_set)):
        before, after = old_set.get(key, "(unset)"), new_set.get(key, "(unset)")
        if before != after:
            needs = key not in RECONFIGURE
            restart |= needs
            why.append(f"{key}: {before} -> {after}" + (" (needs a restart)" if needs else ""))
    joined = sorted(set(new_nodes) - set(old_nodes))
    left = sorted(set(old_nodes) - set(new_nodes))
    if joined or left:
        restart = True
        if joined:
            why.append(f"nodes added to slurm.conf: {compress(joined)} (needs a restart)")
        if left:
            why.append(f"nodes removed from slurm.conf: {compress(left)} (needs a restart)")
    changed_nodes: dict[str, list[str]] = {}
    for name in sorted(set(old_nodes) & set(new_nodes)):
        keys = {
            k
            for k in set(old_nodes[name]) | set(new_nodes[name])
            if old_nodes[name].get(k) != new_nodes[name].get(k)
        }
        for key in sorted(keys):
            changed_nodes.setdefault(key, []).append(name)
    for key, names in sorted(changed_nodes.items()):
        needs = key not in NODE_RECONFIGURE
        restart |= needs
        why.append(f"{key} of {compress(names)}" + (" (needs a restart)" if needs else ""))
    for name in sorted(set(old_parts) | set(new_parts)):
        if old_parts.get(name) != new_parts.get(name):
            what = "added" if name not in old_parts else "removed" if name not in new_parts else ""
            why.append(f"partition {name} {what or 'changed'}")
    if not why:
        return SlurmChange("none")
    return SlurmChange("restart" if restart else "reconfigure", tuple(why))


def changes(old: dict[str, str], new: dict[str, str]) -> Changes:
    """The running cluster's changes between two renders (old: {} before the first apply)."""
    before = inventory_nodes(old[INVENTORY]) if INVENTORY in old else {}
    after = inventory_nodes(new[INVENTORY]) if INVENTORY in new else {}
    return Changes(
        added=tuple(sorted(set(after) - set(before))) if before else (),
        removed=tuple(sorted(set(before) - set(after))),
        slurm=slurm_change(old, new),
        nodes={**before, **after},
        driver=driver_change(old, new) if old else None,
        storage=storage_change(old, new) if old else None,
        kubernetes=kubernetes_upgrade(old, new) if old else None,
        users=users_change(old, new) if old else None,
        accounts=accounts_change(old, new) if old else None,
    )

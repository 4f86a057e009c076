"""The scheduler's checks: Slurm (version, controllers, the settings the renderer owns) and
Kubernetes."""

from __future__ import annotations

import posixpath

from provision.spec.checks.base import Problem, port_problem
from provision.spec.models import Spec
from provision.spec.nodes import Loc, expand_nodes_checked
from provision.spec.ports import (
    SLURM_DIRECTORIES,
    daemon_directory,
    service_ports,
    system_directory,
)
from provision.spec.storage import (
    client_for,
    served_by,
    split_source,
)


def check_scheduler(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    other = "kubernetes" if spec.scheduler == "slurm" else "slurm"
    if other in spec.model_fields_set:
        problems.append(
            (
                (other,),
                f"'{other}' settings given but scheduler is '{spec.scheduler}': "
                "remove them or change the scheduler",
            )
        )
    names = {p.name: p for p in spec.pools}
    compute = [p.name for p in spec.pools if p.role == "compute"]
    seen: set[str] = set()
    for i, part in enumerate(spec.slurm.partitions):
        at: Loc = ("slurm", "partitions", i)
        if part.name in names or part.name in seen:
            what = "a pool's" if part.name in names else "another partition's"
            problems.append(((*at, "name"), f"'{part.name}' is {what} name: pick another"))
        seen.add(part.name)
        for j, pool in enumerate(part.pools):
            if pool not in compute:
                problems.append(
                    (
                        (*at, "pools", j),
                        f"'{pool}' is not a compute pool: use one of {', '.join(compute)}",
                    )
                )
            elif pool in part.pools[:j]:
                problems.append(((*at, "pools", j), f"'{pool}' is named twice"))
    dp = spec.slurm.default_partition
    if dp is not None and dp not in compute and dp not in seen:
        problems.append(
            (
                ("slurm", "default_partition"),
                f"'{dp}' is neither a compute pool nor a partition: use one of "
                + ", ".join(compute + [p.name for p in spec.slurm.partitions]),
            )
        )
    if spec.scheduler == "kubernetes":
        problems.extend(_check_kubernetes(spec))
    return problems


def _check_kubernetes(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    kube = spec.kubernetes
    heads = sum(p.size for p in spec.pools if p.role == "head")
    if kube.ha and heads < 3:
        problems.append(
            (
                ("kubernetes", "ha"),
                f"an HA control plane needs at least 3 head nodes (etcd quorum), the "
                f"spec has {heads}: raise the head pool's count or set ha: false",
            )
        )
    mgmt = spec.network.management.cidr
    if kube.ha and kube.api_address is None:
        problems.append(
            (
                ("kubernetes", "ha"),
                f"an HA control plane needs api_address: a free address in {mgmt} (keepalived "
                "moves it to a healthy head; on heads in a cloud, its load balancer takes it)",
            )
        )
    if kube.api_address is not None:
        if not kube.ha:
            problems.append(
                (
                    ("kubernetes", "api_address"),
                    "api_address is the HA control plane's virtual address: set ha: true, or "
                    "remove it (the API is then the first head's own address)",
                )
            )
        elif kube.api_address not in mgmt or kube.api_address in (
            mgmt.network_address,
            mgmt.broadcast_address,
        ):
            problems.append(
                (
                    ("kubernetes", "api_address"),
                    f"{kube.api_address} is not a host address of the management network {mgmt}",
                )
            )
    return problems


# The Slurm series each OS's own archive carries (stable releases keep their series); Rocky 9's
# comes from EPEL, which moves on, so the slurm role checks it on the node instead
SLURM_SERIES = {"debian12": "22.05", "ubuntu22.04": "21.08", "ubuntu24.04": "23.11"}


def check_slurm_version(spec: Spec) -> list[Problem]:
    version, series = spec.software.slurm, SLURM_SERIES.get(spec.os)
    if version is None or series is None:
        return []
    if version == series or version.startswith(f"{series}."):
        return []
    return [
        (
            ("software", "slurm"),
            f"'{version}': {spec.os}'s Slurm packages are {series}, the only series the slurm "
            f"role installs there; pin {series} (or one of its releases, like {series}.1) or "
            "leave software.slurm out",
        )
    ]


def check_controllers(spec: Spec) -> list[Problem]:
    """Two or more heads run a primary and backup slurmctld: the controller's state must be on
    storage every head mounts, served by none of them (it would fail with its server)."""
    for i, pool in enumerate(spec.pools):
        if pool.role != "head" or pool.size < 2 or spec.scheduler != "slurm":
            continue
        state = str(spec.slurm.config.get("StateSaveLocation", ""))
        shared = [
            m
            for m in spec.storage.mounts
            if (m.pools is None or pool.name in m.pools)
            and state.startswith(m.path.rstrip("/") + "/")
        ]
        at: Loc = (
            ("slurm", "config", "StateSaveLocation")
            if state
            else ("pools", i, "hosts" if pool.hosts is not None else "count")
        )
        if not shared:
            return [
                (
                    at,
                    f"{pool.size} head nodes run a primary and a backup slurmctld, which share "
                    "their state: set slurm.config StateSaveLocation under a path of "
                    "storage.mounts that every head mounts (like /shared/slurm/state under a "
                    "mount at /shared/slurm)",
                )
            ]
        nodes, _ = expand_nodes_checked(spec)
        heads = {n.name for n in nodes if n.pool == pool.name}
        served = served_by(spec, nodes, shared[0])
        server = served.node.name if served else split_source(shared[0])[0]
        if server in heads:
            return [
                (
                    at,
                    f"StateSaveLocation is on {shared[0].source}, served by head {server}: the "
                    "backup controller could not read it once that head is down; mount it from "
                    "storage outside the head pool",
                )
            ]
        if served is not None and served.export is not None:
            client = client_for(spec, nodes, served.export, pool.name)
            if client is not None and client.squash != "none":
                return [
                    (
                        at,
                        f"StateSaveLocation is on {shared[0].source}, whose export squashes the "
                        f"heads' root ({client.squash}): the slurm role makes the directory as "
                        "root and gives it to slurm; give the head pool's client entry in "
                        f"storage.exports[{served.index}] squash: none",
                    )
                ]
    return []


# slurm.conf keys the renderer owns: the pools and the cluster write them
_SLURM_RENDERED = {
    key.lower(): why
    for keys, why in (
        (
            ("NodeName", "PartitionName", "NodeSet", "DownNodes", "FrontendName", "Include",
             "SlurmctldHost", "ControlMachine", "ControlAddr", "BackupController", "BackupAddr",
             "ClusterName", "AccountingStorageHost"),
            "is rendered from the spec's name and pools: change those instead",
        ),
        (
            ("AuthType", "CredType", "SlurmUser"),
            "is what the cluster is built on (munge, the slurm user): it cannot be changed",
        ),
        (
            ("AccountingStoragePort", "SrunPortRange"),
            "not supported yet: slurmdbd listens on 6819; srun's ports are slurm.srun_port_range",
        ),
    )
    for key in keys
}  # fmt: skip


def check_slurm_config(spec: Spec) -> list[Problem]:
    """slurm.config may tune Slurm, not rebuild what the renderer and the roles rely on."""
    problems: list[Problem] = []
    config = spec.slurm.config
    # Slurm reads keys in any case; the ports, the firewall and the role read them as written
    canonical = {k.lower(): k for k in (*SLURM_DIRECTORIES, "SlurmctldPort", "SlurmdPort")}
    for key, value in config.items():
        at: Loc = ("slurm", "config", key)
        if key.lower() in _SLURM_RENDERED:
            problems.append((at, f"{key} {_SLURM_RENDERED[key.lower()]}"))
        elif key.lower() in canonical and key != canonical[key.lower()]:
            problems.append((at, f"write it as {canonical[key.lower()]}"))
        elif key in SLURM_DIRECTORIES:
            text = str(value)
            if not text.startswith("/") or posixpath.normpath(text) != text:
                problems.append((at, f"{text!r} must be an absolute, normalised path"))
                continue
            directory = daemon_directory(key, text)
            if system_directory(directory):
                default = daemon_directory(key, SLURM_DIRECTORIES[key])
                problems.append(
                    (
                        at,
                        f"{directory} is a system directory the slurm role would give to the "
                        f"slurm user: use a directory of its own, like {default}",
                    )
                )
        elif key == "SlurmctldPort":
            problems.extend(port_problem(at, value, ranges=True))
        elif key == "SlurmdPort":
            problems.extend(port_problem(at, value, ranges=False))
    ports = service_ports(spec)
    if ports.ssh in (ports.slurmctld_first, ports.slurmd):
        problems.append((("ssh", "port"), f"port {ports.ssh} is also a Slurm daemon's port"))
    return problems

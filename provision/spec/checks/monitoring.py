"""The monitoring and health checks: receivers, Grafana, the health checks and DCGM's
diagnostics."""

from __future__ import annotations

from provision.parsers.dcgm import DIAG_TIMEOUT_S, LONG_DIAG_FROM
from provision.spec.checks.base import Problem
from provision.spec.checks.gpu import gpu_pools
from provision.spec.models import Health, Spec
from provision.spec.nodes import Loc
from provision.spec.ports import (
    HEALTH_KEYS,
    service_ports,
    system_directory,
)


def check_monitoring(spec: Spec) -> list[Problem]:
    monitoring = spec.monitoring
    if monitoring is None:
        return []
    problems: list[Problem] = []
    pools = {p.name: p for p in spec.pools}
    if monitoring.pool is not None:
        at: Loc = ("monitoring", "pool")
        pool = pools.get(monitoring.pool)
        if pool is None:
            problems.append((at, f"no pool named '{monitoring.pool}'"))
        elif pool.elastic:
            problems.append(
                (at, f"'{pool.name}' is elastic: its nodes come and go; name a lasting pool")
            )
        elif pool.role in ("compute", "login"):
            who = "jobs run" if pool.role == "compute" else "users log in"
            problems.append(
                (
                    at,
                    f"'{pool.name}' is a {pool.role} pool, where {who}: they would reach "
                    "Prometheus and Alertmanager on its loopback (and could silence the "
                    "cluster's alerts); name a head or storage pool, or leave pool unset",
                )
            )
    ports = service_ports(spec)
    taken = {
        ports.ssh: "SSH",
        ports.slurmd: "slurmd",
        ports.slurmdbd: "slurmdbd",
        ports.mariadb: "MariaDB",
        ports.nfs: "NFS",
        str(spec.nvidia.dcgm_exporter_port): "the DCGM exporter",
    }
    low, _, high = ports.slurmctld.partition("-")
    for number in range(int(low), int(high or low) + 1):
        taken[str(number)] = "slurmctld"
    for field in ("prometheus_port", "alertmanager_port", "node_exporter_port"):
        port = str(getattr(monitoring, field))
        if port in taken:
            problems.append((("monitoring", field), f"port {port} is also {taken[port]}'s port"))
        taken[port] = field.removesuffix("_port").replace("_", " ")
    if monitoring.grafana is not None:
        port = str(monitoring.grafana.port)
        if port in taken:
            problems.append(
                (("monitoring", "grafana", "port"), f"port {port} is also {taken[port]}'s port")
            )
    if system_directory(monitoring.storage_path):
        problems.append(
            (
                ("monitoring", "storage_path"),
                f"{monitoring.storage_path} is a system directory Prometheus would own: use one "
                "of its own, like /var/lib/prometheus/metrics2",
            )
        )
    seen: set[str] = set()
    for i, receiver in enumerate(monitoring.receivers):
        at = ("monitoring", "receivers", i)
        if receiver.name in seen:
            problems.append(((*at, "name"), f"a second receiver '{receiver.name}'"))
        seen.add(receiver.name)
        if (receiver.webhook is None) == (receiver.email is None):
            problems.append(
                (at, "give the receiver either 'webhook' or 'email', not both or neither")
            )
        email = receiver.email
        if email is not None and (email.username is None) != (email.password_file is None):
            given = "username" if email.username is not None else "password_file"
            problems.append(
                (
                    (*at, "email", given),
                    "the relay's login needs both 'username' and 'password_file'",
                )
            )
    return problems


def check_health(spec: Spec) -> list[Problem]:
    health = spec.health
    if health is None:
        return []
    problems: list[Problem] = []
    if spec.scheduler != "slurm":
        problems.append((("health",), "health checks run under Slurm: use scheduler: slurm"))
    for key in HEALTH_KEYS:
        if key in spec.slurm.config:
            problems.append(
                (
                    ("slurm", "config", key),
                    f"{key} is set by health: leave it out, or leave health out to run your own",
                )
            )
    if health.prolog and "Prolog" in spec.slurm.config and gpu_pools(spec):
        problems.append(
            (
                ("slurm", "config", "Prolog"),
                "Prolog is set by health (its checks before every job on GPU nodes): leave "
                "it out, or set health.prolog: false",
            )
        )
    seen: set[str] = set()
    for i, disk in enumerate(health.disks):
        if disk.path in seen:
            problems.append((("health", "disks", i, "path"), f"{disk.path} is given twice"))
        seen.add(disk.path)
    return problems + _check_dcgm_diag(spec, health)


def _check_dcgm_diag(spec: Spec, health: Health) -> list[Problem]:
    diag = health.dcgm_diag
    if diag is None:
        return []
    at: Loc = ("health", "dcgm_diag")
    if not gpu_pools(spec):
        return [(at, "no pool has GPUs: DCGM's diagnostics have nothing to test")]
    if not spec.nvidia.dcgm:
        return [(at, "DCGM's diagnostics need DCGM: set nvidia.dcgm: true")]
    problems: list[Problem] = []
    if diag.when == "prolog":
        if diag.level == 3:
            problems.append(
                (
                    (*at, "level"),
                    "level 3 runs for about half an hour: not before every job; run it by hand "
                    "in a maintenance reservation, or use level 2",
                )
            )
        if not health.prolog:
            problems.append(((*at, "when"), "health.prolog is false: no prolog runs it"))
        if diag.every is not None:
            problems.append(((*at, "every"), "'every' is for when: periodic"))
    elif diag.every is not None and diag.every < health.interval:
        problems.append(
            ((*at, "every"), f"{diag.every} s is shorter than health.interval ({health.interval})")
        )
    elif (
        diag.level >= LONG_DIAG_FROM
        and diag.every is not None
        and diag.every < 10 * DIAG_TIMEOUT_S[diag.level]
    ):
        # the node is held while it runs: at most a tenth of its time goes to the diagnostic
        least = 10 * DIAG_TIMEOUT_S[diag.level]
        problems.append(
            (
                (*at, "every"),
                f"{diag.every} s: a level {diag.level} diagnostic holds the node for up to "
                f"{DIAG_TIMEOUT_S[diag.level]} s; run it at most every {least} s",
            )
        )
    return problems

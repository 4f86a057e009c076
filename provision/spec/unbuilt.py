"""Spec fields the schema accepts whose feature nothing builds yet: each is refused with "not
supported yet", naming what to do instead. The change that builds a feature removes its entry.

Tests of the parts already written for those features (the elastic pools' slurm.conf lines, the
Kubernetes firewall rules) load their specs with `load_spec(path, unbuilt=True)`; the command
line never does.
"""

from __future__ import annotations

from provision.spec.models import CLOUD_PROVIDERS, Spec
from provision.spec.nodes import Loc

Problem = tuple[Loc, str]


# The Alertmanager each OS ships (Debian 12: 0.25; Ubuntu 22.04: 0.23; Ubuntu 24.04: 0.26): a
# relay's password is read from a file (auth_password_file) from 0.25 on; before, only inline.
ALERTMANAGER = {"debian12": (0, 25), "ubuntu22.04": (0, 23), "ubuntu24.04": (0, 26)}
PASSWORD_FILE_SINCE = (0, 25)


def check_unbuilt(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    shipped = ALERTMANAGER.get(spec.os)
    receivers = spec.monitoring.receivers if spec.monitoring is not None else []
    for i, receiver in enumerate(receivers):
        if shipped and shipped < PASSWORD_FILE_SINCE and receiver.email and receiver.email.username:
            problems.append(
                (
                    ("monitoring", "receivers", i, "email", "username"),
                    f"not supported yet: a mail relay login on {spec.os} (its Alertmanager "
                    f"{'.'.join(map(str, shipped))} takes the password only inside "
                    "alertmanager.yml, which holds no secret; auth_password_file came in 0.25): "
                    "a relay that takes the cluster's mail without a login, or a webhook",
                )
            )
    problems.extend(_cloud_heads(spec))
    if spec.identity is not None:
        problems.extend(
            (
                ("pools", i, "elastic"),
                "elastic pools with a directory (identity): not supported yet (a burst node "
                "joins from its image, which must not hold the bind password, and would not "
                "know the directory's users)",
            )
            for i, pool in enumerate(spec.pools)
            if pool.elastic
        )
    if spec.scheduler == "kubernetes":
        problems.extend(_kubernetes(spec))
    if spec.converge.mode == "pull":
        problems.extend(pull_problems(spec))
    if spec.monitoring is not None and spec.os == "rocky9":
        problems.append(
            (
                ("monitoring",),
                "not supported yet: monitoring on rocky9 (Prometheus comes from Debian's and "
                "Ubuntu's packages; Rocky has none); leave monitoring out",
            )
        )
    return problems


# the Python each OS ships: pull mode runs Ansible 2.19 on the nodes, which needs 3.11
PYTHON = {"debian12": (3, 11), "ubuntu22.04": (3, 10), "ubuntu24.04": (3, 12), "rocky9": (3, 9)}
PULL_PYTHON = (3, 11)


def pull_problems(spec: Spec) -> list[Problem]:
    """Why the nodes cannot converge themselves (converge.mode pull), if they cannot."""
    problems: list[Problem] = []
    if spec.scheduler == "kubernetes":
        problems.append(
            (
                ("converge", "mode"),
                "not supported yet: pull with Kubernetes (a worker's join needs the control "
                "plane's token, which only a run that reaches both has); use push",
            )
        )
    if PYTHON[spec.os] < PULL_PYTHON:
        problems.append(
            (
                ("converge", "mode"),
                f"not supported yet: pull on {spec.os} (its Python "
                f"{'.'.join(map(str, PYTHON[spec.os]))} is older than the 3.11 Ansible needs on "
                "the nodes); use push",
            )
        )
    return problems


def _kubernetes(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    if spec.os == "rocky9":
        problems.append(
            (
                ("os",),
                "not supported yet: Kubernetes on rocky9 (containerd comes from Debian's and "
                "Ubuntu's packages; Rocky has none); use debian12, ubuntu22.04 or ubuntu24.04",
            )
        )
    return problems


def _cloud_heads(spec: Spec) -> list[Problem]:
    """Heads in a cloud: the whole cluster in that cloud, its network the management network.
    Pools elsewhere would reach the heads through the tunnel, whose hub is a head: a cloud
    head's public address exists only once its instance does, and nothing names it yet."""
    home = next((p.provider for p in spec.pools if p.role == "head"), None)
    if home not in CLOUD_PROVIDERS:
        return []
    why = (
        f"not supported yet: with the heads on {home}, " + "{what} (the tunnel's hub is a head, "
        "and a cloud head's public address is not known before its instance exists); "
        f"put every pool on {home}, or the heads on premises"
    )
    problems: list[Problem] = [
        (("pools", i, "provider"), why.format(what=f"a pool on {p.provider}"))
        for i, p in enumerate(spec.pools)
        if p.provider != home
    ]
    if spec.network.remote:
        problems.append((("network", "remote"), why.format(what="remote networks")))
    return problems

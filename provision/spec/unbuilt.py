"""Spec fields the schema accepts whose feature nothing builds yet: each is refused with "not
supported yet", naming what to do instead. The change that builds a feature removes its entry.

Tests of the parts already written for those features (the elastic pools' slurm.conf lines, the
Kubernetes firewall rules) load their specs with `load_spec(path, unbuilt=True)`; the command
line never does.
"""

from __future__ import annotations

from provision.spec.models import Spec
from provision.spec.nodes import Loc

Problem = tuple[Loc, str]


def check_unbuilt(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    if spec.scheduler == "kubernetes":
        problems.append(
            (
                ("scheduler",),
                "not supported yet: scheduler 'kubernetes' (nothing installs Kubernetes); "
                "use scheduler: slurm",
            )
        )
    for i, pool in enumerate(spec.pools):
        if pool.elastic and pool.provider != "lab":
            problems.append(
                (
                    ("pools", i, "elastic"),
                    f"not supported yet: elastic {pool.provider} pools (a new cloud instance "
                    "cannot join the cluster by itself yet); leave elastic out and size the "
                    "pool with count",
                )
            )
        if pool.role == "head" and spec.scheduler == "slurm" and pool.size > 1:
            problems.append(
                (
                    ("pools", i, "hosts" if pool.hosts is not None else "count"),
                    f"not supported yet: {pool.size} head nodes (a backup controller needs a "
                    "StateSaveLocation both heads share); give the head pool one node",
                )
            )
    if spec.software.slurm is not None:
        problems.append(
            (
                ("software", "slurm"),
                "not supported yet: a pinned Slurm version (the slurm role installs the Slurm "
                "packages of the OS); leave software.slurm out",
            )
        )
    for i in range(len(spec.storage.exports)):
        problems.append(
            (
                ("storage", "exports", i),
                "not supported yet: NFS exports (nothing serves them); serve the directory "
                "outside provision and leave storage.exports out",
            )
        )
    for i in range(len(spec.storage.mounts)):
        problems.append(
            (
                ("storage", "mounts", i),
                "not supported yet: NFS mounts (nothing mounts them); mount it outside provision "
                "and leave storage.mounts out",
            )
        )
    return problems

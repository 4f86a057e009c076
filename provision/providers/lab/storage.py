"""The spec's storage on a lab: NFS cannot be mounted inside these containers (no kernel NFS
client or server in a rootful podman container here), so each exported or mounted directory is
a podman volume, mounted into every node that serves or mounts it. Files written on one node
are seen on the others, as on NFS; what NFS adds (its daemons, exports' access lists, mount
options) is not exercised. Plan and README say so.

One volume per served directory: an export is one per node of its pool (each node serves its
own directory, as NFS servers do), named by that node and path; a mount of `node:/path` uses
that node's volume, and a mount from a server outside the spec (a site's filer) gets one
volume of its own, shared by every node that mounts it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from provision.cluster import Cluster


@dataclass(frozen=True)
class Volume:
    name: str  # the podman volume
    source: str  # server:/path, what it stands for
    path: str  # where it is mounted in the node


def volume_name(cluster: str, source: str) -> str:
    """provision-<cluster>-<server-and-path>-<hash>: readable, and distinct per source."""
    slug = re.sub(r"[^a-z0-9]+", "-", source.lower()).strip("-")[:40]
    digest = hashlib.sha256(source.encode()).hexdigest()[:6]
    return f"provision-{cluster}-{slug}-{digest}"


def lab_volumes(cluster: Cluster) -> dict[str, list[Volume]]:
    """Node -> the volumes it mounts, for the lasting nodes of lab pools."""
    spec = cluster.spec
    by_pool: dict[str, list[str]] = {}
    for n in cluster.lasting_nodes:
        by_pool.setdefault(n.pool, []).append(n.name)
    found: dict[str, list[Volume]] = {}

    def add(node: str, source: str, path: str) -> None:
        volume = Volume(volume_name(spec.name, source), source, path)
        if volume not in found.setdefault(node, []):
            found[node].append(volume)

    for export in spec.storage.exports:
        for node in by_pool.get(export.pool, []):
            add(node, f"{node}:{export.path}", export.path)
    for mount in spec.storage.mounts:
        pools = mount.pools if mount.pools is not None else list(by_pool)
        for pool in pools:
            for node in by_pool.get(pool, []):
                add(node, mount.source, mount.path)
    lab = {p.name for p in spec.pools if p.provider == "lab"}
    keep = {n.name for n in cluster.lasting_nodes if n.pool in lab}
    return {node: volumes for node, volumes in found.items() if node in keep}

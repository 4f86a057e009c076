"""The spec's storage on a lab: NFS cannot be mounted inside these containers (no kernel NFS
client or server in a rootful podman container here), so each exported or mounted directory is
a podman volume, mounted into every node that serves or mounts it. Files written on one node
are seen on the others, as on NFS, and a client an export admits read-only mounts it read-only;
what NFS adds beyond that (its daemons, root squash, mount options) is not exercised here (the
nfs_server role runs live in its Molecule scenario, and a kernel NFS client under root squash in
tests/integration/test_vm_storage.py, on VMs). Plan and docs/ha-and-storage.md say so.

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
from provision.spec.storage import client_for, served_by, split_source


@dataclass(frozen=True)
class Volume:
    name: str  # the podman volume
    source: str  # server:/path, what it stands for
    path: str  # where it is mounted in the node
    readonly: bool = False  # a client the export admits read-only


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

    def add(node: str, source: str, path: str, readonly: bool = False) -> None:
        volume = Volume(volume_name(spec.name, source), source, path, readonly)
        have = found.setdefault(node, [])
        same = next((v for v in have if (v.name, v.path) == (volume.name, volume.path)), None)
        if same is None:
            have.append(volume)
        elif same.readonly and not readonly:  # served here, or admitted read-write too
            have[have.index(same)] = volume

    for export in spec.storage.exports:
        for node in by_pool.get(export.pool, []):
            add(node, f"{node}:{export.path}", export.path)
    for mount in spec.storage.mounts:
        served = served_by(spec, cluster.nodes, mount)
        source = mount.source
        if served is not None:  # by the node's name, whatever the spec wrote (address, FQDN)
            source = f"{served.node.name}:{split_source(mount)[1]}"
        pools = mount.pools if mount.pools is not None else list(by_pool)
        for pool in pools:
            client = (
                client_for(spec, cluster.nodes, served.export, pool)
                if served is not None and served.export is not None
                else None
            )
            for node in by_pool.get(pool, []):
                add(node, source, mount.path, client is not None and client.access == "ro")
    lab = {p.name for p in spec.pools if p.provider == "lab"}
    keep = {n.name for n in cluster.lasting_nodes if n.pool in lab}
    return {node: volumes for node, volumes in found.items() if node in keep}

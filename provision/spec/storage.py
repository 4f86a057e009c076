"""What the spec's storage means node by node: which node serves a mount, who an export's
clients are (as addresses and networks), and the problems that would only show on the nodes
(a mount of a directory nobody exports, a pool mounting an export that refuses it).

The checks and the renderer both read storage through here, so what validate accepts is what
the nfs_server and mounts roles are given.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from provision.spec.models import Export, ExportClient, Mount, Spec
from provision.spec.nodes import Loc, Node

Problem = tuple[Loc, str]

# Lustre: 'nid[,nid][:nid[,nid]]:/fsname', an MGS NID being address@network (10.0.0.5@tcp,
# mgs1@o2ib); a file system name is 1-8 letters, digits, '_' or '-'
_LUSTRE = re.compile(
    r"[A-Za-z0-9.-]+@[a-z0-9]+(,[A-Za-z0-9.-]+@[a-z0-9]+)*"
    r"(:[A-Za-z0-9.-]+@[a-z0-9]+(,[A-Za-z0-9.-]+@[a-z0-9]+)*)*:/[A-Za-z0-9_-]{1,8}"
)
_NFS_SERVER = re.compile(r"[A-Za-z0-9.-]{1,253}")


# where useradd puts a user's home (HOME in /etc/default/useradd on every OS we support)
HOMES = "/home"


def holds_homes(path: str) -> bool:
    """A mount at `path` holds the users' homes: it is /home, or a directory above it."""
    return posixpath.commonpath([path, HOMES]) == path


def shared_home_mounts(spec: Spec, pool: str | None = None) -> list[Mount]:
    """The storage mounts that hold the users' homes (of `pool`, or of any pool)."""
    return [
        m
        for m in spec.storage.mounts
        if holds_homes(m.path) and (pool is None or m.pools is None or pool in m.pools)
    ]


@dataclass(frozen=True)
class Served:
    """A mount whose server is a node of this cluster, and the export that serves it."""

    node: Node
    index: int  # in spec.storage.exports; -1: the node exports nothing holding the path
    export: Export | None


@dataclass(frozen=True)
class Client:
    """One client entry as the server sees it: the addresses or networks it matches."""

    matches: tuple[str, ...]
    access: str
    squash: str


def split_source(mount: Mount) -> tuple[str, str]:
    server, _, remote = mount.source.rpartition(":/")
    return server, "/" + remote


def served_by(spec: Spec, nodes: list[Node], mount: Mount) -> Served | None:
    """The node and export a mount reads, where its server is a node of this cluster (by name,
    full name or address); None for a site's own server (a filer, a Lustre MGS)."""
    if mount.fstype == "lustre":
        return None
    server, remote = split_source(mount)
    domain = spec.network.management.domain
    for node in nodes:
        names = {node.name, f"{node.name}.{domain}" if domain else node.name}
        if node.address is not None:
            names.add(str(node.address))
        if server not in names:
            continue
        for i, export in enumerate(spec.storage.exports):
            if export.pool == node.pool and _under(remote, export.path):
                return Served(node, i, export)
        return Served(node, -1, None)
    return None


def _under(path: str, top: str) -> bool:
    path, top = posixpath.normpath(path), posixpath.normpath(top)
    return path == top or path.startswith(top.rstrip("/") + "/")


def export_clients(spec: Spec, nodes: list[Node], export: Export) -> list[Client]:
    """The export's clients as addresses and networks; unset: the management network, rw."""
    if not export.clients:
        return [Client((str(spec.network.management.cidr),), "rw", "root")]
    out = []
    for client in export.clients:
        if client.network is not None:
            matches: tuple[str, ...] = (str(client.network),)
        else:
            pools = set(client.pools or [])
            matches = tuple(
                str(n.address)
                for n in nodes
                if n.pool in pools and n.address is not None and not n.elastic
            )
        out.append(Client(matches, client.access, client.squash))
    return out


def client_for(spec: Spec, nodes: list[Node], export: Export, pool: str) -> ExportClient | None:
    """The first client entry of an export that admits every node of a pool (None: refused)."""
    if not export.clients:
        return ExportClient(network=spec.network.management.cidr)
    members = [n for n in nodes if n.pool == pool]
    for client in export.clients:
        if client.pools is not None and pool in client.pools:
            return client
        if (
            client.network is not None
            and members
            and all(n.address is not None and n.address in client.network for n in members)
        ):
            return client
    return None


def check_storage_nodes(spec: Spec, nodes: list[Node]) -> list[Problem]:
    """What the nodes would fail at: sources of the wrong form, mounts of directories the
    server does not export or exports to others, exports to pools without addresses."""
    problems: list[Problem] = []
    roles = {p.name: p.role for p in spec.pools}
    for i, export in enumerate(spec.storage.exports):
        for j, client in enumerate(export.clients):
            for k, pool in enumerate(client.pools or []):
                at: Loc = ("storage", "exports", i, "clients", j, "pools", k)
                if pool not in roles:
                    problems.append((at, f"no pool named '{pool}'"))
                elif any(n.address is None for n in nodes if n.pool == pool and not n.elastic):
                    problems.append(
                        (
                            at,
                            f"pool '{pool}' has nodes without a known address, which an "
                            "export's client list needs: give the pool's hosts addresses "
                            "(or first_address), or name a network instead of pools",
                        )
                    )
                elif any(n.elastic for n in nodes if n.pool == pool):
                    problems.append(
                        (
                            at,
                            f"pool '{pool}' is elastic: its nodes' addresses are not known "
                            "when the export is written; name their network instead of pools",
                        )
                    )
        for j, other in enumerate(spec.storage.exports[:i]):
            if other.pool == export.pool and (
                _under(export.path, other.path) or _under(other.path, export.path)
            ):
                problems.append(
                    (
                        ("storage", "exports", i, "path"),
                        f"{export.path} and storage.exports[{j}]'s {other.path} are one tree "
                        f"on pool '{export.pool}': export the top directory once",
                    )
                )
    for i, mount in enumerate(spec.storage.mounts):
        at = ("storage", "mounts", i, "source")
        if mount.fstype == "lustre":
            if not _LUSTRE.fullmatch(mount.source):
                problems.append(
                    (
                        at,
                        f"'{mount.source}' is not a Lustre source: write the MGS NIDs, then "
                        "':/' and the file system name, like 10.0.0.5@tcp:/scratch",
                    )
                )
            continue
        server, remote = split_source(mount)
        if not _NFS_SERVER.fullmatch(server):
            problems.append(
                (at, f"'{mount.source}' should be 'server:/path' (a node name or address)")
            )
            continue
        served = served_by(spec, nodes, mount)
        if served is None:
            continue
        if served.export is None:
            exported = [e.path for e in spec.storage.exports if e.pool == served.node.pool]
            said = f" (it exports {', '.join(exported)})" if exported else ""
            problems.append(
                (
                    at,
                    f"{served.node.name} exports nothing holding {remote}{said}: add it to "
                    f"storage.exports for pool '{served.node.pool}'",
                )
            )
            continue
        for pool in mount.pools if mount.pools is not None else list(roles):
            if pool not in roles:
                continue  # said by _check_storage
            members = [n.name for n in nodes if n.pool == pool]
            if mount.path == remote and members == [served.node.name]:
                continue  # the server has the directory itself (the mounts role skips it)
            if client_for(spec, nodes, served.export, pool) is None:
                problems.append(
                    (
                        ("storage", "mounts", i, "pools" if mount.pools is not None else "source"),
                        f"pool '{pool}' mounts {mount.source}, but storage.exports"
                        f"[{served.index}].clients does not admit it: add the pool there",
                    )
                )
    return problems

"""The WireGuard path between the management network and the remote networks (network.remote).

The first head is the hub: it listens on network.tunnel.port, knows each remote node by its key
and its one address, and routes the remote ranges into the tunnel. A remote node (a spoke) dials
the hub (network.tunnel.endpoint; NAT on the way is fine, it keeps the path open) and routes the
management range and the other remote ranges through it. The other nodes on the management
network reach remote nodes through the hub. Keys are made by apply in the state directory
(lifecycle.py); only public keys reach another node.
"""

from __future__ import annotations

from dataclasses import dataclass

from provision.burst.config import TUNNEL_INTERFACE
from provision.cluster import Cluster
from provision.spec.nodes import Node

INTERFACE = TUNNEL_INTERFACE


@dataclass(frozen=True)
class TunnelLayout:
    hub: Node
    endpoint: str  # host:port the spokes dial
    port: int
    spokes: tuple[Node, ...]  # each remote node
    routed: tuple[Node, ...]  # nodes on the management network other than the hub
    # each node of a remote elastic pool: a peer of the hub from its resume to its suspend
    # (burst/tunnel.py), its key made by apply for its name
    bursting: tuple[Node, ...] = ()


def tunnel_layout(cluster: Cluster) -> TunnelLayout | None:
    """The tunnel's members, or None without remote networks (or before the hub exists)."""
    spec = cluster.spec
    if not spec.network.remote or not cluster.head_nodes:
        return None
    hub = cluster.head_nodes[0]
    tunnel = spec.network.tunnel
    host = tunnel.endpoint or (str(hub.address) if hub.address is not None else hub.name)
    spokes = []
    routed = []
    bursting = []
    for view in cluster.pools:
        network = view.pool.network
        for node in view.nodes:
            if node.elastic:
                if network is not None:
                    bursting.append(node)
                continue
            if network is not None:
                if node.address is not None:  # a cloud node has one once it exists
                    spokes.append(node)
            elif node.name != hub.name:
                routed.append(node)
    return TunnelLayout(
        hub, f"{host}:{tunnel.port}", tunnel.port, tuple(spokes), tuple(routed), tuple(bursting),
    )  # fmt: skip


def far_ranges(cluster: Cluster, network: str | None) -> list[str]:
    """The ranges on the tunnel's other side, seen from a node on `network` (a remote network's
    name; None: the management network's): what it sends into the tunnel, and what its firewall
    takes from the tunnel only."""
    spec = cluster.spec
    own = next((str(r.cidr) for r in spec.network.remote if r.name == network), None)
    remote = [str(r.cidr) for r in spec.network.remote]
    if own is None:
        return remote
    return [str(spec.network.management.cidr), *(r for r in remote if r != own)]


def members(cluster: Cluster) -> list[str]:
    """The nodes that hold a WireGuard key: the hub and every remote node, burst nodes too
    (their names are known before any exists)."""
    shape = tunnel_layout(cluster)
    if shape is None:
        return []
    return [shape.hub.name, *(node.name for node in (*shape.spokes, *shape.bursting))]


def tunnel_host_vars(cluster: Cluster) -> dict[str, dict[str, object]]:
    """Each node's tunnel variables (the tunnel role), by node name."""
    shape = tunnel_layout(cluster)
    if shape is None:
        return {}
    pool_network = {p.name: p.network for p in cluster.spec.pools}
    out: dict[str, dict[str, object]] = {
        shape.hub.name: {
            "tunnel_role": "hub",
            "tunnel_port": shape.port,
            "tunnel_address": shape.hub.reach,
            "tunnel_routes": far_ranges(cluster, None),
            "tunnel_peers": [{"name": node.name, "address": node.reach} for node in shape.spokes],
            # the other nodes on the management network reach remote nodes through the hub
            "tunnel_forward": bool(shape.routed),
            # burst nodes: their public keys for the burst programs, which add each one's peer
            "tunnel_burst_peers": [node.name for node in shape.bursting],
        }
    }
    for node in shape.spokes:
        out[node.name] = {
            "tunnel_role": "spoke",
            "tunnel_address": node.reach,
            "tunnel_hub": shape.hub.name,
            "tunnel_endpoint": shape.endpoint,
            "tunnel_routes": far_ranges(cluster, pool_network[node.pool]),
        }
    if shape.hub.address is not None:
        for node in shape.routed:
            out[node.name] = {
                "tunnel_role": "routed",
                "tunnel_via": str(shape.hub.address),
                "tunnel_routes": far_ranges(cluster, None),
            }
    return out

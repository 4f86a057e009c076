"""The WireGuard path between the management network and the remote networks (network.remote).

The first head is the hub: it listens on network.tunnel.port, knows each remote node by its key
and its one address, and routes the remote ranges into the tunnel. A remote node (a spoke) dials
the hub (network.tunnel.endpoint; NAT on the way is fine, it keeps the path open) and routes the
management range and the other remote ranges through it. The other nodes on the management
network reach remote nodes through the hub. Keys are made by apply in the state directory
(lifecycle.py); only public keys reach another node.

With two heads each is a hub with the same peers, and each routes the remote ranges into its
own tunnel: a spoke dials both (network.tunnel.endpoints) and sends the second head its own
address alone (WireGuard's most specific allowed range wins), so the second head's slurmctld
reaches every remote node and is reached by it whether or not the first head is up. The other
nodes on the management network keep reaching remote nodes through the first head.
"""

from __future__ import annotations

from dataclasses import dataclass

from provision.burst.config import TUNNEL_INTERFACE
from provision.cluster import Cluster
from provision.spec.nodes import Node

INTERFACE = TUNNEL_INTERFACE


@dataclass(frozen=True)
class TunnelLayout:
    hubs: tuple[Node, ...]  # every head, the first first
    endpoints: tuple[str, ...]  # host:port the spokes dial, one per hub
    port: int
    spokes: tuple[Node, ...]  # each remote node
    routed: tuple[Node, ...]  # nodes on the management network other than the hubs
    # each node of a remote elastic pool: a peer of the hubs from its resume to its suspend
    # (burst/tunnel.py), its key made by apply for its name
    bursting: tuple[Node, ...] = ()

    @property
    def hub(self) -> Node:
        """The first head: the hub that carries the spokes' traffic to the cluster."""
        return self.hubs[0]

    @property
    def endpoint(self) -> str:
        return self.endpoints[0]


def tunnel_layout(cluster: Cluster) -> TunnelLayout | None:
    """The tunnel's members, or None without remote networks (or before the hub exists)."""
    spec = cluster.spec
    if not spec.network.remote or not cluster.head_nodes:
        return None
    hubs = tuple(cluster.head_nodes)
    tunnel = spec.network.tunnel
    hosts = list(tunnel.endpoints) or [
        str(head.address) if head.address is not None else head.name for head in hubs
    ]
    if tunnel.endpoint:
        hosts[0] = tunnel.endpoint
    hub_names = {head.name for head in hubs}
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
            elif node.name not in hub_names:
                routed.append(node)
    return TunnelLayout(
        hubs,
        tuple(f"{host}:{tunnel.port}" for host in hosts),
        tunnel.port,
        tuple(spokes),
        tuple(routed),
        tuple(bursting),
    )


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
    """The nodes that hold a WireGuard key: the hubs and every remote node, burst nodes too
    (their names are known before any exists)."""
    shape = tunnel_layout(cluster)
    if shape is None:
        return []
    return [*(h.name for h in shape.hubs), *(n.name for n in (*shape.spokes, *shape.bursting))]


def tunnel_host_vars(cluster: Cluster) -> dict[str, dict[str, object]]:
    """Each node's tunnel variables (the tunnel role), by node name."""
    shape = tunnel_layout(cluster)
    if shape is None:
        return {}
    pool_network = {p.name: p.network for p in cluster.spec.pools}
    out: dict[str, dict[str, object]] = {}
    for n, hub in enumerate(shape.hubs):
        out[hub.name] = {
            "tunnel_role": "hub",
            "tunnel_port": shape.port,
            "tunnel_address": hub.reach,
            "tunnel_routes": far_ranges(cluster, None),
            "tunnel_peers": [{"name": node.name, "address": node.reach} for node in shape.spokes],
            # the other nodes on the management network reach remote nodes through the first
            "tunnel_forward": n == 0 and bool(shape.routed),
            # burst nodes: their public keys for the burst programs, which add each one's peer
            "tunnel_burst_peers": [node.name for node in shape.bursting],
        }
    for node in shape.spokes:
        routes = far_ranges(cluster, pool_network[node.pool])
        out[node.name] = {
            "tunnel_role": "spoke",
            "tunnel_address": node.reach,
            # the first head carries the node's traffic to the cluster; another its own alone
            "tunnel_hubs": [
                {
                    "name": hub.name,
                    "endpoint": endpoint,
                    "allowed_ips": routes if n == 0 else [f"{hub.reach}/32"],
                }
                for n, (hub, endpoint) in enumerate(zip(shape.hubs, shape.endpoints, strict=True))
            ],
            "tunnel_routes": routes,
        }
    if shape.hub.address is not None:
        for node in shape.routed:
            out[node.name] = {
                "tunnel_role": "routed",
                "tunnel_via": str(shape.hub.address),
                "tunnel_routes": far_ranges(cluster, None),
            }
    return out

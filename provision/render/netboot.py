"""The boot server of the pools that boot from the network (pools[].boot: network).

The first head serves them on the management network (the netboot role): dnsmasq answers each
node's DHCP request by its MAC address with the node's address and name, iPXE and nginx give it
its pool's image (kernel, initramfs, root squashfs, built by apply: providers/lab/netboot.py),
and it runs from memory. Only the nodes named here get an address; every other machine on the
network gets nothing.
"""

from __future__ import annotations

from provision.cluster import Cluster
from provision.spec.nodes import Node, lab_mac

HTTP_PORT = 8069  # the netboot role's netboot_http_port: the images and iPXE scripts


def booted_nodes(cluster: Cluster) -> list[Node]:
    """The nodes that boot from the network, in spec order."""
    pools = {p.name for p in cluster.spec.pools if p.boot == "network"}
    return [n for n in cluster.nodes if n.pool in pools]


def boot_server(cluster: Cluster) -> Node | None:
    """The node that boots them (the first head), or None when no pool boots so."""
    heads = cluster.head_nodes
    return heads[0] if heads and booted_nodes(cluster) else None


def netboot_host_vars(cluster: Cluster) -> dict[str, dict[str, object]]:
    """The boot server's role inputs, by its name (none without pools that boot so). The
    images themselves are apply's extra variable netboot_images, one per pool by its name."""
    server = boot_server(cluster)
    if server is None or server.address is None:
        return {}
    management = cluster.spec.network.management
    macs = {
        host.name: host.mac
        for pool in cluster.spec.pools
        if pool.boot == "network"
        for host in pool.hosts or []
    }
    for node in booted_nodes(cluster):  # the metal lab's machines: theirs from their address
        if node.provider == "lab" and node.address is not None:
            macs[node.name] = lab_mac(node.address)
    values: dict[str, object] = {
        "netboot_address": str(server.address),
        "netboot_network": str(management.cidr),
        "netboot_nodes": [
            {"name": n.name, "mac": macs[n.name], "address": str(n.address), "image": n.pool}
            for n in booted_nodes(cluster)
        ],
    }
    if management.gateway is not None:
        values["netboot_router"] = str(management.gateway)
    return {server.name: values}

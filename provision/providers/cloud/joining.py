"""What every cloud's program gives an elastic pool's template so its instances join by
themselves: the user data (render/userdata.py) with the head's address, which a head of the
same stack has only once its instance exists, the identity that reads the munge key, and a
remote pool's tunnel keys."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pulumi

from provision.burst.tunnel import tunnel_secret_text
from provision.cluster import Cluster, PoolView
from provision.providers.cloud.layout import CloudLayout, CloudPool
from provision.render.userdata import user_data


def tunnel_keys_value(cluster: Cluster, view: PoolView, keys: Path) -> bytes | None:
    """A remote elastic pool's tunnel secret: the heads' public keys (the hub's first) and each
    node's private key (JSON, the keys as `wg` writes them; burst/tunnel.py reads it on the
    node). None while a key is not made yet (a preview before the first apply)."""
    heads = [keys / f"{head.name}.pub" for head in cluster.head_nodes]
    private = {node.name: keys / f"{node.name}.key" for node in view.nodes}
    if not all(path.exists() for path in [*heads, *private.values()]):
        return None
    nodes = {name: path.read_text().strip() for name, path in private.items()}
    hub, *backups = (path.read_text().strip() for path in heads)
    return tunnel_secret_text(hub, nodes, backups)


def pool_user_data(
    layout: CloudLayout,
    pool: CloudPool,
    nodes: dict[str, dict[str, pulumi.Output[str]]],
    identity: Any = "",
) -> pulumi.Output[str]:
    """The pool's `#cloud-config`. Each head's address is the spec's, or the private address
    of the head's instance where it is a node of this stack (made before the pool); identity
    is Azure's client ID of the pool's managed identity."""
    join = pool.join
    assert join is not None
    addresses: list[Any] = []
    for name, address in join.controllers:
        if address:
            addresses.append(address)
        elif name in nodes:
            addresses.append(nodes[name]["private"])
        else:
            raise ValueError(f"pool {pool.name}: the head {name} has no address this stack knows")
    names = [name for name, _ in join.controllers]

    def text(values: list[Any]) -> str:
        *found, client = values
        pairs = tuple(zip(names, found, strict=True))
        return user_data(replace(join, controllers=pairs, identity=client or ""))

    return pulumi.Output.all(*addresses, identity).apply(text)

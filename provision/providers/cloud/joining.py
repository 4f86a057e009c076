"""What every cloud's program gives an elastic pool's template so its instances join by
themselves: the user data (render/userdata.py) with the head's address, which a head of the
same stack has only once its instance exists, and the identity that reads the munge key."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pulumi

from provision.providers.cloud.layout import CloudLayout, CloudPool
from provision.render.userdata import user_data


def pool_user_data(
    layout: CloudLayout,
    pool: CloudPool,
    nodes: dict[str, dict[str, pulumi.Output[str]]],
    identity: Any = "",
) -> pulumi.Output[str]:
    """The pool's `#cloud-config`. The head's address is the spec's, or the private address
    of the head's instance where it is a node of this stack (made before the pool); identity
    is Azure's client ID of the pool's managed identity."""
    join = pool.join
    assert join is not None
    address: Any = join.controller_address
    if not address:
        if layout.head not in nodes:
            raise ValueError(
                f"pool {pool.name}: the head {layout.head} has no address this stack knows"
            )
        address = nodes[layout.head]["private"]
    return pulumi.Output.all(address, identity).apply(
        lambda both: user_data(replace(join, controller_address=both[0], identity=both[1] or ""))
    )

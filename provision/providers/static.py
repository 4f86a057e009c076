"""Existing hosts reached over SSH: nothing to create, nothing to destroy."""

from __future__ import annotations

import ipaddress

from provision.cluster import compress
from provision.providers.base import Defaults, ProviderPlan
from provision.spec.nodes import Node
from provision.state import State


class StaticProvider(Defaults):
    kind = "static"
    destroy_note: str | None = "static hosts are left as they are: destroy only forgets them"

    def plan(self, nodes: list[Node], state: State) -> ProviderPlan:
        return ProviderPlan(provider="static", existing=[n.name for n in nodes], what="host")

    def create(self, nodes: list[Node], state: State) -> dict[str, ipaddress.IPv4Address]:
        # The spec already gives every static address (the checks make sure of it).
        return {}

    def release(self, names: list[str], state: State) -> str:
        return (
            f"static: {compress(names)} left the cluster and were left alone: stop slurmd "
            "there, or reuse them"
        )

    def destroy(self, nodes: list[Node], state: State) -> list[str]:
        # Static hosts are the user's machines: destroy forgets them, it never wipes them.
        return []

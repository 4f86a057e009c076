"""Existing hosts reached over SSH: nothing to create, nothing to destroy."""

from __future__ import annotations

import ipaddress

from provision.providers.base import ProviderPlan
from provision.spec.nodes import Node
from provision.state import State


class StaticProvider:
    kind = "static"

    def plan(self, nodes: list[Node], state: State) -> ProviderPlan:
        return ProviderPlan(provider="static", existing=[n.name for n in nodes], what="host")

    def create(self, nodes: list[Node], state: State) -> dict[str, ipaddress.IPv4Address]:
        # The spec already gives every static address (the checks make sure of it).
        return {}

    def destroy(self, nodes: list[Node], state: State) -> list[str]:
        # Static hosts are the user's machines: destroy forgets them, it never wipes them.
        return []

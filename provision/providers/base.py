"""The interface every kind of node source has (its package finds them by kind):

    plan(nodes)            what create would do, without doing it
    create(nodes)          make the nodes exist; return the addresses the provider assigned
    destroy(nodes)         remove what create made

Providers take typed Node records and return typed ProviderPlan records; cloud SDKs are imported
only inside the provider that needs them, so the toolkit runs without them.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Protocol

from provision.spec.nodes import Node
from provision.state import State


@dataclass(frozen=True)
class ProviderPlan:
    provider: str
    create: list[str] = field(default_factory=list)  # node names that would be created
    existing: list[str] = field(default_factory=list)  # node names already there
    on_demand: list[str] = field(default_factory=list)  # elastic nodes, created when jobs wait
    what: str = "node"  # what one node is for this provider ("container", "instance", ...)
    resources: list[str] = field(default_factory=list)  # what else the provider makes


class Provider(Protocol):
    kind: str

    def plan(self, nodes: list[Node], state: State) -> ProviderPlan: ...

    def create(self, nodes: list[Node], state: State) -> dict[str, ipaddress.IPv4Address]: ...

    def destroy(self, nodes: list[Node], state: State) -> list[str]: ...


def planned_only(kind: str, nodes: list[Node]) -> ProviderPlan:
    """A plan read from the spec alone, for providers that cannot be asked (yet)."""
    what = {"lab": "container"}.get(kind, "instance")
    return ProviderPlan(
        provider=kind,
        create=[n.name for n in nodes if not n.elastic],
        on_demand=[n.name for n in nodes if n.elastic],
        what=what,
    )

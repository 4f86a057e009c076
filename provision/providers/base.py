"""The interface every kind of node source has (its package finds them by kind):

    prepare(cluster)       refuse, before any node of any kind is made, what would fail
    chosen(cluster)        the nodes of this kind that create makes
    plan(nodes)            what create would do, without doing it
    create(nodes)          make the nodes exist; return the addresses the provider assigned
    login_addresses()      where this machine logs in, where that is not the node's address
    release(names)         what becomes of nodes that left the spec: a line that says so
    image_builds(cluster, pools)
                           images the elastic pools start from that are missing or stale (or
                           those of `pools`, whatever theirs), made during the converge (None:
                           none to make)
    destroy(nodes)         remove what create made
    destroy_note           what destroy leaves, said after it (None: nothing)

Providers take typed Node records and return typed ProviderPlan records; cloud SDKs are imported
only inside the provider that needs them, so the toolkit runs without them.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from provision.cluster import Cluster
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
    # what plan prints before each of the resources: the cloud's stack, or the provider's own
    resources_label: str = "cloud"


class ImageBuilds(Protocol):
    """Images made by the converge itself: builder hosts the run takes as more nodes."""

    inventory: Path  # the inventory that adds the builders to the run

    @property
    def hosts(self) -> list[str]:
        """The builders' inventory names."""
        ...

    @property
    def images(self) -> list[str]:
        """What they become."""
        ...

    def finish(self, state: State, ok: bool) -> None:
        """Seal and keep each image when the run went well; remove the builders either way."""
        ...


class Provider(Protocol):
    kind: str
    destroy_note: str | None

    def prepare(self, cluster: Cluster) -> None: ...

    def chosen(self, cluster: Cluster) -> list[Node]: ...

    def plan(self, nodes: list[Node], state: State) -> ProviderPlan: ...

    def create(self, nodes: list[Node], state: State) -> dict[str, ipaddress.IPv4Address]: ...

    def login_addresses(self, state: State) -> dict[str, ipaddress.IPv4Address]: ...

    def release(self, names: list[str], state: State) -> str: ...

    def image_builds(
        self, cluster: Cluster, state: State, pools: list[str] | None = None
    ) -> ImageBuilds | None: ...

    def destroy(self, nodes: list[Node], state: State) -> list[str]: ...


class Defaults:
    """What a provider does where it has nothing of its own to do: it needs nothing checked
    first, makes the lasting nodes of its kind, and is logged in to at their addresses."""

    kind: str
    destroy_note: str | None = None

    def prepare(self, cluster: Cluster) -> None:
        return None

    def chosen(self, cluster: Cluster) -> list[Node]:
        return [n for n in cluster.lasting_nodes if n.provider == self.kind]

    def login_addresses(self, state: State) -> dict[str, ipaddress.IPv4Address]:
        return {}

    def image_builds(
        self, cluster: Cluster, state: State, pools: list[str] | None = None
    ) -> ImageBuilds | None:
        return None


def planned_only(kind: str, nodes: list[Node]) -> ProviderPlan:
    """A plan read from the spec alone, for providers that cannot be asked (yet)."""
    what = {"lab": "container"}.get(kind, "instance")
    return ProviderPlan(
        provider=kind,
        create=[n.name for n in nodes if not n.elastic],
        on_demand=[n.name for n in nodes if n.elastic],
        what=what,
    )

"""Where nodes come from: one module per kind behind one small interface.

    plan(nodes)            what create would do, without doing it
    create(nodes)          make the nodes exist; return the addresses the provider assigned
    destroy(nodes)         remove what create made

Providers take typed Node records and return typed ProviderPlan records; cloud SDKs are imported
only inside the provider that needs them, so the toolkit runs without them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from provision.errors import OperationError
from provision.spec.models import CLOUD_PROVIDERS, Spec
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


def get_provider(kind: str, spec: Spec, log: Callable[[str], None] | None = None) -> Provider:
    if kind == "static":
        from provision.providers.static import StaticProvider

        return StaticProvider()
    if kind == "lab":
        from provision.cluster import Cluster
        from provision.providers.lab import LabProvider
        from provision.providers.lab.storage import lab_volumes

        elastic = [p.name for p in spec.pools if p.elastic and p.provider == "lab"]
        volumes = lab_volumes(Cluster(spec)) if spec.storage.exports or spec.storage.mounts else {}
        return LabProvider(spec.name, spec.network.management.cidr, log, elastic, volumes)
    if kind in CLOUD_PROVIDERS:
        from provision.providers.cloud import CloudProvider

        return CloudProvider(kind, spec, log)
    raise OperationError(f"unknown provider {kind}")


def planned_only(kind: str, nodes: list[Node]) -> ProviderPlan:
    """A plan read from the spec alone, for providers that cannot be asked (yet)."""
    what = {"lab": "container"}.get(kind, "instance")
    return ProviderPlan(
        provider=kind,
        create=[n.name for n in nodes if not n.elastic],
        on_demand=[n.name for n in nodes if n.elastic],
        what=what,
    )

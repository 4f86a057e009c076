"""Where nodes come from: one module per kind behind one small interface (base.py), found here
by kind."""

from __future__ import annotations

from collections.abc import Callable

from provision.errors import OperationError
from provision.providers.base import Provider, ProviderPlan, planned_only
from provision.spec.models import CLOUD_PROVIDERS, Spec

__all__ = ["Provider", "ProviderPlan", "get_provider", "planned_only"]


def get_provider(kind: str, spec: Spec, log: Callable[[str], None] | None = None) -> Provider:
    if kind == "static":
        from provision.providers.static import StaticProvider

        return StaticProvider()
    if kind == "lab":
        from provision.cluster import Cluster
        from provision.providers.lab import LabProvider
        from provision.providers.lab.metal import machines
        from provision.providers.lab.storage import lab_volumes

        elastic = [p.name for p in spec.pools if p.elastic and p.provider == "lab"]
        volumes = lab_volumes(Cluster(spec)) if spec.storage.exports or spec.storage.mounts else {}
        bmc_port = (spec.network.bmc.port or 443) if spec.network.bmc else 443
        return LabProvider(
            spec.name,
            spec.network.management.cidr,
            log,
            elastic,
            volumes,
            machines(spec),
            bmc_port,
        )
    if kind in CLOUD_PROVIDERS:
        from provision.providers.cloud import CloudProvider

        return CloudProvider(kind, spec, log)
    raise OperationError(f"unknown provider {kind}")

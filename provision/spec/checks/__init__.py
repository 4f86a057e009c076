"""Cross-field checks: what no single field can know. Each problem names its key path and says
what to do about it. One module per domain; check_spec runs them all."""

from __future__ import annotations

from collections.abc import Callable

from provision.spec.checks.accounts import check_accounts
from provision.spec.checks.base import Problem
from provision.spec.checks.gpu import check_gpu, check_gpu_generation
from provision.spec.checks.identity import check_identity
from provision.spec.checks.monitoring import check_health, check_monitoring
from provision.spec.checks.networks import check_fabric, check_fabric_nodes, check_networks
from provision.spec.checks.pools import (
    check_capacity,
    check_compute,
    check_efa,
    check_head,
    check_network_boot,
    check_nodes,
    check_pools,
    check_reservations,
    check_storage,
)
from provision.spec.checks.scheduler import (
    check_controllers,
    check_scheduler,
    check_slurm_config,
    check_slurm_version,
)
from provision.spec.checks.security import check_security
from provision.spec.checks.users import check_users
from provision.spec.models import Spec
from provision.spec.nodes import expand_nodes_checked
from provision.spec.storage import check_storage_nodes


def check_spec(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    for check in CHECKS:
        problems.extend(check(spec))
    nodes, node_problems = expand_nodes_checked(spec)
    problems.extend(node_problems)
    if not problems:
        problems.extend(check_nodes(spec, nodes))
    if not problems:
        problems.extend(check_storage_nodes(spec, nodes))
    if not problems:
        problems.extend(check_fabric_nodes(spec, nodes))
    return problems


CHECKS: list[Callable[[Spec], list[Problem]]] = [
    check_head,
    check_slurm_config,
    check_compute,
    check_pools,
    check_network_boot,
    check_reservations,
    check_capacity,
    check_efa,
    check_networks,
    check_scheduler,
    check_slurm_version,
    check_controllers,
    check_security,
    check_users,
    check_identity,
    check_accounts,
    check_storage,
    check_monitoring,
    check_health,
    check_gpu,
    check_gpu_generation,
    check_fabric,
]

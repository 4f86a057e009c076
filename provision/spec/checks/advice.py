"""What a spec may say but a cluster engineer would advise against: warnings, not errors. The
spec loads and applies as it is; validate, plan and apply show each warning on one line,
naming its file, line and key, as they show an error."""

from __future__ import annotations

from collections.abc import Callable

from provision.spec.checks.base import Problem
from provision.spec.checks.gpu import gpu_pools
from provision.spec.models import Spec


def advise_health(spec: Spec) -> list[Problem]:
    """GPU nodes under Slurm with no health checks: a node whose GPU or fabric port fails keeps
    taking jobs (and failing them) until someone drains it by hand."""
    if spec.scheduler != "slurm" or spec.health is not None:
        return []
    pools = gpu_pools(spec)
    if not pools:
        return []
    first = next(i for i, p in enumerate(spec.pools) if p.name == pools[0])
    return [
        (
            ("pools", first, "profile"),
            f"GPU pool(s) {', '.join(pools)} without health checks: a node whose GPU or fabric "
            "port fails keeps taking jobs until drained by hand; add `health: {}` (Slurm drains "
            "it, naming the failure)",
        )
    ]


ADVICE: list[Callable[[Spec], list[Problem]]] = [advise_health]


def advise(spec: Spec) -> list[Problem]:
    return [problem for check in ADVICE for problem in check(spec)]

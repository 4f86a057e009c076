"""What every burst backend offers the programs, and how a backend says "no capacity".

A backend starts and removes the nodes of one elastic pool and lists what it has made. Lab
containers are made one by one; cloud instances in one API call per pool and resume, so a
backend takes the whole list. A start that failed for want of capacity (a cloud's
InsufficientInstanceCapacity, ZONE_RESOURCE_POOL_EXHAUSTED, AllocationFailed, a quota) is
reported with the CAPACITY prefix: the programs then take the pool out for the cooldown, so
Slurm's next try lands on another pool of the partition.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

# An error text that starts so means: no capacity (or quota) in this pool now
CAPACITY = "capacity: "


class BurstError(Exception):
    """A start or removal the backend could not do: the message is the service's own, one
    line."""


def one_line(exc: BaseException, limit: int = 200) -> str:
    return " ".join(str(exc).split())[:limit] or type(exc).__name__


def each(nodes: list[str], action: Callable[[str], object]) -> dict[str, str]:
    """Run action on every node at once; node -> error text for those that failed."""

    def one(node: str) -> tuple[str, str | None]:
        try:
            action(node)
        except (OSError, BurstError, ValueError) as exc:
            return node, one_line(exc)
        return node, None

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(nodes)))) as pool:
        results = list(pool.map(one, nodes))
    return {node: error for node, error in results if error is not None}


class Backend:
    """One pool's nodes. Subclasses that make nodes one at a time implement resume(node) and
    suspend(node); those with batch APIs override start and stop. A start whose cloud chose
    the nodes' addresses leaves them in `addresses` (node -> address), for Slurm and the
    tunnel."""

    def __init__(self) -> None:
        self.addresses: dict[str, str] = {}

    def resume(self, node: str) -> None:
        raise NotImplementedError

    def suspend(self, node: str) -> bool:
        """Remove the node's container or instance; False when there was none."""
        raise NotImplementedError

    def start(self, nodes: list[str]) -> dict[str, str]:
        """Make these nodes; node -> error text for each that could not be made."""
        return each(nodes, self.resume)

    def stop(self, nodes: list[str]) -> tuple[set[str], dict[str, str]]:
        """Remove these nodes: (those that were there, node -> error text)."""
        gone: set[str] = set()

        def remove(node: str) -> None:
            if self.suspend(node):
                gone.add(node)

        errors = each(nodes, remove)
        return gone, errors

    def states(self) -> dict[str, str]:
        """Node of this pool -> the state of what exists for it (running, pending, exited...)."""
        raise NotImplementedError

    def running(self) -> set[str]:
        return {node for node, state in self.states().items() if state == "running"}

    def present(self) -> set[str]:
        return set(self.states())

    def ended(self, nodes: list[str]) -> dict[str, str]:
        """Why the cloud ended these nodes' instances, where it says (a spot reclaim)."""
        return {}

    def sweep(self, now: float) -> list[str]:
        """Remove what carries the pool's tags but no node's name (a start cut short between
        making and naming); what was removed, for the log."""
        return []

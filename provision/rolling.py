"""Rolling changes (`provision apply --batch N|P%`): a change that restarts daemons or reboots
nodes goes through the compute nodes a batch at a time, so the rest of the cluster serves.

Per batch: drain (no new job starts there; wait for the running ones, or requeue them with
--force), change (Ansible on the batch alone), verify (slurmd back and answering), resume. The
first batch that fails stops the roll: it stays drained (its nodes are in doubt), the batches
before it are done and serving, the ones after it are untouched and serving. Run the same apply
again once the cause is fixed: batches already changed have nothing left to do.

The ordering lives here, apart from SSH and Ansible (drain.SlurmBatchSteps does those), so a
test can drive it with a recording stand-in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Protocol

from provision.cluster import compress
from provision.errors import OperationError, UsageError


def batch_size(text: str, total: int) -> int:
    """`--batch`: a count ("2") or a share of the nodes ("25%", rounded up, at least 1)."""
    match = re.fullmatch(r"([1-9][0-9]{0,5})(%?)", text.strip())
    if not match or (match[2] and int(match[1]) > 100):
        raise UsageError(f"--batch {text!r}: a number of nodes (2) or a percentage (25%)")
    if match[2]:
        return max(1, math.ceil(total * int(match[1]) / 100))
    return int(match[1])


def batches(nodes: list[str], size: int) -> list[list[str]]:
    return [nodes[i : i + size] for i in range(0, len(nodes), size)]


class Steps(Protocol):
    def drain(self, batch: list[str]) -> list[str]:
        """Drain the batch and wait for its jobs; the nodes resume should give back (not the
        ones an operator had drained or Slurm had down before)."""

    def change(self, batch: list[str]) -> None:
        """Apply the change to the batch alone; OperationError if it failed."""

    def verify(self, batch: list[str]) -> None:
        """Check the batch is back (slurmd answering); OperationError if not."""

    def resume(self, nodes: list[str]) -> None:
        """Give the nodes back to the scheduler."""


def roll(nodes: list[str], size: int, steps: Steps, say: Callable[[str], None]) -> int:
    """Drain, change, verify and resume `nodes` a batch of `size` at a time, stopping at the
    first batch that fails (OperationError saying where the cluster stands). The batch count."""
    groups = batches(nodes, size)
    for number, batch in enumerate(groups, 1):
        say(f"rolling: batch {number}/{len(groups)}: {compress(batch)}")
        ours = steps.drain(batch)
        try:
            steps.change(batch)
            steps.verify(batch)
        except OperationError as exc:
            done = [n for g in groups[: number - 1] for n in g]
            rest = [n for g in groups[number:] for n in g]
            raise OperationError(
                f"rolling: batch {number}/{len(groups)} ({compress(batch)}) failed: {exc}; it "
                "stays drained"
                + (f", {compress(done)} changed and serving" if done else "")
                + (f", {compress(rest)} not changed and serving" if rest else "")
                + "; fix the cause and run the same apply again"
            ) from None
        if ours:
            steps.resume(ours)
        say(f"rolling: batch {number}/{len(groups)}: {compress(batch)} changed and serving")
    return len(groups)

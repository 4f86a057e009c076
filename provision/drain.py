"""`provision drain` and `provision resume`: take compute nodes out of Slurm's scheduling and
wait until no job runs on them, or give them back. Run on the first head over SSH, as an
operator would with scontrol."""

from __future__ import annotations

import getpass
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from provision.cluster import Cluster, compress
from provision.errors import OperationError, UsageError
from provision.lifecycle import open_cluster, ssh_argv

POLL_S = 5.0


def pick_nodes(cluster: Cluster, names: str, spec_path: Path) -> list[str]:
    """A hostlist or pool name -> the lasting compute nodes it names; anything else: exit 2."""
    from provision.burst.hostlist import expand

    computes = {n.name for n in cluster.lasting_nodes if n.role == "compute"}
    pools = {v.name: [n.name for n in v.nodes if n.name in computes] for v in cluster.pools}
    if pools.get(names):
        return pools[names]
    try:
        wanted = expand(names)
    except ValueError as exc:
        raise UsageError(f"{names!r}: {exc}") from None
    unknown = [n for n in wanted if n not in computes]
    if unknown:
        raise UsageError(
            f"{spec_path}: {compress(unknown)} is not a lasting compute node of cluster "
            f"'{cluster.spec.name}' (they are: {compress(sorted(computes)) or 'none'})"
        )
    return wanted


def on_head(spec_path: Path, state_root: Path, command: str, timeout: float = 60) -> str:
    """Run one shell command on the first head; its output, or OperationError with its error."""
    _, cluster, _ = open_cluster(spec_path, state_root)
    head = cluster.head_nodes[0].name
    argv = ssh_argv(spec_path, state_root, head, [command])
    argv.insert(1, "-oBatchMode=yes")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        why = " ".join(done.stderr.split())[-300:] or f"exit {done.returncode}"
        raise OperationError(f"on {head}: {why}")
    return done.stdout


def _reason(text: str | None) -> str:
    reason = text if text is not None else f"provision drain by {getpass.getuser()}"
    if not reason.isprintable() or not reason.strip():
        raise UsageError("--reason: one line of printable text")
    return reason[:200]


def drain(
    spec_path: Path,
    state_root: Path,
    names: str,
    reason: str | None,
    wait: bool,
    timeout: float,
    say: Callable[[str], None],
) -> list[str]:
    """Drain the spec's compute nodes these names give; with wait, until no job runs there."""
    _, cluster, _ = open_cluster(spec_path, state_root)
    nodes = pick_nodes(cluster, names, spec_path)
    drain_nodes(spec_path, state_root, nodes, _reason(reason), wait, timeout, say)
    return nodes


def drain_nodes(
    spec_path: Path,
    state_root: Path,
    nodes: list[str],
    reason: str,
    wait: bool,
    timeout: float,
    say: Callable[[str], None],
    requeue: bool = False,
) -> None:
    """Drain these nodes (names Slurm knows; they need not be in the spec any more); with
    requeue, their jobs go back to the queue (or are cancelled, if they cannot) at once."""
    hostlist = compress(nodes)
    why = shlex.quote(reason)
    on_head(spec_path, state_root, f"scontrol update NodeName={hostlist} State=DRAIN Reason={why}")
    say(f"drain: {hostlist}: no new job starts there")
    if requeue:
        requeued = on_head(
            spec_path,
            state_root,
            f"for j in $(squeue -h -w {hostlist} -o %i); do "
            "scontrol requeue $j 2>/dev/null || scancel $j; echo $j; done",
        ).split()
        if requeued:
            say(f"drain: {hostlist}: requeued (or cancelled) job(s) {', '.join(requeued)}")
    if not wait:
        return
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        jobs = on_head(spec_path, state_root, f"squeue -h -w {hostlist} -o '%i %N'").split("\n")
        running = [line.strip() for line in jobs if line.strip()]
        if not running:
            say(f"drain: {hostlist}: drained, no job runs there")
            return
        now = f"{len(running)} job(s) still running: " + ", ".join(running[:10])
        if now != last:
            say(f"drain: {hostlist}: {now}")
            last = now
        if time.monotonic() >= deadline:
            raise OperationError(
                f"{hostlist}: {now} after {timeout:.0f}s; they stay drained (provision resume "
                "gives them back)"
            )
        time.sleep(POLL_S)


def resume(spec_path: Path, state_root: Path, names: str, say: Callable[[str], None]) -> list[str]:
    """Resume the nodes that are drained, draining or down (Slurm refuses the others); the
    nodes resumed."""
    _, cluster, _ = open_cluster(spec_path, state_root)
    nodes = pick_nodes(cluster, names, spec_path)
    shown = on_head(spec_path, state_root, f"sinfo -h -N -n {compress(nodes)} -o '%N %T'")
    states = dict(line.split(None, 1) for line in shown.splitlines() if len(line.split()) == 2)
    out = [n for n in nodes if states.get(n, "").startswith(("drain", "down"))]
    rest = [n for n in nodes if n not in out]
    if out:
        on_head(spec_path, state_root, f"scontrol update NodeName={compress(out)} State=RESUME")
        say(f"resume: {compress(out)}: jobs may start there again")
    if rest:
        say(f"resume: {compress(rest)}: not drained or down, left as they are")
    return out

"""`provision drain` and `provision resume`: take compute nodes out of the scheduler's hands and
wait until no job (Slurm) or pod (Kubernetes) runs on them, or give them back. Run on the first
head over SSH, as an operator would with scontrol or kubectl."""

from __future__ import annotations

import getpass
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass

from provision.cluster import compress, pick_nodes
from provision.errors import OperationError, UsageError
from provision.head import Head
from provision.parsers.kubernetes import KubeNode, parse_nodes
from provision.spec.nodes import login_user

POLL_S = 5.0
# the reason a rolling apply drains a batch with: a roll run again after an interruption takes up
# the nodes an earlier one left so, and gives them back
ROLLING_REASON = "provision apply --batch: rolling change"


def _reason(text: str | None) -> str:
    reason = text if text is not None else f"provision drain by {getpass.getuser()}"
    if not reason.isprintable() or not reason.strip():
        raise UsageError("--reason: one line of printable text")
    return reason[:200]


def drain(
    head: Head,
    names: str,
    reason: str | None,
    wait: bool,
    timeout: float,
    say: Callable[[str], None],
) -> list[str]:
    """Drain the spec's compute nodes these names give; with wait, until no job runs there."""
    nodes = pick_nodes(head.cluster, names, head.spec_path)
    why = _reason(reason)
    if head.spec.scheduler == "kubernetes":
        # kubectl drain waits for the evictions itself; without --wait, it is a cordon
        if wait:
            evict(head, nodes, timeout, say)
        else:
            head.on_head(f"{kubectl(head)} cordon {shlex.join(nodes)}")
            say(f"drain: {compress(nodes)}: cordoned, no new pod is scheduled there")
        return nodes
    drain_nodes(head, nodes, why, wait, timeout, say)
    return nodes


def drain_nodes(
    head: Head,
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
    admin = scontrol(head)
    head.on_head(f"{admin} update NodeName={hostlist} State=DRAIN Reason={why}")
    say(f"drain: {hostlist}: no new job starts there")
    if requeue:
        requeued = head.on_head(
            f"for j in $(squeue -h -w {hostlist} -o %i); do "
            f"{admin} requeue $j 2>/dev/null || {as_admin(head)}scancel $j; "
            "echo $j; done",
        ).split()
        if requeued:
            say(f"drain: {hostlist}: requeued (or cancelled) job(s) {', '.join(requeued)}")
    if wait:
        wait_for_jobs(head, nodes, timeout, say)


def as_admin(head: Head) -> str:
    """What a command on the first head starts with to run as root: `sudo -n ` when its login
    user is not root (the examples that log in as ubuntu), else nothing."""
    user = login_user(head.spec, head.cluster.head_nodes[0].provider)
    return "" if user == "root" else "sudo -n "


def scontrol(head: Head) -> str:
    """scontrol as Slurm's administrator on the first head: `update`, `requeue` and
    `reconfigure` are refused to any other user."""
    return as_admin(head) + "scontrol"


def kubectl(head: Head) -> str:
    """kubectl as the cluster's administrator on the first head."""
    return as_admin(head) + "kubectl --kubeconfig /etc/kubernetes/admin.conf"


def kube_nodes(head: Head) -> dict[str, KubeNode]:
    """The nodes the Kubernetes API knows, by name."""
    shown = head.on_head(f"{kubectl(head)} get nodes -o json")
    try:
        return {n.name: n for n in parse_nodes(shown)}
    except ValueError as exc:
        raise OperationError(f"kubectl get nodes: not a node list ({exc})") from None


def evict(
    head: Head,
    nodes: list[str],
    timeout: float,
    say: Callable[[str], None],
    force: bool = False,
) -> None:
    """Cordon these Kubernetes nodes and evict their pods (PodDisruptionBudgets respected,
    DaemonSets left); with force, pods no controller owns are deleted too and budgets are not
    waited for."""
    extra = " --force --disable-eviction" if force else ""
    head.on_head(
        f"{kubectl(head)} drain {shlex.join(nodes)} --ignore-daemonsets "
        f"--delete-emptydir-data --timeout={int(timeout)}s{extra}",
        timeout=timeout + 60,
    )
    say(f"drain: {compress(nodes)}: cordoned, {'its' if len(nodes) == 1 else 'their'} pods evicted")


def drain_kubernetes_nodes(
    head: Head,
    nodes: list[str],
    timeout: float,
    say: Callable[[str], None],
    force: bool = False,
) -> None:
    """Take these workers out of a Kubernetes cluster, one at a time: cordoned and their pods
    evicted, then the node deleted from the API."""
    for node in nodes:
        evict(head, [node], timeout, say, force)
        head.on_head(f"{kubectl(head)} delete node {shlex.quote(node)}")
        say(f"drain: {node}: removed from the Kubernetes cluster")


def uncordon(head: Head, nodes: list[str], say: Callable[[str], None]) -> None:
    head.on_head(f"{kubectl(head)} uncordon {shlex.join(nodes)}")
    say(f"resume: {compress(nodes)}: pods may be scheduled there again")


def wait_for_jobs(
    head: Head,
    nodes: list[str],
    timeout: float,
    say: Callable[[str], None],
) -> None:
    """Until no job runs on these nodes; OperationError after `timeout` seconds."""
    hostlist = compress(nodes)
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        jobs = head.on_head(f"squeue -h -w {hostlist} -o '%i %N'").split("\n")
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


def running_jobs(head: Head, nodes: list[str]) -> list[str]:
    """The jobs on these nodes now: "jobid user nodes" each."""
    shown = head.on_head(f"squeue -h -w {compress(nodes)} -o '%i %u %N'", 30)
    return [line.strip() for line in shown.splitlines() if line.strip()]


def node_reasons(head: Head, nodes: list[str]) -> dict[str, tuple[str, str]]:
    """Node -> (Slurm's state as sinfo spells it: `drained`, `idle*`, `down+drain` ...; the
    reason it was drained or downed)."""
    shown = head.on_head(f"sinfo -h -N -n {compress(nodes)} -o '%N|%T|%E'")
    split = (line.split("|", 2) for line in shown.splitlines())
    return {parts[0]: (parts[1], parts[2]) for parts in split if len(parts) == 3}


def out_of_service(state: str) -> bool:
    """Drained, draining or down already: not ours to give back."""
    return state.startswith(("drain", "down", "fail")) or "drain" in state


def resume(head: Head, names: str, say: Callable[[str], None]) -> list[str]:
    """Resume the nodes that are drained, draining or down (Slurm refuses the others); the
    nodes resumed."""
    nodes = pick_nodes(head.cluster, names, head.spec_path)
    if head.spec.scheduler == "kubernetes":
        known = kube_nodes(head)
        cordoned = [n for n in nodes if n in known and known[n].unschedulable]
        others = [n for n in nodes if n not in cordoned]
        if cordoned:
            uncordon(head, cordoned, say)
        if others:
            say(f"resume: {compress(others)}: not cordoned, left as they are")
        return cordoned
    states = node_reasons(head, nodes)
    out = [n for n in nodes if out_of_service(states.get(n, ("", ""))[0])]
    rest = [n for n in nodes if n not in out]
    if out:
        head.on_head(f"{scontrol(head)} update NodeName={compress(out)} State=RESUME")
        say(f"resume: {compress(out)}: jobs may start there again")
    if rest:
        say(f"resume: {compress(rest)}: not drained or down, left as they are")
    return out


@dataclass
class SlurmBatchSteps:
    """The steps of a rolling change (provision/rolling.py) on a Slurm cluster, through the
    first head; `change` runs Ansible on a batch (lifecycle gives it)."""

    head: Head
    change: Callable[[list[str]], None]
    say: Callable[[str], None]
    drain_timeout: float = 24 * 3600
    requeue: bool = False
    back_timeout: float = 600  # a reboot included
    poll_s: float = POLL_S

    def drain(self, batch: list[str]) -> list[str]:
        before = node_reasons(self.head, batch)
        # an earlier roll that was interrupted or failed left these drained with its own
        # reason: they are this roll's to give back, not an operator's
        left = [
            n
            for n in batch
            if "drain" in before.get(n, ("", ""))[0] and before[n][1] == ROLLING_REASON
        ]
        kept = [n for n in batch if n not in left and out_of_service(before.get(n, ("", ""))[0])]
        ours = [n for n in batch if n not in kept]
        if left:
            self.say(f"rolling: {compress(left)} left drained by an earlier roll: taken up again")
        if kept:
            self.say(
                f"rolling: {compress(kept)} already out of service "
                f"({', '.join(sorted({before[n][0] for n in kept}))}): left so afterwards"
            )
        if fresh := [n for n in ours if n not in left]:
            drain_nodes(
                self.head,
                fresh,
                ROLLING_REASON,
                False,
                0,
                self.say,
                requeue=self.requeue,
            )
        wait_for_jobs(self.head, batch, self.drain_timeout, self.say)
        return ours

    def verify(self, batch: list[str]) -> None:
        """slurmd on every node of the batch registered again and answering (a node that
        rebooted comes back as down+drain or drained; `*` marks one not answering)."""

        def problems() -> dict[str, str]:
            states = node_reasons(self.head, batch)
            return {
                n: " ".join(states.get(n, ("unknown to Slurm", ""))).strip()
                for n in batch
                if n not in states or not _answering(*states[n])
            }

        _wait_back(problems, self.back_timeout, self.poll_s)
        self.say(f"rolling: {compress(batch)}: slurmd answering")

    def resume(self, nodes: list[str]) -> None:
        self.head.on_head(f"{scontrol(self.head)} update NodeName={compress(nodes)} State=RESUME")
        self.say(f"resume: {compress(nodes)}: jobs may start there again")


@dataclass
class KubernetesBatchSteps:
    """The steps of a rolling change on a Kubernetes cluster, through kubectl on the first head:
    a batch is cordoned and its pods evicted, changed, checked Ready at the release, and
    uncordoned."""

    head: Head
    change: Callable[[list[str]], None]
    say: Callable[[str], None]
    release: str  # kubernetes.version: each node's kubelet is at it afterwards
    drain_timeout: float = 3600
    force: bool = False
    back_timeout: float = 600
    poll_s: float = POLL_S

    def drain(self, batch: list[str]) -> list[str]:
        before = kube_nodes(self.head)
        kept = [n for n in batch if n in before and before[n].unschedulable]
        if kept:
            self.say(f"rolling: {compress(kept)} cordoned already: left so afterwards")
        evict(self.head, batch, self.drain_timeout, self.say, self.force)
        return [n for n in batch if n not in kept]

    def verify(self, batch: list[str]) -> None:
        """Every node of the batch Ready, its kubelet at the release."""

        def problems() -> dict[str, str]:
            known = kube_nodes(self.head)
            bad = {}
            for n in batch:
                node = known.get(n)
                if node is None:
                    bad[n] = "unknown to the API"
                elif not node.ready:
                    bad[n] = "not Ready"
                elif node.kubelet_version.lstrip("v") != self.release:
                    bad[n] = f"kubelet {node.kubelet_version or 'unknown'}"
            return bad

        _wait_back(problems, self.back_timeout, self.poll_s)
        self.say(f"rolling: {compress(batch)}: Ready at {self.release}")

    def resume(self, nodes: list[str]) -> None:
        uncordon(self.head, nodes, self.say)


def _wait_back(problems: Callable[[], dict[str, str]], timeout: float, poll_s: float) -> None:
    """Until `problems` finds none (node -> what is wrong with it); OperationError naming them
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while bad := problems():
        if time.monotonic() >= deadline:
            shown = ", ".join(f"{n} {s}" for n, s in sorted(bad.items()))
            raise OperationError(f"not back after {timeout:.0f}s: {shown}")
        time.sleep(poll_s)


def _answering(state: str, reason: str) -> bool:
    """slurmd registered and answering: no `*` (not responding) or power-saving mark, and not
    down, unless for the reboot itself ("Node unexpectedly rebooted"; resume clears it)."""
    if state.endswith(("*", "~", "#", "%", "!")):
        return False
    if "down" in state or "fail" in state:
        return "reboot" in reason.lower()
    return True

"""`provision drain` and `provision resume`: which nodes they accept, what they ask of the head
(a recording stand-in for SSH) and how drain waits for the jobs; live in
tests/integration/test_lab.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision import drain, rolling
from provision.cluster import Cluster, pick_nodes
from provision.errors import OperationError, UsageError
from provision.spec import load_spec

from .conftest import ROOT, run_provision
from .fakehead import FakeHead

LAB = ROOT / "examples" / "lab.yaml"


def test_nodes_by_hostlist_or_pool() -> None:
    cluster = Cluster(load_spec(LAB))
    assert pick_nodes(cluster, "compute002", LAB) == ["compute002"]
    assert pick_nodes(cluster, "compute[001-002]", LAB) == ["compute001", "compute002"]
    assert pick_nodes(cluster, "compute", LAB) == ["compute001", "compute002"]
    for bad in ("head001", "compute009", "compute[001"):
        with pytest.raises(UsageError):
            pick_nodes(cluster, bad, LAB)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["head001"], "head001 is not a lasting compute node of cluster 'lab'"),
        (["compute001", "--reason", "two\nlines"], "--reason: one line of printable text"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    r = run_provision("drain", *args, "--state-dir", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and r.stderr.count("\n") == 1, r.stderr


class Head:
    """Answers what drain asks the head: each squeue returns the next of `queues`."""

    def __init__(self, queues: list[str]) -> None:
        self.queues = queues
        self.commands: list[str] = []

    def __call__(self, command: str, timeout: float = 60) -> str:
        self.commands.append(command)
        return self.queues.pop(0) if command.startswith("squeue") else ""


def test_drain_waits_for_the_jobs_and_says_what_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    head = Head(["12 compute001\n13 compute001\n", "13 compute001\n", "13 compute001\n", ""])
    monkeypatch.setattr(drain, "POLL_S", 0)
    said: list[str] = []
    nodes = drain.drain(FakeHead(LAB, head), "compute001", "new driver", True, 60, said.append)
    assert nodes == ["compute001"]
    assert head.commands[0] == "scontrol update NodeName=compute001 State=DRAIN Reason='new driver'"
    assert said == [
        "drain: compute001: no new job starts there",
        "drain: compute001: 2 job(s) still running: 12 compute001, 13 compute001",
        "drain: compute001: 1 job(s) still running: 13 compute001",
        "drain: compute001: drained, no job runs there",
    ]


def test_drain_gives_up_after_the_timeout_and_leaves_them_drained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    head = FakeHead(LAB, Head(["7 compute002\n"] * 50))
    monkeypatch.setattr(drain, "POLL_S", 0.01)
    with pytest.raises(OperationError, match=r"1 job\(s\) still running: 7 compute002 after"):
        drain.drain(head, "compute002", None, True, 0.05, lambda _m: None)
    # the spec is read once, not at every poll: the handle is the one given
    assert len(head.asked) > 2 and head.asked[0].startswith("scontrol update")


def test_resume_gives_back_the_drained_and_leaves_the_rest() -> None:
    class Sinfo(Head):
        def __call__(self, command: str, timeout: float = 60) -> str:
            self.commands.append(command)
            shown = "compute001|idle|none\ncompute002|drained|new DIMM\n"
            return shown if command.startswith("sinfo") else ""

    head = Sinfo([])
    said: list[str] = []
    assert drain.resume(FakeHead(LAB, head), "compute", said.append) == ["compute002"]
    assert head.commands == [
        "sinfo -h -N -n compute[001-002] -o '%N|%T|%E'",
        "scontrol update NodeName=compute002 State=RESUME",
    ]
    assert said == [
        "resume: compute002: jobs may start there again",
        "resume: compute001: not drained or down, left as they are",
    ]


def test_kubernetes_workers_leaving_are_drained_then_deleted(tmp_path: Path) -> None:
    head = Head([])
    said: list[str] = []
    spec = ROOT / "examples" / "lab-k8s.yaml"
    drain.drain_kubernetes_nodes(FakeHead(spec, head), ["worker002"], 600, said.append)
    kubectl = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
    assert head.commands == [
        f"{kubectl} drain worker002 --ignore-daemonsets --delete-emptydir-data --timeout=600s",
        f"{kubectl} delete node worker002",
    ]
    assert said == [
        "drain: worker002: cordoned, its pods evicted",
        "drain: worker002: removed from the Kubernetes cluster",
    ]
    # forced: pods without a controller go too, disruption budgets are not waited for; a user
    # that is not root reaches admin.conf through sudo
    other = tmp_path / "k.yaml"
    other.write_text(spec.read_text() + "ssh:\n  user: ubuntu\n")
    head.commands.clear()
    drain.drain_kubernetes_nodes(FakeHead(other, head), ["worker001"], 60, said.append, force=True)
    assert head.commands[0] == (
        f"sudo -n {kubectl} drain worker001 --ignore-daemonsets --delete-emptydir-data "
        "--timeout=60s --force --disable-eviction"
    )


def _node(name: str, version: str, ready: bool = True, cordoned: bool = False) -> dict[str, object]:
    """One node as `kubectl get nodes -o json` gives it (the fields read)."""
    return {
        "metadata": {"name": name, "labels": {}},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "nodeInfo": {"kubeletVersion": f"v{version}"},
        },
    }


class KubeHead:
    """Answers kubectl on the head: each `get nodes` returns the next of `lists`."""

    def __init__(self, lists: list[list[dict[str, object]]]) -> None:
        self.lists = lists
        self.commands: list[str] = []

    def __call__(self, command: str, timeout: float = 60) -> str:
        self.commands.append(command.replace(KUBECTL, "kubectl"))
        if command.endswith("get nodes -o json"):
            return json.dumps({"items": self.lists.pop(0)})
        return ""


KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
K8S = ROOT / "examples" / "lab-k8s.yaml"


def test_a_kubernetes_batch_is_evicted_changed_checked_at_the_release_and_uncordoned() -> None:
    head = KubeHead(
        [
            # before: worker002 was cordoned by an operator
            [_node("worker001", "1.32.9"), _node("worker002", "1.32.9", cordoned=True)],
            # after the change: worker002 not Ready yet, then both back at the release
            [_node("worker001", "1.33.5"), _node("worker002", "1.32.9", ready=False)],
            [_node("worker001", "1.33.5"), _node("worker002", "1.33.5", cordoned=True)],
        ]
    )
    changed: list[list[str]] = []
    said: list[str] = []
    steps = drain.KubernetesBatchSteps(
        FakeHead(K8S, head), changed.append, said.append, "1.33.5", drain_timeout=900, poll_s=0
    )
    assert rolling.roll(["worker001", "worker002"], 2, steps, said.append) == 1
    assert changed == [["worker001", "worker002"]]
    assert head.commands == [
        "kubectl get nodes -o json",
        "kubectl drain worker001 worker002 --ignore-daemonsets --delete-emptydir-data "
        "--timeout=900s",
        "kubectl get nodes -o json",
        "kubectl get nodes -o json",
        # only the node the roll cordoned is given back
        "kubectl uncordon worker001",
    ]
    assert said[1:] == [
        "rolling: worker002 cordoned already: left so afterwards",
        "drain: worker[001-002]: cordoned, their pods evicted",
        "rolling: worker[001-002]: Ready at 1.33.5",
        "resume: worker001: pods may be scheduled there again",
        "rolling: batch 1/1: worker[001-002] changed and serving",
    ]


def test_a_kubernetes_batch_not_back_at_the_release_stops_the_roll() -> None:
    stuck = [_node("worker001", "1.32.9")]
    steps = drain.KubernetesBatchSteps(
        FakeHead(K8S, KubeHead([stuck] * 50)),
        lambda _b: None,
        lambda _m: None,
        "1.33.5",
        back_timeout=0.05,
        poll_s=0.01,
    )
    with pytest.raises(
        OperationError,
        match=r"batch 1/2 \(worker001\) failed: not back after "
        r"0s: worker001 kubelet v1.32.9; it stays drained, worker002 not changed",
    ):
        rolling.roll(["worker001", "worker002"], 1, steps, lambda _m: None)


def test_drain_and_resume_of_kubernetes_workers_cordon_and_uncordon() -> None:
    head = KubeHead([[_node("worker001", "1.33.5", cordoned=True), _node("worker002", "1.33.5")]])
    said: list[str] = []
    fake = FakeHead(K8S, head)
    drain.drain(fake, "worker001", None, False, 60, said.append)
    drain.drain(fake, "worker002", None, True, 60, said.append)
    assert drain.resume(fake, "worker", said.append) == ["worker001"]
    assert head.commands == [
        "kubectl cordon worker001",
        "kubectl drain worker002 --ignore-daemonsets --delete-emptydir-data --timeout=60s",
        "kubectl get nodes -o json",
        "kubectl uncordon worker001",
    ]
    assert said == [
        "drain: worker001: cordoned, no new pod is scheduled there",
        "drain: worker002: cordoned, its pods evicted",
        "resume: worker001: pods may be scheduled there again",
        "resume: worker002: not cordoned, left as they are",
    ]

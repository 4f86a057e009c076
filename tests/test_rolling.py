"""Rolling changes (provision/rolling.py, drain.SlurmBatchSteps, a Kubernetes cluster's order):
the order of the steps per batch, where a failed batch leaves the cluster, and what the head is
asked; the CLI's refusals.
Live: tests/integration/test_lab.py (a rolling slurmd restart under a job array)."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision import drain
from provision.errors import OperationError, UsageError
from provision.rolling import batch_size, batches, roll

from .conftest import ROOT, run_provision
from .fakehead import FakeHead

LAB = ROOT / "examples" / "lab.yaml"


@pytest.mark.parametrize(
    ("text", "total", "size"),
    [("1", 8, 1), ("3", 8, 3), ("25%", 8, 2), ("10%", 8, 1), ("30%", 8, 3), ("100%", 5, 5)],
)
def test_batch_sizes(text: str, total: int, size: int) -> None:
    assert batch_size(text, total) == size


@pytest.mark.parametrize("text", ["0", "-1", "0%", "101%", "a", "2.5", "1e3", "", "%"])
def test_bad_batch_sizes_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="--batch"):
        batch_size(text, 8)


def test_batches_keep_the_order() -> None:
    assert batches(["a", "b", "c", "d", "e"], 2) == [["a", "b"], ["c", "d"], ["e"]]


class Recorder:
    """Records each step; `fail` names a (step, first node of the batch) that fails."""

    def __init__(self, fail: tuple[str, str] | None = None, kept: set[str] = frozenset()) -> None:
        self.calls: list[str] = []
        self.fail = fail
        self.kept = kept

    def _step(self, step: str, nodes: list[str]) -> None:
        self.calls.append(f"{step} {','.join(nodes)}")
        if self.fail == (step, nodes[0]):
            raise OperationError(f"{step} went wrong")

    def drain(self, batch: list[str]) -> list[str]:
        self._step("drain", batch)
        return [n for n in batch if n not in self.kept]

    def change(self, batch: list[str]) -> None:
        self._step("change", batch)

    def verify(self, batch: list[str]) -> None:
        self._step("verify", batch)

    def resume(self, nodes: list[str]) -> None:
        self._step("resume", nodes)


NODES = ["c1", "c2", "c3", "c4", "c5"]


def test_each_batch_is_drained_changed_verified_and_resumed_before_the_next() -> None:
    steps = Recorder()
    said: list[str] = []
    assert roll(NODES, 2, steps, said.append) == 3
    assert steps.calls == [
        "drain c1,c2", "change c1,c2", "verify c1,c2", "resume c1,c2",
        "drain c3,c4", "change c3,c4", "verify c3,c4", "resume c3,c4",
        "drain c5", "change c5", "verify c5", "resume c5",
    ]  # fmt: skip
    assert said[0] == "rolling: batch 1/3: c[1-2]"
    assert said[-1] == "rolling: batch 3/3: c5 changed and serving"


def test_nodes_out_of_service_before_stay_so() -> None:
    steps = Recorder(kept={"c2"})
    roll(NODES[:2], 2, steps, lambda _m: None)
    assert steps.calls[-1] == "resume c1"


@pytest.mark.parametrize("step", ["change", "verify"])
def test_the_first_failed_batch_stops_the_roll_and_stays_drained(step: str) -> None:
    steps = Recorder(fail=(step, "c3"))
    with pytest.raises(OperationError) as caught:
        roll(NODES, 2, steps, lambda _m: None)
    assert steps.calls[-1] == f"{step} c3,c4"  # nothing after: no resume, no next batch
    assert "resume c3,c4" not in steps.calls and "drain c5" not in steps.calls
    assert str(caught.value) == (
        f"rolling: batch 2/3 (c[3-4]) failed: {step} went wrong; it stays drained, c[1-2] "
        "changed and serving, c5 not changed and serving; fix the cause and run the same apply "
        "again"
    )


def test_a_batch_whose_jobs_do_not_end_stops_before_any_change() -> None:
    steps = Recorder(fail=("drain", "c1"))
    with pytest.raises(OperationError, match="drain went wrong"):
        roll(NODES, 2, steps, lambda _m: None)
    assert steps.calls == ["drain c1,c2"]


class Head:
    """The first head as SlurmBatchSteps sees it: sinfo answers from `states` (node -> state,
    reason), squeue from `queues`; every command recorded beside the changes."""

    def __init__(self, log: list[str], states: list[dict[str, tuple[str, str]]]) -> None:
        self.log = log
        self.states = states
        self.queues = [""]

    def __call__(self, command: str, timeout: float = 60) -> str:
        self.log.append(command)
        if command.startswith("sinfo"):
            now = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            if "%E" in command:
                return "".join(f"{n}|{s}|{r}\n" for n, (s, r) in now.items())
            return "".join(f"{n} {s}\n" for n, (s, _r) in now.items())
        if command.startswith("squeue"):
            return self.queues.pop(0) if len(self.queues) > 1 else self.queues[0]
        return ""


def _steps(states: list[dict[str, tuple[str, str]]]) -> tuple[drain.SlurmBatchSteps, list[str]]:
    log: list[str] = []
    steps = drain.SlurmBatchSteps(
        FakeHead(LAB, Head(log, states)),
        change=lambda batch: log.append(f"ansible on {','.join(batch)}"),
        say=lambda _m: None,
        back_timeout=0.2,
        poll_s=0.01,
    )
    return steps, log


def test_what_the_head_is_asked_in_a_batch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    before = {"compute001": ("mixed", "none"), "compute002": ("drained", "disk")}
    restarting = {"compute001": ("drained*", "none"), "compute002": ("drained*", "disk")}
    back = {"compute001": ("drained", "x"), "compute002": ("drained", "disk")}
    steps, log = _steps([before, restarting, back])
    roll(["compute001", "compute002"], 2, steps, lambda _m: None)
    assert log == [
        "sinfo -h -N -n compute[001-002] -o '%N|%T|%E'",
        # the operator's drain (reason "disk") is left alone
        "scontrol update NodeName=compute001 State=DRAIN "
        "Reason='provision apply --batch: rolling change'",
        "squeue -h -w compute[001-002] -o '%i %N'",
        "ansible on compute001,compute002",
        "sinfo -h -N -n compute[001-002] -o '%N|%T|%E'",  # one not answering yet
        "sinfo -h -N -n compute[001-002] -o '%N|%T|%E'",
        "scontrol update NodeName=compute001 State=RESUME",
    ]


def test_a_roll_run_again_gives_back_what_an_interrupted_one_left_drained() -> None:
    """The first roll was stopped (SIGINT, a failed batch) with compute001 drained by it; the
    same apply again takes it up, drains only the node it had not reached, and resumes both;
    an operator's drain in the same batch stays."""
    reason = "provision apply --batch: rolling change"
    before = {
        "compute001": ("drained", reason),
        "compute002": ("idle", "none"),
        "compute003": ("drained", "health: bad DIMM"),
    }
    back = {n: ("drained", r) for n, (_s, r) in before.items()}
    steps, log = _steps([before, back])
    roll(["compute001", "compute002", "compute003"], 3, steps, lambda _m: None)
    assert log[1] == f"scontrol update NodeName=compute002 State=DRAIN Reason='{reason}'"
    assert log[-1] == "scontrol update NodeName=compute[001-002] State=RESUME"


def test_operators_commands_go_through_sudo_where_the_login_user_is_not_root(
    tmp_path: Path,
) -> None:
    """scontrol update, requeue and reconfigure are Slurm's administrator's: the examples that
    log in as ubuntu reach them through sudo, as verify does; squeue and sinfo need not."""
    spec = tmp_path / "ubuntu.yaml"
    spec.write_text(LAB.read_text().replace("name: lab\n", "name: lab\nssh: {user: ubuntu}\n"))
    log: list[str] = []
    idle = {"compute001": ("idle", "none")}
    head = FakeHead(spec, Head(log, [idle, {"compute001": ("drained", "x")}]))
    steps = drain.SlurmBatchSteps(
        head, change=lambda _b: None, say=lambda _m: None, requeue=True, poll_s=0.01
    )
    roll(["compute001"], 1, steps, lambda _m: None)
    assert [c.split(" NodeName")[0] for c in log if c.startswith(("scontrol", "sudo"))] == [
        "sudo -n scontrol update", "sudo -n scontrol update"
    ]  # fmt: skip
    requeue = next(c for c in log if "requeue" in c)
    assert "sudo -n scontrol requeue $j" in requeue and "sudo -n scancel $j" in requeue
    assert not any(c.startswith("sudo") for c in log if "sinfo" in c or c.startswith("squeue"))
    drain.resume(head, "compute001", lambda _m: None)
    assert log[-1] == "sudo -n scontrol update NodeName=compute001 State=RESUME"


def test_a_node_back_from_its_reboot_counts_as_back() -> None:
    rebooted = {"compute001": ("down", "Node unexpectedly rebooted")}
    steps, _log = _steps([rebooted])
    steps.verify(["compute001"])


@pytest.mark.parametrize(
    "state",
    [("down", "Not responding"), ("idle*", "none"), ("down*", "Node unexpectedly rebooted")],
)
def test_a_node_that_does_not_come_back_fails_its_batch(state: tuple[str, str]) -> None:
    steps, _log = _steps([{"compute001": state}])
    with pytest.raises(OperationError, match=r"not back after 0s: compute001 "):
        steps.verify(["compute001"])
    steps, _log = _steps([{}])
    with pytest.raises(OperationError, match="compute002 unknown to Slurm"):
        steps.verify(["compute002"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "0"], "--batch '0': a number of nodes (2) or a percentage (25%)"),
        (["--batch", "150%"], "--batch '150%'"),
        (["--limit", "compute009"], "compute009 is not a lasting head/login/compute/storage node"),
        (["--tags", "slurm,nosuch"], "--tags 'slurm,nosuch': 'nosuch' is no tag of the roles"),
    ],
)
def test_bad_scope_is_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    r = run_provision("apply", str(LAB), *args, "--state-dir", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "lab").exists()  # refused before anything was made


def test_a_kubernetes_roll_upgrades_the_heads_then_drained_worker_batches(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """apply --batch on a Kubernetes cluster: the heads (the control plane, before any kubelet)
    and new nodes in one run, then the workers the cluster had, compute and login, through
    KubernetesBatchSteps (kubectl drain and uncordon), never Slurm's."""
    from provision import lifecycle
    from provision.cluster import Cluster
    from provision.head import Handle
    from provision.spec import load_spec
    from provision.state import State

    spec_path = ROOT / "examples" / "lab-k8s.yaml"
    cluster = Cluster(load_spec(spec_path))
    plays: list[tuple[list[str] | None, object]] = []
    monkeypatch.setattr(
        lifecycle,
        "_play",
        lambda _k, _r, limit, extra, *_a, **_kw: plays.append(
            (limit, extra.get("provision_drained"))
        ),
    )
    made: list[tuple[str, float, bool]] = []

    class Steps:
        def __init__(self, head, change, say, release, drain_timeout, force) -> None:  # type: ignore[no-untyped-def]
            made.append((release, drain_timeout, force))
            self.change = change

        def drain(self, batch: list[str]) -> list[str]:
            plays.append((["drain", *batch], None))
            return batch

        def verify(self, batch: list[str]) -> None:
            plays.append((["verify", *batch], None))

        def resume(self, nodes: list[str]) -> None:
            plays.append((["resume", *nodes], None))

    monkeypatch.setattr(drain, "KubernetesBatchSteps", Steps)
    monkeypatch.setattr(drain, "SlurmBatchSteps", None)  # never Slurm's
    hosts = [n.name for n in cluster.lasting_nodes]
    state = State(tmp_path, cluster.spec.name)
    run = lifecycle._Run(
        Handle(spec_path, cluster.spec, cluster, state),
        lambda _m: None,
        lifecycle.ApplyReport(),
        lifecycle.Leaving(timeout=300, force=True),
        lifecycle.Scope(batch="1"),
        hosts,
    )
    lifecycle._roll(cluster, None, run, {"provision_drained": []}, [], "restart", [])
    assert made == [("1.33.5", 300, True)]
    assert plays == [
        (["cp001", "cp002", "cp003"], []),
        (["drain", "worker001"], None),
        (["worker001"], ["worker001"]),
        (["verify", "worker001"], None),
        (["resume", "worker001"], None),
        (["drain", "worker002"], None),
        (["worker002"], ["worker002"]),
        (["verify", "worker002"], None),
        (["resume", "worker002"], None),
    ]


def _metal_run(tmp_path: Path, batch: str | None) -> tuple[object, object, list[str]]:
    """examples/metal-lab.yaml's cluster, and a run of apply on it that records what it says."""
    from provision import lifecycle
    from provision.cluster import Cluster
    from provision.head import Handle
    from provision.spec import load_spec
    from provision.state import State

    spec_path = ROOT / "examples" / "metal-lab.yaml"
    cluster = Cluster(load_spec(spec_path))
    said: list[str] = []
    run = lifecycle._Run(
        Handle(spec_path, cluster.spec, cluster, State(tmp_path, cluster.spec.name)),
        said.append,
        lifecycle.ApplyReport(),
        lifecycle.Leaving(timeout=300, force=False),
        lifecycle.Scope(batch=batch),
        [n.name for n in cluster.lasting_nodes],
    )
    return cluster, run, said


def test_a_node_on_an_older_image_is_booted_into_the_new_one_in_its_drained_batch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """apply --batch 1 on the metal lab, cpu002 on an older image: the head first, then cpu001
    as any batch, then cpu002 drained, booted into its pool's image through its BMC (a running
    machine: waited for until it goes down), converged as a new node, checked and resumed."""
    from provision import boot, lifecycle

    cluster, run, said = _metal_run(tmp_path, "1")
    steps: list[object] = []
    monkeypatch.setattr(
        lifecycle,
        "_play",
        lambda _k, _r, limit, extra, *_a, **_kw: steps.append(
            ("play", limit, extra.get("provision_drained"), extra.get("provision_new_nodes"))
        ),
    )
    monkeypatch.setattr(
        boot,
        "power_up",
        lambda _c, _s, nodes, _argv, _say, then, running: steps.append(
            ("power_up", [n.name for n in nodes], then, running)
        ),
    )

    class Steps:
        def __init__(self, head, change, say, drain_timeout, requeue) -> None:  # type: ignore[no-untyped-def]
            self.change = change

        def drain(self, batch: list[str]) -> list[str]:
            steps.append(("drain", batch))
            return batch

        def verify(self, batch: list[str]) -> None:
            steps.append(("verify", batch))

        def resume(self, nodes: list[str]) -> None:
            steps.append(("resume", nodes))

    monkeypatch.setattr(drain, "SlurmBatchSteps", Steps)
    lifecycle._roll(cluster, None, run, {}, [], "none", ["cpu002"])  # type: ignore[arg-type]
    assert steps == [
        ("play", ["head001"], None, None),
        ("drain", ["cpu001"]),
        ("play", ["cpu001"], ["cpu001"], []),
        ("verify", ["cpu001"]),
        ("resume", ["cpu001"]),
        ("drain", ["cpu002"]),
        ("power_up", ["cpu002"], "", True),
        ("play", ["cpu002"], ["cpu002"], ["cpu002"]),
        ("verify", ["cpu002"]),
        ("resume", ["cpu002"]),
    ]
    assert "boot: cpu002: drained, booted into the pool's new image" in said


@pytest.mark.parametrize("batch", [None, "1"])
def test_a_plain_apply_names_the_nodes_on_an_older_image_and_leaves_them(
    batch: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from provision import boot, lifecycle

    cluster, run, said = _metal_run(tmp_path, batch)
    asked: list[list[str]] = []

    def older(_c, hosts, images, _command):  # type: ignore[no-untyped-def]
        asked.append(hosts)
        assert images == {"cpu": "/cache/9a9a9a9a9a9a9a9a"}
        return {"cpu002": "0c0c0c0c0c0c0c0c"}

    monkeypatch.setattr(boot, "older", older)
    made = lifecycle._Made(cluster, {}, tmp_path)  # type: ignore[arg-type]
    images = {"netboot_images": {"cpu": "/cache/9a9a9a9a9a9a9a9a"}}
    rolling = batch is not None
    found = lifecycle._older_images(made, run, images, ["cpu001"], rolling)  # type: ignore[arg-type]
    assert found == ["cpu002"]
    assert asked == [["head001", "cpu002"]]  # not cpu001, booted by this apply
    line = "boot: cpu002: an older image than the pool's runs there until the node boots again"
    assert any(s.startswith(line) for s in said) is not rolling, said
    # no pool boots from the network: nobody asked
    assert lifecycle._older_images(made, run, {}, [], rolling) == []  # type: ignore[arg-type]
    assert len(asked) == 1

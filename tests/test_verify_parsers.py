"""Parsers of node output, fed real recorded output from tests/data/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provision.parsers.node import (
    host_entries,
    missing_host_lines,
    missing_keys,
    os_matches,
    parse_os_release,
    parse_stat,
)
from provision.parsers.slurm import (
    allreduce_problem,
    parse_drained,
    parse_sacct_steps,
    parse_sinfo_nodes,
    parse_srun_hosts,
    parse_srun_users,
)
from provision.verify.remote import Output

from .conftest import ROOT

DATA = Path(__file__).parent / "data"
KEY_A = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFxsWi/kWC/jwkJ3ZrWg1zvAFVA3skOEzrF8xvZk54Zh "
    "alice@example.org"
)
KEY_B = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH0kRR1l5bfCvEikwjKUxuaIOnYhCnjHhNimCrYIzaQ1 "
    "bob@example.org"
)


def test_host_entries_of_a_real_hosts_file() -> None:
    entries = host_entries((DATA / "etc-hosts-static-node.txt").read_text())
    assert ("127.0.0.1", ("localhost",)) in entries
    assert ("10.78.0.11", ("pt1.test.internal", "pt1")) in entries
    assert all(not addr.startswith("#") for addr, _ in entries)


def test_missing_host_lines() -> None:
    actual = (DATA / "etc-hosts-static-node.txt").read_text()
    rendered = "# header\n10.78.0.12 pt2.test.internal pt2\n10.78.0.99 ghost\n"
    assert missing_host_lines(rendered, actual) == ["10.78.0.99 ghost"]


def test_missing_keys_ignores_comments_and_options() -> None:
    authorized = (
        "# managed\n"
        'from="10.0.0.0/8",no-pty ' + KEY_A.replace("alice@example.org", "other comment") + "\n"
    )
    assert missing_keys([KEY_A], authorized) == []
    assert missing_keys([KEY_A, KEY_B], authorized) == [KEY_B]
    assert missing_keys([KEY_A], "") == [KEY_A]


def test_sinfo_idle_and_drained() -> None:
    idle = parse_sinfo_nodes((DATA / "sinfo-nodes-idle.txt").read_text())
    assert idle == {"compute001": "idle", "compute002": "idle"}
    drained = parse_sinfo_nodes((DATA / "sinfo-nodes-drained.txt").read_text())
    assert drained["compute002"] == "drained"


def test_srun_hosts() -> None:
    job, hosts = parse_srun_hosts((DATA / "srun-hosts.txt").read_text())
    assert (job, hosts) == ("2", ["compute001", "compute002"])
    assert parse_srun_hosts("srun: error: Unable to allocate resources\n") == (None, [])


def test_srun_users() -> None:
    """Recorded on the lab: `runuser -u nobody -- srun -N2 sh -c 'echo $SLURM_JOB_ID
    $(hostname) $(id -un)'`."""
    text = (DATA / "srun-users.txt").read_text()
    assert parse_srun_hosts(text) == ("3", ["compute001", "compute002"])
    assert parse_srun_users(text) == {"nobody"}
    assert parse_srun_users((DATA / "srun-hosts.txt").read_text()) == set()


def test_mpi_allreduce() -> None:
    """Recorded on the lab: `runuser -u nobody -- srun --mpi=pmix -N2 --ntasks-per-node=1
    /usr/local/libexec/provision/mpi-allreduce`, and the same before libpmix-dev was there."""
    good = (DATA / "mpi-allreduce.txt").read_text()
    assert allreduce_problem(good, ["compute001", "compute002"]) is None
    assert allreduce_problem(good, ["compute001", "compute003"]) == (
        "ranks ran on compute001, compute002, not compute001, compute003"
    )
    bad_sum = good.replace("1 2 3 compute002", "1 2 2 compute002")
    assert allreduce_problem(bad_sum, ["compute001", "compute002"]) == (
        "rank 1 got sum 2 of 2 ranks, not 3"
    )
    failed = (DATA / "mpi-allreduce-no-pmix.txt").read_text()
    assert allreduce_problem(failed, ["compute001", "compute002"]) == (
        "ranks none answered, not 0-1"
    )


def test_verify_runs_the_all_reduce_where_the_slurm_role_puts_it() -> None:
    import yaml

    from provision.verify.slurm import MPI_ALLREDUCE

    defaults = yaml.safe_load((ROOT / "roles" / "slurm" / "defaults" / "main.yml").read_text())
    assert defaults["slurm_mpi_allreduce_path"] == MPI_ALLREDUCE


def test_sacct_steps() -> None:
    """Recorded on the lab: a batch job of verify's, its script and its one step."""
    rows = parse_sacct_steps((DATA / "sacct-steps.txt").read_text())
    assert rows == {"2": ("COMPLETED", 2), "2.batch": ("COMPLETED", 1), "2.0": ("COMPLETED", 2)}
    assert parse_sacct_steps("7|CANCELLED by 0|1\n") == {"7": ("CANCELLED", 1)}
    assert parse_sacct_steps("") == {}


def test_drained_nodes() -> None:
    """Recorded on the lab: `scontrol -o show node` with compute002 drained (the kernel string
    left out of its OS field)."""
    text = (DATA / "scontrol-show-node-drained.txt").read_text()
    assert parse_drained(text) == ["compute002"]
    assert parse_drained(text.replace("IDLE+DRAIN", "IDLE")) == []


def test_stat_munge_key() -> None:
    assert parse_stat((DATA / "stat-munge-key.txt").read_text()) == ("400", "munge:munge")


def test_os_release() -> None:
    os_id, version = parse_os_release((DATA / "os-release-debian12.txt").read_text())
    assert (os_id, version) == ("debian", "12")
    assert os_matches("debian12", os_id, version)
    assert not os_matches("ubuntu22.04", os_id, version)
    assert os_matches("rocky9", "rocky", "9.4")
    assert not os_matches("rocky9", "rocky", "90")


class _Slurm:
    """A head that answers like slurmctld: sinfo from a script of states (one entry per call,
    the last one kept), reservations made and removed, srun on the nodes it is given."""

    def __init__(self, *sinfo: str, create_fails: int = 0, delete_fails: bool = False) -> None:
        self.sinfo = list(sinfo)
        self.asked: list[str] = []
        self.reservations: set[str] = set()
        self.create_fails = create_fails
        self.delete_fails = delete_fails
        self.user = "root"
        self.said: list[str] = []  # verify's progress lines
        self.nodes: list[str] = []  # where the last job ran

    def run(self, command: str, sudo: bool = False, timeout: float = 60.0) -> Output:
        self.asked.append(command)
        if command.startswith("sinfo"):
            return Output(0, self.sinfo.pop(0) if len(self.sinfo) > 1 else self.sinfo[0], "")
        if command.startswith("scontrol -o show reservation"):
            if "provision-verify" not in self.reservations:
                return Output(1, "", "Reservation provision-verify not found\n")
            return Output(
                0,
                "ReservationName=provision-verify StartTime=2026-12-02T10:00:00 "
                "EndTime=2026-12-02T11:00:00 Duration=01:00:00 Nodes=compute[001-002] "
                "NodeCnt=2 Flags=MAINT,IGNORE_JOBS,SPEC_NODES Users=root\n",
                "",
            )
        if command.startswith("scontrol create reservation"):
            if self.create_fails:
                self.create_fails -= 1
                return Output(1, "", "Error creating the reservation: Requested nodes are busy")
            self.reservations.add("provision-verify")
            return Output(0, "Reservation created: provision-verify\n", "")
        if command.startswith("scontrol delete reservation"):
            if "provision-verify" not in self.reservations or self.delete_fails:
                return Output(1, "", "Reservation provision-verify not found")
            self.reservations.discard("provision-verify")
            return Output(0, "", "")
        if "srun" in command or "sbatch" in command:
            hosts = command.split(" -w ")[1].split()[0]
            self.nodes = ["compute001", "compute002"] if hosts == "compute[001-002]" else [hosts]
            if "sbatch" in command:  # the batch job's id (--parsable)
                return Output(0, "8\n", "")
            return Output(0, "".join(f"7 {n} nobody\n" for n in self.nodes), "")
        if command.startswith("scontrol -o show node"):
            return Output(0, "".join(f"NodeName={n} State=IDLE\n" for n in self.nodes), "")
        if command.endswith("-j 8"):  # the batch job, its script and its one step
            n = len(self.nodes)
            return Output(0, f"8|COMPLETED|{n}\n8.batch|COMPLETED|1\n8.0|COMPLETED|{n}\n", "")
        return Output(0, f"7|COMPLETED|{len(self.nodes)}\n7.0|COMPLETED|{len(self.nodes)}\n", "")


def _verify_slurm(
    head: _Slurm, maintenance: bool = False, wait_s: float = 3600.0, state_root: Path | None = None
) -> list[tuple[str, str, bool, str]]:
    """hold_nodes, check_scheduler and release against `head`, as verify_cluster runs them."""
    import tempfile

    from provision.cluster import Cluster
    from provision.spec import load_spec
    from provision.state import State
    from provision.verify import VerifyContext, slurm

    cluster = Cluster(load_spec(ROOT / "examples" / "lab.yaml"))
    state = State(state_root or Path(tempfile.mkdtemp()), "lab")
    state.ensure()
    ctx = VerifyContext(cluster, state, "")
    remotes: dict[str, Any] = {"head001": head}
    said: list[str] = []
    hold = slurm.hold_nodes(ctx, remotes, maintenance, wait_s, said.append)
    results = hold.results + slurm.check_scheduler(ctx, remotes, hold)
    results += slurm.release(remotes, ctx, hold)
    head.said = said
    return [(r.check, r.target, r.passed, r.evidence) for r in results]


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    from provision.verify import slurm

    monkeypatch.setattr(slurm.time, "sleep", lambda _: None)


def test_verify_on_a_busy_cluster_holds_and_tests_the_idle_nodes_only(no_sleep: None) -> None:
    head = _Slurm("compute001 allocated\ncompute002 idle\n")
    results = _verify_slurm(head)
    assert results == [
        ("sinfo", "compute001", True, "state allocated (running jobs)"),
        ("sinfo", "compute002", True, "state idle"),
        (
            "hold",
            "compute[001-002]",
            True,
            "reservation provision-verify on the idle nodes; compute001 run jobs: read only, "
            "not tested under load (--maintenance tests them)",
        ),
        ("srun", "compute002", True, "job 7 ran on compute002 as nobody"),
        ("sacct", "job 7", True, "state COMPLETED"),
        ("sbatch", "compute002", True, "batch job 8: its step ran on 1 node(s) as nobody"),
    ]
    create = [a for a in head.asked if a.startswith("scontrol create")]
    assert create == [
        "scontrol create reservation ReservationName=provision-verify StartTime=now "
        "Duration=60 Users=root,nobody Nodes=compute002"
    ]
    where = "--reservation=provision-verify -p compute -N1 -w compute002 --time=2"
    srun = f"runuser -u nobody -- timeout 120 srun --chdir=/tmp {where} "
    assert any(a.startswith(srun) for a in head.asked), head.asked
    sbatch = "runuser -u nobody -- timeout 150 sbatch -W --parsable --chdir=/tmp "
    assert any(a.startswith(sbatch) and where in a for a in head.asked), head.asked
    assert not head.reservations  # released


def test_verify_with_every_node_busy_holds_none_and_runs_no_job(no_sleep: None) -> None:
    head = _Slurm("compute001 mixed\ncompute002 allocated\n")
    results = _verify_slurm(head)
    assert results[-2][:3] == ("hold", "compute[001-002]", True)
    assert results[-2][3].startswith("no node idle; compute[001-002] run jobs")
    assert results[-1] == (
        "srun",
        "compute[001-002]",
        True,
        "not run: every compute node runs jobs",
    )
    assert not any("srun" in a or "sbatch" in a or "scontrol create" in a for a in head.asked)


def test_a_job_landing_before_the_reservation_is_left_alone(no_sleep: None) -> None:
    head = _Slurm(
        "compute001 idle\ncompute002 idle\n",
        "compute001 allocated\ncompute002 idle\n",
        create_fails=1,
    )
    results = _verify_slurm(head)
    create = [a.split("Nodes=")[1] for a in head.asked if a.startswith("scontrol create")]
    assert create == ["compute[001-002]", "compute002"]
    assert ("srun", "compute002", True, "job 7 ran on compute002 as nobody") in results


def test_maintenance_waits_for_the_jobs_then_tests_every_node(no_sleep: None) -> None:
    head = _Slurm(
        "compute001 allocated\ncompute002 idle\n",  # in service
        "compute001 allocated+maint\ncompute002 maint\n",  # held: the job still runs
        "compute001 completing+maint\ncompute002 maint\n",
        "compute001 maint\ncompute002 maint\n",  # the job ended
    )
    results = _verify_slurm(head, maintenance=True)
    hold = next(r for r in results if r[0] == "hold")
    assert hold[2] and "maintenance reservation provision-verify; waited" in hold[3]
    assert hold[3].endswith("for the jobs on compute001")
    assert ("srun", "compute[001-002]", True, "job 7 ran on compute[001-002] as nobody") in results
    create = next(a for a in head.asked if a.startswith("scontrol create"))
    assert create.endswith("Nodes=compute[001-002] Flags=MAINT,IGNORE_JOBS")
    assert head.said[0].startswith("maintenance: waiting for the jobs on compute001 to end")
    assert not head.reservations


def test_maintenance_that_runs_out_of_time_fails_and_releases(no_sleep: None) -> None:
    head = _Slurm(
        "compute001 allocated\ncompute002 idle\n",
        "compute001 allocated+maint\ncompute002 maint\n",
    )
    results = _verify_slurm(head, maintenance=True, wait_s=-1)
    hold = next(r for r in results if r[0] == "hold")
    assert not hold[2]
    assert hold[3] == "compute001 still ran jobs after -1 s: not tested under load"
    assert ("srun", "compute002", True, "job 7 ran on compute002 as nobody") in results
    assert not head.reservations


class _Drains(_Slurm):
    """A head whose batch jobs never start: sbatch -W says 0, the job may read COMPLETED, and
    the node is drained ("batch job complete failure"), as a user's job did on the lab before
    its nodes could pin a user's tasks."""

    def run(self, command: str, sudo: bool = False, timeout: float = 60.0) -> Output:
        if command.startswith("scontrol -o show node"):
            self.asked.append(command)
            return Output(0, "NodeName=compute002 State=IDLE+DRAIN Reason=batch_job_failure\n", "")
        return super().run(command, sudo, timeout)


class _AsRoot(_Slurm):
    """A head whose srun tasks run as root, whatever the job was submitted as."""

    def run(self, command: str, sudo: bool = False, timeout: float = 60.0) -> Output:
        out = super().run(command, sudo, timeout)
        return Output(out.rc, out.stdout.replace(" nobody", " root"), out.stderr)


def test_a_batch_job_that_drains_its_node_fails_verify(no_sleep: None) -> None:
    results = _verify_slurm(_Drains("compute001 allocated\ncompute002 idle\n"))
    assert ("sbatch", "compute002", False, "batch job 8 drained compute002") in results


def test_a_job_whose_tasks_ran_as_another_user_fails_verify(no_sleep: None) -> None:
    results = _verify_slurm(_AsRoot("compute001 allocated\ncompute002 idle\n"))
    assert ("srun", "compute002", False, "job 7 ran as root, not nobody") in results


class _Stuck(_Slurm):
    """A head whose batch job cannot end (its node cannot reach slurmctld): sbatch -W times
    out, and the reservation stays busy until the cancelled job has left."""

    def __init__(self, *sinfo: str) -> None:
        super().__init__(*sinfo)
        self.busy = 2

    def run(self, command: str, sudo: bool = False, timeout: float = 60.0) -> Output:
        if "sbatch" in command:
            self.asked.append(command)
            return Output(124, "8\n", "")
        if command.startswith("scontrol delete reservation") and self.busy:
            self.asked.append(command)
            self.busy -= 1
            return Output(1, "", "Error deleting the reservation: Reservation request busy")
        return super().run(command, sudo, timeout)


def test_a_batch_job_that_cannot_end_is_cancelled_and_the_nodes_released(no_sleep: None) -> None:
    head = _Stuck("compute001 idle\ncompute002 idle\n")
    results = _verify_slurm(head)
    assert ("sbatch", "compute[001-002]", False, "rc 124: 8") in results
    assert "scancel 8" in head.asked
    assert "scancel --reservation=provision-verify --user=nobody" in head.asked
    assert not any(r[0] == "release" for r in results)
    assert not head.reservations


def test_a_reservation_verify_cannot_remove_is_a_failure_naming_the_fix(no_sleep: None) -> None:
    head = _Slurm("compute001 idle\ncompute002 idle\n", delete_fails=True)
    results = _verify_slurm(head)
    assert results[-1][:3] == ("release", "provision-verify", False)
    assert "`scontrol delete reservation provision-verify` on a head" in results[-1][3]


def test_another_verifys_reservation_is_never_removed_from_under_it(
    no_sleep: None, tmp_path: Path
) -> None:
    """A verify from another workstation (or another state) holds the nodes: this one says
    so and neither removes nor replaces its reservation, so no job lands on nodes under test."""
    head = _Slurm("compute001 maint\ncompute002 maint\n")
    head.reservations.add("provision-verify")
    results = _verify_slurm(head, state_root=tmp_path)
    hold = next(r for r in results if r[0] == "hold")
    assert not hold[2]
    assert hold[3].startswith(
        "reservation provision-verify is another verify's (compute[001-002] since "
        "2026-12-02T10:00:00, MAINT,IGNORE_JOBS,SPEC_NODES): wait for it to end"
    )
    assert not any(a.startswith(("scontrol delete", "scontrol create")) for a in head.asked)
    assert head.reservations == {"provision-verify"}
    assert not (tmp_path / "lab" / "verify-reservation").exists()


def test_a_reservation_this_states_killed_verify_left_goes_first(
    no_sleep: None, tmp_path: Path
) -> None:
    head = _Slurm("compute001 idle\ncompute002 idle\n")
    head.reservations.add("provision-verify")  # left by a verify killed before its release
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "verify-reservation").touch()
    results = _verify_slurm(head, state_root=tmp_path)
    assert ("srun", "compute[001-002]", True, "job 7 ran on compute[001-002] as nobody") in results
    changes = [
        a.split(" Start")[0] for a in head.asked if a.startswith("scontrol ") and "show" not in a
    ]
    assert changes == [
        "scontrol delete reservation provision-verify",
        "scontrol create reservation ReservationName=provision-verify",
        "scontrol delete reservation provision-verify",
    ]
    assert not (tmp_path / "lab" / "verify-reservation").exists()  # released: no mark left


def test_a_verify_while_another_command_holds_the_state_is_refused(tmp_path: Path) -> None:
    import subprocess
    import sys

    from provision.state import State

    spec = tmp_path / "lab.yaml"
    spec.write_text((ROOT / "examples" / "lab.yaml").read_text())
    state = State(tmp_path / ".provision", "lab")
    (state.build / "files").mkdir(parents=True)
    (state.build / "files" / "hosts").write_text("")
    with state.locked("verify lab.yaml"):
        r = subprocess.run(
            [sys.executable, "-m", "provision", "verify", str(spec)],
            capture_output=True, text=True, check=False, timeout=60, cwd=tmp_path,
        )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cluster 'lab' is busy: `provision verify lab.yaml`" in r.stderr

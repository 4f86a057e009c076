"""Parsers of node output, fed real recorded output from tests/data/."""

from __future__ import annotations

from pathlib import Path

from provision.parsers.node import (
    host_entries,
    missing_host_lines,
    missing_keys,
    os_matches,
    parse_os_release,
    parse_stat,
)
from provision.parsers.slurm import parse_sacct_states, parse_sinfo_nodes, parse_srun_hosts

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


def test_sacct_states() -> None:
    assert parse_sacct_states((DATA / "sacct-job.txt").read_text()) == {"2": "COMPLETED"}
    assert parse_sacct_states("7|CANCELLED by 0\n") == {"7": "CANCELLED"}
    assert parse_sacct_states("") == {}


def test_stat_munge_key() -> None:
    assert parse_stat((DATA / "stat-munge-key.txt").read_text()) == ("400", "munge:munge")


def test_os_release() -> None:
    os_id, version = parse_os_release((DATA / "os-release-debian12.txt").read_text())
    assert (os_id, version) == ("debian", "12")
    assert os_matches("debian12", os_id, version)
    assert not os_matches("ubuntu22.04", os_id, version)
    assert os_matches("rocky9", "rocky", "9.4")
    assert not os_matches("rocky9", "rocky", "90")


def _scheduler_results(sinfo: str) -> tuple[list[tuple[str, str, bool, str]], list[str]]:
    """check_scheduler against a head that answers sinfo with `sinfo` and runs srun."""
    from provision.cluster import Cluster
    from provision.spec import load_spec
    from provision.state import State
    from provision.verify import VerifyContext
    from provision.verify.remote import Output
    from provision.verify.slurm import check_scheduler

    asked: list[str] = []

    class Head:
        def run(self, command: str, sudo: bool = False, timeout: float = 60.0) -> Output:
            asked.append(command)
            if command.startswith("sinfo"):
                return Output(0, sinfo, "")
            if "srun" in command:
                return Output(0, "7 compute002\n", "")
            return Output(0, "7|COMPLETED\n", "")

    cluster = Cluster(load_spec(ROOT / "examples" / "lab.yaml"))
    ctx = VerifyContext(cluster, State(Path("/nonexistent"), "lab"), "")
    results = check_scheduler(ctx, {"head001": Head()})  # type: ignore[dict-item]
    return [(r.check, r.target, r.passed, r.evidence) for r in results], asked


def test_verify_on_a_busy_cluster_runs_its_job_on_the_idle_nodes_only() -> None:
    results, asked = _scheduler_results("compute001 allocated\ncompute002 idle\n")
    assert results == [
        ("sinfo", "compute001", True, "state allocated (running jobs)"),
        ("sinfo", "compute002", True, "state idle"),
        ("srun", "compute002", True, "job 7 ran on compute002"),
        ("sacct", "job 7", True, "state COMPLETED"),
    ]
    assert any("srun -N1 -w compute002 --time=2" in a for a in asked), asked


def test_verify_with_every_node_busy_runs_no_job() -> None:
    results, asked = _scheduler_results("compute001 mixed\ncompute002 allocated\n")
    assert results[-1] == (
        "srun",
        "compute[001-002]",
        True,
        "not run: every compute node runs jobs",
    )
    assert not any("srun" in a for a in asked)

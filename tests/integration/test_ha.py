"""examples/lab-ha.yaml end to end, with an elastic pool and a login node beside it: two heads
with a primary and a backup slurmctld, their state and /home on shared storage (podman volumes
in a lab); a user of the spec logs in to the login node, not the heads, and runs a job. The
primary's container is stopped with a job running: the backup takes control, the job completes,
a new job runs, and a job on the elastic pool bursts from the backup (its slurmctld runs the
burst programs, its reconciler acts, the primary's stays quiet when it is back); the primary
comes back and takes control again. The figures are bench/failover.py's.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.providers.lab import container_name, podman

from ..conftest import ROOT, with_burst_pool
from ..conftest import run_provision as provision
from .conftest import user_login

NAME = "hatest"


@pytest.fixture(scope="module")
def ha(lab_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    work = tmp_path_factory.mktemp("ha")
    spec = work / "lab-ha.yaml"
    # the admin's key: one of the test's own, to log in as labadmin
    key = work / "labadmin"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    example = (ROOT / "examples" / "lab-ha.yaml").read_text()
    example_key = next(line for line in example.splitlines() if "ssh-ed25519" in line)
    # a login node, the users' door, and a user with a key of the test's own
    user = work / "ana"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(user)], check=True)
    assert "\nstorage:\n" in example
    ana = user.with_suffix(".pub").read_text().strip()
    spec.write_text(
        with_burst_pool(example)
        .replace("name: lab-ha", f"name: {NAME}")
        .replace("10.79.0.", "10.74.0.")
        .replace(example_key.strip(), "- " + key.with_suffix(".pub").read_text().strip())
        .replace("\nstorage:\n", "\n" + LOGIN_POOL + "storage:\n")
        + f'users: [{{name: ana, uid: 6001, ssh_keys: ["{ana}"]}}]\n'
    )
    provision("destroy", str(spec), "--yes", cwd=work)  # a crashed earlier run's leftovers
    yield spec, work
    provision("destroy", str(spec), "--yes", cwd=work)


LOGIN_POOL = "  - {name: login, role: login, profile: lab-container, provider: lab, count: 1}\n"


def _on(spec: Path, work: Path, node: str, command: str, check: bool = True) -> str:
    r = provision("ssh", "-f", str(spec), node, "--", command, cwd=work)
    assert r.returncode == 0 or not check, r.stderr
    return r.stdout.strip()


def _until(spec: Path, work: Path, node: str, command: str, want: str, seconds: float) -> str:
    """The node's answer once it contains `want`, or the last one after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        got = _on(spec, work, node, command, check=False)
        if want in got or time.monotonic() > deadline:
            return got
        time.sleep(2)


PING = "scontrol ping"
ROOT_LIBEXEC = "/usr/local/libexec/provision"
BOTH_UP = "Slurmctld(primary) at head001 is UP\nSlurmctld(backup) at head002 is UP"


def test_apply_makes_two_controllers_on_shared_state(ha: tuple[Path, Path]) -> None:
    spec, work = ha
    r = provision("apply", str(spec), cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "0 failed" in r.stdout, r.stdout[-3000:]
    assert _until(spec, work, "head002", PING, BOTH_UP, 60).endswith(BOTH_UP)
    # one volume, the same files, on both heads
    state = "stat -c '%U %a' /shared/slurm/state && ls /shared/slurm/state | sort | head -3"
    assert _on(spec, work, "head001", state) == _on(spec, work, "head002", state)
    assert _on(spec, work, "head001", state).startswith("slurm ")


def test_home_is_shared_by_every_node(ha: tuple[Path, Path]) -> None:
    spec, work = ha
    job = _on(
        spec, work, "head001", "sbatch --parsable -w compute002 --chdir /home --wrap hostname"
    )
    out = f"/home/slurm-{job}.out"
    assert _until(spec, work, "head002", f"cat {out}", "compute002", 60) == "compute002"
    assert _on(spec, work, "compute001", f"cat {out}") == "compute002"


def test_users_log_in_to_the_login_node_and_not_to_the_heads(ha: tuple[Path, Path]) -> None:
    """With a login pool, the login nodes are the users' door: a user logs in there with their
    key and runs a 2-node job through the two controllers; the heads take no user's key, and
    plan says so."""
    spec, work = ha
    login = _on(spec, work, "head001", "getent hosts login001").split()[0]
    ran = user_login(work, "ana", login, "srun -N2 -p compute sh -c 'echo $(hostname) $(id -u)'")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert sorted(ran.stdout.splitlines()) == ["compute001 6001", "compute002 6001"], ran.stdout
    head = _on(spec, work, "head001", "getent hosts head001").split()[0]
    refused = user_login(work, "ana", head, "true")
    assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused.stderr
    plan = provision("plan", str(spec), cwd=work)
    door = next(ln for ln in plan.stdout.splitlines() if "ssh (users)" in ln)
    assert "login001" in door and "head" not in door, door


def test_the_admins_home_is_made_on_the_shared_home_once_with_one_owner(
    ha: tuple[Path, Path],
) -> None:
    """labadmin's uid is pinned by the spec (5001) and its home made on the shared /home after
    the mounts: the same owner on every node; labadmin logs in with its key from root's file
    (its home has no .ssh), writes there, and runs a job on both compute nodes as itself."""
    spec, work = ha
    for node in ("head001", "head002", "compute001", "compute002"):
        got = _on(spec, work, node, "id -u labadmin; stat -c '%u:%g %a' /home/labadmin")
        assert got.split() == ["5001", "5001:5001", "700"], (node, got)
    assert _on(spec, work, "head002", "ls -A /home/labadmin") == ""  # no keys in the home
    address = _on(spec, work, "head001", "getent hosts compute002").split()[0]
    session = subprocess.run(
        ["ssh", "-i", str(work / "labadmin"), "-o", "BatchMode=yes", "-o",
         "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         f"labadmin@{address}",
         "echo written > ~/note && srun -N2 -w compute[001-002] id -u"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert session.stdout.split() == ["5001", "5001"], session.stdout + session.stderr
    assert _on(spec, work, "head001", "stat -c %u /home/labadmin/note") == "5001"
    _on(spec, work, "head001", "rm /home/labadmin/note")


def test_the_backup_takes_over_and_gives_back(ha: tuple[Path, Path]) -> None:
    spec, work = ha
    job = _on(
        spec,
        work,
        "head001",
        "sbatch --parsable -J through-failover -w compute001 --wrap 'sleep 40'",
    )
    running = _until(spec, work, "head001", f"squeue -h -j {job} -o %T", "RUNNING", 60)
    assert running == "RUNNING"
    # a job that has run a while: slurmctld writes its state a moment after a change, and a
    # primary killed before that leaves the backup a record of the job still pending (found
    # here: the backup then starts it again, after Slurm's hold on requeued jobs)
    elapsed = f"squeue -h -j {job} -o %M"
    assert _until(spec, work, "head001", elapsed, "0:1", 60).startswith("0:1")
    primary = container_name(NAME, "head001")
    podman.podman("stop", "-t", "0", primary)
    try:
        # the backup takes control after SlurmctldTimeout (10 s) and schedules a new job
        srun = "timeout 20 srun -N1 -w compute002 hostname"
        assert _until(spec, work, "head002", srun, "compute002", 120) == "compute002"
        assert "Slurmctld(backup) at head002 is UP" in _on(spec, work, "head002", PING, False)
        # the job that ran through the takeover completes (the accounting database is on
        # head001: the controller's own record says it)
        show = f"scontrol show job {job} -o | grep -o 'JobState=[A-Z_]* Reason=[^ ]*'"
        state = _until(spec, work, "head002", show, "COMPLETED", 90)
        assert state.startswith("JobState=COMPLETED"), state
        # a job on the elastic pool: the backup's slurmctld runs the burst program, whose new
        # node asks the primary, then the backup, for its configuration and registers
        burst = "timeout 240 srun -p burst -N1 hostname"
        assert _on(spec, work, "head002", burst, check=False) == "burst001"
        burst_log = f"/var/log/provision/burst-{NAME}.log"
        assert " burst001 resume ok (burst, " in _on(spec, work, "head002", f"cat {burst_log}")
        # the backup's reconciler acts (the primary's ran nothing while it was down)
        reconcile = f"{ROOT_LIBEXEC}/burst reconcile; echo $?"
        assert _on(spec, work, "head002", reconcile).endswith("0")
    finally:
        podman.podman("start", primary)
    # the primary comes back, takes control again, and jobs run through it
    assert _until(spec, work, "head001", PING, BOTH_UP, 120).endswith(BOTH_UP)
    srun = "timeout 30 srun -N2 hostname | sort"
    assert _until(spec, work, "head001", srun, "compute001\ncompute002", 90) == (
        "compute001\ncompute002"
    )
    log = _on(
        spec,
        work,
        "head002",
        "grep -c 'Running as primary controller' /var/log/slurm/slurmctld.log",
        check=False,
    )
    assert log.isdigit() and int(log) >= 1  # the backup did run as the controller
    # in control again, the primary's reconciler acts and the backup's returns at once: with
    # burst001's container gone while Slurm has it up, the backup's run (first, at once) says
    # nothing and leaves it, the primary's marks it down
    burst_log = f"/var/log/provision/burst-{NAME}.log"
    quiet = _on(spec, work, "head002", f"cat {burst_log}")
    podman.podman("rm", "-f", "-t", "0", container_name(NAME, "burst001"))
    _on(spec, work, "head002", f"{ROOT_LIBEXEC}/burst reconcile")
    assert _on(spec, work, "head002", f"cat {burst_log}") == quiet
    _on(spec, work, "head001", f"{ROOT_LIBEXEC}/burst reconcile")
    gone = "burst001 reconcile: instance or container gone while Slurm has it up"
    assert gone in _on(spec, work, "head001", f"cat {burst_log}")
    reason = "sinfo -h -R -n burst001 -o %E"
    assert _on(spec, work, "head001", reason).startswith("burst: node vanished")


def test_destroy_removes_the_volumes(ha: tuple[Path, Path]) -> None:
    spec, work = ha
    r = provision("destroy", str(spec), "--yes", cwd=work)
    assert r.returncode == 0, r.stdout + r.stderr
    volumes = podman.text("volume", "ls", "--format", "{{.Name}}").split()
    assert not [v for v in volumes if v.startswith(f"provision-{NAME}-")]

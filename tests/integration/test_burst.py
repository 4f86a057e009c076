"""Bursting live on the lab: examples/lab-burst.yaml (renamed, on its own network, a shorter
SuspendTime and cooldown), as a user runs it. A job sent to the elastic pool runs on containers
the head's burst programs create through the workstation's podman; they are removed once idle;
a resume that fails marks the nodes down with the cause and the job waits, then runs once the
fault is fixed and the cooldown is over; a node whose container vanishes under a job is marked
down by the reconciler and the job requeued; destroy removes the burst containers and the
pool's image.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.providers.lab import podman

from ..conftest import ROOT
from ..conftest import run_provision as provision

NAME = "bursttest"
IMAGE = f"localhost/provision-{NAME}-burst:latest"


def _containers() -> list[str]:
    out = podman.text(
        "ps", "-a", "--filter", f"label=provision.cluster={NAME}", "--format", "{{.Names}}"
    )
    return sorted(out.split())


def _burst_containers() -> list[str]:
    return [c for c in _containers() if "-burst0" in c]


@pytest.fixture(scope="module")
def cluster(
    lab_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path]]:
    work = tmp_path_factory.mktemp("burst")
    spec = work / "lab-burst.yaml"
    spec.write_text(
        (ROOT / "examples" / "lab-burst.yaml")
        .read_text()
        .replace("name: labburst", f"name: {NAME}")
        .replace("10.78.0.", "10.75.0.")
        .replace("suspend_time: 90", "suspend_time: 30")
        .replace("burst_cooldown: 120", "burst_cooldown: 5")
    )
    provision("destroy", str(spec), "--yes", cwd=work)  # a crashed earlier run's leftovers
    yield spec, work
    provision("destroy", str(spec), "--yes", cwd=work)


def _on_head(cluster: tuple[Path, Path], command: str, timeout: float = 60) -> str:
    spec, work = cluster
    r = provision("ssh", "-f", str(spec), "head001", "--", command, cwd=work, timeout=timeout)
    assert r.returncode == 0, f"{command}: {r.stdout[-2000:]} {r.stderr[-2000:]}"
    return r.stdout


def _wait(what: str, probe, timeout: float, every: float = 2) -> object:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s")
        time.sleep(every)


def _node_states(cluster: tuple[Path, Path]) -> dict[str, str]:
    out = _on_head(cluster, "sinfo -h -N -p burst -o '%N %T'")
    return dict(line.split() for line in out.splitlines() if line.strip())


def test_apply_makes_the_pool_image_and_no_burst_node(cluster: tuple[Path, Path]) -> None:
    spec, work = cluster
    r = provision("apply", str(spec), cwd=work, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert f"images: {IMAGE} made" in r.stdout
    assert podman.image_exists(IMAGE)
    assert _burst_containers() == []
    assert _node_states(cluster) == {f"burst00{i}": "idle~" for i in range(1, 5)}
    # the head reaches podman through the mounted socket; nothing else does
    assert _on_head(cluster, "stat -c '%a %U' /run/provision-podman").split() == ["700", "root"]
    assert _on_head(cluster, "systemctl is-active provision-burst-reconcile.timer").strip() == (
        "active"
    )
    # the munge key is never in the pool's image
    probe = podman.podman("run", "--rm", IMAGE, "ls", "/etc/munge", check=False)
    assert b"munge.key" not in probe.stdout


def test_a_job_bursts_onto_new_nodes_that_leave_when_idle(cluster: tuple[Path, Path]) -> None:
    started = time.monotonic()
    out = _on_head(cluster, "timeout 240 srun -p burst -N2 hostname", timeout=300)
    seconds = time.monotonic() - started
    assert sorted(out.split()) == ["burst001", "burst002"], out
    assert seconds < 120, f"the job took {seconds:.0f}s to run on new nodes"
    assert _burst_containers() == [f"provision-{NAME}-burst001", f"provision-{NAME}-burst002"]
    log = _on_head(cluster, f"cat /var/log/provision/burst-{NAME}.log")
    assert "burst001 resume ok (burst," in log and "burst002 resume ok (burst," in log
    # idle for SuspendTime (30 s): the suspend program removes them, Slurm powers them down
    _wait("burst containers removed", lambda: _burst_containers() == [], timeout=240)
    states = _node_states(cluster)
    assert states["burst001"] in ("idle%", "idle~") and states["burst002"] in ("idle%", "idle~")
    log = _on_head(cluster, f"cat /var/log/provision/burst-{NAME}.log")
    assert "burst001 suspend ok (burst)" in log


def test_the_default_partition_fills_the_lasting_node_first(cluster: tuple[Path, Path]) -> None:
    """Partition `all` (compute and burst): one lasting node, so a two-node job takes it and
    one new burst node."""
    out = _on_head(cluster, "timeout 240 srun -N2 hostname", timeout=300).split()
    assert "compute001" in out and len(out) == 2, out
    assert next(n for n in out if n != "compute001").startswith("burst00"), out


def _powered_down_node(cluster: tuple[Path, Path]) -> str:
    """A burst node with no container, which a job would have to start (not one still up
    from an earlier test, before its SuspendTime)."""
    found = _wait(
        "a powered-down burst node",
        lambda: sorted(n for n, s in _node_states(cluster).items() if s == "idle~"),
        timeout=240,
    )
    return str(found[0])  # type: ignore[index]


def test_a_failed_resume_marks_nodes_down_and_the_job_waits(cluster: tuple[Path, Path]) -> None:
    node = _powered_down_node(cluster)
    podman.podman("tag", IMAGE, f"{IMAGE}-aside")
    podman.podman("rmi", IMAGE)
    try:
        job = _on_head(
            cluster, f"sbatch --parsable -p burst -w {node} -o /dev/null --wrap hostname"
        ).strip()
        _wait(
            "a node down with the cause",
            lambda: "burst resume failed" in _on_head(cluster, "sinfo -h -R -o '%E'"),
            timeout=90,
        )
        reasons = _on_head(cluster, "sinfo -h -R -o '%E|%N'")
        assert "burst resume failed: HTTP 500: " in reasons and "image not known" in reasons, (
            reasons
        )
        state = _on_head(cluster, f"squeue -h -j {job} -o %T").strip()
        assert state in ("PENDING", "CONFIGURING"), state  # requeued, not lost
    finally:
        podman.podman("tag", f"{IMAGE}-aside", IMAGE)
        podman.podman("rmi", f"{IMAGE}-aside", check=False)
    # the fault fixed, the cooldown (5 s here) over: the reconciler powers the nodes down to
    # idle~, and the requeued job runs once it may start again
    time.sleep(6)
    _on_head(cluster, "systemctl start provision-burst-reconcile.service")
    log = _on_head(cluster, f"cat /var/log/provision/burst-{NAME}.log")
    assert "reconcile: cooldown of 5s over, powered down to idle~" in log, log[-2000:]
    # Slurm sets a requeued job's begin time a while ahead (about two minutes here); an
    # operator's StartTime=now ends that wait, so the job's second start follows at once
    held = _on_head(cluster, f"squeue -h -j {job} -o '%T %S'").strip()
    _on_head(cluster, f"scontrol update JobId={job} StartTime=now")
    _wait(
        f"the job done (it was {held})",
        lambda: _on_head(cluster, f"squeue -h -j {job}").strip() == "",
        300,
        5,
    )
    assert "burst resume failed" not in _on_head(cluster, "sinfo -h -R -o '%E'")


def test_a_vanished_node_is_marked_down_and_its_job_requeued(cluster: tuple[Path, Path]) -> None:
    job = _on_head(cluster, "sbatch --parsable -p burst -N1 -o /dev/null --wrap 'sleep 600'")
    job = job.strip()
    running = _wait(
        "the job running",
        lambda: _on_head(cluster, f"squeue -h -j {job} -t R -o %N").strip(),
        timeout=180,
    )
    node = str(running)
    podman.podman("rm", "-f", "-t", "0", f"provision-{NAME}-{node}")
    # the reconciler's timer runs every minute; run it now as the timer would
    _on_head(cluster, "systemctl start provision-burst-reconcile.service")
    reasons = _on_head(cluster, "sinfo -h -R -o '%N|%E'")
    assert f"{node}|burst: node vanished (container or instance gone)" in reasons, reasons
    state = _on_head(cluster, f"squeue -h -j {job} -o '%T %r'")
    assert state.split()[0] in ("PENDING", "CONFIGURING"), state  # requeued
    _on_head(cluster, f"scancel {job}")


def test_destroy_removes_burst_nodes_and_the_image(cluster: tuple[Path, Path]) -> None:
    spec, work = cluster
    _on_head(cluster, "timeout 240 srun -p burst -N1 hostname", timeout=300)
    assert _burst_containers()  # up until SuspendTime
    r = provision("destroy", str(spec), "--yes", cwd=work)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _containers() == []
    assert not podman.image_exists(IMAGE)
    assert not podman.network_exists(f"provision-{NAME}")
    assert subprocess.run(["pgrep", "-f", f"{NAME}/podman-api"], check=False).returncode == 1

"""Bursting live on the lab: examples/lab-burst.yaml (renamed, on its own network, a shorter
SuspendTime and cooldown), as a user runs it. A job sent to the elastic pool runs on containers
the head's burst programs create through the workstation's podman; they are removed once idle;
a resume that fails marks the nodes down with the cause and the job waits, then runs once the
fault is fixed and the cooldown is over; a node whose container vanishes under a job is marked
down by the reconciler and the job requeued; destroy removes the burst containers and the
pool's image.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.burst.config import (
    CONFIG_PATH,
    LAB_LABEL,
    TAG_CLUSTER,
    TAG_POOL,
    cloud_template,
    lab_container_prefix,
    lab_network,
    munge_secret,
    parse_config,
)
from provision.burst.join import JoinConfig
from provision.providers.lab import podman
from provision.render.userdata import user_data

from ..conftest import ROOT
from ..conftest import run_provision as provision
from . import labcloud

NAME = "bursttest"
# seconds Slurm waits for a new node's registration (the lab's nodes start in seconds)
RESUME_TIMEOUT = 90
# what each node of the cloud-boot job says: its name, and what a job's user (nobody) gets
# from the instance's metadata service
PROBE = (
    "echo $(hostname) $(runuser -u nobody -- python3 -c 'import urllib.request as u; "
    'u.urlopen(u.Request("http://169.254.169.254/latest/api/token", method="PUT"), timeout=5)\' '
    "2>&1 | tail -1)"
)
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
        .replace("burst_cooldown: 120", f"burst_cooldown: 5\n  resume_timeout: {RESUME_TIMEOUT}")
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


def test_image_build_makes_a_current_image_only_when_asked(cluster: tuple[Path, Path]) -> None:
    """`provision image build`: nothing to make right after apply; naming the pool makes it
    again, by a run of its builder alone (the cluster's nodes untouched), the same way."""
    spec, work = cluster
    before = podman.text("image", "inspect", IMAGE, "--format", "{{.Id}}")
    r = provision("image", "build", "-f", str(spec), cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "every elastic pool's image is current" in r.stdout
    assert podman.text("image", "inspect", IMAGE, "--format", "{{.Id}}") == before
    started = time.monotonic()
    r = provision("image", "build", "burst", "-f", str(spec), cwd=work, timeout=900)
    took = time.monotonic() - started
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert f"images: {IMAGE} made" in r.stdout and "image build: done" in r.stdout
    print(f"provision image build burst: {took:.0f} s")
    after = podman.text("image", "inspect", IMAGE, "--format", "{{.Id}}")
    assert after != before
    # the builder was the run's one host: the cluster's nodes were not touched
    assert "burst001 │" in r.stdout
    assert "head001" not in r.stdout and "compute001" not in r.stdout
    assert [c for c in _containers() if "image-" in c] == []
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


def _all_powered_down(cluster: tuple[Path, Path]) -> None:
    """Every burst node powered down and idle (a down one given back), whatever ran before."""
    _on_head(cluster, "scontrol update nodename=burst[001-004] state=power_down_force")
    _wait(
        "every burst node powered down",
        lambda: set(_node_states(cluster).values()) <= {"idle~", "down~"},
        timeout=240,
    )
    down = sorted(n for n, state in _node_states(cluster).items() if state == "down~")
    if down:
        _on_head(cluster, f"scontrol update nodename={','.join(down)} state=resume")
    _wait(
        "every burst node idle~",
        lambda: set(_node_states(cluster).values()) == {"idle~"},
        timeout=60,
    )


def test_a_cloud_node_boots_with_cloud_init_and_joins_by_itself(
    cluster: tuple[Path, Path], tmp_path: Path
) -> None:
    """The cloud's boot path, live: the pool bursts through the AWS backend into the lab's cloud
    (moto, a metadata service, a hypervisor: tests/integration/labcloud.py). Each new instance is
    a container from the pool's image with real cloud-init, seeded with the user data moto gives
    back; the join program in it fetches the munge key from Secrets Manager with the instance's
    own credentials and starts slurmd, and a two-node job runs there. Then the same with the
    secret gone: the nodes never register, resume fails, the job waits."""
    gateway = "10.75.0.1"
    original = _on_head(cluster, f"cat {CONFIG_PATH}")
    pool = parse_config(original).pools["burst"]
    head = _on_head(cluster, "getent hosts head001").split()[0]
    tls = labcloud.make_tls(tmp_path / "tls", gateway)
    tag = f"localhost/provision-{NAME}-burst-cloud"
    # the pool's image as a cloud builder leaves it: the burst role's image tasks and seal
    sealed = labcloud.sealed_image(IMAGE, tmp_path / "image", tag)
    found = podman.text(
        "run", "--rm", "--no-hosts", sealed, "sh", "-c",
        "ls /etc/munge /etc/slurm; echo machine-id $(wc -c < /etc/machine-id);"
        " echo host-keys $(ls /etc/ssh | grep -c ssh_host_);"
        " echo cloud-init $(ls /var/lib/cloud/instances 2>/dev/null | wc -l);"
        " systemctl is-enabled slurmd munge; ls /opt/provision;"
        " python3 -c 'import boto3' && echo boto3; command -v cloud-init",
    )  # fmt: skip
    lines = found.splitlines()
    assert "munge.key" not in lines and "slurm.conf" not in lines, found
    assert {"machine-id 0", "host-keys 0", "cloud-init 0", "boto3"} <= set(lines), found
    assert lines.count("disabled") == 2 and "gpu-provision.whl" in lines, found
    assert "/usr/bin/cloud-init" in lines, found
    image = labcloud.build_image(sealed, tmp_path / "image", gateway, tls[0], tag)
    addresses = sorted(pool.nodes.values(), key=ipaddress.ip_address)
    cloud = labcloud.LabCloud(
        gateway,
        addresses,
        lab_network(NAME),
        image,
        lab_container_prefix(NAME),
        f"{LAB_LABEL}={NAME}",
        tls,
    )
    join = JoinConfig(
        cluster=NAME,
        cloud="aws",
        controllers=(("head001", head),),
        port=6817,
        secret=munge_secret(NAME),
        region=labcloud.REGION,
    )
    text = user_data(join)
    doc = json.loads(original)
    doc["pools"]["burst"] = {
        "backend": "aws",
        "nodes": dict(pool.nodes),
        "cloud": {
            "region": labcloud.REGION,
            "template": cloud_template(NAME, "burst"),
            "tags": {TAG_CLUSTER: NAME, TAG_POOL: "burst"},
        },
    }
    _all_powered_down(cluster)
    burst_log = f"/var/log/provision/burst-{NAME}.log"
    with cloud.running():
        key = base64.b64decode(_on_head(cluster, "base64 -w0 /etc/munge/munge.key"))
        cloud.secrets().create_secret(Name=munge_secret(NAME), SecretBinary=key)
        cloud.ec2().create_launch_template(
            LaunchTemplateName=cloud_template(NAME, "burst"),
            LaunchTemplateData={
                "ImageId": "ami-12c6146b",
                "InstanceType": "t3.micro",
                "UserData": base64.b64encode(text.encode()).decode(),
                "IamInstanceProfile": {"Name": labcloud.ROLE},
                "MetadataOptions": {"HttpTokens": "required", "InstanceMetadataTags": "enabled"},
            },
        )
        # the head is outside the cloud: boto3 from Debian, the credentials in root's 0600
        # file, the endpoints' names (and this cloud's CA)
        _on_head(
            cluster,
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-boto3 >/dev/null",
            timeout=300,
        )
        ca = tls[0].read_text()
        _on_head(
            cluster,
            f"cat > /usr/local/share/ca-certificates/lab-cloud.crt <<'EOF'\n{ca}EOF\n"
            "update-ca-certificates >/dev/null\n"
            f"grep -q amazonaws /etc/hosts || echo '{labcloud.hosts_line(gateway)}' >> /etc/hosts\n"
            "umask 077; mkdir -p /root/.aws\n"
            "printf '[default]\\naws_access_key_id = lab\\naws_secret_access_key = lab\\n'"
            " > /root/.aws/credentials\n"
            f"cat > {CONFIG_PATH} <<'EOF'\n{json.dumps(doc, indent=1)}\nEOF\n",
        )
        try:
            started = time.monotonic()
            out = _on_head(
                cluster, f"timeout 300 srun -p burst -N2 sh -c {shlex.quote(PROBE)}", 360
            )
            seconds = time.monotonic() - started
            assert cloud.errors == {}, cloud.errors
            lines = sorted(out.split("\n"))
            assert [line.split()[0] for line in lines if line] == ["burst001", "burst002"], out
            # a job's user (here nobody) cannot reach the instance's metadata, so not its
            # credentials
            assert all("refused" in line for line in lines if line), out
            consoles = {iid: labcloud.console(c) for iid, c in cloud.containers.items()}
            assert len(consoles) == 2
            for iid, said in consoles.items():
                for step in ("metadata", "name", "munge key", "names", "slurmd", "spot"):
                    assert f"provision: join {step}: ok" in said, said[-3000:]
                data = cloud.ec2().describe_instance_attribute(InstanceId=iid, Attribute="userData")
                sent = base64.b64decode(data["UserData"]["Value"])
                assert sent == text.encode()  # what the backend's template sent, exactly
                # no key material in the user data or the boot log
                for blob in (sent, said.encode()):
                    assert key not in blob and base64.b64encode(key) not in blob
            print(f"cloud boot: srun -N2 to done in {seconds:.1f}s")

            # the secret gone: the join stops at the key, slurmd never starts, and once
            # ResumeTimeout is over the resume-fail program terminates the instances and the
            # nodes are down with the reason; the batch job waits, requeued
            cloud.secrets().delete_secret(
                SecretId=munge_secret(NAME), ForceDeleteWithoutRecovery=True
            )
            first = set(cloud.containers)
            job = _on_head(
                cluster,
                "sbatch --parsable -p burst -w burst[003-004] -o /dev/null --wrap hostname",
            ).strip()

            def stopped() -> list[str]:
                new = [c for i, c in dict(cloud.containers).items() if i not in first]
                said = [labcloud.console(c) for c in new]
                return said if len(said) == 2 and all("join failed" in t for t in said) else []

            failed = _wait("both joins stopped", stopped, timeout=120)
            for said in failed:  # type: ignore[attr-defined]
                assert "provision: join failed: munge key: Secrets Manager: " in said, said[-2000:]
                assert "slurmd not started" in said
                assert key not in said.encode() and base64.b64encode(key).decode() not in said
            _wait(
                "burst003 down after ResumeTimeout",
                lambda: (
                    "burst003|burst: no slurmd registration"
                    in _on_head(cluster, "sinfo -h -R -N -o '%N|%E'")
                ),
                timeout=RESUME_TIMEOUT + 120,
                every=5,
            )
            state = _on_head(cluster, f"squeue -h -j {job} -o %T").strip()
            assert state in ("PENDING", "CONFIGURING"), state  # requeued, not lost
            _on_head(cluster, f"scancel {job}")
            # the resume-fail program terminated the instances: the hypervisor removed them
            _wait(
                "the instances terminated",
                lambda: not set(cloud.containers) - first,
                timeout=60,
            )
            log = _on_head(cluster, f"cat {burst_log}")
            assert "burst003 resume-fail cleanup ok (burst)" in log, log[-2000:]
            assert key not in log.encode() and base64.b64encode(key).decode() not in log
        finally:
            booted = dict(cloud.containers)
            for container in booted.values():
                said = labcloud.console(container)
                print(
                    f"--- {container}:",
                    *(line for line in said.splitlines() if "provision:" in line),
                    sep="\n",
                )
            print(_on_head(cluster, f"tail -20 {burst_log}; sinfo -h -R -N -o '%N|%E'"))
            restore = base64.b64encode(original.encode()).decode()
            _on_head(cluster, f"echo {restore} | base64 -d > {CONFIG_PATH}")
    # back to the lab's own bursting for the tests after this one
    _all_powered_down(cluster)


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

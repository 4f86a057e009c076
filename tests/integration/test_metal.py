"""From power-off to a verified Slurm cluster, for real, the way a user runs the metal lab
(examples/metal-lab.yaml): a lab head (a container) and a lab pool that boots from the network,
whose two machines apply makes as QEMU machines without a disk, each with a Redfish BMC
(sushy-tools' emulator, providers/lab/metal.py) and a second card on the lab's RoCE fabric. One
`provision apply` makes the BMCs, builds the node image, converges the head (its boot server:
dnsmasq, iPXE, nginx, and the firewall openings for them), tells each BMC to boot its machine
from the network and powers it on, waits for SSH, converges all three and verifies the cluster,
the machines' soft RoCE (rdma_rxe) and an RDMA write between them among the checks; a user's
job then runs on a machine's own kernel, from memory.

Then one machine is powered off through its BMC (`provision power off`): the next apply finds
it silent, boots it again (a new machine: its host key learned anew) and converges it from its
image, while the head and the other machine change nothing. destroy leaves nothing of the lab:
no daemon, no routing rule, no tap.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from provision import boot
from provision.power import load_credentials
from provision.providers.lab import metal, podman
from provision.state import State

from ..conftest import run_provision as provision
from ..test_power import _free_port
from .vms import VM

NAME = "metaltest"
PREFIX = "10.95.0"
NODE, ADDRESS, BMC = "cpu001", f"{PREFIX}.21", "127.0.95.21"
STEPS = ("boot:", "rolling:", "resume:", "drain", "apply:")  # apply's lines of its own
OTHER = "cpu002"  # its fabric peer (soft RoCE), at .22

SPEC = """\
name: {name}
os: debian12
slurm:
  config:  # the head is a container: no writable cgroups (examples/lab.yaml)
    ProctrackType: proctrack/linuxproc
    TaskPlugin: task/affinity
    JobAcctGatherType: jobacct_gather/linux
network:
  management: {{cidr: {prefix}.0/24, gateway: {prefix}.1}}
  bmc: {{cidr: 127.0.95.0/24, port: {port}}}
  fabric: {{kind: roce, subnet: 192.168.95.0/24, ib_write_bw_gbps: 0.01}}
pools:
  - {{name: head, role: head, profile: lab-container, provider: lab, count: 1}}
  - name: cpu
    role: compute
    profile: lab-vm-roce
    provider: lab
    boot: network
    count: 2
    first_address: {address}
    first_bmc_address: {bmc}
security:
  admin_cidrs: [{prefix}.1/32]
"""


@pytest.fixture(scope="module")
def metal_lab(
    lab_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path, State]]:
    work = tmp_path_factory.mktemp("metal")
    spec = work / "metal.yaml"
    port = _free_port()
    spec.write_text(SPEC.format(name=NAME, prefix=PREFIX, port=port, address=ADDRESS, bmc=BMC))
    state = State(work / ".provision", NAME)
    provision("destroy", str(spec), "--yes", cwd=work)  # a crashed earlier run's leftovers
    try:
        yield spec, work, state
    finally:
        gone = provision("destroy", str(spec), "--yes", cwd=work)
        podman.podman("network", "rm", "-f", f"provision-{NAME}", check=False)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    # nothing of the lab is left on this machine: no daemon, no machine's rule or tap
    assert metal.MetalLab(state, "", port, print).pid() is None
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    assert f"{metal.RULE_MARK} provision-{NAME} {ADDRESS}" not in rules
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "t21:" not in links and "t22:" not in links, links


def _daemon_log(state: State) -> list[str]:
    return (metal.directory(state.dir) / metal.LOG).read_text().splitlines()


def _system(spec: Path, state: State) -> dict[str, object]:
    """The machine's system as its BMC answers an administrator (the lab's certificate)."""
    creds = load_credentials(state)
    port = int(re.search(r"port: (\d+)", spec.read_text())[1])  # type: ignore[index]
    base = f"https://{BMC}:{port}"
    auth, ca = (creds.user, creds.password), str(metal.ca_file(state.dir))
    systems = requests.get(f"{base}/redfish/v1/Systems", auth=auth, verify=ca, timeout=10)
    member = systems.json()["Members"][0]["@odata.id"]
    answer = requests.get(base + member, auth=auth, verify=ca, timeout=10)
    answer.raise_for_status()
    result: dict[str, object] = answer.json()
    return result


def _apply(spec: Path, work: Path) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    r = provision("apply", str(spec), cwd=work, timeout=2400)
    print(f"apply: {time.monotonic() - started:.0f} s")
    print(r.stdout[-6000:])
    return r


def test_power_off_to_a_verified_cluster(metal_lab: tuple[Path, Path, State]) -> None:
    spec, work, state = metal_lab
    r = _apply(spec, work)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr
    out = r.stdout
    # the BMC made first, the head served before the machine was powered, which was told to
    # boot from the network
    silent = "boot: cpu[001-002] silent: the boot server first"
    assert out.index(f"the metal lab's BMCs answer ({NODE} at {BMC}") < out.index(silent)
    for node in (NODE, OTHER):
        assert out.index(silent) < out.index(f"boot: {node}: powered on (next boot from the")
    system = _system(spec, state)
    assert system["Boot"]["BootSourceOverrideTarget"] == "Pxe"  # type: ignore[index]
    assert system["PowerState"] == "On"
    # the machine started once, by its BMC's notification, and runs
    assert [line.split(" (")[0] for line in _daemon_log(state) if line.startswith(NODE)] == [
        f"{NODE}: started"
    ]
    booted = re.search(r"boot: cpu001 answers SSH, (\d+) s after its power-on", out)
    assert booted is not None, out
    print(f"power-on to SSH: {booted[1]} s")
    assert re.search(r"verify: \d+ checks? passed|passed", out), out
    # the RoCE path in the machines' own kernels: the rdma role's soft RoCE over eth1 on the
    # lab's fabric, checked as an adapter, and an RDMA write between the two machines, through
    # each one's nftables (the firewall role opens RoCE v2 to the fabric for soft RoCE alone)
    for node in (NODE, OTHER):
        assert f"PASS hca rxe0 {node}: port 1 Active/LinkUp at SDR 10" in out, out
    assert re.search(rf"PASS ib_write_bw {NODE}->{OTHER} rxe0 {NODE}: [\d.]+ Gb/s", out), out
    rules = provision("ssh", "-f", str(spec), OTHER, "--", "nft list ruleset", cwd=work)
    assert "ip saddr 192.168.95.0/24 udp dport 4791 accept" in rules.stdout, rules.stdout
    # and those rules, in each machine's own kernel, keep this machine from Slurm's ports
    for node in (NODE, OTHER):
        assert re.search(rf"PASS slurm ports from workstation {node}: closed: 6817 filtered", out)
    # a machine the server does not know, powered on beside it: no address, never a kernel
    bridge = podman.text(
        "network", "inspect", "--format", "{{.NetworkInterface}}", f"provision-{NAME}"
    )
    stranger = VM("stranger", f"{PREFIX}.99", None, bridge, work, "52:54:00:95:00:99")
    stranger.start()
    try:
        # a job on the machine: its own kernel (not this machine's), its root the image's
        # squashfs under an overlay in memory, no disk at all
        job = provision(
            "ssh", "-f", str(spec), "head001", "--",
            f"cd /tmp && sbatch --wait -o /tmp/job.out -w {NODE} "
            "--wrap 'uname -r; findmnt -no FSTYPE,OPTIONS /; test -e /dev/vda || echo no-disk'",
            cwd=work,
        )  # fmt: skip
        assert job.returncode == 0, job.stdout + job.stderr
        seen = provision("ssh", "-f", str(spec), NODE, "--", "cat /tmp/job.out", cwd=work)
        assert seen.returncode == 0, seen.stderr
        kernel, root, disk = seen.stdout.splitlines()
        assert kernel != os.uname().release and kernel.endswith("-amd64"), kernel
        assert root.startswith("overlay") and "root.squashfs" in root, root
        assert disk == "no-disk"
        deadline = time.monotonic() + 120
        while "No configuration methods" not in stranger.console_tail(40):  # DHCP gave up
            assert time.monotonic() < deadline, stranger.console_tail(40)
            time.sleep(5)
        assert "Linux version" not in stranger.console_tail(200)
    finally:
        stranger.stop()


def test_a_node_powered_off_through_its_bmc_is_booted_again(
    metal_lab: tuple[Path, Path, State],
) -> None:
    spec, work, state = metal_lab
    off = provision("power", "off", NODE, "-f", str(spec), "--yes", cwd=work)
    assert off.returncode == 0, off.stdout + off.stderr
    deadline = time.monotonic() + 60  # the emulator applies a power change 1-11 s late
    while _daemon_log(state)[-1] != f"{NODE}: stopped":
        assert time.monotonic() < deadline, _daemon_log(state)[-5:]
        time.sleep(1)
    r = _apply(spec, work)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr
    assert "boot: cpu001 silent" in r.stdout
    assert "the metal lab's BMCs answer" not in r.stdout  # the same daemon: nothing made again
    assert _daemon_log(state)[-1].startswith(f"{NODE}: started")
    # the head, its boot server among its roles, as the first apply left it: nothing changed
    report = json.loads((state.dir / "last-apply.json").read_text())
    assert report["hosts"]["head001"]["changed"] == 0, report["hosts"]
    assert report["hosts"][NODE]["changed"] > 0  # a new machine, converged from its image
    # its peer left as it was: not converged at all (nothing changed for it), or to no change
    assert report["hosts"].get(OTHER, {}).get("changed", 0) == 0, report["hosts"]
    # the new machine's soft RoCE made again, and the write between the two passes again
    assert re.search(rf"PASS ib_write_bw {NODE}->{OTHER} rxe0 {NODE}", r.stdout), r.stdout


def test_a_rolling_apply_boots_a_node_on_an_older_image_into_its_pools(
    metal_lab: tuple[Path, Path, State],
) -> None:
    """A node that runs an older image than its pool's (its kernel command line names
    another): a plain apply names it and leaves it; `apply --batch 1` drains it in its batch,
    boots it into the pool's image through its BMC, converges it as a new machine and resumes
    it, while the other machine is only converged in its own batch."""
    spec, work, state = metal_lab

    def on(node: str, command: str) -> str:
        done = provision("ssh", "-f", str(spec), node, "--", command, cwd=work)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    current = boot.booted_image(on(NODE, "cat /proc/cmdline"))
    assert re.fullmatch(r"[0-9a-f]{16}", current), current
    # OTHER stands for a node booted from an older image: what its kernel's command line shows
    # names another one (a second image for real costs a build CI has no room for); the
    # reboot takes the stand-in away with it
    on(OTHER, "sed 's/provision.image=[^ ]*/provision.image=0123456789abcdef/' /proc/cmdline"
              " > /run/older-cmdline && mount --bind /run/older-cmdline /proc/cmdline")  # fmt: skip
    started = len(_daemon_log(state))
    started_at = time.monotonic()
    r = provision("apply", str(spec), "--batch", "1", cwd=work, timeout=2400)
    print(f"apply --batch 1: {time.monotonic() - started_at:.0f} s")
    print("\n".join(line for line in r.stdout.splitlines() if line.startswith(STEPS)))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr
    out = r.stdout
    assert f"boot: {OTHER}: drained, booted into the pool's new image" in out, out
    assert f"boot: {NODE}:" not in out  # on the pool's image: converged in its batch alone
    assert out.index(f"rolling: batch 1/2: {NODE}") < out.index(f"rolling: batch 2/2: {OTHER}")
    assert f"rolling: batch 2/2: {OTHER} changed and serving" in out
    # its BMC powered it again (a cycle), the other machine's did not
    power = [line.split(" (")[0] for line in _daemon_log(state)[started:]]
    assert power[:2] == [f"{OTHER}: stopped", f"{OTHER}: started"], power
    assert not any(line.startswith(NODE) for line in power), power
    assert boot.booted_image(on(OTHER, "cat /proc/cmdline")) == current
    # and it takes jobs again: resumed, its slurmd back from the reboot
    job = on("head001", f"srun -w {OTHER} -t 1 hostname")
    assert job.strip() == OTHER

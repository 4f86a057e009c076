"""From power-off to a verified Slurm cluster, for real: a lab head (a container) and a machine
with no disk and a Redfish BMC (the metal lab: tests/integration/metal.py), one spec, one
`provision apply`. apply builds the node image, converges the head (its boot server: dnsmasq,
iPXE, nginx, and the firewall openings for them), tells the BMC to boot the machine from the
network and powers it on, waits for SSH, converges both and verifies the cluster; a user's job
then runs on the machine's own kernel, from memory.

Then the machine is powered off behind apply's back: the next apply finds it silent, boots it
again (a new machine: its host key learned anew) and converges it from its image.
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

from provision.providers.lab import podman

from ..conftest import run_provision as provision
from ..fakebmc import Emulator
from ..test_power import PASSWORD, USER, _free_port
from .metal import PowerService
from .vms import VM

NAME = "metaltest"
PREFIX = "10.95.0"
NODE, ADDRESS, MAC, BMC = "cpu001", f"{PREFIX}.21", "52:54:00:95:00:21", "127.0.0.95"

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
  bmc: {{cidr: 127.0.0.0/24, protocol: redfish, port: {port}, ca_file: {bundle}}}
pools:
  - {{name: head, role: head, profile: lab-container, provider: lab, count: 1}}
  - name: cpu
    role: compute
    profile: vm
    boot: network
    hosts: [{{name: {node}, address: {address}, mac: "{mac}", bmc_address: {bmc}}}]
profiles:
  vm:
    description: a QEMU machine of the metal lab, booted from the network
    providers: [static]
    cpu: {{model: any, sockets: 1, cores_per_socket: 1, threads_per_core: 1}}
    memory_gib: 1
    max_power_w: 50
security:
  admin_cidrs: [{prefix}.1/32]
"""


@pytest.fixture(scope="module")
def metal(
    lab_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path, PowerService, Emulator]]:
    work = tmp_path_factory.mktemp("metal")
    spec = work / "metal.yaml"
    port = _free_port()
    consoles = work / ".provision" / NAME / "consoles"
    power = PowerService({NODE: (ADDRESS, MAC)}, f"provision-{NAME}", consoles, work)
    bmc = Emulator(BMC, port, USER, PASSWORD, work, notify=power.url, name=NODE)
    spec.write_text(
        SPEC.format(
            name=NAME, prefix=PREFIX, port=port, bundle=bmc.cert, node=NODE, address=ADDRESS,
            mac=MAC, bmc=BMC,
        )
    )  # fmt: skip
    provision("destroy", str(spec), "--yes", cwd=work)  # a crashed earlier run's leftovers
    try:
        with bmc:
            saved = provision(
                "bmc-credentials", str(spec), "--user", USER, "--password-stdin", cwd=work,
                stdin=PASSWORD + "\n",
            )  # fmt: skip
            assert saved.returncode == 0, saved.stderr
            yield spec, work, power, bmc
    finally:
        power.close()
        provision("destroy", str(spec), "--yes", cwd=work)
        podman.podman("network", "rm", "-f", f"provision-{NAME}", check=False)


def _apply(spec: Path, work: Path) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    r = provision("apply", str(spec), cwd=work, timeout=2400)
    print(f"apply: {time.monotonic() - started:.0f} s")
    print(r.stdout[-6000:])
    return r


def test_power_off_to_a_verified_cluster(
    metal: tuple[Path, Path, PowerService, Emulator],
) -> None:
    spec, work, power, bmc = metal
    r = _apply(spec, work)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr
    out = r.stdout
    # the head served before the machine was powered; it was told to boot from the network
    assert out.index("boot: cpu001 silent: the boot server first") < out.index(
        "boot: cpu001: powered on (next boot from the network)"
    )
    assert bmc.get()["Boot"]["BootSourceOverrideTarget"] == "Pxe"
    assert power.events == [(NODE, "started")]
    booted = re.search(r"boot: cpu001 answers SSH, (\d+) s after its power-on", out)
    assert booted is not None, out
    print(f"power-on to SSH: {booted[1]} s")
    assert re.search(r"verify: \d+ checks? passed|passed", out), out
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


def test_a_node_powered_off_behind_applys_back_is_booted_again(
    metal: tuple[Path, Path, PowerService, Emulator],
) -> None:
    spec, work, power, _bmc = metal
    power.notified({"name": NODE, "power_state": "Off"})  # pulled from its socket
    assert power.events[-1] == (NODE, "stopped")
    r = _apply(spec, work)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr
    assert "boot: cpu001 silent" in r.stdout
    assert power.events[-1] == (NODE, "started")
    # the head, its boot server among its roles, as the first apply left it: nothing changed
    report = json.loads((work / ".provision" / NAME / "last-apply.json").read_text())
    assert report["hosts"]["head001"]["changed"] == 0, report["hosts"]
    assert report["hosts"][NODE]["changed"] > 0  # a new machine, converged from its image

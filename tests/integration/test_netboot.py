"""Network boot, for real: a boot server (the netboot role, converged by ansible-playbook on a
lab container) and QEMU virtual machines with no disk, powered on into their network card's
firmware. The one the server knows gets its reserved address from dnsmasq, iPXE's script and its
image's kernel and initramfs over HTTP (nginx), and live-boot fetches the root squashfs; it is
then a node running from memory with its own kernel, reached over SSH. The one it does not know
gets no address, and its console says so.

The image is built by provision (providers/lab/netboot.py) from the lab image. QEMU's card ROM
is iPXE already, so the TFTP step (undionly.kpxe for a plain PXE firmware) is rendered and
served but not taken here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision import assets
from provision.providers.lab import netboot, podman

from .conftest import start_node, wait_for_ssh
from .vms import VM

NETWORK, PREFIX = "provision-test-netboot", "10.94.0"
SERVER = f"{PREFIX}.2"
NODE = {"name": "nb-cpu0", "address": f"{PREFIX}.12", "mac": "52:54:00:5e:00:0c"}
STRANGER = {"name": "nb-other", "address": f"{PREFIX}.13", "mac": "52:54:00:5e:00:0d"}

PLAY = """\
- name: The boot server
  hosts: all
  gather_facts: true
  pre_tasks:
    - name: Read the installed packages
      gpu_provision.cluster.installed_packages:
  roles:
    - role: gpu_provision.cluster.netboot
      vars:
        netboot_address: {server}
        netboot_network: {prefix}.0/24
        netboot_router: {prefix}.1
        netboot_images: {{compute: {image}}}
        netboot_nodes:
          - {{name: {name}, mac: "{mac}", address: {address}, image: compute}}
"""


@pytest.fixture
def server(lab_image: str, ssh_key: Path) -> Iterator[str]:
    """The boot server, a lab container on a network of its own; the network's bridge."""
    podman.podman("rm", "-f", "-t", "0", "ptest-nb-server", check=False)
    if not podman.network_exists(NETWORK):
        podman.podman(
            "network", "create", "--subnet", f"{PREFIX}.0/24", "--gateway", f"{PREFIX}.1", NETWORK
        )
    try:
        start_node(
            lab_image, "ptest-nb-server", "nb-server", NETWORK, SERVER, ssh_key.with_suffix(".pub")
        )
        wait_for_ssh(SERVER, ssh_key)
        yield podman.text("network", "inspect", "--format", "{{.NetworkInterface}}", NETWORK)
    finally:
        podman.podman("rm", "-f", "-t", "0", "ptest-nb-server", check=False)
        podman.podman("network", "rm", "-f", NETWORK, check=False)


def _converge(work: Path, key: Path, image: Path) -> str:
    (work / "play.yml").write_text(PLAY.format(server=SERVER, prefix=PREFIX, image=image, **NODE))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")},
        "ANSIBLE_COLLECTIONS_PATH": str(assets.collections_path()),
        "ANSIBLE_HOME": str(work / "home"),
        "ANSIBLE_HOST_KEY_CHECKING": "false",
    }
    r = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", f"{SERVER},", "-u", "root",
         "--private-key", str(key), str(work / "play.yml")],
        capture_output=True, text=True, check=False, env=env, cwd=work, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    return r.stdout


def test_a_diskless_node_boots_from_the_server(
    lab_image: str, server: str, ssh_key: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    image = netboot.build(lab_image, ssh_key.with_suffix(".pub").read_text(), tmp_path / "cache")
    sizes = {p.name: p.stat().st_size for p in image.files}
    print(f"image: {time.monotonic() - started:.0f} s, {sizes}")
    assert sizes["root.squashfs"] > 50_000_000 and sizes["vmlinuz"] > 1_000_000

    started = time.monotonic()
    _converge(tmp_path, ssh_key, image.directory)
    print(f"boot server converged in {time.monotonic() - started:.0f} s")
    again = _converge(tmp_path, ssh_key, image.directory)  # changes nothing the second time
    assert re.search(rf"{SERVER} +: ok=\d+ +changed=0 +unreachable=0 +failed=0", again), again

    known = VM(NODE["name"], NODE["address"], None, server, tmp_path, NODE["mac"], 1536)
    stranger = VM(STRANGER["name"], STRANGER["address"], None, server, tmp_path, STRANGER["mac"])
    try:
        known.start()
        stranger.start()
        print(f"{known.name}: SSH {known.wait_for_ssh(ssh_key, timeout=420):.0f} s after power-on")
        r = known.ssh(ssh_key, "root", "hostname; uname -r; findmnt -no FSTYPE,OPTIONS /")
        hostname, kernel, root = r.stdout.splitlines()
        assert hostname == NODE["name"] and kernel.endswith("-amd64")
        # its root is the image's squashfs under an overlay in memory: no disk at all
        assert root.startswith("overlay") and "root.squashfs" in root, root
        assert known.ssh(ssh_key, "root", "test -e /dev/vda").returncode == 1
        # the machine the server does not know got no address, and never a kernel
        console = stranger.console_tail(40)
        assert "iPXE" in console and "Linux version" not in console, console
        assert stranger.ssh(ssh_key, "root", "true").returncode != 0
    finally:
        known.stop()
        stranger.stop()

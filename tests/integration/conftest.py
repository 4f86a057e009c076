"""Integration fixtures: real podman containers with systemd and sshd, built from the lab image.

These tests need root and podman (the README's test command installs it). They skip where
podman is missing, unless PROVISION_REQUIRE_INTEGRATION=1 (set by .ci/run), where they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.providers.lab import podman
from provision.providers.lab.image import debian_mirror, ensure_image


def _available() -> str | None:
    if os.geteuid() != 0:
        return "needs root (podman networks with fixed addresses)"
    if (
        shutil.which("podman") is None
        or shutil.which("debootstrap", path="/usr/sbin:/sbin:" + os.environ.get("PATH", "")) is None
    ):
        return "needs podman and debootstrap"
    return None


@pytest.fixture(scope="session")
def lab_image() -> str:
    missing = _available()
    if missing:
        if os.environ.get("PROVISION_REQUIRE_INTEGRATION") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    name, _ = ensure_image(debian_mirror())
    return name


OPERATOR = "ops"  # the static hosts' login user: not root, with sudo


def start_node(
    image: str, name: str, hostname: str, network: str, address: str, pubkey: Path
) -> None:
    podman.podman("rm", "-f", "-t", "0", name, check=False)
    podman.podman(
        "create",
        "--name",
        name,
        "--hostname",
        hostname,
        "--network",
        f"{network}:ip={address}",
        "--systemd=always",
        "--cap-add",
        "NET_ADMIN",
        "--cap-add",
        "SYS_NICE",  # as the lab's nodes: slurmstepd pins a non-root user's tasks
        "--device",
        "/dev/net/tun",  # userspace WireGuard (the tunnel to remote networks)
        "--no-hosts",
        image,
        "/sbin/init",
    )
    podman.podman("cp", str(pubkey), f"{name}:/root/.ssh/authorized_keys")
    podman.podman("start", name)
    # the login of most real sites: a user of the image's with passwordless sudo (ubuntu on
    # Ubuntu's cloud and DGX images), never root
    podman.podman(
        "exec", name, "sh", "-c",
        f"useradd -m -s /bin/bash {OPERATOR} && install -d -m 700 -o {OPERATOR} "
        f"/home/{OPERATOR}/.ssh && install -m 600 -o {OPERATOR} /root/.ssh/authorized_keys "
        f"/home/{OPERATOR}/.ssh/ && echo '{OPERATOR} ALL=(ALL:ALL) NOPASSWD: ALL' "
        f"> /etc/sudoers.d/{OPERATOR} && chmod 440 /etc/sudoers.d/{OPERATOR}",
    )  # fmt: skip


def wait_for_ssh(address: str, key: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(
            [
                "ssh",
                "-i",
                str(key),
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "ConnectTimeout=2",
                f"root@{address}",
                "true",
            ],
            capture_output=True,
            check=False,
        )
        if r.returncode == 0:
            return
        time.sleep(1)
    raise TimeoutError(f"no SSH on {address} after {timeout}s")


@pytest.fixture
def ssh_key(tmp_path: Path) -> Path:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


@pytest.fixture
def static_hosts(lab_image: str, ssh_key: Path) -> Iterator[dict[str, str]]:
    """Three throwaway hosts, reachable over SSH as root and as OPERATOR (passwordless sudo): a
    head and a node on their site's
    network, and a node on a "remote" network of its own, which reaches the head only through
    this machine's NAT (podman masquerades what leaves a network), as a cloud node reaches an
    on-premises head."""
    networks = {"provision-test-static": "10.78.0", "provision-test-remote": "10.84.0"}
    nodes = {"st-head": "10.78.0.11", "st-cpu0": "10.78.0.12", "st-cpu1": "10.84.0.12"}
    on = {"st-head": "provision-test-static", "st-cpu0": "provision-test-static"}
    for name in nodes:
        podman.podman("rm", "-f", "-t", "0", f"ptest-{name}", check=False)
    for network, prefix in networks.items():
        if not podman.network_exists(network):
            podman.podman(
                "network", "create", "--subnet", f"{prefix}.0/24", "--gateway", f"{prefix}.1",
                network,
            )  # fmt: skip
    try:
        for name, address in nodes.items():
            network = on.get(name, "provision-test-remote")
            start_node(
                lab_image, f"ptest-{name}", name, network, address, ssh_key.with_suffix(".pub")
            )
        for address in nodes.values():
            wait_for_ssh(address, ssh_key)
        yield nodes
    finally:
        for name in nodes:
            podman.podman("rm", "-f", "-t", "0", f"ptest-{name}", check=False)
        for network in networks:
            podman.podman("network", "rm", "-f", network, check=False)


def user_login(
    work: Path, user: str, address: str, command: str, key: str | None = None
) -> subprocess.CompletedProcess[str]:
    """A user's own SSH login with their key (the file named after them in `work`, or `key`),
    a new session each time."""
    return subprocess.run(
        ["ssh", "-i", str(work / (key or user)), "-o", "BatchMode=yes", "-o", "ControlMaster=no",
         "-o", "ControlPath=none", "-o", "StrictHostKeyChecking=no", "-o",
         "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", f"{user}@{address}", command],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip

"""Virtual machines with their own kernel, for what a lab container cannot show: a kernel NFS
client under a server's root squash (the containers have no NFS in the kernel), and a machine
without a disk that boots from the network.

QEMU emulates in software (TCG): this machine's KVM cannot run a stock kernel. Each VM boots
Debian 12's kernel from its own disk, on a bridge of this machine's with one tap device per VM,
its address and name from the kernel command line (`ip=`, read by systemd-network-generator;
`systemd.hostname=`), so the VMs are "existing hosts" at fixed addresses, reached over SSH.

The disk is the lab image plus a kernel and the packages the tests' roles would install (no
mirror is needed inside a VM), built by podman from the lab image: its tag carries a hash of the
lab image and of the recipe, so an unchanged pair is built once. Its files go into an ext4 image
(`mkfs.ext4 -d`) that every VM boots through a qcow2 overlay of its own.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from provision.providers.lab import podman
from provision.providers.lab.metal import qemu_command, tap_name

# libnss-myhostname: a VM's name resolves before the cluster's /etc/hosts is written (sudo
# looks it up); there is no DNS on the VMs' bridge
PACKAGES = [
    "linux-image-amd64", "libnss-myhostname", "nfs-common", "nfs-kernel-server", "chrony",
]  # fmt: skip
RECIPE = """\
FROM {base}
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
--no-install-recommends {packages} >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*
RUN systemctl enable systemd-networkd systemd-network-generator
"""
SSH_OPTIONS = [
    "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
    "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
]  # fmt: skip


@dataclass(frozen=True)
class Disk:
    raw: Path  # the root file system, which each VM's overlay reads
    kernel: Path
    initrd: Path


def image(lab_image: str) -> str:
    """The VM image's name, built from the lab image unless it exists."""
    base_id = podman.text("image", "inspect", "--format", "{{.Id}}", lab_image)
    recipe = RECIPE.format(base=lab_image, packages=" ".join(PACKAGES))
    name = f"localhost/provision-vm:{hashlib.sha256((base_id + recipe).encode()).hexdigest()[:12]}"
    if not podman.image_exists(name):
        with tempfile.TemporaryDirectory() as context:
            podman.podman("build", "-q", "-t", name, "-f", "-", context, stdin=recipe.encode())
    return name


def build_disk(lab_image: str, workdir: Path, pubkey: Path, operator: str) -> Disk:
    """A root disk from the VM image, which root and `operator` (uid 1000, passwordless sudo,
    its home under /home as on most sites) log in to with `pubkey`."""
    root = workdir / "root"
    root.mkdir()
    container = podman.text("create", image(lab_image))
    try:
        exported = subprocess.Popen(
            [podman.require(), "export", container], stdout=subprocess.PIPE, env=podman.env()
        )
        subprocess.run(["tar", "-C", str(root), "-xf", "-"], stdin=exported.stdout, check=True)
        assert exported.wait() == 0, "podman export failed"
    finally:
        podman.podman("rm", container, check=False)
    # no DNS server on the bridge: the resolver gives up at once (the nodes' names are in the
    # cluster's /etc/hosts)
    (root / "etc" / "resolv.conf").unlink(missing_ok=True)
    (root / "etc" / "resolv.conf").write_text("options timeout:1 attempts:1\n")
    # no route to a mirror either: the package lists are the image's, and the common role
    # refreshes them when they are older than an hour (apt's cache_valid_time reads this
    # stamp), which needs one. The disk is made now: its lists count as refreshed now.
    stamp = root / "var" / "lib" / "apt" / "periodic" / "update-success-stamp"
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.touch()
    key = pubkey.read_text()
    (root / "root" / ".ssh").mkdir(mode=0o700, exist_ok=True)
    (root / "root" / ".ssh" / "authorized_keys").write_text(key)
    (root / "root" / ".ssh" / "authorized_keys").chmod(0o600)
    subprocess.run(
        ["chroot", str(root), "useradd", "-m", "-u", "1000", "-s", "/bin/bash", operator],
        check=True,
    )
    home = root / "home" / operator
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "authorized_keys").write_text(key)
    (home / ".ssh" / "authorized_keys").chmod(0o600)
    shutil.chown(home / ".ssh", 1000, 1000)
    shutil.chown(home / ".ssh" / "authorized_keys", 1000, 1000)
    sudoers = root / "etc" / "sudoers.d" / operator
    sudoers.write_text(f"{operator} ALL=(ALL:ALL) NOPASSWD: ALL\n")
    sudoers.chmod(0o440)
    # the kernel and initrd, read by QEMU from here
    kernel = workdir / "vmlinuz"
    initrd = workdir / "initrd.img"
    shutil.copy(next((root / "boot").glob("vmlinuz-*")), kernel)
    shutil.copy(next((root / "boot").glob("initrd.img-*")), initrd)
    raw = workdir / "root.raw"
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-L", "root", "-d", str(root), str(raw), "3G"], check=True
    )
    shutil.rmtree(root)
    return Disk(raw, kernel, initrd)


@contextmanager
def bridge(name: str, gateway: str) -> Iterator[str]:
    """A bridge of this machine's at gateway (10.x.y.1/24); removed afterwards."""
    subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", gateway, "dev", name], check=True)
        subprocess.run(["ip", "link", "set", name, "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)


class VM:
    """One VM on a bridge: started, reached over SSH, stopped (its tap and overlay removed)."""

    def __init__(
        self,
        name: str,
        address: str,
        disk: Disk | None,
        bridge: str,
        workdir: Path,
        mac: str | None = None,
        memory_mib: int = 1024,
    ) -> None:
        """disk None: no disk; the machine boots from the network (its firmware's PXE, which
        is iPXE in QEMU's network card ROM)."""
        self.name, self.address, self.disk, self.bridge = name, address, disk, bridge
        self.memory_mib = memory_mib
        last = int(address.rsplit(".", 1)[1])
        self.mac = mac or f"52:54:00:00:{last // 256:02x}:{last % 256:02x}"
        self.tap = tap_name(bridge, address)
        self.overlay = workdir / f"{name}.qcow2"
        self.console = workdir / f"{name}.console"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        subprocess.run(["ip", "link", "del", self.tap], capture_output=True, check=False)
        subprocess.run(["ip", "tuntap", "add", self.tap, "mode", "tap"], check=True)
        subprocess.run(["ip", "link", "set", self.tap, "master", self.bridge, "up"], check=True)
        if self.disk is None:
            boot = ["-boot", "n"]
        else:
            subprocess.run(
                ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(self.disk.raw), "-F", "raw",
                 str(self.overlay)],
                check=True,
            )  # fmt: skip
            gateway = self.address.rsplit(".", 1)[0] + ".1"
            boot = [
                "-kernel", str(self.disk.kernel), "-initrd", str(self.disk.initrd),
                "-append",
                f"root=/dev/vda rw console=ttyS0 net.ifnames=0 systemd.hostname={self.name} "
                f"ip={self.address}::{gateway}:255.255.255.0::eth0:off",
                "-drive", f"file={self.overlay},if=virtio,format=qcow2",
            ]  # fmt: skip
        self._log = self.console.open("wb")
        self._process = subprocess.Popen(
            qemu_command(self.name, self.mac, self.tap, self.memory_mib, boot, reboot=False),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def console_tail(self, lines: int = 15) -> str:
        text = self.console.read_bytes().decode(errors="replace") if self.console.exists() else ""
        return "\n".join(text.replace("\r", "").splitlines()[-lines:])

    def wait_for_ssh(self, key: Path, timeout: float = 300) -> float:
        """Seconds from now until root logs in; TimeoutError with the console's last lines."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self._process is not None and self._process.poll() is not None:
                break
            if self.ssh(key, "root", "true").returncode == 0:
                return time.monotonic() - started
            time.sleep(3)
        raise TimeoutError(
            f"{self.name}: no SSH on {self.address} after {time.monotonic() - started:.0f} s; "
            f"its console ends:\n{self.console_tail()}"
        )

    def ssh(self, key: Path, user: str, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ssh", "-i", str(key), *SSH_OPTIONS, f"{user}@{self.address}", command],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._log is not None:
            self._log.close()
        subprocess.run(["ip", "link", "del", self.tap], capture_output=True, check=False)
        self.overlay.unlink(missing_ok=True)

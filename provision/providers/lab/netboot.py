"""A node image that boots from the network and runs from memory (diskless, as Warewulf's
stateless nodes and Debian Live do): a kernel, its initramfs with live-boot's network hooks, and
the root file system as one squashfs that the initramfs fetches over HTTP and mounts under a
writable overlay in RAM.

It is built here from the lab's base image (debootstrap, the machine's own mirror) with podman,
so it needs what the lab needs, and is kept by its inputs: the base image, this recipe and the
keys let in. The boot server (the `netboot` role) serves it; iPXE loads the kernel and initramfs,
and the kernel's command line names the squashfs:

    boot=live fetch=http://SERVER:PORT/POOL/root.squashfs

Measured here (2 cores, QEMU in software): the build about 2 minutes (the package layer 76 s,
the squashfs 40 s, 177 MB with zstd); power-on to SSH 112 s.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import provision.providers.lab.podman as podman
from provision.errors import OperationError

# the kernel, live-boot's initramfs hooks (they fetch the squashfs and mount the overlay), and
# the name service module that answers for the node's own name before /etc/hosts has it
PACKAGES = [
    "linux-image-amd64", "initramfs-tools", "live-boot", "live-boot-initramfs-tools", "busybox",
    "libnss-myhostname",
]  # fmt: skip
# the lists go, and with them what says they are fresh (the stamp, the directory's time): a
# booted node's first converge fetches them, as it would on any machine whose lists are old
RECIPE = """\
FROM {base}
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
--no-install-recommends {packages} >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/* \
/var/lib/apt/periodic/update-success-stamp && touch -d @0 /var/lib/apt/lists
"""
# what the squashfs leaves out: the kernel and initramfs are served beside it
EXCLUDE = ["boot"]
FILES = ("vmlinuz", "initrd.img", "root.squashfs")


@dataclass(frozen=True)
class BootImage:
    directory: Path  # vmlinuz, initrd.img and root.squashfs
    tag: str  # the hash of its inputs

    @property
    def files(self) -> list[Path]:
        return [self.directory / f for f in FILES]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "provision" / "netboot"


def build(
    base_image: str,
    authorized_keys: str,
    cache: Path | None = None,
    log: Callable[[str], None] = print,
) -> BootImage:
    """The boot image from `base_image`, root letting in `authorized_keys` (public keys, one a
    line); built unless one of the same inputs is kept in `cache`."""
    mksquashfs = podman.require("mksquashfs")
    base_id = podman.text("image", "inspect", "--format", "{{.Id}}", base_image)
    recipe = RECIPE.format(base=base_image, packages=" ".join(PACKAGES))
    layer = hashlib.sha256(f"{base_id}\0{recipe}".encode()).hexdigest()[:16]
    tag = hashlib.sha256(f"{layer}\0{authorized_keys}".encode()).hexdigest()[:16]
    target = (cache or cache_dir()) / tag
    if all((target / f).is_file() for f in FILES):
        return BootImage(target, tag)
    name = f"localhost/provision-netboot:{layer}"  # the packages, whatever keys go in
    if not podman.image_exists(name):
        log(f"netboot: building {name} (the kernel and live-boot on the lab image, once)")
        with tempfile.TemporaryDirectory() as context:
            podman.podman("build", "-q", "-t", name, "-f", "-", context, stdin=recipe.encode())
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{tag}.", dir=target.parent))
    try:
        root = work / "root"
        root.mkdir()
        _export(name, root)
        _customise(root, authorized_keys)
        out = work / "out"
        out.mkdir()
        shutil.copy(_one(root / "boot", "vmlinuz-*"), out / "vmlinuz")
        shutil.copy(_one(root / "boot", "initrd.img-*"), out / "initrd.img")
        log("netboot: making the root's squashfs (zstd)")
        made = subprocess.run(
            [mksquashfs, str(root), str(out / "root.squashfs"), "-comp", "zstd", "-noappend",
             "-quiet", "-no-progress", "-e", *EXCLUDE],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if made.returncode != 0:
            raise OperationError(f"mksquashfs failed: {' '.join(made.stderr.split())[-400:]}")
        for f in FILES:
            (out / f).chmod(0o644)
        shutil.rmtree(target, ignore_errors=True)
        out.rename(target)  # whole or not at all: a build cut off leaves no image behind
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BootImage(target, tag)


def _export(image: str, root: Path) -> None:
    container = podman.text("create", image)
    try:
        exported = subprocess.Popen(
            [podman.require(), "export", container], stdout=subprocess.PIPE, env=podman.env()
        )
        untar = subprocess.run(
            ["tar", "-C", str(root), "-xf", "-"], stdin=exported.stdout, capture_output=True
        )
        assert exported.stdout is not None
        exported.stdout.close()  # a tar that stopped early: podman's next write fails, not hangs
        if exported.wait() != 0 or untar.returncode != 0:
            raise OperationError(f"podman export of {image} failed: {untar.stderr[-400:]!r}")
    finally:
        podman.podman("rm", container, check=False)


def _customise(root: Path, authorized_keys: str) -> None:
    ssh = root / "root" / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").write_text(authorized_keys)
    (ssh / "authorized_keys").chmod(0o600)
    # podman's bind-mounted files: the live system's initramfs writes its own resolv.conf and
    # hostname from DHCP and the kernel's command line
    for name in ("resolv.conf", "hostname"):
        (root / "etc" / name).unlink(missing_ok=True)


def _one(directory: Path, pattern: str) -> Path:
    found = sorted(directory.glob(pattern))
    if len(found) != 1:
        raise OperationError(f"{directory}: {len(found)} files match {pattern}, not one")
    return found[0]

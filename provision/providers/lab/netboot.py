"""A node image that boots from the network and runs from memory (diskless, as Warewulf's
stateless nodes and Debian Live do): a kernel, its initramfs with live-boot's network hooks, and
the root file system as one squashfs that the initramfs fetches over HTTP and mounts under a
writable overlay in RAM.

It is built here from the lab's base image (debootstrap, the machine's own mirror) with podman,
so it needs what the lab needs: a layer with the kernel and live-boot (this recipe, once for the
base image), then a pool's packages installed on it by Ansible in a builder container
(playbooks/image.yml; provision/boot.py runs it) and committed, then exported into a squashfs
kept by the packages it holds and the keys let in. The boot server (the `netboot` role) serves
it; iPXE loads the kernel and initramfs, and the kernel's command line names the squashfs:

    boot=live nonetworking fetch=http://SERVER:PORT/POOL/root.squashfs

Measured here (2 cores, QEMU in software): the kernel's layer 76 s once; a pool's packages and
its squashfs about 90 s (240 MB with zstd for a compute pool on the fabric, 177 MB without
the packages); power-on to SSH 110-125 s.
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
from provision.burst.config import LAB_LABEL, lab_container_prefix
from provision.errors import OperationError
from provision.providers.lab.burst import INPUTS_LABEL  # what Ansible made an image from

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


def layer(base_image: str, log: Callable[[str], None] = print) -> str:
    """The image of the kernel and live-boot on `base_image` (built once for its inputs)."""
    base_id = podman.text("image", "inspect", "--format", "{{.Id}}", base_image)
    recipe = RECIPE.format(base=base_image, packages=" ".join(PACKAGES))
    digest = hashlib.sha256(f"{base_id}\0{recipe}".encode()).hexdigest()[:16]
    name = f"localhost/provision-netboot:{digest}"
    if not podman.image_exists(name):
        log(f"netboot: building {name} (the kernel and live-boot on the lab image, once)")
        with tempfile.TemporaryDirectory() as context:
            podman.podman("build", "-q", "-t", name, "-f", "-", context, stdin=recipe.encode())
    return name


# --- a pool's image: the layer with the packages its nodes' roles install ---------------------


def pool_image(cluster: str, pool: str) -> str:
    return f"localhost/provision-netboot-{cluster}-{pool}"


def builder_name(cluster: str, pool: str) -> str:
    return f"{lab_container_prefix(cluster)}netboot-{pool}"


def start_builder(layer_image: str, container: str, cluster: str) -> None:
    """A container of the layer that Ansible installs a pool's packages into (podman exec):
    no init, and services kept from starting (a package's postinst would start them here)."""
    podman.podman("rm", "-f", "-t", "0", container, check=False)
    podman.podman(
        "run", "-d", "--name", container, "--label", f"{LAB_LABEL}={cluster}", "--no-hosts",
        layer_image, "sleep", "infinity",
    )  # fmt: skip
    podman.podman("exec", container, "sh", "-c", POLICY)


# services stay stopped while the builder installs (Debian's invoke-rc.d asks policy-rc.d)
POLICY = "printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d"
# What the image must not carry, as a builder left it: the policy above, the munge key munge's
# package made (the cluster's own reaches each node at its converge), apt's downloads. The
# package lists stay: a node's converge installs what the image lacks without fetching them.
SEAL = """set -e
rm -f /usr/sbin/policy-rc.d /etc/munge/munge.key
apt-get clean
"""
# the packages in the image, with their versions: what its squashfs is kept by
LIST = ["dpkg-query", "--show", "--showformat=${db:Status-Status} ${Package}=${Version}\n"]


def finish_builder(container: str, image: str, inputs: str, layer_image: str, ok: bool) -> None:
    """The builder sealed and committed as `image` (labelled with its inputs and the hash of
    its layer and packages) when Ansible's run went well; removed either way."""
    try:
        if ok:
            podman.podman("exec", container, "sh", "-c", SEAL)
            listed = podman.text("exec", container, *LIST)
            installed = sorted(
                line.split(" ", 1)[1]
                for line in listed.splitlines()
                if line.startswith("installed ")
            )
            held = "\n".join([layer_image, *installed])
            packages = hashlib.sha256(held.encode()).hexdigest()[:16]
            podman.podman(
                "commit", "--quiet",
                "--change", f"LABEL {INPUTS_LABEL}={inputs}",
                "--change", f"LABEL {PACKAGES_LABEL}={packages}",
                container, image,
            )  # fmt: skip
    finally:
        podman.podman("rm", "-f", "-t", "0", container, check=False)


PACKAGES_LABEL = "provision.packages"  # the hash of the packages it holds


def build(
    image: str,
    authorized_keys: str,
    cache: Path | None = None,
    log: Callable[[str], None] = print,
) -> BootImage:
    """The boot image of `image` (a pool's, or the layer), root letting in `authorized_keys`
    (public keys, one a line); made unless one of the same packages and keys is kept in
    `cache`."""
    mksquashfs = podman.require("mksquashfs")
    target = kept_at(image, authorized_keys, cache)
    tag = target.name
    if all((target / f).is_file() for f in FILES):
        return BootImage(target, tag)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{tag}.", dir=target.parent))
    try:
        root = work / "root"
        root.mkdir()
        _export(image, root)
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


def kept_at(image: str, authorized_keys: str, cache: Path | None = None) -> Path:
    """Where the boot image of `image` for `authorized_keys` is kept (whether made or not): by
    the packages it holds and the keys, under `cache`."""
    held = podman.image_label(image, PACKAGES_LABEL) or podman.text(
        "image", "inspect", "--format", "{{.Id}}", image
    )
    tag = hashlib.sha256(f"{SQUASH}\0{held}\0{authorized_keys}".encode()).hexdigest()[:16]
    return (cache or cache_dir()) / tag


# how a root becomes a squashfs (_customise, EXCLUDE): a change here makes each image again
SQUASH = "2"


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

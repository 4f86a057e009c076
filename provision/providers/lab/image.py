"""The lab's base image, built here from Debian packages (no registry needed) and reused.

debootstrap makes a minimal bookworm root with systemd, sshd and python3; the machine's own apt
sources go in, so apt inside the nodes reaches the same mirror, and the root is upgraded from
them. The image tag carries a hash of this recipe, so a change to it builds a new image and an
unchanged recipe reuses the old one.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import provision.providers.lab.podman as podman
from provision.errors import OperationError

SUITE = "bookworm"
PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "sudo",
    "iproute2",
    "procps",
    "ca-certificates",
    "gnupg",
]
ENV_MIRROR = "PROVISION_LAB_MIRROR"

# One host key a node, Ed25519, made at its first boot, and sshd told to offer that one alone:
# `ssh-keygen -A` also made RSA (3072 bits) and ECDSA keys, about 0.45 CPU-seconds a node
# (5.7 of a 12-node cold apply on 2 cores), for key types nothing here uses (OpenSSH and
# paramiko both prefer Ed25519).
_HOSTKEY_UNIT = """\
[Unit]
Description=Generate this node's SSH host key on first boot
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -q -t ed25519 -N "" -f /etc/ssh/ssh_host_ed25519_key

[Install]
WantedBy=multi-user.target
"""
_SSHD_HOSTKEY = "# the node's one host key (provision)\nHostKey /etc/ssh/ssh_host_ed25519_key\n"
_HOSTS = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"


# Certificate authorities this machine adds to Debian's (a proxy's, a company's): the nodes
# trust them too, so HTTPS from inside the lab (pip, get_url) works as it does here.
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")
_PIP_CONF = (
    "[global]\n"
    "# the system's CA bundle, with this machine's local CAs\n"
    "cert = /etc/ssl/certs/ca-certificates.crt\n"
)


# A lab node is a throwaway container: dpkg need not fsync every file it unpacks (what Debian's
# own container images set). A cold apply of the 3-node lab: 85 s of Ansible before, 72 s after.
_DPKG_SPEEDUP = "# a lab node is a throwaway container (provision)\nforce-unsafe-io\n"

# debootstrap installs from the release alone, a point release behind the updates and security
# suites the nodes' sources name: each node's first install then upgraded what those suites had
# changed since (22 of the image's packages in December 2026, Python 3.11 and OpenSSL among
# them, pulled in by python3-venv and the like). An installer's or a cloud's image is current
# with its suites; this one is too, upgraded from the nodes' own sources when it is built.
_UPGRADE = (
    ["apt-get", "update", "-qq"],
    ["apt-get", "upgrade", "-y", "-qq", "-o", "Dpkg::Options::=--force-confold"],
    ["apt-get", "clean"],
)


def local_cas(ca_dir: Path = LOCAL_CA_DIR) -> dict[str, bytes]:
    if not ca_dir.is_dir():
        return {}
    return {p.name: p.read_bytes() for p in sorted(ca_dir.glob("*.crt")) if p.is_file()}


def recipe_hash(mirror: str, cas: dict[str, bytes] | None = None) -> str:
    cas = local_cas() if cas is None else cas
    ca_digest = hashlib.sha256(b"".join(k.encode() + v for k, v in cas.items())).hexdigest()
    recipe = "\n".join(
        [
            SUITE,
            *PACKAGES,
            _HOSTKEY_UNIT,
            _SSHD_HOSTKEY,
            _HOSTS,
            _PIP_CONF,
            _DPKG_SPEEDUP,
            *(" ".join(command) for command in _UPGRADE),
            mirror,
            ca_digest,
        ]
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def image_name(mirror: str) -> str:
    return f"localhost/provision-lab:{SUITE}-{recipe_hash(mirror)}"


def debian_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this machine's apt uses (PROVISION_LAB_MIRROR wins)."""
    if os.environ.get(ENV_MIRROR):
        return os.environ[ENV_MIRROR].rstrip("/")
    found = mirror_from_sources(sources_dir)
    if found is None:
        raise OperationError(
            f"no Debian {SUITE} mirror in this machine's apt sources: set {ENV_MIRROR} "
            "to a Debian mirror URL"
        )
    return found


def mirror_from_sources(apt_dir: Path, suite: str = SUITE) -> str | None:
    """Read deb822 (*.sources) and one-line (sources.list) entries for a suite's main component."""
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text(errors="replace")):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if (
                fields.get("enabled", "yes") != "no"
                and "deb" in fields.get("types", "").split()
                and suite in fields.get("suites", "").split()
                and "main" in fields.get("components", "").split()
            ):
                return fields["uris"].split()[0].rstrip("/")
    lists = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in lists:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            parts = re.sub(r"\[[^\]]*\]", "", line).split()
            if len(parts) >= 4 and parts[0] == "deb" and parts[2] == suite and "main" in parts[3:]:
                return parts[1].rstrip("/")
    return None


# A stable name for the newest base image, for tools that cannot compute the hash (Molecule).
ALIAS = "localhost/provision-lab:latest"


@contextmanager
def _image_lock() -> Iterator[None]:
    """The machine-wide build lock, in the temporary directory: never through a link another
    user planted there, never a file of theirs."""
    path = Path(tempfile.gettempdir()) / f"provision-lab-image-{os.geteuid()}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise OperationError(
            f"{path}: cannot open the image build lock ({exc}): remove it"
        ) from None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise OperationError(f"{path} belongs to another user: remove it")
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def ensure_image(mirror: str, log: Callable[[str], None] = print) -> tuple[str, float]:
    """Build the base image unless it exists. Returns its name and the seconds spent."""
    name = image_name(mirror)
    with _image_lock():  # two builds at once would both debootstrap
        seconds = 0.0
        if not podman.image_exists(name):
            started = time.monotonic()
            log(f"image: building {name} from {mirror} (debootstrap, about a minute, once)")
            _build(name, mirror)
            seconds = time.monotonic() - started
        podman.podman("tag", name, ALIAS)
        return name, seconds


def _build(name: str, mirror: str) -> None:
    debootstrap = podman.require("debootstrap")
    workdir = Path(tempfile.mkdtemp(prefix="provision-lab-image-", dir="/var/tmp"))
    root = workdir / "root"
    try:
        result = subprocess.run(
            [
                debootstrap,
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(root),
                mirror,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            tail = " ".join((result.stdout + result.stderr).split())[-400:]
            raise OperationError(f"debootstrap failed ({mirror}): {tail}")
        _customise(root, mirror)
        _upgrade(root)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        imported = subprocess.run(
            [podman.require(), "import", "--change", "CMD=/sbin/init", "-", name],
            stdin=tar.stdout,
            capture_output=True,
            env=podman.env(),
            check=False,
        )
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise OperationError(f"podman import failed: {imported.stderr.decode()[-400:]}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def apt_sources(mirror: str, apt_dir: Path = Path("/etc/apt")) -> str:
    """The nodes' apt sources: the mirror with every component (the NVIDIA packages live in
    non-free), and the machine's security mirror when it has one."""
    stanza = (
        "Types: deb\n"
        "URIs: {uri}\n"
        "Suites: {suites}\n"
        "Components: main contrib non-free non-free-firmware\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    text = stanza.format(uri=mirror, suites=f"{SUITE} {SUITE}-updates")
    security = mirror_from_sources(apt_dir, f"{SUITE}-security")
    if security is not None:
        text += "\n" + stanza.format(uri=security, suites=f"{SUITE}-security")
    return text


def _upgrade(root: Path) -> None:
    """The root brought up to date from the sources _customise wrote (the nodes' own); its
    package lists stay, with their age: a node applied within the hour uses them as they are."""
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "DEBIAN_FRONTEND": "noninteractive",
        "LC_ALL": "C.UTF-8",
    }
    for command in _UPGRADE:
        done = subprocess.run(
            ["chroot", str(root), *command], capture_output=True, text=True, env=env, check=False
        )
        if done.returncode != 0:
            tail = " ".join((done.stdout + done.stderr).split())[-400:]
            raise OperationError(f"{' '.join(command)} in the image failed: {tail}")


def _customise(root: Path, mirror: str, cas: dict[str, bytes] | None = None) -> None:
    (root / "etc" / "hosts").write_text(_HOSTS)
    (root / "etc" / "machine-id").write_text("")  # each node makes its own at first boot
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()  # each node makes its own host key at first boot
    sshd = root / "etc" / "ssh" / "sshd_config.d"
    sshd.mkdir(exist_ok=True)
    (sshd / "10-provision-lab-hostkey.conf").write_text(_SSHD_HOSTKEY)
    units = root / "etc" / "systemd" / "system"
    (units / "ssh-hostkeys.service").write_text(_HOSTKEY_UNIT)
    wants = units / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / "ssh-hostkeys.service"
    if not link.exists():
        link.symlink_to("/etc/systemd/system/ssh-hostkeys.service")
    apt = root / "etc" / "apt"
    (apt / "sources.list").unlink(missing_ok=True)
    (apt / "sources.list.d" / "debian.sources").write_text(apt_sources(mirror))
    (root / "root" / ".ssh").mkdir(mode=0o700, exist_ok=True)
    cas = local_cas() if cas is None else cas
    if cas:
        target = root / LOCAL_CA_DIR.relative_to("/")
        target.mkdir(parents=True, exist_ok=True)
        for name, data in cas.items():
            (target / name).write_bytes(data)
        done = subprocess.run(
            ["chroot", str(root), "update-ca-certificates"], capture_output=True, check=False
        )
        if done.returncode != 0:
            raise OperationError(f"update-ca-certificates in the image failed: {done.stderr!r}")
    (root / "etc" / "pip.conf").write_text(_PIP_CONF)
    (root / "etc" / "dpkg" / "dpkg.cfg.d").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "dpkg" / "dpkg.cfg.d" / "provision-lab").write_text(_DPKG_SPEEDUP)

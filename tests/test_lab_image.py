"""The lab image recipe without building it: mirrors read from apt sources, the nodes' apt
sources, and what customisation does to a root file system."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from provision import assets
from provision.cluster import Cluster
from provision.errors import OperationError
from provision.providers.lab import burst, image
from provision.spec import load_spec
from provision.state import State

from .conftest import ROOT


def _apt(tmp_path: Path, sources: str | None = None, listfile: str | None = None) -> Path:
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    if sources is not None:
        (apt / "sources.list.d" / "debian.sources").write_text(sources)
    if listfile is not None:
        (apt / "sources.list").write_text(listfile)
    return apt


DEB822 = """\
Types: deb
# a comment
URIs: http://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_deb822(tmp_path: Path) -> None:
    apt = _apt(tmp_path, DEB822)
    assert image.mirror_from_sources(apt) == "http://mirror.example/debian"
    assert image.mirror_from_sources(apt, "bookworm-security") == (
        "http://security.example/debian-security"
    )


def test_mirror_from_one_line_format(tmp_path: Path) -> None:
    apt = _apt(
        tmp_path,
        listfile=(
            "# deb http://old.example/debian bookworm main\n"
            "deb-src http://src.example/debian bookworm main\n"
            "deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main contrib\n"
        ),
    )
    assert image.mirror_from_sources(apt) == "http://one.example/debian"


def test_disabled_or_other_suites_are_ignored(tmp_path: Path) -> None:
    apt = _apt(
        tmp_path,
        DEB822.replace("Types: deb\n# a comment", "Types: deb\nEnabled: no").replace(
            "bookworm-security", "trixie-security"
        ),
    )
    assert image.mirror_from_sources(apt) is None


def test_no_mirror_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(image.ENV_MIRROR, raising=False)
    with pytest.raises(OperationError, match="PROVISION_LAB_MIRROR"):
        image.debian_mirror(_apt(tmp_path))
    monkeypatch.setenv(image.ENV_MIRROR, "http://given.example/debian/")
    assert image.debian_mirror(_apt(tmp_path / "x")) == "http://given.example/debian"


def test_node_apt_sources_have_every_component_and_security(tmp_path: Path) -> None:
    text = image.apt_sources("http://mirror.example/debian", _apt(tmp_path, DEB822))
    assert "Components: main contrib non-free non-free-firmware" in text
    assert "URIs: http://security.example/debian-security\nSuites: bookworm-security" in text


def test_recipe_hash_follows_the_mirror() -> None:
    a = image.image_name("http://a.example/debian")
    assert a == image.image_name("http://a.example/debian")
    assert a != image.image_name("http://b.example/debian")


def test_customise_makes_every_node_unique(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for d in ("etc/ssh", "etc/apt/sources.list.d", "etc/systemd/system", "root"):
        (root / d).mkdir(parents=True)
    (root / "etc" / "ssh" / "ssh_host_ed25519_key").write_text("built-in key")
    (root / "etc" / "machine-id").write_text("0123")
    (root / "etc" / "apt" / "sources.list").write_text("deb old")
    image._customise(root, "http://mirror.example/debian", cas={})
    assert not list((root / "etc" / "ssh").glob("ssh_host_*"))  # made at first boot
    assert (root / "etc" / "machine-id").read_text() == ""
    unit = root / "etc/systemd/system/multi-user.target.wants/ssh-hostkeys.service"
    assert unit.is_symlink()
    # one host key, Ed25519, and sshd offers it alone (no RSA key to make at every first boot)
    made = (root / "etc/systemd/system/ssh-hostkeys.service").read_text()
    assert (
        'ExecStart=/usr/bin/ssh-keygen -q -t ed25519 -N "" -f /etc/ssh/ssh_host_ed25519_key' in made
    )
    assert "ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key" in made
    offered = (root / "etc/ssh/sshd_config.d/10-provision-lab-hostkey.conf").read_text()
    assert [line for line in offered.splitlines() if not line.startswith("#")] == [
        "HostKey /etc/ssh/ssh_host_ed25519_key"
    ]
    assert not (root / "etc" / "apt" / "sources.list").exists()
    assert (
        "http://mirror.example/debian"
        in (root / "etc/apt/sources.list.d/debian.sources").read_text()
    )
    assert "localhost" in (root / "etc" / "hosts").read_text()
    assert oct((root / "root" / ".ssh").stat().st_mode & 0o777) == "0o700"
    # pip in the nodes trusts the system bundle (with this machine's local CAs, when it has any)
    assert "cert = /etc/ssl/certs/ca-certificates.crt" in (root / "etc" / "pip.conf").read_text()


def test_recipe_hash_follows_the_local_cas(tmp_path: Path) -> None:
    (tmp_path / "proxy.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nAAAA\n")
    (tmp_path / "notes.txt").write_text("not a certificate")
    cas = image.local_cas(tmp_path)
    assert list(cas) == ["proxy.crt"]
    mirror = "http://a.example/debian"
    assert image.recipe_hash(mirror, cas) != image.recipe_hash(mirror, {})
    assert image.recipe_hash(mirror, cas) == image.recipe_hash(mirror, dict(cas))
    assert image.local_cas(tmp_path / "absent") == {}


def test_an_elastic_pools_image_follows_the_roles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inputs an elastic lab pool's image is made from include every file of the
    collection: a role changed makes the image stale."""
    files = assets.collection_files()
    names = {str(p.relative_to(assets.collection_dir())) for p in files}
    assert {"galaxy.yml", "roles/slurm/tasks/main.yml", "playbooks/site.yml"} <= names
    assert not any(n.startswith(("provision/", "tests/", "docs/")) for n in names)
    copy = tmp_path / "collection"
    for part in assets.COLLECTION_PARTS:
        source = ROOT / part
        if source.is_file():
            copy.mkdir(exist_ok=True)
            shutil.copy(source, copy / part)
        else:
            shutil.copytree(source, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(assets, "collection_dir", lambda: copy)
    cluster = Cluster(load_spec(ROOT / "examples" / "lab-burst.yaml"))
    state = State(tmp_path / "state", cluster.spec.name)
    before = burst._digest(cluster, state, "base", "burst")
    assert burst._digest(cluster, state, "base", "burst") == before
    task = copy / "roles" / "slurm" / "tasks" / "main.yml"
    task.write_text(task.read_text() + "\n")
    assert burst._digest(cluster, state, "base", "burst") != before

"""Where a cluster's state is: found the same way from any working directory, and never
replaced beside a running cluster (a new state would make new keys and secrets and push them)."""

from __future__ import annotations

import hashlib
import ipaddress
import os
from pathlib import Path

import pytest

from provision import preflight
from provision.errors import UsageError
from provision.providers.lab import LabProvider
from provision.spec import load_spec
from provision.spec.nodes import expand_nodes
from provision.state import State, default_root, refuse_lost_state, user_root
from provision.verify.remote import Output

from .conftest import ROOT
from .conftest import run_provision as provision

LAB = ROOT / "examples" / "lab.yaml"


def test_the_default_root_is_beside_the_spec_or_the_users_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROVISION_STATE_DIR", raising=False)
    spec = tmp_path / "clusters" / "a.yaml"
    spec.parent.mkdir()
    spec.write_text(LAB.read_text())
    monkeypatch.chdir(tmp_path)
    assert default_root(Path("clusters/a.yaml")) == tmp_path / "clusters" / ".provision"
    monkeypatch.chdir(spec.parent)
    assert default_root(Path("a.yaml")) == tmp_path / "clusters" / ".provision"
    # the examples this package carries may lie where nobody may write: the user's own
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_root(LAB) == user_root() == tmp_path / "xdg" / "provision"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert user_root() == Path.home() / ".local" / "state" / "provision"
    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "env"))
    assert default_root(spec) == tmp_path / "env"


def test_render_from_two_directories_finds_one_state(tmp_path: Path) -> None:
    spec = tmp_path / "site" / "lab.yaml"
    spec.parent.mkdir()
    spec.write_text(LAB.read_text())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    first = provision("render", "lab.yaml", cwd=spec.parent)
    assert first.returncode == 0, first.stderr
    key = spec.parent / ".provision" / "lab" / "build" / "inventory" / "hosts.yml"
    assert key.exists()
    again = provision("render", str(spec), cwd=elsewhere)
    assert again.returncode == 0 and "(0 changed)" in again.stdout, again.stdout + again.stderr
    assert not (elsewhere / ".provision").exists()


def test_a_state_left_under_the_working_directory_is_named_not_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Earlier versions kept the state under the working directory: a run from there finds
    the cluster's secrets there and says how to move them, exit 2, rather than making new."""
    spec = tmp_path / "specs" / "lab.yaml"
    spec.parent.mkdir()
    spec.write_text(LAB.read_text())
    legacy = tmp_path / ".provision" / "lab" / "secrets"
    legacy.mkdir(parents=True)
    (legacy / "munge.key").write_bytes(os.urandom(64))
    for verb in (["plan", str(spec)], ["apply", str(spec)], ["ssh", "-f", str(spec), "head001"]):
        r = provision(*verb, cwd=tmp_path)
        assert r.returncode == 2, (verb, r.stdout + r.stderr)
        assert r.stderr.count("\n") == 1, r.stderr
        assert f"its state is in {tmp_path / '.provision' / 'lab'}" in r.stderr, r.stderr
        assert f"--state-dir {tmp_path / '.provision'}" in r.stderr
    assert not (spec.parent / ".provision").exists()
    monkeypatch.chdir(tmp_path)
    refuse_lost_state(tmp_path / ".provision", "lab")  # that state itself: nothing to say
    with pytest.raises(UsageError):
        refuse_lost_state(spec.parent / ".provision", "lab")


class _Node:
    """A node's SSH session as preflight sees it, its munge key's digest (or none)."""

    def __init__(self, digest: str | None) -> None:
        self.digest = digest
        self.asked: list[tuple[str, bool]] = []

    def run(self, command: str, sudo: bool = False, timeout: float = 60.0) -> Output:
        self.asked.append((command, sudo))
        line = f"{self.digest}  /etc/munge/munge.key\n" if self.digest else ""
        return Output(0, line, "")


def test_a_node_with_another_states_munge_key_fails_preflight(tmp_path: Path) -> None:
    state = State(tmp_path, "lab")
    state.ensure()
    key = os.urandom(1024)
    (state.secrets / "munge.key").write_bytes(key)
    ours = preflight._munge_digest(state)
    assert ours == hashlib.sha256(key).hexdigest()
    node = expand_nodes(load_spec(LAB))[1]
    remote = _Node("0" * 64)
    found = preflight._same_munge_key(node, remote, ours, state)  # type: ignore[arg-type]
    assert not found.passed and "is not the key of this state" in found.evidence
    assert remote.asked == [("sha256sum /etc/munge/munge.key 2>/dev/null || true", True)]
    for digest in (None, ours):  # a new host, or one this state's first apply reached
        assert preflight._same_munge_key(node, _Node(digest), ours, state).passed  # type: ignore[arg-type]
    state.applied.mkdir()  # after this state's first apply the cluster is its own
    assert preflight._munge_digest(state) is None


def test_a_running_lab_is_never_given_new_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load_spec(LAB)
    lab = LabProvider("lab", spec.network.management.cidr)
    monkeypatch.setattr("provision.providers.lab._require_root", lambda: None)
    monkeypatch.setattr(
        LabProvider, "containers", lambda self: {"provision-lab-head001": "running"}
    )
    state = State(tmp_path, "lab")
    with pytest.raises(UsageError, match=r"lab: cluster 'lab' runs \(provision-lab-head001\)"):
        lab.create(expand_nodes(spec), state)
    assert not (state.keys / "id_ed25519").exists()


def _lab_with_running(
    running: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[LabProvider, list[str], Path]:
    """A lab provider whose `podman ps` lists these containers, what it says, and a stand-in
    for the inotify limit at Debian's 128."""
    import subprocess

    from provision.providers.lab import podman

    said: list[str] = []
    lab = LabProvider("lab", ipaddress.IPv4Network("10.77.0.0/24"), log=said.append)
    ran = subprocess.CompletedProcess(["podman"], 0, stdout=running, stderr=b"")
    monkeypatch.setattr(podman, "podman", lambda *args, **kw: ran)
    limit = tmp_path / "max_user_instances"
    limit.write_text("128\n")
    return lab, said, limit


def test_the_lab_raises_the_inotify_limit_its_containers_need_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each container's systemd holds about 5 inotify instances: at Debian's 128 the 26th
    container of a 40-node lab never started sshd. The limit is raised, said, never lowered."""
    lab, said, limit = _lab_with_running(b"a1\nb2\n", tmp_path, monkeypatch)
    lab._ensure_inotify(39, limit)  # 2 running, 39 new
    assert limit.read_text() == f"{128 + 8 * 41}\n"
    assert said == [
        "lab: fs.inotify.max_user_instances raised from 128 to 456 for 41 containers (each "
        "one's systemd holds several)"
    ]
    lab._ensure_inotify(3, limit)  # enough already: left as it is
    assert limit.read_text() == "456\n" and len(said) == 1


def test_a_limit_the_lab_cannot_raise_is_said_with_the_command_and_the_lab_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class ReadOnly(type(tmp_path)):  # type: ignore[misc]
        def write_text(self, *args: object, **kwargs: object) -> int:
            raise PermissionError(30, "Read-only file system")

    lab, said, limit = _lab_with_running(b"", tmp_path, monkeypatch)
    lab._ensure_inotify(3, ReadOnly(limit))
    assert said == [
        "lab: 3 containers may need about 152 inotify instances and "
        "fs.inotify.max_user_instances is 128 (Read-only file system); if a container's SSH "
        "never answers, run `sysctl -w fs.inotify.max_user_instances=152`"
    ]
    assert limit.read_text() == "128\n"

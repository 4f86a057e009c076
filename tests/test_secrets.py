"""Cluster secrets: made once, private from the first byte, kept across runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provision.errors import OperationError, UsageError
from provision.secrets import MUNGE_KEY, SLURMDBD_PASSWORD, ensure_cluster_secrets, make_secrets
from provision.state import State


def test_made_once_and_private(tmp_path: Path) -> None:
    directory = make_secrets(tmp_path / "secrets", "slurm")
    key, password = directory / MUNGE_KEY, directory / SLURMDBD_PASSWORD
    assert oct(directory.stat().st_mode & 0o777) == "0o700"
    assert [oct(p.stat().st_mode & 0o777) for p in (key, password)] == ["0o600", "0o600"]
    assert len(key.read_bytes()) == 1024
    first = (key.read_bytes(), password.read_text())
    make_secrets(directory, "slurm")
    assert (key.read_bytes(), password.read_text()) == first
    key.chmod(0o644)  # loosened by hand: refused, not used, not silently tightened
    with pytest.raises(UsageError, match=r"mode 0644, readable by others: `chmod 600 "):
        make_secrets(directory, "slurm")
    assert key.read_bytes() == first[0] and oct(key.stat().st_mode & 0o777) == "0o644"


def test_state_dir_and_scheduler(tmp_path: Path) -> None:
    slurm = ensure_cluster_secrets(State(tmp_path, "a"), "slurm")
    assert slurm == tmp_path / "a" / "secrets" and (slurm / MUNGE_KEY).exists()
    k8s = ensure_cluster_secrets(State(tmp_path, "b"), "kubernetes")
    assert list(k8s.iterdir()) == []


def test_a_secret_that_is_a_link_or_the_wrong_size_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "secrets"
    directory.mkdir(mode=0o700)
    elsewhere = tmp_path / "attacker-chosen"
    elsewhere.write_bytes(b"x" * 1024)
    elsewhere.chmod(0o600)
    (directory / MUNGE_KEY).symlink_to(elsewhere)
    with pytest.raises(UsageError, match="not a regular file"):
        make_secrets(directory, "slurm")
    (directory / MUNGE_KEY).unlink()
    short = directory / MUNGE_KEY
    short.write_bytes(b"tiny")
    short.chmod(0o600)
    with pytest.raises(UsageError, match="is 4 bytes, not 32-1048576"):
        make_secrets(directory, "slurm")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_secret_or_state_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    state = State(tmp_path, "c")
    ensure_cluster_secrets(state, "slurm")
    os.chown(state.secrets / MUNGE_KEY, 65534, 65534)
    with pytest.raises(UsageError, match="belongs to user 65534, not to you"):
        ensure_cluster_secrets(state, "slurm")
    os.chown(state.dir, 65534, 65534)
    with pytest.raises(UsageError, match="belongs to user 65534"):
        state.ensure()


def test_the_state_dir_is_made_0700_and_tightened(tmp_path: Path) -> None:
    state = State(tmp_path, "d")
    state.ensure()
    assert oct(state.dir.stat().st_mode & 0o777) == "0o700"
    state.dir.chmod(0o777)
    state.ensure()
    assert oct(state.dir.stat().st_mode & 0o777) == "0o700"


def test_a_second_command_on_a_busy_cluster_names_the_holder(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    state = State(tmp_path, "lab")
    with state.locked("apply examples/lab.yaml"):
        held = json.loads((state.dir / "lock").read_text())
        assert held["pid"] == os.getpid() and held["command"] == "apply examples/lab.yaml"
        busy = rf"cluster 'lab' is busy: `provision apply examples/lab.yaml` \(pid {os.getpid()}, "
        with pytest.raises(OperationError, match=busy), state.locked("destroy"):
            pass
        for verb in (["render"], ["destroy", "--yes"], ["apply"]):
            done = subprocess.run(
                [sys.executable, "-m", "provision", *verb, "--state-dir", str(tmp_path)],
                capture_output=True,
                text=True,
                check=False,
                cwd=root,
                timeout=120,
            )
            assert done.returncode == 1, (verb, done.stderr)
            assert "cluster 'lab' is busy: `provision apply examples/lab.yaml`" in done.stderr
    assert state.dir.exists()  # destroy did not run
    with state.locked("render"):  # free again once the holder is done
        pass


def test_grafana_password_made_once_and_relay_passwords_copied_private(tmp_path: Path) -> None:
    from provision.secrets import GRAFANA_PASSWORD, monitoring_secrets, smtp_password

    directory = tmp_path / "secrets"
    source = tmp_path / "relay.password"
    source.write_text("s3cret-relay\n")
    source.chmod(0o600)
    where = "monitoring.receivers[1].email.password_file"
    monitoring_secrets(directory, True, [("mail", str(source), where)])
    admin = (directory / GRAFANA_PASSWORD).read_text()
    copy = directory / smtp_password("mail")
    assert copy.read_bytes() == b"s3cret-relay"  # one line, no newline for Alertmanager
    assert oct(copy.stat().st_mode & 0o777) == "0o600"
    assert oct((directory / GRAFANA_PASSWORD).stat().st_mode & 0o777) == "0o600"
    source.write_text("rotated\n")
    monitoring_secrets(directory, True, [("mail", str(source), where)])
    assert copy.read_bytes() == b"rotated" and (directory / GRAFANA_PASSWORD).read_text() == admin
    source.chmod(0o644)  # others can read it: refused, naming the spec key
    with pytest.raises(
        UsageError, match=r"^monitoring\.receivers\[1\]\.email\.password_file: .*0644"
    ):
        monitoring_secrets(directory, False, [("mail", str(source), where)])
    source.chmod(0o600)
    source.write_text("two\nlines\n")
    with pytest.raises(UsageError, match="on one line"):
        monitoring_secrets(directory, False, [("mail", str(source), where)])
    with pytest.raises(UsageError, match="does not exist"):
        monitoring_secrets(directory, False, [("mail", str(tmp_path / "none"), where)])
    assert copy.read_bytes() == b"rotated"

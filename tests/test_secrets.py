"""Cluster secrets: made once, private from the first byte, kept across runs."""

from __future__ import annotations

from pathlib import Path

from provision.secrets import MUNGE_KEY, SLURMDBD_PASSWORD, ensure_cluster_secrets, make_secrets
from provision.state import State


def test_made_once_and_private(tmp_path: Path) -> None:
    directory = make_secrets(tmp_path / "secrets", "slurm")
    key, password = directory / MUNGE_KEY, directory / SLURMDBD_PASSWORD
    assert oct(directory.stat().st_mode & 0o777) == "0o700"
    assert [oct(p.stat().st_mode & 0o777) for p in (key, password)] == ["0o600", "0o600"]
    assert len(key.read_bytes()) == 1024
    first = (key.read_bytes(), password.read_text())
    key.chmod(0o644)  # loosened by hand: the next run tightens it, and keeps the content
    make_secrets(directory, "slurm")
    assert (key.read_bytes(), password.read_text()) == first
    assert oct(key.stat().st_mode & 0o777) == "0o600"


def test_state_dir_and_scheduler(tmp_path: Path) -> None:
    slurm = ensure_cluster_secrets(State(tmp_path, "a"), "slurm")
    assert slurm == tmp_path / "a" / "secrets" and (slurm / MUNGE_KEY).exists()
    k8s = ensure_cluster_secrets(State(tmp_path, "b"), "kubernetes")
    assert list(k8s.iterdir()) == []

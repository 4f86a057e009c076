"""Secrets a cluster generates once and keeps in its state dir: mode 0600, never printed.

Ansible gets the directory's path, never a secret's value; the tasks that read them are no_log.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

from provision.state import State

MUNGE_KEY = "munge.key"
SLURMDBD_PASSWORD = "slurmdbd.password"


def create_once(path: Path, make: Callable[[], bytes]) -> Path:
    if path.exists():
        path.chmod(0o600)
        return path
    # O_EXCL: two runs racing never both write; 0600 from the first byte on
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(make())
    return path


def make_secrets(directory: Path, scheduler: str) -> Path:
    """Create, once, the secrets a cluster with this scheduler needs in `directory` (0700)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    if scheduler == "slurm":
        create_once(directory / MUNGE_KEY, lambda: secrets.token_bytes(1024))
        create_once(directory / SLURMDBD_PASSWORD, lambda: secrets.token_urlsafe(32).encode())
    return directory


def ensure_cluster_secrets(state: State, scheduler: str) -> Path:
    """The secrets of a cluster, in its state dir; returns the directory that holds them."""
    state.ensure()
    return make_secrets(state.secrets, scheduler)

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


def _create_once(path: Path, make: Callable[[], bytes]) -> Path:
    if path.exists():
        path.chmod(0o600)
        return path
    # O_EXCL: two runs racing never both write; 0600 from the first byte on
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(make())
    return path


def ensure_cluster_secrets(state: State, scheduler: str) -> Path:
    """Create the secrets this cluster needs; return the directory that holds them."""
    state.ensure()
    if scheduler == "slurm":
        _create_once(state.secrets / MUNGE_KEY, lambda: secrets.token_bytes(1024))
        _create_once(state.secrets / SLURMDBD_PASSWORD, lambda: secrets.token_urlsafe(32).encode())
    return state.secrets

"""The SSH keys a cluster is reached with: the spec's own, or one made for the cluster and kept
in its state directory; and the known_hosts entries of nodes that were made anew."""

from __future__ import annotations

import subprocess
from pathlib import Path

from provision.errors import UsageError
from provision.secrets import check_secret_file
from provision.spec.models import CLOUD_PROVIDERS, Spec
from provision.state import State


def ensure_ssh_key(state: State) -> Path:
    """The cluster's own SSH key for Ansible, made once, kept private to the state dir."""
    state.ensure()
    key = state.keys / "id_ed25519"
    if not key.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"provision@{state.cluster}",
             "-f", str(key)],
            check=True,
            capture_output=True,
        )  # fmt: skip
    return check_secret_file(key, (64, 16 * 1024))


def private_key(spec: Spec, state: State) -> Path | None:
    """The key Ansible and verify log in with: the spec's, or the cluster's own."""
    if spec.ssh.private_key_file:
        key = Path(spec.ssh.private_key_file)  # absolute: the spec resolved it
        if not key.exists():
            raise UsageError(f"ssh.private_key_file: {key} does not exist")
        return key
    own_key = state.keys / "id_ed25519"
    if any(p.provider in ("lab", *CLOUD_PROVIDERS) for p in spec.pools) and own_key.exists():
        return own_key
    return None


def public_key(spec: Spec, state: State) -> str:
    """The public half of that key, for cloud instances: the spec's, or the cluster's own."""
    private = (
        Path(spec.ssh.private_key_file) if spec.ssh.private_key_file else ensure_ssh_key(state)
    )
    public = private.with_name(private.name + ".pub")
    if not public.exists():
        raise UsageError(f"ssh.private_key_file: {public} does not exist (cloud nodes need it)")
    return public.read_text().strip()


def host_key_options(state: State) -> list[str]:
    """ssh options for host keys: learned on first contact, checked ever after, per cluster."""
    return [
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-o",
        f"UserKnownHostsFile={state.known_hosts.resolve()}",
    ]


def forget_host_key(state: State, address: str) -> None:
    """Drop an address from the cluster's known_hosts (a new node there has new host keys)."""
    if state.known_hosts.exists():
        subprocess.run(
            ["ssh-keygen", "-R", address, "-f", str(state.known_hosts)],
            capture_output=True,
            check=False,
        )
        Path(f"{state.known_hosts}.old").unlink(missing_ok=True)

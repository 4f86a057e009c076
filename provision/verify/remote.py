"""SSH sessions to nodes for preflight and verify (paramiko), sharing Ansible's known_hosts."""

from __future__ import annotations

import shlex
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko

_KNOWN_HOSTS_LOCK = threading.Lock()


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """OpenSSH's accept-new: learn a key on first contact; a changed key is still refused."""

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        with _KNOWN_HOSTS_LOCK:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            with self.known_hosts.open("a") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            self.known_hosts.chmod(0o600)


@dataclass(frozen=True)
class Output:
    rc: int
    stdout: str
    stderr: str


class Remote:
    """One node reached over SSH. `run` returns exit code and output; it never raises on rc."""

    def __init__(
        self,
        name: str,
        address: str,
        user: str,
        port: int,
        key_file: Path | None,
        known_hosts: Path,
        timeout: float = 15.0,
    ) -> None:
        self.name = name
        self.address = address
        self.user = user
        self.port = port
        self.key_file = key_file
        self.known_hosts = known_hosts
        self.timeout = timeout
        self.client: paramiko.SSHClient | None = None
        self.connect_seconds = 0.0

    def connect(self) -> None:
        client = paramiko.SSHClient()
        if self.known_hosts.exists():
            client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(_AcceptNew(self.known_hosts))
        started = time.monotonic()
        client.connect(
            self.address,
            port=self.port,
            username=self.user,
            key_filename=str(self.key_file) if self.key_file else None,
            timeout=self.timeout,
            banner_timeout=self.timeout,
            auth_timeout=self.timeout,
            allow_agent=self.key_file is None,
            look_for_keys=self.key_file is None,
        )
        self.connect_seconds = time.monotonic() - started
        self.client = client

    def run(self, command: str, sudo: bool = False, timeout: float = 60.0) -> Output:
        if self.client is None:
            self.connect()
        assert self.client is not None
        if sudo and self.user != "root":
            command = "sudo -n sh -c " + shlex.quote(command)
        _, out, err = self.client.exec_command(command, timeout=timeout)
        rc = out.channel.recv_exit_status()
        return Output(rc, out.read().decode(errors="replace"), err.read().decode(errors="replace"))

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

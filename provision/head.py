"""One handle on a cluster that runs: its spec, nodes and state, loaded once, and how to reach
its nodes as Ansible does (the cluster's key, login user, port and known hosts). The verbs that
talk to a running cluster (ssh, drain, resume, bursting's status) take it."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from provision.cluster import Cluster, compress
from provision.errors import OperationError, UsageError
from provision.providers.cloud import saved_addresses
from provision.spec import Spec, load_spec
from provision.spec.models import CLOUD_PROVIDERS
from provision.spec.nodes import login_user
from provision.sshkeys import host_key_options, private_key
from provision.state import State


def open_cluster(spec_path: Path, state_root: Path) -> tuple[Spec, Cluster, State]:
    spec = load_spec(spec_path)
    return spec, Cluster(spec), State(state_root, spec.name)


class Head(Protocol):
    """What the verbs that talk to a running cluster need of it: its spec and nodes, and a
    command run on its first head. Handle is the one that reaches it over SSH; tests give a
    fake that answers as a head would."""

    @property
    def spec_path(self) -> Path: ...
    @property
    def spec(self) -> Spec: ...
    @property
    def cluster(self) -> Cluster: ...
    def on_head(self, command: str, timeout: float = 60) -> str: ...


@dataclass(frozen=True)
class Handle:
    spec_path: Path
    spec: Spec
    cluster: Cluster
    state: State

    @classmethod
    def open(cls, spec_path: Path, state_root: Path) -> Handle:
        spec, cluster, state = open_cluster(spec_path, state_root)
        return cls(spec_path, spec, cluster, state)

    @property
    def head(self) -> str:
        """The first head's name: where the scheduler's commands run."""
        return self.cluster.head_nodes[0].name

    def argv(self, node_name: str, command: list[str]) -> list[str]:
        """The ssh command line that reaches a node: host keys learned on first contact and
        checked ever after. The words of `command` are passed on; ssh joins them with spaces
        and the node's shell runs them."""
        spec, cluster, state = self.spec, self.cluster, self.state
        node = next((n for n in cluster.nodes if n.name == node_name), None)
        if node is None:
            names = compress([n.name for n in cluster.nodes])
            raise UsageError(f"{self.spec_path}: no node named '{node_name}' (the nodes: {names})")
        address = node.address
        if node.provider in CLOUD_PROVIDERS:  # its public address, else its private one
            found = saved_addresses(state, node.provider, "public") or {}
            address = found.get(node.name) or saved_addresses(state, node.provider).get(node.name)
        if address is None:
            why = (
                "elastic nodes exist only while Slurm has them up" if node.elastic else "run apply"
            )
            raise UsageError(f"{node_name} has no known address yet: {why}")
        user = login_user(spec, node.provider)
        argv = ["ssh", *host_key_options(state), "-p", str(spec.ssh.port), "-l", user]
        key = private_key(spec, state)
        if key is not None:
            argv += ["-i", str(key.resolve()), "-o", "IdentitiesOnly=yes"]
        return [*argv, "--", str(address), *command]

    def on_head(self, command: str, timeout: float = 60) -> str:
        """Run one shell command on the first head; its output, or OperationError with its
        error."""
        argv = self.argv(self.head, [command])
        argv[1:1] = ["-oBatchMode=yes", "-oConnectTimeout=10"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            why = " ".join(done.stderr.split())[-300:] or f"exit {done.returncode}"
            raise OperationError(f"on {self.head}: {why}")
        return done.stdout


def ssh_argv(spec_path: Path, state_root: Path, node_name: str, command: list[str]) -> list[str]:
    """Handle.argv, for a caller with the spec's path alone (`provision ssh`)."""
    return Handle.open(spec_path, state_root).argv(node_name, command)


def forward_options(forwards: list[str], with_command: bool) -> list[str]:
    """ssh's options for `provision ssh --forward PORT|LOCAL:PORT`: this machine's 127.0.0.1
    port to the node's loopback port; without a command, no shell: the forward alone."""
    options = ["-o", "ExitOnForwardFailure=yes"]
    for text in forwards:
        match = re.fullmatch(r"(?:([1-9][0-9]{0,4}):)?([1-9][0-9]{0,4})", text.strip())
        if not match or any(int(p) > 65535 for p in match.groups() if p):
            raise UsageError(f"--forward {text!r}: a port (9090) or LOCAL:PORT (19090:9090)")
        local, remote = match[1] or match[2], match[2]
        options += ["-L", f"127.0.0.1:{local}:127.0.0.1:{remote}"]
    return options if with_command else [*options, "-N"]

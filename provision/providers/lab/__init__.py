"""The lab provider: cluster nodes as podman containers running systemd, on a podman network
the project creates with the spec's management network, reached over SSH like bare metal.

Containers are named `provision-<cluster>-<node>` and labelled with the cluster, so create
reuses what exists (starting stopped nodes) and destroy finds everything it made.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provision.burst.config import LAB_LABEL, LAB_SOCKET_DIR, lab_container_prefix, lab_network
from provision.cluster import Cluster, compress
from provision.errors import OperationError, UsageError
from provision.providers.base import Defaults, ProviderPlan
from provision.providers.lab import burst, podman
from provision.providers.lab.image import debian_mirror, ensure_image
from provision.providers.lab.metal import Machine, MetalLab
from provision.providers.lab.storage import Volume
from provision.render.burst import burst_config
from provision.spec.nodes import Node
from provision.sshkeys import ensure_ssh_key, forget_host_key
from provision.state import State

LABEL = LAB_LABEL
SSH_WAIT_S = 90
# and this much more per container: they boot their systemd at once on this machine's cores (40
# on 2 cores took over 90 s)
SSH_WAIT_PER_NODE_S = 3
# each container's systemd (PID 1, journald, logind) holds about 5 inotify instances, all root's
# on this machine; Debian's default limit of 128 stops the 26th container's systemd halfway
# (its path units fail, sshd never starts)
INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")
INOTIFY_PER_CONTAINER = 8
INOTIFY_SPARE = 128  # the workstation's own


def container_name(cluster: str, node: str) -> str:
    return lab_container_prefix(cluster) + node


def network_name(cluster: str) -> str:
    return lab_network(cluster)


@dataclass
class LabImageBuilds:
    builds: list[burst.ImageBuild]
    conf_server: str
    inventory: Path

    @property
    def hosts(self) -> list[str]:
        return [b.host for b in self.builds]

    @property
    def images(self) -> list[str]:
        return [b.image for b in self.builds]

    def finish(self, state: State, ok: bool) -> None:
        burst.finish_builders(self.builds, self.conf_server, state, ok)


class LabProvider(Defaults):
    kind = "lab"

    def __init__(
        self,
        cluster: str,
        cidr: ipaddress.IPv4Network,
        log: Callable[[str], None] | None = None,
        burst_pools: list[str] | None = None,
        volumes: dict[str, list[Volume]] | None = None,
        machines: list[Machine] | None = None,
        bmc_port: int = 443,
    ) -> None:
        self.cluster = cluster
        self.cidr = cidr
        self.log = log or (lambda _msg: None)
        # elastic lab pools: the head drives podman through its API to make their nodes
        self.burst_pools = burst_pools or []
        # the spec's storage: node -> the shared volumes standing in for NFS (storage.py)
        self.volumes = volumes or {}
        # the metal lab's machines (lab pools that boot from the network): QEMU, each with
        # its BMC, made powered off; apply's boot phase powers them on (metal.py)
        self.machines = machines or []
        self.bmc_port = bmc_port

    # --- reading ---------------------------------------------------------------------------

    def containers(self) -> dict[str, str]:
        """Container name -> state (running, exited, created...), for every container of this
        cluster. JSON, not a Go template: podman 4.3's `ps` template gives .State as its
        human status ("Up 2 minutes")."""
        out = podman.text(
            "ps", "-a", "--filter", f"label={LABEL}={self.cluster}", "--format", "json", check=False
        )
        try:
            listed = json.loads(out or "[]")
        except ValueError:
            return {}
        found = {}
        for entry in listed if isinstance(listed, list) else []:
            names = entry.get("Names") or []
            if names:
                found[str(names[0])] = str(entry.get("State", "")).lower()
        return found

    def plan(self, nodes: list[Node], state: State) -> ProviderPlan:
        if _podman_missing():
            existing: dict[str, str] = {}
        else:
            existing = self.containers()
        machines = {m.name for m in self.machines}
        lasting = [n for n in nodes if not n.elastic and n.name not in machines]
        return ProviderPlan(
            provider="lab",
            create=[
                n.name for n in lasting if container_name(self.cluster, n.name) not in existing
            ],
            existing=[n.name for n in lasting if container_name(self.cluster, n.name) in existing],
            on_demand=[n.name for n in nodes if n.elastic],
            what="container",
            resources=self._volume_lines() + self._machine_lines(state),
            resources_label="lab",
        )

    def _metal(self, state: State) -> MetalLab:
        return MetalLab(state, network_name(self.cluster), self.bmc_port, self.log)

    def _machine_lines(self, state: State) -> list[str]:
        if not self.machines:
            return []
        running = self._metal(state).pid()
        names = compress([m.name for m in self.machines])
        lines = [
            f"{names}: QEMU machines without a disk (the metal lab), each with a Redfish BMC "
            f"emulator on {self.machines[0].bmc} and after (port {self.bmc_port}): "
            + ("running" if running else "made powered off; apply's boot phase powers them on")
        ]
        fabric = [m.name for m in self.machines if m.fabric]
        if fabric:
            lines.append(
                f"{compress(fabric)}: a card on the lab's RoCE fabric per soft RoCE rail (eth1, "
                "...), a QEMU segment between the machines alone"
            )
        return lines

    def _volume_lines(self) -> list[str]:
        where: dict[Volume, list[str]] = {}
        for node, volumes in sorted(self.volumes.items()):
            for v in volumes:
                where.setdefault(v, []).append(node)
        return [
            f"{v.source} at {v.path}{' read-only' if v.readonly else ''} on {compress(nodes)}: "
            f"podman volume {v.name} (a shared volume stands in for NFS in a lab)"
            for v, nodes in sorted(where.items(), key=lambda kv: (kv[0].source, kv[0].path))
        ]

    # --- changing --------------------------------------------------------------------------

    def create(self, nodes: list[Node], state: State) -> dict[str, ipaddress.IPv4Address]:
        _require_root()
        existing = self.containers()
        if existing and not (state.keys / "id_ed25519").exists():
            # the containers take the key they were made with: a new one would lock us out,
            # and new secrets would replace the running cluster's
            raise UsageError(
                f"lab: cluster '{self.cluster}' runs ({', '.join(sorted(existing))}), but its "
                f"state (keys, secrets) is not in {state.dir}: pass the state it was made with "
                f"(--state-dir), or `provision destroy` it first"
            )
        machines = {m.name for m in self.machines}
        booted = [n for n in nodes if n.name in machines]  # powered on by apply's boot phase
        nodes = [n for n in nodes if n.name not in machines]
        key = ensure_ssh_key(state)
        image, seconds = ensure_image(debian_mirror(), log=self.log)
        if seconds:
            self.log(f"image: built in {seconds:.0f}s")
        self._ensure_network()
        self._ensure_inotify(
            len([n for n in nodes if container_name(self.cluster, n.name) not in existing])
        )
        api = burst.ensure_api_service(state, self.log) if self.burst_pools else None
        self._ensure_volumes()
        created = []
        for node in nodes:
            name = container_name(self.cluster, node.name)
            status = existing.get(name)
            if status is None:
                mounts = []
                if api is not None and node.role == "head":
                    # root in this head is root on the workstation: a lab's trade (docs/security.md)
                    mounts = ["--volume", f"{api.parent.resolve()}:{LAB_SOCKET_DIR}"]
                for v in self.volumes.get(node.name, []):
                    mounts += ["--volume", f"{v.name}:{v.path}" + (":ro" if v.readonly else "")]
                self._create_container(node, image, key, mounts)
                created.append(node)
            else:
                if api is not None and node.role == "head":
                    self._require_api_mount(name, node.name)
                self._require_volumes(name, node.name)
                if status != "running":
                    self.log(f"lab: starting stopped node {node.name}")
                    podman.podman("start", name)
        for node in created:
            forget_host_key(state, str(node.address))  # a new container has new host keys
        if self.machines:
            self._metal(state).ensure(self.machines)
        _wait_for_ssh(
            [str(n.address) for n in nodes], SSH_WAIT_S + SSH_WAIT_PER_NODE_S * len(nodes)
        )
        return {n.name: n.address for n in nodes + booted if n.address is not None}

    def _ensure_inotify(self, new: int, limit: Path = INOTIFY_LIMIT) -> None:
        """Enough inotify instances for every running container's systemd and the new ones':
        raised (root runs the lab) and said, where the machine's limit is lower."""
        if not new or not limit.exists():
            return
        running = len(podman.podman("ps", "--quiet").stdout.split())
        needed = INOTIFY_SPARE + INOTIFY_PER_CONTAINER * (running + new)
        current = int(limit.read_text().strip())
        if current >= needed:
            return
        try:
            limit.write_text(f"{needed}\n")
        except OSError as exc:  # the estimate is generous: the containers may still start
            self.log(
                f"lab: {running + new} containers may need about {needed} inotify instances "
                f"and fs.inotify.max_user_instances is {current} ({exc.strerror}); if a "
                f"container's SSH never answers, run `sysctl -w "
                f"fs.inotify.max_user_instances={needed}`"
            )
            return
        self.log(
            f"lab: fs.inotify.max_user_instances raised from {current} to {needed} for "
            f"{running + new} containers (each one's systemd holds several)"
        )

    def _require_api_mount(self, container: str, node: str) -> None:
        """A head made before the spec had an elastic pool cannot reach podman: say so."""
        mounts = podman.text(
            "container",
            "inspect",
            container,
            "--format",
            "{{range .Mounts}}{{.Destination}} {{end}}",
        )
        if str(LAB_SOCKET_DIR) not in mounts.split():
            raise OperationError(
                f"{node} was created before the spec had an elastic lab pool, so it cannot reach "
                "podman to create burst nodes: `provision destroy` the cluster and apply again"
            )

    def _ensure_volumes(self) -> None:
        """The shared volumes, labelled with the cluster so destroy finds them."""
        names = sorted({v.name for vs in self.volumes.values() for v in vs})
        if not names:
            return
        have = set(podman.text("volume", "ls", "--format", "{{.Name}}").split())
        for name in names:
            if name not in have:
                podman.podman("volume", "create", "--label", f"{LABEL}={self.cluster}", name)

    def _require_volumes(self, container: str, node: str) -> None:
        """A node made before the spec gave it storage cannot mount it later: say so."""
        wanted = self.volumes.get(node, [])
        if not wanted:
            return
        mounted = podman.text(
            "container", "inspect", container, "--format", "{{range .Mounts}}{{.Name}} {{end}}"
        ).split()
        missing = [v for v in wanted if v.name not in mounted]
        if missing:
            raise OperationError(
                f"{node} was created before the spec gave it {', '.join(v.path for v in missing)} "
                "(a lab node's volumes are fixed when it is made): `provision destroy` the "
                "cluster and apply again"
            )

    def _ensure_network(self) -> None:
        name = network_name(self.cluster)
        gateway = str(self.cidr.network_address + 1)
        if podman.network_exists(name):
            subnet = podman.text(
                "network", "inspect", name, "--format", "{{range .Subnets}}{{.Subnet}} {{end}}"
            )
            if str(self.cidr) not in subnet.split():
                raise OperationError(
                    f"podman network {name} exists with subnet {subnet.strip()}, the spec says "
                    f"{self.cidr}: run `provision destroy` first, or change the spec back"
                )
            return
        podman.podman(
            "network",
            "create",
            "--subnet",
            str(self.cidr),
            "--gateway",
            gateway,
            "--label",
            f"{LABEL}={self.cluster}",
            name,
        )

    def _create_container(self, node: Node, image: str, key: Path, mounts: list[str]) -> None:
        name = container_name(self.cluster, node.name)
        self.log(f"lab: creating {node.name} ({node.address})")
        podman.podman(
            "create",
            "--name",
            name,
            "--hostname",
            node.name,
            "--network",
            f"{network_name(self.cluster)}:ip={node.address}",
            "--label",
            f"{LABEL}={self.cluster}",
            "--label",
            f"provision.node={node.name}",
            "--systemd=always",
            "--cap-add",
            "NET_ADMIN",
            # slurmstepd (root) pins a user's tasks to their CPUs: sched_setaffinity on another
            # user's process needs CAP_SYS_NICE, which a host's root has and podman's default
            # set leaves out (without it a non-root user's job fails to launch)
            "--cap-add",
            "SYS_NICE",
            "--no-hosts",
            *mounts,
            image,
            "/sbin/init",
        )
        try:
            podman.podman("cp", str(key.with_suffix(".pub")), f"{name}:/root/.ssh/authorized_keys")
            podman.podman("start", name)
        except OperationError:
            podman.podman("rm", "-f", "-t", "0", name, check=False)  # nothing half-made stays
            raise

    def image_builds(
        self, cluster: Cluster, state: State, pools: list[str] | None = None
    ) -> LabImageBuilds | None:
        """Builder containers for the elastic lab pools whose image is missing or stale (or
        for `pools`, whatever their image)."""
        if not burst.elastic_lab_pools(cluster):
            return None
        config = burst_config(cluster)
        assert config is not None  # an elastic pool has one
        base, _ = ensure_image(debian_mirror(), log=self.log)
        builds = burst.stale_images(cluster, state, base, pools)
        if not builds:
            return None
        inventory = burst.start_builders(builds, base, cluster, state)
        return LabImageBuilds(builds, config.conf_server, inventory)

    def release(self, names: list[str], state: State) -> str:
        """Remove the containers of nodes that left the spec."""
        existing = self.containers()
        removed = []
        for name in names:
            container = container_name(self.cluster, name)
            if container in existing:
                podman.podman("rm", "-f", "-t", "0", container)
                removed.append(name)
        return f"lab: removed {compress(removed) or 'no container'} (left the spec)"

    def destroy(self, nodes: list[Node], state: State) -> list[str]:
        # the metal lab's machines and their BMCs, before the network they are on
        removed = self._metal(state).stop()
        if _podman_missing():
            return removed
        for name in sorted(self.containers()):
            podman.podman("rm", "-f", "-t", "0", name)
            removed.append(name)
        if podman.network_exists(network_name(self.cluster)):
            podman.podman("network", "rm", "-f", network_name(self.cluster))
        volumes = podman.text(
            "volume", "ls", "--filter", f"label={LABEL}={self.cluster}", "--format", "{{.Name}}"
        ).split()
        for volume in volumes:
            podman.podman("volume", "rm", "-f", volume)
        burst.stop_api_service(state)
        burst.remove_images(self.cluster, self.burst_pools)
        return removed


def _podman_missing() -> bool:
    try:
        podman.require("podman")
    except OperationError:
        return True
    return False


def _require_root() -> None:
    if os.geteuid() != 0:
        raise OperationError(
            "the lab provider needs root (podman networks with fixed addresses and systemd "
            "containers): run it with sudo"
        )


def _wait_for_ssh(addresses: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    waiting = set(addresses)
    while waiting and time.monotonic() < deadline:
        for address in sorted(waiting):
            try:
                with socket.create_connection((address, 22), timeout=1) as conn:
                    if conn.recv(4).startswith(b"SSH"):
                        waiting.discard(address)
            except OSError:
                pass
        if waiting:
            time.sleep(0.5)
    if waiting:
        raise OperationError(f"no SSH on {', '.join(sorted(waiting))} after {timeout:.0f}s")

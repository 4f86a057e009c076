"""The verbs Slurm runs: resume, suspend, resume-fail, and the reconciler's reconcile.

Each logs one line per node and action to the cluster's burst log, returns within seconds, and
never leaves a node down without a reason: a node that cannot be made is marked DOWN with the
cause, so Slurm requeues its job and `sinfo -R` says why.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from provision.burst import slurm
from provision.burst.backend import CAPACITY, Backend, BurstError, one_line
from provision.burst.config import MUNGE_KEY, BurstConfig, Pool
from provision.burst.hostlist import compress
from provision.burst.podman_api import PodmanAPI, PodmanError
from provision.burst.tunnel import Hub

Log = Callable[[str], None]


class LabBackend(Backend):
    """Burst nodes as containers of the lab cluster's network, made through the workstation's
    podman API from the pool's image (the compute roles already applied)."""

    def __init__(self, pool: Pool, munge_key: Path = MUNGE_KEY) -> None:
        super().__init__()
        assert pool.lab is not None
        self.pool, self.lab = pool, pool.lab
        self.api = PodmanAPI(self.lab.socket)
        self.munge_key = munge_key

    def container(self, node: str) -> str:
        return self.lab.container_prefix + node

    def resume(self, node: str) -> None:
        key, value = self.lab.label.split("=", 1)
        name = self.container(node)
        self.api.remove(name)  # a leftover of an earlier run never blocks the name
        self.api.create(
            {
                "name": name,
                "hostname": node,
                "image": self.lab.image,
                "command": ["/sbin/init"],
                "systemd": "always",
                "cap_add": ["NET_ADMIN", "SYS_NICE"],  # SYS_NICE: slurmstepd pins users' tasks
                "labels": {key: value, "provision.node": node, "provision.burst": self.pool.name},
                "netns": {"nsmode": "bridge"},
                "Networks": {self.lab.network: {"static_ips": [self.pool.nodes[node]]}},
                # the image's /etc/hosts is the cluster's (rendered); podman writes none
                "use_image_hosts": True,
            }
        )
        try:
            # the key never lives in the image: it goes from the head into the new container
            self.api.put_file(name, "/etc/munge", "munge.key", self.munge_key.read_bytes(), 0o400)
            self.api.start(name)
        except (OSError, PodmanError):
            self.api.remove(name)  # nothing half-made stays
            raise

    def suspend(self, node: str) -> bool:
        return self.api.remove(self.container(node))

    def states(self) -> dict[str, str]:
        """Node of this pool -> its container's state, for the containers that exist."""
        prefix = self.lab.container_prefix
        found = self.api.containers(self.lab.label)
        return {
            name[len(prefix) :]: state
            for name, state in found.items()
            if name[len(prefix) :] in self.pool.nodes
        }


def backend_for(pool: Pool) -> Backend:
    if pool.backend == "lab":
        return LabBackend(pool)
    if pool.backend == "aws":
        from provision.burst.aws import AwsBackend

        return AwsBackend(pool)
    if pool.backend == "gcp":
        from provision.burst.gcp import GcpBackend

        return GcpBackend(pool)
    if pool.backend == "azure":
        from provision.burst.azure import AzureBackend

        return AzureBackend(pool)
    raise ValueError(f"pool {pool.name}: no burst backend '{pool.backend}' on this head")


def _by_pool(config: BurstConfig, nodes: list[str], log: Log) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for node in nodes:
        pool = config.pool_of(node)
        if pool is None:
            log(f"{node} skip: not a node of an elastic pool of this cluster")
            continue
        grouped.setdefault(pool.name, []).append(node)
    return grouped


def _cooling(pool: Pool, cooldown: int, now: float) -> str | None:
    """Why the pool is out, if a start failed for want of capacity less than the cooldown ago:
    Slurm's own reasons are the record, so every head and every run agrees."""
    try:
        reasons = slurm.parse_reasons(slurm.show_nodes(sorted(pool.nodes)))
    except OSError:
        return None
    for reason, since in reasons.values():
        if reason.startswith(slurm.CAPACITY_REASON) and now - since < cooldown:
            left = int(cooldown - (now - since))
            cause = reason[len(slurm.CAPACITY_REASON) :].strip()
            return f"pool {pool.name} out for {left}s more after: {cause}"
    return None


def resume(config: BurstConfig, nodes: list[str], log: Log, now: float | None = None) -> int:
    now = time.time() if now is None else now
    failed = 0
    for pool_name, names in _by_pool(config, nodes, log).items():
        started = time.monotonic()
        pool = config.pools[pool_name]
        cooling = _cooling(pool, config.cooldown, now) if pool.backend != "lab" else None
        if cooling:
            # not even asked: the job is requeued and lands on the partition's next pool
            for node in names:
                log(f"{node} resume refused ({pool_name}): {cooling}")
            slurm.mark_down(names, f"{slurm.POOL_OUT_REASON}: {cooling}")
            failed += len(names)
            continue
        try:
            backend = backend_for(pool)
            errors = backend.start(names)
            made = {n: a for n, a in backend.addresses.items() if n not in errors}
            if pool.tunnel:
                # the hub takes each node's peer before the node dials; one it cannot take
                # could never register: it goes
                unjoined = hub().add(made)
                if unjoined:
                    backend.stop(sorted(unjoined))
                    errors.update(unjoined)
                made = {n: a for n, a in made.items() if n not in unjoined}
            slurm.set_addresses(made)
        except (BurstError, ValueError, ImportError) as exc:
            errors = {n: one_line(exc) for n in names}
        seconds = time.monotonic() - started
        for node in names:
            if node in errors:
                log(f"{node} resume failed ({pool_name}, {seconds:.1f}s): {errors[node]}")
            else:
                log(f"{node} resume ok ({pool_name}, {seconds:.1f}s)")
        for reason in sorted(set(errors.values())):
            down = [n for n in names if errors.get(n) == reason]
            slurm.mark_down(down, f"burst resume failed: {reason}")
        if any(e.startswith(CAPACITY) for e in errors.values()):
            log(f"{pool_name} out for {config.cooldown}s: no capacity")
        failed += len(errors)
    return 1 if failed else 0


def hub() -> Hub:
    """This head's end of the tunnel (tests replace it)."""
    return Hub()


def suspend(config: BurstConfig, nodes: list[str], log: Log, why: str = "suspend") -> int:
    failed = 0
    for pool_name, names in _by_pool(config, nodes, log).items():
        pool = config.pools[pool_name]
        try:
            gone, errors = backend_for(pool).stop(names)
        except (BurstError, ValueError, ImportError) as exc:
            gone, errors = set(), {n: one_line(exc) for n in names}
        if pool.tunnel:  # their peers go with them (an instance not removed keeps its peer)
            try:
                errors.update(hub().remove([n for n in names if n not in errors]))
            except BurstError as exc:
                errors.update({n: one_line(exc) for n in names if n not in errors})
        for node in names:
            if node in errors:
                log(f"{node} {why} failed ({pool_name}): {errors[node]}")
            else:
                log(f"{node} {why} ok ({pool_name}{'' if node in gone else ', was not there'})")
        failed += len(errors)
    return 1 if failed else 0


def resume_fail(config: BurstConfig, nodes: list[str], log: Log) -> int:
    """Slurm gave up on these nodes (no registration within ResumeTimeout) and set them DOWN:
    remove what was made, and leave the reason."""
    code = suspend(config, nodes, log, why="resume-fail cleanup")
    slurm.mark_down(nodes, "burst: no slurmd registration within ResumeTimeout")
    return code


def reconcile(
    config: BurstConfig, log: Log, now: float | None = None, host: str | None = None
) -> int:
    """Containers and instances Slurm does not have up are removed (orphans); nodes Slurm
    counts on whose container or instance is gone (killed, crashed, reclaimed) are marked DOWN,
    so their jobs are requeued; nodes the programs took out after a failed start, or because
    their pool had no capacity, return to idle~ once the cooldown is over.

    With two heads the timer runs on both, and only the head whose slurmctld is in control
    acts (slurmctld runs resume and suspend there too): the other only keeps its own end of the
    tunnel in step (standby_tunnel). host is this head's name (tests)."""
    now = time.time() if now is None else now
    if len(config.controllers) > 1:
        me = host or socket.gethostname().split(".", 1)[0]
        try:
            charge = slurm.in_control(slurm.ping())
        except (OSError, subprocess.SubprocessError):
            charge = None
        if charge != me:
            return standby_tunnel(config, log)
    code = 0
    for pool in config.pools.values():
        try:
            backend = backend_for(pool)
            states = backend.states()
            for stray in backend.sweep(now):
                log(f"{pool.name} reconcile: {stray} terminated (the pool's, never named)")
        except (BurstError, ValueError, ImportError) as exc:
            log(f"{pool.name} reconcile failed: {one_line(exc)}")
            code = 1
            continue
        try:
            shown = slurm.show_nodes(sorted(pool.nodes))
        except OSError as exc:  # no scontrol yet: Slurm is not installed
            log(f"{pool.name} reconcile skipped: {exc}")
            continue
        present = set(states)
        running = {node for node, state in states.items() if state == "running"}
        flags_of, reasons = slurm.parse_node_states(shown), slurm.parse_reasons(shown)
        cooled = [
            node
            for node, (reason, since) in sorted(reasons.items())
            if "DOWN" in flags_of.get(node, set())
            and reason.startswith(slurm.COOLDOWN_REASONS)
            and now - since >= config.cooldown
        ]
        for node in cooled:
            log(f"{node} reconcile: cooldown of {config.cooldown}s over, powered down to idle~")
        slurm.power_down(cooled)
        orphans = {
            node
            for node, flags in flags_of.items()
            if node in present and slurm.powered_down(flags) and node not in cooled
        }
        vanished = [
            node
            for node, flags in sorted(flags_of.items())
            if node not in orphans
            and node not in cooled
            and node not in running
            and slurm.expected_up(flags)
            and "DOWN" not in flags
        ]
        why = _ended(backend, vanished, log)
        for node in sorted(orphans | set(vanished)):
            if node in orphans:
                log(f"{node} reconcile: orphan removed (Slurm has it powered down)")
                gone, _ = backend.stop([node])
                present -= gone
            else:
                said = why.get(node, "instance or container gone")
                log(f"{node} reconcile: {said} while Slurm has it up")
                slurm.mark_down([node], f"burst: node vanished ({why.get(node, GONE)})")
        if pool.tunnel and not _drop_stale_peers(pool, present, log):
            code = 1
    return code


# a vanished node's reason where the cloud says nothing more
GONE = "container or instance gone"


def standby_tunnel(config: BurstConfig, log: Log) -> int:
    """The head not in control is a hub of the tunnel too (its slurmctld takes over when the
    other's stops): each timer it gives its end the peers of the remote burst nodes Slurm has
    up, at the address resume gave Slurm (NodeAddr), and drops the others. Quiet when nothing
    changes."""
    code = 0
    for pool in config.pools.values():
        if not pool.tunnel:
            continue
        try:
            shown = slurm.show_nodes(sorted(pool.nodes))
        except OSError as exc:  # no scontrol yet: Slurm is not installed
            log(f"{pool.name} standby tunnel skipped: {exc}")
            continue
        flags_of, addresses = slurm.parse_node_states(shown), slurm.parse_addresses(shown)
        wanted = {}
        for node, flags in flags_of.items():
            address = addresses.get(node, node)
            if node in pool.nodes and address != node and not slurm.powered_down(flags):
                wanted[node] = address
        end = hub()
        try:
            up = {n: a for n, a in end.up().items() if n in pool.nodes}
            added = {n: a for n, a in wanted.items() if up.get(n) != a}
            gone = sorted(set(up) - set(wanted))
            errors = {**end.add(added), **end.remove(gone)}
        except BurstError as exc:
            log(f"{pool.name} standby tunnel: {one_line(exc)}")
            code = 1
            continue
        for node in sorted(added):
            log(f"{node} standby tunnel: {errors.get(node, f'peer at {added[node]}')}")
        for node in gone:
            log(f"{node} standby tunnel: {errors.get(node, 'peer removed')}")
        if errors:
            code = 1
    return code


def _ended(backend: Backend, nodes: list[str], log: Log) -> dict[str, str]:
    """Why the cloud ended the nodes' instances, where it says; {} where it cannot be asked."""
    if not nodes:
        return {}
    try:
        return backend.ended(nodes)
    except BurstError as exc:
        log(f"reconcile: why {compress(nodes)} ended is not known: {one_line(exc)}")
        return {}


def _drop_stale_peers(pool: Pool, present: set[str], log: Log) -> bool:
    """The hub's peers of the pool's nodes that have no instance (removed, reclaimed) go."""
    try:
        stale = sorted(set(hub().up()) & set(pool.nodes) - present)
        errors = hub().remove(stale)
    except BurstError as exc:
        log(f"{pool.name} reconcile: {one_line(exc)}")
        return False
    for node in stale:
        log(f"{node} reconcile: {errors.get(node, 'tunnel peer removed (no instance)')}")
    return not errors

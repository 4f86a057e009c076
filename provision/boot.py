"""The nodes of the pools that boot from the network (pools[].boot: network), as apply brings
them up before its preflight.

Each apply with such pools has their image (providers/lab/netboot.py: built once for its
inputs, kept after) for the boot server's role. A node that does not answer SSH is booted: the
boot server (the first head) is converged first, so that it serves; then each silent node is
told through its BMC to boot from the network once and powered on (power cycled if it is on
and silent: a diskless node holds nothing a cycle loses), all of them in spec order, and apply
waits until each answers SSH. A node booted so is a new machine: its host key is forgotten
before it is powered and learned when it answers. One that does not answer in time is
reported with its BMC's power state and its console's last lines where one is kept (the metal
lab's machines keep one each in the state directory), and apply stops before anything else is
changed: a rerun boots only the nodes still silent.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import PurePath

from provision.changes import inventory_document
from provision.cluster import Cluster, compress
from provision.errors import OperationError, UsageError
from provision.power import (
    Action,
    Credentials,
    PowerResult,
    bmc_settings,
    load_credentials,
    power,
)
from provision.render.netboot import booted_nodes
from provision.render.output import read_render
from provision.render.yamldata import Template, yaml_value
from provision.spec.nodes import Node
from provision.sshkeys import forget_host_key, public_key
from provision.state import State
from provision.verify.base import probe_ports

IMAGE_ARG = "provision.image"  # the kernel's command line names the image a node booted
BOOT_TIMEOUT_S = 900.0  # power-on to SSH: a server's firmware alone may take minutes
POLL_S = 5.0
DOWN_TIMEOUT_S = 300.0  # a running node's power cycle: until its SSH stops answering
DOWN_TRIES = 3
CONSOLES = "consoles"  # state/consoles/NODE.log: a machine's console, where one is kept
CONSOLE_LINES = 12
_NOT_TEXT = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|[\x00-\x08\x0b-\x1f\x7f]")

Say = Callable[[str], None]


def images(cluster: Cluster, state: State, say: Say) -> dict[str, str]:
    """The image of each pool that boots from the network, by the pool's name: the lab's base
    image with Debian's kernel and live-boot, the packages the pool's roles install (Ansible
    installs them in a builder container of the pool: image.yml) and root letting in the
    cluster's key. A pool's packages are installed again when the inventory or the roles
    change, its squashfs made again only when the packages do (netboot.build keeps it by them).
    OperationError if a builder's run failed."""
    from provision.providers.lab import image, netboot, podman  # only where a pool boots so
    from provision.providers.lab.burst import INPUTS_LABEL

    pools = [p.name for p in cluster.spec.pools if p.boot == "network"]
    if not pools:
        return {}
    base, _ = image.ensure_image(image.debian_mirror(), log=say)
    layer = netboot.layer(base, log=say)
    name = cluster.spec.name
    inputs = {pool: _inputs(state, layer, pool) for pool in pools}
    stale = [
        p
        for p in pools
        if podman.image_label(netboot.pool_image(name, p), INPUTS_LABEL) != inputs[p]
    ]
    if stale:
        _install_packages(cluster, state, layer, {p: inputs[p] for p in stale}, say)
    keys = _root_keys(cluster, state)
    made = {}
    for pool in pools:
        started = time.monotonic()
        built = netboot.build(netboot.pool_image(name, pool), keys, log=say)
        spent = time.monotonic() - started
        if spent > 5:
            say(f"netboot: pool {pool}: image {built.tag} made in {spent:.0f} s")
        made[pool] = str(built.directory.resolve())
    return made


IMAGE_INVENTORY = "netboot-image-hosts.yml"


def _root_keys(cluster: Cluster, state: State) -> str:
    """The keys root lets in on a pool's image (what its squashfs is kept by, with its
    packages): the cluster's public key."""
    return public_key(cluster.spec, state) + "\n"


def _inputs(state: State, layer: str, pool: str) -> str:
    """What a pool's packages follow from: the layer, the rendered inventory (its groups and
    variables) and the collection (the roles and image.yml)."""
    from provision import assets

    h = hashlib.sha256(f"{layer}\n{pool}\n".encode())
    for rel, content in sorted(read_render(state.build).items()):
        if rel.startswith("inventory/"):
            h.update(f"{rel}\n{content}\n".encode())
    assets.hash_collection(h)
    return h.hexdigest()[:16]


def _install_packages(
    cluster: Cluster, state: State, layer: str, stale: dict[str, str], say: Say
) -> None:
    """A builder container per pool (named `image-POOL` in Ansible's run, in the groups of the
    pool's first node, with its variables), image.yml run on them all at once, each committed as
    its pool's image; the builders removed whatever happened."""
    from provision.providers.lab import netboot
    from provision.run.ansible import run_playbook

    name = cluster.spec.name
    groups = inventory_document((state.build / "inventory" / "hosts.yml").read_text())
    children = (groups.get("all") or {}).get("children") or {}
    hosts: dict[str, dict[str, object]] = {}
    members: dict[str, dict[str, None]] = {}
    views = {v.name: v for v in cluster.pools}
    for pool in stale:
        host, container = f"image-{pool}", netboot.builder_name(name, pool)
        first = views[pool].nodes[0].name
        own: dict[str, object] = {}  # its variables (its fabric addresses), not its connection's
        for group, body in children.items():
            listed = (body or {}).get("hosts") or {}
            if first in listed:
                members.setdefault(group, {})[host] = None
                own.update(
                    (k, v) for k, v in (listed[first] or {}).items() if not k.startswith("ansible_")
                )
        # how Ansible reaches the builder (ours, plain), then the node's variables (data)
        hosts[host] = {
            "ansible_connection": Template("containers.podman.podman"),
            "ansible_host": Template(container),
            **own,
        }
    path = state.build / "inventory" / IMAGE_INVENTORY
    ok = False
    try:
        for pool in stale:
            netboot.start_builder(layer, netboot.builder_name(name, pool), name)
        # each value as the renderer writes it: a string `!unsafe`, never a template
        lines = ["all:", "  hosts:"]
        for host, values in hosts.items():
            lines += [f"    {host}:", *(f"      {k}: {yaml_value(v)}" for k, v in values.items())]
        lines.append("  children:")
        for group, names in members.items():
            lines += [f"    {group}:", "      hosts:", *(f"        {h}:" for h in names)]
        path.write_text("\n".join(lines) + "\n")
        say(f"netboot: installing the packages of {compress(list(stale))}'s image (image.yml)")
        started = time.monotonic()
        result = run_playbook(
            "image.yml", state, None, limit=",".join(hosts), extra_inventory=[path]
        )
        if result.rc != 0:
            why = next((result.hosts[h].failure for h in result.failed_hosts), "")
            raise OperationError(
                f"the packages of {compress(list(stale))}'s image failed"
                f"{f' ({why})' if why else ''} (log: {result.log_dir})"
            )
        say(f"netboot: packages installed in {time.monotonic() - started:.0f} s")
        ok = True
    finally:
        for pool, inputs in stale.items():
            netboot.finish_builder(
                netboot.builder_name(name, pool), netboot.pool_image(name, pool), inputs, layer, ok
            )
        path.unlink(missing_ok=True)


def remove_images(cluster: Cluster, state: State) -> list[str]:
    """The pools' images that boot from the network, removed (destroy): podman's, with their
    packages, and the squashfs made of each for the cluster's key (no other cluster's key lets
    in the same root: none would take it)."""
    from provision.providers.lab import netboot, podman

    names = [netboot.pool_image(cluster.spec.name, p.name) for p in cluster.spec.pools]
    try:
        there = [n for n in names if podman.image_exists(n)]
    except OperationError:  # no podman here: no image of ours either
        return []
    own = cluster.spec.ssh.private_key_file is not None or (state.keys / "id_ed25519").exists()
    try:  # never a key made here only to be removed with the state
        keys = _root_keys(cluster, state) if own else None
    except UsageError:  # the spec's key is gone: its squashfs cannot be told apart
        keys = None
    removed = []
    for name in there:
        kept = netboot.kept_at(name, keys) if keys is not None else None
        if kept is not None and kept.is_dir():
            shutil.rmtree(kept, ignore_errors=True)
            removed.append(str(kept))
        podman.podman("rmi", "-f", name, check=False)
        removed.append(name)
    return removed


def silent(cluster: Cluster, hosts: list[str]) -> list[Node]:
    """The nodes of `hosts` that boot from the network and whose SSH port does not answer."""
    port = cluster.spec.ssh.port
    nodes = [n for n in booted_nodes(cluster) if n.name in hosts]
    states = probe_ports([(n, port) for n in nodes])
    return [n for n in nodes if states[(n, port)] != "open"]


def wait_down(
    argv: Callable[[str], list[str]], nodes: list[Node], timeout: float = DOWN_TIMEOUT_S
) -> list[Node]:
    """Wait until none of `nodes` answers SSH as itself any more, by the host key known for
    it, DOWN_TRIES times in a row, a second apart (a power cycle a BMC applies late: the machine
    before it must not be taken for the one after, nor its key learned again, for one
    connection that failed by chance); those still answering after `timeout`."""

    def answers(node: Node) -> bool:
        line = argv(node.name)
        line[1:1] = ["-oStrictHostKeyChecking=yes"]  # ssh keeps an option's first value
        try:
            done = subprocess.run(line, capture_output=True, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    deadline = time.monotonic() + timeout
    silent = dict.fromkeys((n.name for n in nodes), 0)  # failed tries in a row
    while True:
        for node in nodes:
            if silent[node.name] < DOWN_TRIES:
                silent[node.name] = 0 if answers(node) else silent[node.name] + 1
        up = [n for n in nodes if silent[n.name] < DOWN_TRIES]
        if not up or time.monotonic() >= deadline:
            return up
        time.sleep(1)


def image_id(directory: str) -> str:
    """A pool's image's id, as the netboot role names it on the kernel's command line: the name
    of its directory (the hash its squashfs is kept by)."""
    return PurePath(directory).name


def booted_image(cmdline: str) -> str:
    """The image a node's kernel command line names ("" where it names none: booted by an
    older boot server, or not from the network)."""
    found = re.search(rf"(?:^|\s){re.escape(IMAGE_ARG)}=(\S+)", cmdline)
    return found[1] if found else ""


def older(
    cluster: Cluster,
    hosts: list[str],
    images: dict[str, str],
    command: Callable[[str, list[str]], list[str]],
) -> dict[str, str]:
    """The nodes of `hosts` that boot from the network and run another image than the one their
    pool's is now (`images`: apply's, by pool), read from each one's kernel command line over
    SSH (`command(name, argv)`: the ssh command line); by name, the image each runs ("" where
    its command line names none). A node that does not answer is left out (preflight names
    it)."""
    nodes = [n for n in booted_nodes(cluster) if n.name in hosts and n.pool in images]
    if not nodes:
        return {}

    def ask(node: Node) -> str | None:
        try:
            done = subprocess.run(
                command(node.name, ["cat", "/proc/cmdline"]),
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None
        return booted_image(done.stdout) if done.returncode == 0 else None

    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        running = dict(zip(nodes, pool.map(ask, nodes), strict=True))
    return {
        n.name: found
        for n, found in running.items()
        if found is not None and found != image_id(images[n.pool])
    }


def power_on(
    cluster: Cluster,
    state: State,
    nodes: list[Node],
    creds: Credentials,
    say: Say,
    forget: bool = True,
) -> list[PowerResult]:
    """Each node's next boot from the network, then its power on (a cycle where it is on); the
    results of the nodes whose BMC refused or did not answer. `forget`: each node's host key
    forgotten first (not for a node still running: the caller forgets it once it is down)."""
    settings = bmc_settings(cluster.spec, state)
    assert settings is not None  # the spec's checks: a pool that boots so has BMCs
    for node in nodes if forget else []:  # a new machine at that address: new host keys
        forget_host_key(state, str(node.login_address))
    told = power(nodes, "pxe", settings, creds)
    failed = [r for r in told if not r.ok]
    ready = {r.node for r in told if r.ok}
    on = [n for n, r in zip(nodes, told, strict=True) if r.ok and r.state.startswith("on")]
    off = [n for n in nodes if n.name in ready and n not in on]
    steps: tuple[tuple[list[Node], Action], ...] = ((off, "on"), (on, "cycle"))
    for group, action in steps:
        if not group:
            continue
        done = power(group, action, settings, creds)
        failed += [r for r in done if not r.ok]
        for r in done:
            if r.ok:
                say(f"boot: {r.node}: {r.state} (next boot from the network)")
    return failed


def wait_for_ssh(
    argv: Callable[[str], list[str]],
    nodes: list[Node],
    say: Say,
    timeout: float = BOOT_TIMEOUT_S,
) -> list[Node]:
    """Wait until each node answers SSH (`argv(name)`: the ssh command line that runs `true`
    there without asking anything, learning its new host key); the nodes that did not within
    `timeout`."""
    waiting = {n.name: n for n in nodes}
    started = time.monotonic()
    said = started

    def answers(name: str) -> bool:
        try:
            done = subprocess.run(argv(name), capture_output=True, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    with ThreadPoolExecutor(max_workers=min(32, len(nodes) or 1)) as pool:
        while waiting:
            names = list(waiting)
            for name, up in zip(names, pool.map(answers, names), strict=True):
                if up:
                    spent = time.monotonic() - started
                    say(f"boot: {name} answers SSH, {spent:.0f} s after its power-on")
                    del waiting[name]
            now = time.monotonic()
            if not waiting or now - started > timeout:
                break
            if now - said >= 30:
                say(f"boot: waiting for {compress(list(waiting))} ({now - started:.0f} s)")
                said = now
            time.sleep(POLL_S)
    return list(waiting.values())


def console_tail(state: State, node: str, lines: int = CONSOLE_LINES) -> list[str]:
    """The last lines of a node's console where one is kept (state/consoles/NODE.log), as text
    a terminal shows as it is (escape sequences and control characters dropped)."""
    path = state.dir / CONSOLES / f"{node}.log"
    if not path.is_file():
        return []
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - 64 * 1024))
        text = f.read().decode("utf-8", "replace")
    found = [_NOT_TEXT.sub("", line).rstrip() for line in text.splitlines()]
    return [line for line in found if line.strip()][-lines:]


def not_booted(
    state: State,
    failed: list[PowerResult],
    silent_nodes: list[Node],
    stuck: Sequence[Node] = (),
) -> str:
    """Why apply stops: each node that did not come up, its BMC's word or its console's; those
    whose SSH never stopped answering after their BMC took the power cycle."""
    parts = [f"{r.node}: its BMC: {r.state}" for r in failed]
    parts += [
        f"{n.name}: its BMC took the power cycle, but it still answered SSH "
        f"{DOWN_TIMEOUT_S:.0f} s later"
        for n in stuck
    ]
    for node in silent_nodes:
        tail = console_tail(state, node.name)
        where = (
            "its console's last lines:\n    " + "\n    ".join(tail)
            if tail
            else "no console is kept here (a server's serial console is on its BMC)"
        )
        parts.append(f"{node.name}: did not answer SSH after its power-on; {where}")
    return "boot failed: " + "; ".join(parts)


AGAIN = (
    "\nnothing else was changed; fix the cause and run apply again: it boots the nodes still silent"
)


def boot(
    cluster: Cluster,
    state: State,
    nodes: list[Node],
    argv: Callable[[str], list[str]],
    say: Say,
    serve: Callable[[], object],
    timeout: float = BOOT_TIMEOUT_S,
) -> None:
    """Boot `nodes` (silent ones): `serve` converges the boot server, then each node is
    powered on from the network and waited for; OperationError naming those that failed."""
    creds = load_credentials(state)  # the command that saves it, where missing
    say(f"boot: {compress([n.name for n in nodes])} silent: the boot server first")
    serve()
    power_up(cluster, state, nodes, argv, say, timeout, creds)


def power_up(
    cluster: Cluster,
    state: State,
    nodes: list[Node],
    argv: Callable[[str], list[str]],
    say: Say,
    timeout: float = BOOT_TIMEOUT_S,
    creds: Credentials | None = None,
    then: str = AGAIN,
    running: bool = False,
) -> None:
    """Each of `nodes` booted from the network (power cycled where it is on) and waited for,
    the boot server serving already; OperationError naming those that failed (and adding
    `then`). `running`: the nodes answer SSH now (a reboot): each is waited for until it no
    longer answers as itself before its host key is forgotten and the new one learned."""
    creds = creds or load_credentials(state)
    failed = power_on(cluster, state, nodes, creds, say, forget=not running)
    gone = {r.node for r in failed}
    stuck = wait_down(argv, [n for n in nodes if n.name not in gone]) if running else []
    if running:
        for node in nodes:
            if node.name not in gone and node not in stuck:
                forget_host_key(state, str(node.login_address))
    gone |= {n.name for n in stuck}
    waited = [n for n in nodes if n.name not in gone]
    late = wait_for_ssh(argv, waited, say, timeout) if waited else []
    if failed or late or stuck:
        raise OperationError(not_booted(state, failed, late, stuck) + then)

"""apply's boot of the nodes that boot from the network (provision/boot.py), against Redfish's
emulator (sushy-tools, one a BMC): the boot server first, each silent node's next boot from the
network and its power (on, or a cycle where it is on), the wait for SSH; a BMC that refuses,
and a node that never answers, named with its console's last lines, as plain text."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provision import boot
from provision.cluster import Cluster
from provision.errors import OperationError, UsageError
from provision.power import CREDENTIALS, Credentials, save_credentials
from provision.spec.loader import load_spec
from provision.state import State

from .fakebmc import Emulator
from .test_power import OTHER, PASSWORD, USER, _free_port

SPEC = """\
name: metal
os: debian12
network:
  management: {{cidr: 10.92.0.0/24}}
  bmc: {{cidr: 127.0.0.0/24, protocol: redfish, port: {port}, ca_file: {bundle}}}
pools:
  - {{name: head, role: head, profile: cpu-node, hosts: [{{name: head001, address: 10.92.0.11}}]}}
  - name: cpu
    role: compute
    profile: cpu-node
    boot: network
    hosts:
      - {{name: cpu001, address: 10.92.0.21, bmc_address: 127.0.0.21, mac: "52:54:00:ab:00:21"}}
      - {{name: cpu002, address: 10.92.0.22, bmc_address: 127.0.0.22, mac: "52:54:00:ab:00:22"}}
security:
  admin_cidrs: [10.9.0.0/24]
"""


@pytest.fixture
def metal(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Cluster, State, list[Emulator]]]:
    """cpu001's BMC powered off (its account's password the test's parameter, else the one
    saved), cpu002's on (a silent node that is on); the account saved."""
    port = _free_port()
    bmcs = [
        Emulator("127.0.0.21", port, USER, getattr(request, "param", PASSWORD), tmp_path),
        Emulator("127.0.0.22", port, USER, PASSWORD, tmp_path, power="On"),
    ]
    bundle = tmp_path / "bmc-ca.pem"
    bundle.write_text("".join(b.cert.read_text() for b in bmcs))
    (tmp_path / "metal.yaml").write_text(SPEC.format(port=port, bundle=bundle))
    cluster = Cluster(load_spec(tmp_path / "metal.yaml", unbuilt=True))
    state = State(tmp_path / "state", "metal")
    save_credentials(state, Credentials(USER, PASSWORD))
    with contextlib.ExitStack() as running:
        for b in bmcs:
            running.enter_context(b)
        yield cluster, state, bmcs


def _nodes(cluster: Cluster) -> list:  # type: ignore[type-arg]
    return [n for n in cluster.nodes if n.pool == "cpu"]


def test_the_server_first_then_each_node_from_the_network_and_waited_for(
    metal: tuple[Cluster, State, list[Emulator]], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, state, bmcs = metal
    monkeypatch.setattr(boot, "POLL_S", 0.5)
    state.ensure()
    state.known_hosts.write_text(
        "10.92.0.21 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOld0ne\n"
        "10.92.0.11 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHeadKey\n"
    )
    said: list[str] = []
    order: list[str] = []

    def serve() -> None:  # the boot server's converge: before any BMC is told anything
        order.append("serve")
        assert all(b.get()["Boot"]["BootSourceOverrideTarget"] != "Pxe" for b in bmcs)
        assert bmcs[0].get()["PowerState"] == "Off"

    def answers(name: str) -> list[str]:  # "ssh": answers once its BMC has it on
        bmc = bmcs[0] if name == "cpu001" else bmcs[1]
        up = bmc.get()["PowerState"] == "On" and bmc.resets() > 0
        return ["true"] if up else ["false"]

    boot.boot(cluster, state, _nodes(cluster), answers, said.append, serve, timeout=60)
    assert order == ["serve"]
    for bmc in bmcs:
        assert bmc.get()["Boot"]["BootSourceOverrideTarget"] == "Pxe"
        assert bmc.resets() == 1
    assert "boot: cpu001: powered on (next boot from the network)" in said
    assert "boot: cpu002: power cycled (next boot from the network)" in said
    assert {line.split(" answers")[0] for line in said if "answers SSH" in line} == {
        "boot: cpu001",
        "boot: cpu002",
    }
    # the booted node's old host key is forgotten (a new machine), the head's kept
    assert state.known_hosts.read_text().split()[0] == "10.92.0.11"


@pytest.mark.parametrize("metal", [OTHER], indirect=True)
def test_a_refusing_bmc_stops_apply_at_its_node_once_the_others_are_up(
    metal: tuple[Cluster, State, list[Emulator]], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, state, bmcs = metal
    monkeypatch.setattr(boot, "POLL_S", 0.5)
    waited: list[str] = []

    def answers(name: str) -> list[str]:
        waited.append(name)
        return ["true"]

    with pytest.raises(OperationError) as stopped:
        boot.boot(cluster, state, _nodes(cluster), answers, lambda _m: None, lambda: None)
    text = str(stopped.value)
    assert text.startswith("boot failed: cpu001: its BMC: ")
    assert "credentials" in text.lower() and PASSWORD not in text and OTHER not in text
    assert "cpu002" not in text
    # cpu002 was booted and waited for all the same; cpu001 neither told nor powered
    assert set(waited) == {"cpu002"} and bmcs[1].resets() == 1
    assert bmcs[0].resets() == 0 and bmcs[0].get()["Boot"]["BootSourceOverrideTarget"] != "Pxe"


def test_a_node_that_never_answers_is_named_with_its_console(
    metal: tuple[Cluster, State, list[Emulator]], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, state, _bmcs = metal
    monkeypatch.setattr(boot, "POLL_S", 0.5)
    consoles = state.dir / boot.CONSOLES
    consoles.mkdir(parents=True)
    (consoles / "cpu001.log").write_bytes(
        b"iPXE 1.21\r\n" + b"".join(b"line %d\r\n" % i for i in range(30))
        + b"\x1b[1;31mNo configuration methods succeeded\x1b[0m\x07\r\n"
    )  # fmt: skip
    with pytest.raises(OperationError) as stopped:
        boot.boot(
            cluster, state, _nodes(cluster),
            lambda name: ["true"] if name == "cpu002" else ["false"], lambda _m: None,
            lambda: None, timeout=3,
        )  # fmt: skip
    text = str(stopped.value)
    assert text.startswith("boot failed: cpu001: did not answer SSH after its power-on; its ")
    lines = text.split("its console's last lines:\n")[1].split("\nnothing else")[0].splitlines()
    assert len(lines) == boot.CONSOLE_LINES
    assert lines[-1] == "    No configuration methods succeeded"  # no escape sequence, no bell
    assert "cpu002" not in text
    assert "a rerun" in text or "run apply again" in text


def test_without_their_bmcs_account_nothing_is_asked(
    metal: tuple[Cluster, State, list[Emulator]],
) -> None:
    cluster, state, bmcs = metal
    (state.secrets / CREDENTIALS).unlink()
    served: list[bool] = []
    with pytest.raises(UsageError, match="run `provision bmc-credentials SPEC --user NAME` first"):
        boot.boot(cluster, state, _nodes(cluster), lambda n: ["true"], print,
                  lambda: served.append(True))  # fmt: skip
    assert not served and all(b.resets() == 0 for b in bmcs)


def test_silent_names_the_nodes_whose_ssh_port_does_not_answer(tmp_path: Path) -> None:
    import socket

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        spec = SPEC.format(port=443, bundle="x").replace("10.92.0.", "127.0.0.")
        spec = spec.replace("127.0.0.0/24, protocol", "127.0.1.0/24, protocol")
        spec = spec.replace("bmc_address: 127.0.0.2", "bmc_address: 127.0.1.2")
        spec = spec.replace("security:", f"ssh: {{port: {port}}}\nsecurity:")
        (tmp_path / "metal.yaml").write_text(spec.replace("127.0.0.22", "127.0.0.1"))
        cluster = Cluster(load_spec(tmp_path / "metal.yaml", unbuilt=True))
        assert ipaddress.IPv4Address("127.0.0.1") in {n.address for n in cluster.nodes}
        # cpu002 (127.0.0.1) answers on the port, cpu001 (127.0.0.21) does not
        assert [n.name for n in boot.silent(cluster, ["cpu001", "cpu002", "head001"])] == ["cpu001"]
        assert boot.silent(cluster, ["head001"]) == []


SPEC_DATA = "{{ lookup('pipe', 'id') }}/24"


def test_a_pools_image_gets_its_packages_from_a_builder_in_the_groups_of_its_first_node(
    metal: tuple[Cluster, State, list[Emulator]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """images(): a builder per pool whose image was made from other inputs, in the rendered
    groups of the pool's first node, image.yml run on it alone; the image kept while nothing it
    follows from changes; a failed run named, its builder removed unkept."""
    from provision.providers.lab import image, netboot, podman
    from provision.render import render
    from provision.render.output import write_render
    from provision.run import ansible

    cluster, state, _ = metal
    write_render(render(cluster), state.build)
    # a host variable of the pool's first node, which the builder takes, as spec data (unsafe)
    hosts = state.build / "inventory" / "hosts.yml"
    text = hosts.read_text()
    at = text.index("        cpu001:\n", text.index("    pool_cpu:"))
    text = (
        text[:at]
        + f"        cpu001:\n          provision_fabric_addresses: [!unsafe {SPEC_DATA!r}]\n"
        + (text[at + len("        cpu001:\n") :])
    )
    hosts.write_text(text)
    labels: dict[str, str] = {}
    events: list[tuple[object, ...]] = []
    runs: list[tuple[str, str | None, dict[str, Any]]] = []
    rc = [0]
    monkeypatch.setattr(image, "ensure_image", lambda mirror, log: ("base", 0.0))
    monkeypatch.setattr(image, "debian_mirror", lambda: "mirror")
    monkeypatch.setattr(netboot, "layer", lambda base, log: "layer")
    monkeypatch.setattr(podman, "image_label", lambda name, key: labels.get(name))
    monkeypatch.setattr(boot, "public_key", lambda spec, state: "ssh-ed25519 AAAA")
    monkeypatch.setattr(
        netboot, "start_builder", lambda layer, name, cluster: events.append(("start", name))
    )

    def finish(name: str, made: str, inputs: str, layer: str, ok: bool) -> None:
        events.append(("finish", name, ok))
        if ok:
            labels[made] = inputs

    def play(playbook: str, state: State, key: None, **kw: Any) -> ansible.RunResult:
        (path,) = kw["extra_inventory"]
        listed = subprocess.run(  # as Ansible reads the two
            [str(Path(sys.executable).parent / "ansible-inventory"), "--list", "-i", str(hosts),
             "-i", str(path)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        runs.append((playbook, kw["limit"], json.loads(listed.stdout)))
        failed = {"image-cpu": ansible.HostResult(failed=1, failure="apt-get install failed")}
        return ansible.RunResult(
            rc[0], "failed" if rc[0] else "successful", failed if rc[0] else {}
        )

    monkeypatch.setattr(netboot, "finish_builder", finish)
    monkeypatch.setattr(ansible, "run_playbook", play)
    monkeypatch.setattr(
        netboot, "build", lambda made, keys, log: netboot.BootImage(tmp_path / made[-3:], "t")
    )
    said: list[str] = []
    assert boot.images(cluster, state, said.append) == {"cpu": str((tmp_path / "cpu").resolve())}
    builder = netboot.builder_name("metal", "cpu")
    assert events == [("start", builder), ("finish", builder, True)]
    ((playbook, limit, doc),) = runs
    assert (playbook, limit) == ("image.yml", "image-cpu")
    own = doc["_meta"]["hostvars"]["image-cpu"]
    assert (own["ansible_connection"], own["ansible_host"]) == ("containers.podman.podman", builder)
    # cpu001's groups in the render (its role's, its pool's and its provider's) and its own
    # variables, still data Ansible never templates; not its address
    assert [g for g in doc if "image-cpu" in (doc[g].get("hosts") or [])] == [
        "compute", "pool_cpu", "provider_static"
    ]  # fmt: skip
    assert own["provision_fabric_addresses"] == [{"__ansible_unsafe": SPEC_DATA}]
    assert doc["_meta"]["hostvars"]["cpu001"]["ansible_host"] != builder
    assert not (state.build / "inventory" / boot.IMAGE_INVENTORY).exists()
    # nothing it follows from changed: no builder
    boot.images(cluster, state, said.append)
    assert len(runs) == 1
    # the inventory changes: the packages again; this time the run fails
    hosts.write_text(hosts.read_text() + "# another\n")
    rc[0] = 2
    with pytest.raises(OperationError, match=r"cpu's image failed \(apt-get install failed\)"):
        boot.images(cluster, state, said.append)
    assert events[-2:] == [("start", builder), ("finish", builder, False)]
    assert not (state.build / "inventory" / boot.IMAGE_INVENTORY).exists()


def test_destroy_removes_the_pools_images_and_their_squashfs_for_the_clusters_key(
    metal: tuple[Cluster, State, list[Emulator]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """remove_images(): each pool image podman has, and the squashfs kept for it and the
    cluster's key (where build put it); another key's squashfs of the same packages stays."""
    from provision.providers.lab import netboot, podman
    from provision.sshkeys import ensure_ssh_key, public_key

    cluster, state, _ = metal
    ensure_ssh_key(state)
    cache = tmp_path / "cache"
    monkeypatch.setattr(netboot, "cache_dir", lambda: cache)
    image = netboot.pool_image("metal", "cpu")
    monkeypatch.setattr(podman, "image_exists", lambda name: name == image)
    monkeypatch.setattr(podman, "image_label", lambda name, key: "packages-hash")
    removed_images: list[str] = []
    monkeypatch.setattr(podman, "podman", lambda *args, check=True: removed_images.append(args[-1]))
    ours = netboot.kept_at(image, public_key(cluster.spec, state) + "\n")
    theirs = netboot.kept_at(image, "ssh-ed25519 BBBB other\n")
    for kept in (ours, theirs):
        kept.mkdir(parents=True)
        (kept / "root.squashfs").write_bytes(b"hsqs")
    assert ours.parent == cache and ours != theirs
    assert boot.remove_images(cluster, state) == [str(ours), image]
    assert removed_images == [image]
    assert not ours.exists() and (theirs / "root.squashfs").is_file()


def test_a_node_on_another_image_than_its_pools_is_named_with_the_one_it_runs(
    metal: tuple[Cluster, State, list[Emulator]],
) -> None:
    """Each node's kernel command line names the image it booted (the netboot role's iPXE
    script): those that name another than their pool's image now, or none, are the older ones;
    one that does not answer is left to preflight."""
    cluster, _state, _bmcs = metal
    lines = {
        "cpu001": "BOOT_IMAGE=vmlinuz boot=live provision.image=0c0c0c0c0c0c0c0c quiet",
        "cpu002": "boot=live fetch=http://10.92.0.11:8069/cpu/root.squashfs quiet",
        "head001": "BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1",
    }
    asked: list[str] = []

    def command(name: str, argv: list[str]) -> list[str]:
        asked.append(name)
        assert argv == ["cat", "/proc/cmdline"]
        return ["echo", lines[name]]

    images = {"cpu": "/cache/9a9a9a9a9a9a9a9a"}
    every = ["head001", "cpu001", "cpu002"]
    assert boot.older(cluster, every, images, command) == {
        "cpu001": "0c0c0c0c0c0c0c0c",
        "cpu002": "",
    }
    assert sorted(asked) == ["cpu001", "cpu002"]  # the head boots from its disk: not asked
    lines["cpu001"] = lines["cpu001"].replace("0c0c0c0c0c0c0c0c", "9a9a9a9a9a9a9a9a")
    assert boot.older(cluster, every, images, command) == {"cpu002": ""}
    # a node left out of the run, or one that does not answer: not named
    assert boot.older(cluster, ["cpu001"], images, command) == {}
    assert boot.older(cluster, every, images, lambda n, a: ["false"]) == {}
    assert boot.booted_image("provision.image=abc") == "abc"
    assert boot.booted_image("xprovision.image=abc") == ""


def test_a_running_node_is_cycled_and_taken_back_only_once_it_went_down(
    metal: tuple[Cluster, State, list[Emulator]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A reboot into a new image (a rolling apply's): cpu002 is on and answers as itself. Its
    BMC takes the cycle 1-11 s late, so the machine that answers just after the cycle is the
    old one: power_up waits until it no longer answers by its known host key, and only then
    forgets that key and waits for the new machine."""
    import threading

    cluster, state, bmcs = metal
    monkeypatch.setattr(boot, "POLL_S", 0.5)
    state.ensure()
    state.known_hosts.write_text("10.92.0.22 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOld0ne\n")
    machine = tmp_path / "cpu002.machine"  # old (answering as itself), down, new
    machine.write_text("old")
    calls = tmp_path / "calls"
    ssh = tmp_path / "ssh"
    flaky = tmp_path / "flaky"  # the first connection fails by chance, the machine still up
    flaky.touch()
    ssh.write_text(
        "#!/bin/sh\n"
        f'now=$(cat {machine}); strict=no; for a; do [ "$a" = -oStrictHostKeyChecking=yes ] '
        "&& strict=yes; done\n"
        f'[ -e {flaky} ] && rm {flaky} && echo "$strict flaky" >> {calls} && exit 255\n'
        f'echo "$strict $now $(cat {state.known_hosts} 2>/dev/null | wc -l)" >> {calls}\n'
        '[ "$strict" = yes ] && exec test "$now" = old\n'
        'exec test "$now" = new\n'
    )  # fmt: skip
    ssh.chmod(0o755)
    done = threading.Event()

    def machine_follows_its_bmc() -> None:  # QEMU as the lab's daemon runs it, 4 s late
        cycled = 0.0
        while not done.is_set():
            if bmcs[1].resets() > 0:
                cycled = cycled or time.monotonic()
                on = bmcs[1].get()["PowerState"] == "On"
                if time.monotonic() - cycled > 4:
                    machine.write_text("new" if on else "down")
            done.wait(0.2)

    follower = threading.Thread(target=machine_follows_its_bmc)
    follower.start()
    said: list[str] = []
    try:
        cpu002 = [n for n in _nodes(cluster) if n.name == "cpu002"]
        boot.power_up(cluster, state, cpu002, lambda n: [str(ssh)], said.append, 60, running=True)
    finally:
        done.set()
        follower.join()
    seen = [line.split() for line in calls.read_text().splitlines()]
    assert seen[0] == ["yes", "flaky"], seen
    seen = seen[1:]
    # asked strictly while it was the old machine (its key still known: a connection that
    # failed once is not taken for the machine gone), then not
    strict = [s for s in seen if s[0] == "yes"]
    assert strict and strict[0][1:] == ["old", "1"] and strict[-1][1] != "old", seen
    assert [s[1] for s in strict[-3:]] != ["old"] * 3
    learning = [s for s in seen if s[0] == "no"]
    assert learning and all(s[2] == "0" for s in learning), seen  # the old key gone by then
    assert seen.index(strict[-1]) < seen.index(learning[0])
    assert learning[-1][1] == "new" and bmcs[1].resets() == 1
    assert "boot: cpu002: power cycled (next boot from the network)" in said

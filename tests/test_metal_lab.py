"""The metal lab's BMCs (providers/lab/metal.py), for real without its machines: apply's daemon
runs one sushy-tools emulator a machine behind the lab's own certificate and the cluster's BMC
credentials, and `provision power` reaches them as it reaches a rack's BMCs. The machines
themselves (QEMU booted from the network) run in tests/integration/test_metal.py."""

from __future__ import annotations

import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.power import CREDENTIALS, bmc_settings, load_credentials
from provision.providers.lab import metal
from provision.spec import load_spec
from provision.state import State

from .conftest import ROOT, run_provision
from .test_power import _free_port

EXAMPLE = ROOT / "examples" / "metal-lab.yaml"


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[Path, State, metal.MetalLab, list[str]]]:
    port = _free_port()
    spec = tmp_path / "metal.yaml"
    spec.write_text(
        EXAMPLE.read_text()
        .replace("name: metal", "name: metalbmc")
        .replace("127.0.78.", "127.0.79.")
        .replace("10.78.0.", "10.79.0.")
        .replace("port: 8443", f"port: {port}")
    )
    state = State(tmp_path / "state", "metalbmc")
    said: list[str] = []
    lab = metal.MetalLab(state, "provision-metalbmc", port, said.append)
    try:
        yield spec, state, lab, said
    finally:
        lab.stop()


def _listening(address: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex((address, port)) == 0


def test_the_daemon_serves_a_bmc_a_machine_that_provision_power_reaches(
    lab: tuple[Path, State, metal.MetalLab, list[str]],
) -> None:
    spec, state, bmcs, said = lab
    loaded = load_spec(spec)
    machines = metal.machines(loaded)
    assert [(m.name, m.address, m.mac, m.bmc, m.memory_mib) for m in machines] == [
        ("cpu001", "10.79.0.21", "52:54:00:4f:00:15", "127.0.79.21", 2048),
        ("cpu002", "10.79.0.22", "52:54:00:4f:00:16", "127.0.79.22", 2048),
    ]
    with pytest.raises(Exception, match="has no BMCs yet: `provision apply` makes them"):
        bmc_settings(loaded, state)
    bmcs.ensure(machines)
    pid = bmcs.pid()
    assert pid is not None
    # the credentials made for the cluster, and the certificate's key: nobody else reads them
    for secret in (state.secrets / CREDENTIALS, metal.directory(state.dir) / metal.KEY):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    assert load_credentials(state).user == metal.BMC_USER
    assert any("BMCs answer (cpu001 at 127.0.79.21" in line for line in said), said
    # provision power, as a user runs it, over Redfish with the lab's certificate trusted
    status = run_provision(
        "power", "status", "cpu", "-f", str(spec), "--state-dir", str(state.root)
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert "cpu001 (127.0.79.21): off" in status.stdout
    assert "cpu002 (127.0.79.22): off" in status.stdout
    # the same machines: the same daemon; fewer: a new one, said, and the gone BMC silent
    bmcs.ensure(machines)
    assert bmcs.pid() == pid
    bmcs.ensure(machines[:1])
    assert bmcs.pid() not in (None, pid)
    assert any("machines changed" in line for line in said), said
    port = load_spec(spec).network.bmc.port  # type: ignore[union-attr]
    assert port is not None and not _listening("127.0.79.22", port)
    assert _listening("127.0.79.21", port)
    # a machine powered on, then the daemon restarted: its machine is off, and so its BMC says
    # (here the machine cannot start: the lab's network does not exist; the daemon says so)
    on = run_provision("power", "on", "cpu001", "-f", str(spec), "--state-dir", str(state.root))
    assert on.returncode == 0, on.stdout + on.stderr
    deadline = time.monotonic() + 30  # the emulator applies a change 1-11 s late
    while "cpu001 (127.0.79.21): on" not in _status(spec, state):
        assert time.monotonic() < deadline
        time.sleep(1)
    log = (metal.directory(state.dir) / metal.LOG).read_text()
    assert "power: OperationError: podman network inspect" in log, log
    bmcs.ensure(machines)
    assert "cpu001 (127.0.79.21): off" in _status(spec, state)
    # stopped: its BMCs silent; the rules of another lab's machine at the same address stay
    metal._route("provision-other", "10.79.0.21", "10.79.0.0/24", on=True)
    try:
        bmcs.stop()
        assert bmcs.pid() is None and not _listening("127.0.79.21", port)
        rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
        assert rules.count(f"{metal.RULE_MARK} provision-other 10.79.0.21") == 3, rules
    finally:
        metal._route("provision-other", "10.79.0.21", "", on=False)


def _status(spec: Path, state: State) -> str:
    done = run_provision(
        "power", "status", "cpu001", "-f", str(spec), "--state-dir", str(state.root)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_wrong_password_is_refused_by_the_lab_bmc(
    lab: tuple[Path, State, metal.MetalLab, list[str]],
) -> None:
    spec, state, bmcs, _ = lab
    bmcs.ensure(metal.machines(load_spec(spec)))
    changed = run_provision(
        "bmc-credentials", str(spec), "--user", metal.BMC_USER, "--password-stdin",
        "--state-dir", str(state.root), stdin="not-the-password\n",
    )  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    status = run_provision(
        "power", "status", "cpu001", "-f", str(spec), "--state-dir", str(state.root)
    )
    assert status.returncode == 1
    assert "FAIL cpu001 (127.0.79.21)" in status.stdout, status.stdout
    # apply's next ensure gives the BMCs the cluster's password again
    _, _, _, said = lab
    bmcs.ensure(metal.machines(load_spec(spec)))
    assert any("BMC password changed" in line for line in said), said
    again = run_provision(
        "power", "status", "cpu001", "-f", str(spec), "--state-dir", str(state.root)
    )
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_soft_roce_machine_gets_a_card_on_its_labs_fabric_alone() -> None:
    """A metal lab pool whose profile has soft RoCE (lab-vm-roce): each machine has a second
    card, eth1 to its kernel, at the rail's rate, on a multicast segment of its lab's own (two
    labs' fabrics never meet), its MAC from its address as the first card's is."""
    spec = load_spec(EXAMPLE)
    machines = metal.machines(spec)
    assert [m.fabric for m in machines] == [(10,), (10,)]
    command = metal.qemu_command("cpu001", machines[0].mac, "tap0", 2048, [], fabric=[
        (metal.fabric_mac(machines[0].address, 0), metal.fabric_segment("provision-metal", 0), 10)
    ])  # fmt: skip
    cards = [command[i + 1] for i, arg in enumerate(command) if arg == "-device"]
    assert cards == [
        "virtio-net-pci,netdev=n0,mac=52:54:00:4e:00:15",
        "virtio-net-pci,netdev=f0,mac=52:54:01:4e:00:15,speed=10000,duplex=full",
    ]
    segment = metal.fabric_segment("provision-metal", 0)
    assert f"socket,id=f0,mcast={segment},localaddr=127.0.0.1" in command
    assert segment.startswith("239.255.0.1:")
    assert metal.fabric_segment("provision-metalbmc", 0) != segment
    assert metal.fabric_segment("provision-metal", 1).startswith("239.255.1.1:")

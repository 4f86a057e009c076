"""The metal lab: the nodes of a lab pool that boots from the network (`provider: lab`,
`boot: network`) are QEMU machines without a disk on the lab's network, each with a Redfish
BMC of its own, as a rack of servers new from the factory is to `provision apply`.

apply makes the BMCs, not the machines: one daemon of this machine's (`serve`, started by
apply, outliving it, stopped by destroy)
runs one sushy-tools emulator a machine (its fake system, HTTPS with the lab's certificate,
Basic authentication with the cluster's BMC credentials) on the BMC's loopback address, and a
small power service the emulators notify at each change of power: a pending On starts the
machine (QEMU in software, booting from the network: it has no disk), Off stops it, a restart
restarts it. Everything after that is the path real servers take: apply's boot phase tells
each BMC to boot its machine from the network and powers it on (provision/boot.py).

A machine whose profile has soft RoCE (lab-vm-roce) gets a second card per rail on the lab's
fabric: QEMU's socket network on a multicast group of this machine's loopback, which the lab's
machines alone join (no bridge, no address of this machine's), at the rail's rate.

A machine's console (its serial port) is written to the state's consoles directory, where
apply reads its last lines when the machine does not come up. podman's network plugin
masquerades and forwards its containers' addresses alone (a rule per container), so a machine
gets the same rules while it runs: it reaches the Debian mirror through this machine as the
containers do.

Measured here (2 cores, QEMU in software): the daemon and two emulators answer in 2-3 s.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import ipaddress
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

from provision.errors import OperationError
from provision.providers.lab import podman
from provision.secrets import (
    CREDENTIALS,
    Credentials,
    load_credentials,
    save_credentials,
    write_private,
)
from provision.spec.models import Spec
from provision.spec.nodes import lab_mac, metal_lab_pools
from provision.state import State

DIRECTORY = "metal"  # state/metal: the machines, the BMCs' certificate and key, the daemon
CONSOLES = "consoles"  # state/consoles/NODE.log, as provision/boot.py reads them
CONFIG, PIDFILE, READY, LOG = "machines.json", "daemon.pid", "ready", "daemon.log"
CERT, KEY, HTPASSWD = "bmc.crt", "bmc.key", "htpasswd"
BMC_USER = "provision"  # the BMCs' account where the cluster has none yet
START_TIMEOUT_S = 60.0
QEMU = "qemu-system-x86_64"
# the daemon's command (the package imports this module: `-m` would run it twice)
DAEMON = (
    "import sys, pathlib; from provision.providers.lab.metal import serve; "
    "serve(pathlib.Path(sys.argv[1]))"
)
FABRIC_PORTS = 30000  # the lab fabric's UDP ports: from here, by the lab's network
RULE_MARK = "provision metal lab"  # the iptables rules' comment, then the network and address


@dataclass(frozen=True)
class Machine:
    name: str
    address: str
    mac: str
    bmc: str  # its BMC's (loopback) address
    memory_mib: int
    fabric: tuple[int, ...] = ()  # its soft RoCE cards' rates in Gb/s, one per rail (eth1, ...)


def directory(state_dir: Path) -> Path:
    return state_dir / DIRECTORY


def ca_file(state_dir: Path) -> Path:
    """The certificate the lab's BMCs answer with, which power control trusts for them."""
    return directory(state_dir) / CERT


def machines(spec: Spec) -> list[Machine]:
    """The metal lab's machines, in spec order: their memory their profile's, and a card on
    the lab's fabric for each of its soft RoCE rails."""
    from provision.spec.fabric import rails
    from provision.spec.nodes import expand_nodes
    from provision.spec.profiles import load_profiles

    pools = {p.name: p for p in spec.pools if p.name in metal_lab_pools(spec)}
    profiles = load_profiles(spec.profiles)
    kind = spec.network.fabric.kind
    return [
        Machine(
            n.name,
            str(n.address),
            lab_mac(n.address),
            str(n.bmc_address),
            int(profiles[pools[n.pool].profile].memory_gib * 1024),
            tuple(r.rate_gbps for r in rails(profiles[pools[n.pool].profile], kind) if r.soft),
        )
        for n in expand_nodes(spec)
        if n.pool in pools and n.address is not None and n.bmc_address is not None
    ]


def fabric_segment(network: str, rail: int) -> str:
    """The lab fabric's segment of one rail: a multicast group on this machine's loopback that
    QEMU's socket cards join, so that the machines' fabric cards hear each other and nothing
    else (no bridge, no address of this machine's); its port from the lab's network."""
    return f"239.255.{rail}.1:{FABRIC_PORTS + zlib.crc32(network.encode()) % 20000}"


def fabric_mac(address: str, rail: int) -> str:
    """A machine's card on a rail: the management card's MAC with the rail in its third byte."""
    return f"52:54:{rail + 1:02x}" + lab_mac(ipaddress.IPv4Address(address))[8:]


def qemu_command(
    name: str,
    mac: str,
    tap: str,
    memory_mib: int,
    boot: list[str],
    reboot: bool = True,
    fabric: Sequence[tuple[str, str, int]] = (),
) -> list[str]:
    """QEMU in software (this machine's KVM cannot run a stock kernel), one core, its serial
    console on standard output, one virtio card on `tap`; `boot` its boot arguments. `fabric`:
    a card more for each (MAC, multicast segment, rate in Gb/s), which the guest's kernel
    names eth1, eth2, ... after the first and reports at that rate (rdma_rxe takes its own
    rate from it)."""
    cards = []
    for i, (fmac, segment, gbps) in enumerate(fabric):
        cards += [
            "-netdev", f"socket,id=f{i},mcast={segment},localaddr=127.0.0.1",
            "-device", f"virtio-net-pci,netdev=f{i},mac={fmac},speed={gbps * 1000},duplex=full",
        ]  # fmt: skip
    return [
        QEMU, "-name", name, "-accel", "tcg", "-cpu", "max", "-m", str(memory_mib), "-smp", "1",
        "-nographic", "-serial", "stdio", "-monitor", "none",
        *([] if reboot else ["-no-reboot"]), *boot,
        "-netdev", f"tap,id=n0,ifname={tap},script=no,downscript=no",
        "-device", f"virtio-net-pci,netdev=n0,mac={mac}",
        *cards,
    ]  # fmt: skip


def tap_name(bridge: str, address: str) -> str:
    return f"{bridge[:10]}t{address.rsplit('.', 1)[1]}"


# --- apply's side ---------------------------------------------------------------------------


class MetalLab:
    """The metal lab of one cluster: its daemon started with the machines' list, or stopped."""

    def __init__(self, state: State, network: str, port: int, log: Callable[[str], None]) -> None:
        self.state, self.dir = state, directory(state.dir)
        self.network, self.port, self.log = network, port, log

    def ensure(self, machines: list[Machine]) -> None:
        """The BMCs of `machines` answering: the daemon kept where it runs for the same
        machines, else (re)started; a machine it ran goes off with it (it is then silent, and
        apply's boot phase boots it again)."""
        _require_tools()
        self.dir.mkdir(parents=True, exist_ok=True)
        user, password = self._credentials()
        config = {
            "network": self.network,
            "port": self.port,
            "user": user,
            "machines": [asdict(m) for m in machines],
        }
        self._certificate([m.bmc for m in machines])
        wanted = json.dumps(config, indent=2, sort_keys=True) + "\n"
        path = self.dir / CONFIG
        running = self.pid()
        same = path.exists() and path.read_text() == wanted
        if running and same and self._password_kept(password):
            return
        if running:
            what = "machines" if not same else "BMC password"
            self.log(f"lab: the metal lab's {what} changed: its BMCs restart, its machines off")
            self.stop()
        write_private(path, wanted.encode())
        write_private(self.dir / HTPASSWD, f"{user}:{_bcrypt(password)}\n".encode())
        self._start(machines)

    def _password_kept(self, password: str) -> bool:
        """Whether the emulators take the cluster's password (`bmc-credentials` may have
        changed it since they started)."""
        import bcrypt

        try:
            hashed = (self.dir / HTPASSWD).read_text().strip().split(":", 1)[1]
        except (OSError, IndexError):
            return False
        return bcrypt.checkpw(password.encode(), hashed.encode())

    def _credentials(self) -> tuple[str, str]:
        """The cluster's BMC credentials (`provision bmc-credentials`), made where it has
        none: the emulators take whatever it holds."""
        if (self.state.secrets / CREDENTIALS).exists():
            creds = load_credentials(self.state)  # a damaged file: its own clear error
            return creds.user, creds.password
        creds = Credentials(BMC_USER, secrets.token_urlsafe(24))
        save_credentials(self.state, creds)
        self.log("lab: the metal lab's BMC credentials made (the cluster's secrets, 0600)")
        return creds.user, creds.password

    def _certificate(self, addresses: list[str]) -> None:
        """One certificate for every BMC address (its own CA: the lab signs nothing else),
        made again where the addresses changed."""
        cert = self.dir / CERT
        if cert.exists() and _names(cert) == sorted(addresses):
            return
        pem_cert, pem_key = self_signed(addresses)
        write_private(self.dir / KEY, pem_key)
        cert.write_bytes(pem_cert)

    def _start(self, machines: list[Machine]) -> None:
        (self.dir / READY).unlink(missing_ok=True)
        with (self.dir / LOG).open("ab") as log:
            daemon = subprocess.Popen(
                [sys.executable, "-c", DAEMON, str(self.state.dir)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=podman.env(),
            )  # fmt: skip
        (self.dir / PIDFILE).write_text(f"{daemon.pid}\n")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (self.dir / READY).exists():
            if daemon.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise OperationError(
                    f"the metal lab's BMCs did not start; its log ends: {self._log_tail()}"
                )
            time.sleep(0.2)
        names = ", ".join(f"{m.name} at {m.bmc}:{self.port}" for m in machines)
        self.log(f"lab: the metal lab's BMCs answer ({names}); the machines are off")

    def _log_tail(self) -> str:
        path = self.dir / LOG
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(text.splitlines()[-8:]) or "(empty)"

    def pid(self) -> int | None:
        """The daemon's process where it runs."""
        path = self.dir / PIDFILE
        try:
            pid = int(path.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if DAEMON.encode() in cmdline else None

    def stop(self) -> list[str]:
        """The daemon stopped (its machines and emulators with it), and whatever a daemon
        that was killed left: its machines' taps and routing rules; the machines it ran."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while self.pid() is not None and time.monotonic() < deadline:
                time.sleep(0.2)
            if self.pid() is not None:
                os.killpg(pid, signal.SIGKILL)
        (self.dir / PIDFILE).unlink(missing_ok=True)
        (self.dir / READY).unlink(missing_ok=True)
        config = self.dir / CONFIG
        machines = json.loads(config.read_text()).get("machines", []) if config.exists() else []
        for m in machines:
            _route(self.network, m["address"], "", on=False)
        return [str(m["name"]) for m in machines] if pid is not None else []


def _require_tools() -> None:
    if importlib.util.find_spec("sushy_tools") is None:
        raise OperationError(
            "the metal lab's BMCs are sushy-tools' Redfish emulator: install it with "
            "`pip install 'gpu-provision[lab]'` (make setup does)"
        )
    podman.require(QEMU)
    podman.require("iptables")


def _bcrypt(password: str) -> str:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()


def _names(cert: Path) -> list[str]:
    from cryptography import x509

    loaded = x509.load_pem_x509_certificate(cert.read_bytes())
    try:
        san = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return sorted(str(a) for a in san.get_values_for_type(x509.IPAddress))


def self_signed(addresses: list[str], days: int = 825) -> tuple[bytes, bytes]:
    """A certificate for `addresses` that is its own CA, and its key (PEM, unencrypted)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"bmc {addresses[0]}")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(a)) for a in sorted(addresses)]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return (
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def _route(network: str, address: str, subnet: str, on: bool) -> None:
    """A running machine's NAT and forwarding rules (podman's plugin makes them for its
    containers alone), added or removed; removing needs no subnet (found by the comment, which
    names the lab's network: another cluster's rules are never touched)."""
    comment = f"{RULE_MARK} {network} {address}"
    mark = ["-m", "comment", "--comment", comment]
    if not on:
        for table in ("nat", "filter"):
            listed = subprocess.run(
                ["iptables", "-t", table, "-S"], capture_output=True, text=True, check=False
            ).stdout
            for line in listed.splitlines():
                args = shlex.split(line)
                if args[:1] == ["-A"] and comment in args:
                    subprocess.run(
                        ["iptables", "-t", table, "-D", *args[1:]],
                        capture_output=True,
                        check=False,
                    )
        return
    rules = [
        ["-t", "nat", "POSTROUTING", "-s", f"{address}/32", "!", "-d", subnet, "-j",
         "MASQUERADE", *mark],
        ["-t", "filter", "FORWARD", "-s", f"{address}/32", "-j", "ACCEPT", *mark],
        ["-t", "filter", "FORWARD", "-d", f"{address}/32", "-m", "conntrack", "--ctstate",
         "RELATED,ESTABLISHED", "-j", "ACCEPT", *mark],
    ]  # fmt: skip
    for rule in rules:
        where, rest = rule[:2], rule[2:]
        there = subprocess.run(["iptables", *where, "-C", *rest], capture_output=True)
        if there.returncode != 0:
            subprocess.run(["iptables", *where, "-I", *rest], check=True)


# --- the daemon -----------------------------------------------------------------------------


class _Power:
    """The machines' power, as their BMCs' notifications say: QEMU started, stopped or
    restarted, with its routing rules and tap."""

    def __init__(self, machines: list[Machine], network: str, consoles: Path) -> None:
        self.machines = {m.name: m for m in machines}
        self.network, self.consoles = network, consoles
        self.running: dict[str, tuple[subprocess.Popen[bytes], IO[bytes], str]] = {}
        self._lock = threading.Lock()

    def notified(self, system: dict[str, Any]) -> None:
        name = system.get("name", "")
        if name not in self.machines:
            return
        pending = system.get("pending_power") or {}
        target = str(pending.get("power_state") or system.get("power_state", ""))
        with self._lock:
            alive = name in self.running and self.running[name][0].poll() is None
            if "Restart" in target:
                self._stop(name)
                self._start(name)
            elif target == "On" and not alive:
                self._stop(name)  # one that exited by itself: its tap and rules
                self._start(name)
            elif target == "Off" and name in self.running:
                self._stop(name)

    def _start(self, name: str) -> None:
        m = self.machines[name]
        inspect = "{{.NetworkInterface}} {{range .Subnets}}{{.Subnet}}{{end}}"
        bridge, subnet = podman.text(
            "network", "inspect", "--format", inspect, self.network
        ).split()
        _route(self.network, m.address, subnet, on=True)
        tap = tap_name(bridge, m.address)
        subprocess.run(["ip", "link", "del", tap], capture_output=True, check=False)
        subprocess.run(["ip", "tuntap", "add", tap, "mode", "tap"], check=True)
        subprocess.run(["ip", "link", "set", tap, "master", bridge, "up"], check=True)
        self.consoles.mkdir(parents=True, exist_ok=True)
        console = (self.consoles / f"{name}.log").open("wb")
        process = subprocess.Popen(
            qemu_command(name, m.mac, tap, m.memory_mib, ["-boot", "n"], fabric=[
                (fabric_mac(m.address, i), fabric_segment(self.network, i), gbps)
                for i, gbps in enumerate(m.fabric)
            ]),
            stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.running[name] = (process, console, tap)
        _say(f"{name}: started (QEMU {process.pid}, booting from the network)")

    def _stop(self, name: str) -> None:
        if name not in self.running:
            return
        process, console, tap = self.running.pop(name)
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        console.close()
        subprocess.run(["ip", "link", "del", tap], capture_output=True, check=False)
        _route(self.network, self.machines[name].address, "", on=False)
        _say(f"{name}: stopped")

    def close(self) -> None:
        with self._lock:
            for name in list(self.running):
                self._stop(name)


def _say(line: str) -> None:
    """A line of the daemon's log: its standard output is the file apply gave it (LOG)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def serve(state_dir: Path) -> None:
    """The daemon: the emulators and the power service, until SIGTERM stops them and the
    machines."""
    where = directory(state_dir)
    config = json.loads((where / CONFIG).read_text())
    machines = [Machine(**{**m, "fabric": tuple(m.get("fabric", ()))}) for m in config["machines"]]
    power = _Power(machines, config["network"], state_dir / CONSOLES)

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                power.notified(json.loads(self.rfile.read(length) or b"{}"))
            except Exception as exc:  # a machine that cannot start: said, the rest go on
                _say(f"power: {type(exc).__name__}: {exc}")
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    notify = f"http://127.0.0.1:{server.server_address[1]}/"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    emulators = [_emulator(where, m, config["port"], notify) for m in machines]
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    try:
        _wait_listening([(m.bmc, config["port"]) for m in machines], emulators)
        (where / READY).write_text("")
        _say(f"ready: {len(machines)} BMC(s), power service at {notify}")
        while not stopping.wait(5):
            for m, e in zip(machines, emulators, strict=True):
                if e.poll() is not None:
                    _say(f"{m.name}: its BMC emulator exited ({e.returncode})")
                    stopping.set()
    finally:
        power.close()
        for e in emulators:
            if e.poll() is None:
                e.terminate()
        for e in emulators:
            with contextlib.suppress(subprocess.TimeoutExpired):
                e.wait(timeout=10)
        server.shutdown()
        _say("stopped")


def _emulator(where: Path, m: Machine, port: int, notify: str) -> subprocess.Popen[bytes]:
    """One machine's BMC: sushy-tools' emulator with one fake system, powered off."""
    home = where / "bmc" / m.name
    # a new daemon's machines are off: so is what its BMC says (the emulator keeps its
    # systems' state in this directory between runs)
    shutil.rmtree(home / "state", ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    system = {
        "uuid": str(_uuid(m.name)),
        "name": m.name,
        "power_state": "Off",
        "external_notifier": True,
        "nics": [{"mac": m.mac, "ip": m.address}],
    }
    conf = home / "emulator.conf"
    conf.write_text(
        f"SUSHY_EMULATOR_LISTEN_IP = {m.bmc!r}\n"
        f"SUSHY_EMULATOR_LISTEN_PORT = {port}\n"
        f"SUSHY_EMULATOR_SSL_CERT = {str(where / CERT)!r}\n"
        f"SUSHY_EMULATOR_SSL_KEY = {str(where / KEY)!r}\n"
        f"SUSHY_EMULATOR_AUTH_FILE = {str(where / HTPASSWD)!r}\n"
        f"SUSHY_EMULATOR_STATE_DIR = {str(home / 'state')!r}\n"
        "SUSHY_EMULATOR_FAKE_DRIVER = True\n"
        f"SUSHY_EMULATOR_FAKE_SYSTEMS = [{system!r}]\n"
        f"EXTERNAL_NOTIFICATION_URL = {notify!r}\n"
    )
    with (home / "emulator.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "sushy_tools.emulator.main", "--config", str(conf)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def _uuid(name: str) -> str:
    import uuid

    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.metal-lab.provision"))


def _wait_listening(
    addresses: list[tuple[str, int]], processes: list[subprocess.Popen[bytes]]
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S - 10
    waiting = list(addresses)
    while waiting:
        if any(p.poll() is not None for p in processes) or time.monotonic() > deadline:
            raise SystemExit(f"BMC emulators not listening: {waiting}")
        with socket.socket() as probe:
            probe.settimeout(1)
            if probe.connect_ex(waiting[0]) == 0:
                waiting.pop(0)
                continue
        time.sleep(0.2)

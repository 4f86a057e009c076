"""The metal lab's machines: QEMU virtual machines without a disk on a lab's podman network,
each with a Redfish BMC of its own, as a rack of servers new from the factory is to
`provision apply`.

A BMC is sushy-tools' emulator with its fake system driver (tests/fakebmc.py); its external
notifier PUTs the system to `PowerService` at each change, which powers the machine: a pending
On starts it (from the network: it has no disk), Off stops it, a restart stops and starts it.
A machine's console (its serial port) is written to the cluster's state directory, where
apply reads its last lines when the machine does not come up (provision/boot.py).

podman's network plugin masquerades and forwards its containers' addresses alone (a rule per
container), so a machine on the lab's bridge gets the same rules while it runs: it reaches the
Debian mirror through this machine as the containers do.
"""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from provision.providers.lab import podman

from .vms import VM


class PowerService:
    """The machines' power, driven by their BMCs' notifications: NAME -> (address, mac)."""

    def __init__(
        self, machines: dict[str, tuple[str, str]], network: str, consoles: Path, workdir: Path
    ) -> None:
        self.machines, self.network, self.consoles, self.workdir = (
            machines, network, consoles, workdir,
        )  # fmt: skip
        self.running: dict[str, VM] = {}
        self.events: list[tuple[str, str]] = []  # (machine, what was done)
        self._lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                system = json.loads(self.rfile.read(length) or b"{}")
                service.notified(system)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def notified(self, system: dict[str, Any]) -> None:
        name = system.get("name", "")
        if name not in self.machines:
            return
        pending = system.get("pending_power") or {}
        target = pending.get("power_state") or system.get("power_state", "")
        with self._lock:
            vm = self.running.get(name)
            alive = vm is not None and vm.alive()
            if "Restart" in target:
                self._stop(name)
                self._start(name)
            elif target == "On" and not alive:
                self._start(name)
            elif target == "Off" and alive:
                self._stop(name)

    def _rules(self, address: str) -> list[list[str]]:
        """The machine's NAT and forwarding rules, as iptables arguments after -A/-D."""
        network = podman.text(
            "network", "inspect", "--format", "{{range .Subnets}}{{.Subnet}}{{end}}", self.network
        )
        mark = ["-m", "comment", "--comment", f"provision metal lab {address}"]
        return [
            ["-t", "nat", "POSTROUTING", "-s", f"{address}/32", "!", "-d", network, "-j",
             "MASQUERADE", *mark],
            ["FORWARD", "-s", f"{address}/32", "-j", "ACCEPT", *mark],
            ["FORWARD", "-d", f"{address}/32", "-m", "conntrack", "--ctstate",
             "RELATED,ESTABLISHED", "-j", "ACCEPT", *mark],
        ]  # fmt: skip

    def _route(self, address: str, on: bool) -> None:
        for rule in self._rules(address):
            table = rule[:2] if rule[0] == "-t" else []
            rest = rule[len(table) :]
            there = subprocess.run(["iptables", *table, "-C", *rest], capture_output=True)
            if on and there.returncode != 0:
                subprocess.run(["iptables", *table, "-I", *rest], check=True)
            elif not on and there.returncode == 0:
                subprocess.run(["iptables", *table, "-D", *rest], check=True)

    def _start(self, name: str) -> None:
        address, mac = self.machines[name]
        self._route(address, True)
        bridge = podman.text(
            "network", "inspect", "--format", "{{.NetworkInterface}}", self.network
        )
        vm = VM(name, address, None, bridge, self.workdir, mac=mac, memory_mib=1536)
        self.consoles.mkdir(parents=True, exist_ok=True)
        vm.console = self.consoles / f"{name}.log"
        vm.start()
        self.running[name] = vm
        self.events.append((name, "started"))

    def _stop(self, name: str) -> None:
        vm = self.running.pop(name, None)
        if vm is not None:
            vm.stop()
            self._route(self.machines[name][0], False)
            self.events.append((name, "stopped"))

    def close(self) -> None:
        self.server.shutdown()
        with self._lock:
            for name in list(self.running):
                self._stop(name)

"""BMCs on loopback for the power tests.

Redfish: `Emulator` runs OpenStack's Redfish BMC emulator (sushy-tools, its fake system
driver) over HTTPS with Basic authentication, one emulator a BMC as on real servers; the power
tests drive it. `FakeRedfish` is a small HTTPS server of our own for what no BMC emulator does:
BMCs that redirect, answer nonsense, or trickle their answers.

IPMI: run as a script (`python -m tests.fakebmc ipmi ADDRESS PORT USER PASSWORD`), a real
RMCP+ endpoint built on pyghmi's BMC class, the way virtual BMCs are; ipmitool talks to it.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from provision.providers.lab import metal

SESSIONS = "/redfish/v1/SessionService/Sessions"
ROOT = {
    "@odata.id": "/redfish/v1/",
    "Id": "RootService",
    "Systems": {"@odata.id": "/redfish/v1/Systems"},
    "Links": {"Sessions": {"@odata.id": SESSIONS}},
}
SYSTEM = "/redfish/v1/Systems/1"
RESET = SYSTEM + "/Actions/ComputerSystem.Reset"


def self_signed(directory: Path, address: str) -> tuple[Path, Path]:
    """A certificate for `address` (its own CA) and its key, as PEM files."""
    cert, key = metal.self_signed([address], days=1)
    cert_path, key_path = directory / f"{address}.crt", directory / f"{address}.key"
    cert_path.write_bytes(cert)
    key_path.write_bytes(key)
    return cert_path, key_path


class Emulator:
    """sushy-tools' Redfish emulator as one BMC at `address`: HTTPS with a certificate for that
    address, Basic authentication from an htpasswd file, one fake system (powered off unless
    `power` says On, booting from its disk, with one network card). Its fake driver applies a
    power change 1-11 s after the request, as hardware does."""

    def __init__(
        self,
        address: str,
        port: int,
        user: str,
        password: str,
        workdir: Path,
        power: str = "Off",
    ) -> None:
        import bcrypt

        self.address, self.port, self.user, self.password = address, port, user, password
        self.workdir = workdir / f"emulator-{address}"
        self.workdir.mkdir(parents=True)
        self.cert, key = self_signed(self.workdir, address)
        htpasswd = self.workdir / "htpasswd"
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
        htpasswd.write_text(f"{user}:{hashed}\n")
        self.mac = f"52:54:00:00:00:{int(address.rsplit('.', 1)[1]):02x}"
        system = {
            "uuid": str(uuid.uuid4()),
            "name": f"node-{address}",
            "power_state": power,
            "nics": [{"mac": self.mac, "ip": "10.1.0.2"}],
        }
        config = self.workdir / "emulator.conf"
        config.write_text(
            f"SUSHY_EMULATOR_LISTEN_IP = {address!r}\n"
            f"SUSHY_EMULATOR_LISTEN_PORT = {port}\n"
            f"SUSHY_EMULATOR_SSL_CERT = {str(self.cert)!r}\n"
            f"SUSHY_EMULATOR_SSL_KEY = {str(key)!r}\n"
            f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}\n"
            f"SUSHY_EMULATOR_STATE_DIR = {str(self.workdir / 'state')!r}\n"
            "SUSHY_EMULATOR_FAKE_DRIVER = True\n"
            f"SUSHY_EMULATOR_FAKE_SYSTEMS = [{system!r}]\n"
        )
        self.system = f"/redfish/v1/Systems/{system['uuid']}"
        self.log = self.workdir / "emulator.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Emulator:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sushy_tools.emulator.main", "--config",
                 str(self.workdir / "emulator.conf")],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.process.poll() is None:
            with socket.socket() as probe:
                if probe.connect_ex((self.address, self.port)) == 0:
                    return self
            time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(f"the Redfish emulator did not start: {self.log.read_text()[-2000:]}")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def get(self, path: str = "") -> dict[str, Any]:
        """The emulated system (or `path`) as its BMC answers an administrator."""
        import requests

        answer = requests.get(
            f"https://{self.address}:{self.port}{path or self.system}",
            auth=(self.user, self.password),
            verify=str(self.cert),
            timeout=10,
        )
        answer.raise_for_status()
        result: dict[str, Any] = answer.json()
        return result

    def resets(self) -> int:
        """The ComputerSystem.Reset requests the emulator answered 204 (its own log)."""
        log = self.log.read_text()
        return log.count(f'POST {self.system}/Actions/ComputerSystem.Reset HTTP/1.1" 204')

    def wait_for_power(self, state: str, timeout: float = 20) -> float:
        """Seconds until the system's PowerState is `state` (its change is applied late)."""
        started = time.monotonic()
        while (seen := self.get()["PowerState"]) != state:
            if time.monotonic() - started > timeout:
                raise AssertionError(f"{self.address}: still {seen} after {timeout:g} s")
            time.sleep(0.5)
        return time.monotonic() - started


class FakeRedfish:
    """One BMC: `power` is its state; `resets` the ResetTypes it was asked for."""

    def __init__(
        self,
        address: str,
        port: int,
        user: str,
        password: str,
        certdir: Path,
        allowed: list[str] | None = None,
    ) -> None:
        self.power = "Off"
        self.resets: list[str] = []
        # how it answers GETs: ok, redirect (to redirect_to), elsewhere (its system's link is
        # redirect_to), not-json, no-odata, huge, trickle
        self.behaviour = "ok"
        self.redirect_to = ""
        self.stopping = threading.Event()
        self.auth_failures = 0
        # Redfish sessions (DSP0266): the tokens handed out, and those deleted again
        self.sessions: dict[str, str] = {}
        self.closed: list[str] = []
        self.token_uses = 0
        self.allowed = allowed or [
            "On",
            "ForceOff",
            "GracefulShutdown",
            "ForceRestart",
            "GracefulRestart",
            "PowerCycle",
        ]
        expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        bmc = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, code: int, body: dict[str, Any] | None = None) -> None:
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorised(self) -> bool:
                token = self.headers.get("X-Auth-Token")
                if token in bmc.sessions and token not in bmc.closed:
                    bmc.token_uses += 1
                    return True
                if self.headers.get("Authorization") == expected:
                    return True
                bmc.auth_failures += 1
                self._send(401, {"error": {"message": "authentication required"}})
                return False

            def _misbehave(self) -> bool:
                if bmc.behaviour == "redirect":
                    self.send_response(302)
                    self.send_header("Location", bmc.redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif bmc.behaviour == "not-json":
                    self.send_response(200)
                    self.send_header("Content-Length", "22")
                    self.end_headers()
                    self.wfile.write(b"<html>login page</html>"[:22])
                elif bmc.behaviour == "elsewhere" and self.path == "/redfish/v1/Systems":
                    self._send(200, {"Members": [{"@odata.id": bmc.redirect_to}]})
                elif bmc.behaviour == "no-odata" and self.path == "/redfish/v1/Systems":
                    self._send(200, {"Members": [{"Name": "system"}]})
                elif bmc.behaviour == "huge":  # says 2 MB are coming; none are read
                    self.send_response(200)
                    self.send_header("Content-Length", "2000000")
                    self.end_headers()
                elif bmc.behaviour == "trickle":  # one byte a second, never the whole answer
                    self.send_response(200)
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    while not bmc.stopping.wait(1.0):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                else:
                    return False
                return True

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/redfish/v1":  # the service root: no login (DSP0266)
                    self._send(200, ROOT)
                    return
                if not self._authorised() or self._misbehave():
                    return
                if self.path == "/redfish/v1/Systems":
                    self._send(200, {"Members": [{"@odata.id": SYSTEM}], "Members@odata.count": 1})
                elif self.path == SYSTEM:
                    self._send(
                        200,
                        {
                            "@odata.id": SYSTEM,
                            "Id": "1",
                            "PowerState": bmc.power,
                            "Actions": {
                                "#ComputerSystem.Reset": {
                                    "target": RESET,
                                    "ResetType@Redfish.AllowableValues": bmc.allowed,
                                }
                            },
                        },
                    )
                else:
                    self._send(404)

            def do_POST(self) -> None:
                if self.path == SESSIONS:
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    login = f"{body.get('UserName')}:{body.get('Password')}"
                    if "Basic " + base64.b64encode(login.encode()).decode() != expected:
                        bmc.auth_failures += 1
                        self._send(401, {"error": {"message": "authentication failed"}})
                        return
                    token, where = f"token-{len(bmc.sessions)}", f"{SESSIONS}/{len(bmc.sessions)}"
                    bmc.sessions[token] = where
                    data = json.dumps({"@odata.id": where}).encode()
                    self.send_response(201)
                    self.send_header("X-Auth-Token", token)
                    self.send_header("Location", where)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if not self._authorised():
                    return
                if self.path != RESET:
                    self._send(404)
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                kind = body.get("ResetType")
                if kind not in bmc.allowed:
                    self._send(400, {"error": {"message": f"bad ResetType {kind}"}})
                    return
                bmc.resets.append(kind)
                bmc.power = "Off" if kind in ("ForceOff", "GracefulShutdown") else "On"
                self._send(204)

            def do_DELETE(self) -> None:
                token = next((t for t, w in bmc.sessions.items() if w == self.path), None)
                if token is None:
                    self._send(404)
                elif self._authorised():
                    bmc.closed.append(token)
                    self._send(204)

        self.server = ThreadingHTTPServer((address, port), Handler)
        self.port = self.server.server_address[1]
        self.cert, key = self_signed(certdir, address)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeRedfish:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


def serve_ipmi(address: str, port: int, user: str, password: str) -> None:
    import pyghmi.ipmi.bmc as bmc

    class FakeIpmi(bmc.Bmc):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__({user: password}, port=port, address=address)
            self.state = "off"

        def get_power_state(self) -> str:
            return self.state

        def power_on(self) -> None:
            self.state = "on"

        def power_off(self) -> None:
            self.state = "off"

        def power_shutdown(self) -> None:
            self.state = "off"

        def power_cycle(self) -> None:
            self.state = "on"

        def power_reset(self) -> None:
            self.state = "on"

    server = FakeIpmi()
    print("listening", flush=True)
    server.listen()


if __name__ == "__main__":
    if sys.argv[1] == "ipmi":
        serve_ipmi(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])

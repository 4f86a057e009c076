"""Fake BMCs on loopback for the power tests.

Redfish: a small HTTPS server speaking the subset `provision power` uses (service root's
Systems collection, one ComputerSystem with PowerState, the ComputerSystem.Reset action), with
Basic authentication and a self-signed certificate.

IPMI: run as a script (`python -m tests.fakebmc ipmi ADDRESS PORT USER PASSWORD`), a real
RMCP+ endpoint built on pyghmi's BMC class, the way virtual BMCs are; ipmitool talks to it.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SYSTEM = "/redfish/v1/Systems/1"
RESET = SYSTEM + "/Actions/ComputerSystem.Reset"


def self_signed(directory: Path, address: str) -> tuple[Path, Path]:
    """A certificate for `address` and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"bmc {address}")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{address}.crt", directory / f"{address}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


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
        # how it answers GETs: ok, redirect (to redirect_to), not-json, no-odata, trickle
        self.behaviour = "ok"
        self.redirect_to = ""
        self.stopping = threading.Event()
        self.auth_failures = 0
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
                elif bmc.behaviour == "no-odata" and self.path == "/redfish/v1/Systems":
                    self._send(200, {"Members": [{"Name": "system"}]})
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

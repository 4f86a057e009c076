"""An SMTP relay for tests: the commands Alertmanager's client sends (EHLO, AUTH LOGIN, MAIL,
RCPT, DATA, QUIT), each mail kept with when it came and the login it came with."""

from __future__ import annotations

import base64
import socketserver
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Mail:
    at: float
    sender: str
    recipients: list[str]
    data: str
    login: tuple[str, str] | None


@dataclass
class _Session:
    sender: str = ""
    recipients: list[str] = field(default_factory=list)
    login: tuple[str, str] | None = None


class FakeRelay(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: str = "0.0.0.0") -> None:
        self.mails: list[Mail] = []
        super().__init__((address, 0), _Handler)

    def start(self) -> FakeRelay:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class _Handler(socketserver.StreamRequestHandler):
    def _send(self, *lines: str) -> None:
        self.wfile.write("".join(f"{line}\r\n" for line in lines).encode())

    def _read(self) -> str:
        return self.rfile.readline().decode(errors="replace").rstrip("\r\n")

    def handle(self) -> None:
        assert isinstance(self.server, FakeRelay)
        session = _Session()
        self._send("220 relay.test ESMTP")
        while line := self._read():
            verb, _, rest = line.partition(" ")
            verb = verb.upper()
            if verb == "EHLO":
                self._send("250-relay.test", "250-AUTH LOGIN", "250 8BITMIME")
            elif verb == "HELO":
                self._send("250 relay.test")
            elif verb == "AUTH" and rest.upper().startswith("LOGIN"):
                initial = rest.split()[1:]
                if initial:
                    user = base64.b64decode(initial[0]).decode()
                else:
                    self._send(f"334 {_b64('Username:')}")
                    user = base64.b64decode(self._read()).decode()
                self._send(f"334 {_b64('Password:')}")
                password = base64.b64decode(self._read()).decode()
                session.login = (user, password)
                self._send("235 2.7.0 accepted")
            elif verb == "MAIL":
                session.sender = rest.partition(":")[2].split()[0].strip("<>")
                self._send("250 2.1.0 ok")
            elif verb == "RCPT":
                session.recipients.append(rest.partition(":")[2].strip().strip("<>"))
                self._send("250 2.1.5 ok")
            elif verb == "DATA":
                self._send("354 go on")
                body = []
                while (part := self._read()) != ".":
                    body.append(part[1:] if part.startswith("..") else part)
                self.server.mails.append(
                    Mail(
                        time.monotonic(),
                        session.sender,
                        list(session.recipients),
                        "\n".join(body),
                        session.login,
                    )
                )
                session.recipients = []
                self._send("250 2.0.0 queued")
            elif verb in ("RSET", "NOOP"):
                self._send("250 ok")
            elif verb == "QUIT":
                self._send("221 bye")
                return
            else:
                self._send("502 5.5.2 not here")

"""Podman's REST API (libpod, v4) over a unix socket, with the standard library: the head of a
lab cluster creates and removes its burst containers through the workstation's podman."""

from __future__ import annotations

import http.client
import io
import json
import socket
import tarfile
import urllib.parse

from provision.burst.backend import BurstError

API = "/v4.0.0/libpod"


class PodmanError(BurstError):
    """A refused or failed API call: the message is podman's own, on one line."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


class PodmanAPI:
    def __init__(self, socket_path: str, timeout: float = 60) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def _call(
        self, method: str, path: str, body: bytes | None = None, ctype: str = "application/json"
    ) -> tuple[int, bytes]:
        conn = _UnixConnection(self.socket_path, self.timeout)
        try:
            headers = {"Content-Type": ctype} if body is not None else {}
            conn.request(method, API + path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        except OSError as exc:
            raise PodmanError(f"no podman API at {self.socket_path}: {exc}") from None
        finally:
            conn.close()

    def _ok(self, method: str, path: str, body: bytes | None = None, **kw: str) -> bytes:
        status, data = self._call(method, path, body, **kw)
        if status >= 300:
            raise PodmanError(_message(status, data))
        return data

    def create(self, spec: dict[str, object]) -> None:
        self._ok("POST", "/containers/create", json.dumps(spec).encode())

    def put_file(self, container: str, directory: str, name: str, data: bytes, mode: int) -> None:
        """Write one file into a created (not yet started) container."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        query = urllib.parse.urlencode({"path": directory})
        path = f"/containers/{_q(container)}/archive?{query}"
        self._ok("PUT", path, buf.getvalue(), ctype="application/x-tar")

    def start(self, container: str) -> None:
        status, data = self._call("POST", f"/containers/{_q(container)}/start")
        if status not in (204, 304):  # 304: already running
            raise PodmanError(_message(status, data))

    def remove(self, container: str) -> bool:
        """Remove a container, running or not; False when there was none."""
        status, data = self._call("DELETE", f"/containers/{_q(container)}?force=true&timeout=0")
        if status == 404:
            return False
        if status >= 300:
            raise PodmanError(_message(status, data))
        return True

    def containers(self, label: str) -> dict[str, str]:
        """Container name -> state ('running', 'exited', ...) for every container with label."""
        filters = urllib.parse.quote(json.dumps({"label": [label]}))
        data = self._ok("GET", f"/containers/json?all=true&filters={filters}")
        return {c["Names"][0]: c["State"] for c in json.loads(data) if c.get("Names")}

    def image_exists(self, image: str) -> bool:
        status, _ = self._call("GET", f"/images/{_q(image)}/exists")
        return status == 204


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _message(status: int, data: bytes) -> str:
    try:
        text = str(json.loads(data).get("message") or data.decode(errors="replace"))
    except (ValueError, AttributeError):
        text = data.decode(errors="replace")
    return f"HTTP {status}: {' '.join(text.split())[:300]}"

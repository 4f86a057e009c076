"""A JSON service on 127.0.0.1 for the cloud fakes (tests/fakegcp.py, tests/fakeazure.py): it
serves GET, POST, PUT and DELETE from a thread, records every request with its body, and asks
the subclass's `respond` for (status, JSON document or None), one request at a time."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class JsonFake:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def respond(
        self, method: str, path: str, headers: dict[str, str], body: Any
    ) -> tuple[int, Any]:
        raise NotImplementedError

    def _answer(
        self, method: str, path: str, headers: dict[str, str], body: Any
    ) -> tuple[int, Any]:
        with self._lock:
            self.requests.append((method, path, body))
            return self.respond(method, path, headers, body)

    def __enter__(self) -> Self:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:  # JSON, or a form's text as it came (an OAuth token request)
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode()
                status, doc = fake._answer(self.command, self.path, dict(self.headers), body)
                data = b"" if doc is None else json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

"""JSON over HTTPS with the standard library, for the cloud APIs the burst programs call
without an SDK (GCP's Compute Engine, Azure Resource Manager), and the tokens that the head's
instance identity gets from the cloud's metadata service."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from provision.burst.backend import BurstError


class HTTPError(BurstError):
    def __init__(self, status: int, message: str, reasons: list[str]) -> None:
        super().__init__(message)
        self.status = status
        self.reasons = reasons  # the service's error codes, as it names them


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a token never follows a redirect


_OPENER = urllib.request.build_opener(_NoRedirect)


def request(
    method: str,
    url: str,
    body: object = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60,
) -> tuple[int, Any]:
    """The status and the JSON answer ({} for an empty one); HTTPError with the service's
    message and codes for a 4xx or 5xx."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with _OPENER.open(req, timeout=timeout) as answer:
            status, raw = answer.status, answer.read(8 << 20)
    except urllib.error.HTTPError as exc:
        raw = exc.read(1 << 20)
        message, reasons = _error(raw)
        raise HTTPError(exc.code, f"HTTP {exc.code}: {message}", reasons) from None
    except (urllib.error.URLError, OSError) as exc:
        raise BurstError(f"{url.split('?')[0]}: {getattr(exc, 'reason', exc)}") from None
    try:
        return status, json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise BurstError(f"{url.split('?')[0]}: not JSON") from None


def text(
    url: str, headers: dict[str, str] | None = None, method: str = "GET", timeout: float = 10
) -> tuple[int, str]:
    """A plain answer (a metadata service's value, IMDSv2's token): its status and text; a 4xx
    or 5xx is answered as its status with no text, for the caller to wait or refuse."""
    req = urllib.request.Request(url, method=method, data=b"" if method == "PUT" else None)
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    try:
        with _OPENER.open(req, timeout=timeout) as answer:
            return answer.status, answer.read(1 << 20).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError) as exc:
        raise BurstError(f"{url.split('?')[0]}: {getattr(exc, 'reason', exc)}") from None


def call(
    method: str,
    url: str,
    body: object = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60,
) -> Any:
    """The JSON answer; see request."""
    return request(method, url, body, headers, timeout)[1]


def _error(raw: bytes) -> tuple[str, list[str]]:
    """Both clouds answer {"error": {"code": ..., "message": ..., ("errors"|"details"): [...]}};
    their OAuth 2.0 token endpoints {"error": CODE, "error_description": ...} (RFC 6749 5.2)."""
    try:
        doc = json.loads(raw)
        error = doc["error"]
    except (ValueError, KeyError, TypeError):
        return " ".join(raw.decode(errors="replace").split())[:200] or "no message", []
    if not isinstance(error, dict):
        said = f"{error}: {doc.get('error_description', '')}".rstrip(": ")
        return " ".join(said.split())[:200], [str(error)]
    reasons = [str(error.get("code", ""))]
    for item in error.get("errors", []) + error.get("details", []):
        if isinstance(item, dict):
            reasons += [str(item.get(k)) for k in ("reason", "code") if item.get(k)]
    return " ".join(str(error.get("message", "")).split())[:200], [r for r in reasons if r]


class Token:
    """A bearer token from the metadata service, fetched again a minute before it expires."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.url, self.headers = url, headers
        self._value, self._until = "", 0.0

    def __call__(self) -> str:
        if time.monotonic() >= self._until:
            answer = call("GET", self.url, headers=self.headers, timeout=10)
            try:
                self._value = str(answer["access_token"])
                expires = int(answer.get("expires_in", 300))
            except (KeyError, TypeError, ValueError):
                raise BurstError(f"{self.url.split('?')[0]}: no access_token") from None
            self._until = time.monotonic() + max(0, expires - 60)
        return self._value


def form_token(url: str, form: str, timeout: float = 30) -> str:
    """An OAuth 2.0 token for a form-encoded grant (a service principal's client credentials):
    the access_token of the answer; HTTPError with the service's message otherwise."""
    req = urllib.request.Request(url, data=form.encode(), method="POST")
    req.add_header("Content-Type", "application/x-www-form-urlencoded")
    try:
        with _OPENER.open(req, timeout=timeout) as answer:
            doc = json.loads(answer.read(1 << 20) or b"{}")
    except urllib.error.HTTPError as exc:
        message, reasons = _error(exc.read(1 << 20))
        raise HTTPError(exc.code, f"HTTP {exc.code}: {message}", reasons) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise BurstError(f"{url}: {getattr(exc, 'reason', exc)}") from None
    token = doc.get("access_token") if isinstance(doc, dict) else None
    if not token:
        raise BurstError(f"{url}: no access_token")
    return str(token)

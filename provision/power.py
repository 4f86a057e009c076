"""Out-of-band power control: `provision power status|on|off|cycle NODE...` through each node's
BMC, over Redfish (HTTPS, the standard library's client) or IPMI (ipmitool, lanplus).

Credentials live in the cluster's secrets (bmc.json, 0600) and reach ipmitool through its
environment (-E), never its command line; no message ever carries them.
"""

from __future__ import annotations

import base64
import difflib
import json
import os
import queue
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import hostlist

from provision.errors import NOT_ONE_LINE, UsageError
from provision.secrets import check_secret_file, write_private
from provision.spec.models import BmcNetwork
from provision.spec.nodes import Node
from provision.state import State

Action = Literal["status", "on", "off", "cycle"]
ACTIONS: tuple[Action, ...] = ("status", "on", "off", "cycle")
CREDENTIALS = "bmc.json"
TIMEOUT_S = 20.0  # one socket operation
DEADLINE_S = 60.0  # the whole command, every BMC together (--timeout)
MAX_ANSWER = 1024 * 1024  # a Redfish answer larger than this is not one power control reads


class BmcError(Exception):
    """A BMC refused or did not answer; the message is safe to print."""


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str

    def __repr__(self) -> str:  # never print the password, even by accident
        return f"Credentials(user={self.user!r}, password=<hidden>)"


@dataclass(frozen=True)
class PowerResult:
    node: str
    bmc: str
    ok: bool
    state: str  # "on", "off", or what went wrong


# --- credentials -------------------------------------------------------------------------


def save_credentials(state: State, creds: Credentials) -> Path:
    state.ensure()
    data = json.dumps({"user": creds.user, "password": creds.password}).encode()
    return write_private(state.secrets / CREDENTIALS, data)


def load_credentials(state: State) -> Credentials:
    path = state.secrets / CREDENTIALS
    if not path.exists():
        raise UsageError(
            f"no BMC credentials for cluster '{state.cluster}': "
            "run `provision bmc-credentials SPEC --user NAME` first"
        )
    check_secret_file(path, (2, 64 * 1024))
    try:
        data = json.loads(path.read_text())
        return Credentials(str(data["user"]), str(data["password"]))
    except (ValueError, KeyError, TypeError):
        raise UsageError(
            f"{path} is damaged: run `provision bmc-credentials SPEC --user NAME` again"
        ) from None


# --- which nodes ---------------------------------------------------------------------------


def select_nodes(nodes: list[Node], patterns: list[str]) -> list[Node]:
    """Nodes named by hostlists (gpu[001-032]) or pool names, in spec order, each once."""
    by_name = {n.name: n for n in nodes}
    pools: dict[str, list[str]] = {}
    for n in nodes:
        pools.setdefault(n.pool, []).append(n.name)
    wanted: set[str] = set()
    for pattern in patterns:
        try:
            names = hostlist.expand_hostlist(pattern)
        except hostlist.BadHostlist as exc:
            raise UsageError(
                f"'{pattern}' is not a host list ({exc}): write it like gpu[001-032]"
            ) from None
        for name in names:
            if name in by_name:
                wanted.add(name)
            elif name in pools:
                wanted.update(pools[name])
            else:
                close = difflib.get_close_matches(name, [*by_name, *pools], n=1)
                hint = f": did you mean '{close[0]}'?" if close else ""
                raise UsageError(f"'{name}' is not a node or pool of this cluster{hint}")
    chosen = [n for n in nodes if n.name in wanted]
    missing = [n.name for n in chosen if n.bmc_address is None]
    if missing:
        raise UsageError(
            f"{hostlist.collect_hostlist(missing)} ha{'s' if len(missing) == 1 else 've'} no BMC "
            "address: set hosts[].bmc_address or the pool's first_bmc_address"
        )
    return chosen


# --- Redfish -------------------------------------------------------------------------------


class Redfish:
    """The few Redfish calls power control needs: the system, its PowerState, its Reset."""

    def __init__(self, address: str, port: int, creds: Credentials, settings: BmcNetwork) -> None:
        self.base = f"https://{address}:{port}"
        token = base64.b64encode(f"{creds.user}:{creds.password}".encode()).decode()
        self._auth = f"Basic {token}"
        if settings.verify_tls:
            self._tls = _tls_context(settings.ca_file)
        else:
            self._tls = ssl.create_default_context()
            self._tls.check_hostname = False
            self._tls.verify_mode = ssl.CERT_NONE
        self._system: dict[str, Any] | None = None

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        if not path.startswith("/") or path.startswith("//"):
            raise BmcError(f"the BMC named {path[:80]!r}, not a path on itself: not followed")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", self._auth)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        opener = urllib.request.build_opener(
            _NoRedirect, urllib.request.HTTPSHandler(context=self._tls)
        )
        try:
            with opener.open(request, timeout=TIMEOUT_S) as resp:
                raw = resp.read(MAX_ANSWER + 1)
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise BmcError(f"credentials refused (HTTP {exc.code})") from None
            if 300 <= exc.code < 400:
                where = str(exc.headers.get("Location", "?"))[:120]
                raise BmcError(
                    f"{method} {path}: redirected (HTTP {exc.code}) to {where}: not followed, "
                    "so the credentials never leave for another address"
                ) from None
            raise BmcError(f"{method} {path}: HTTP {exc.code} {exc.reason}") from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise BmcError(
                    f"certificate not trusted ({reason.verify_message}): set network.bmc.ca_file, "
                    "or verify_tls: false"
                ) from None
            raise BmcError(f"unreachable: {reason}") from None
        except (TimeoutError, OSError) as exc:
            raise BmcError(f"unreachable: {exc}") from None
        if len(raw) > MAX_ANSWER:
            raise BmcError(f"{method} {path}: an answer of more than {MAX_ANSWER:,} bytes")
        if not raw:
            return {}
        try:
            answer = json.loads(raw)
        except ValueError:
            raise BmcError(f"{method} {path}: the answer is not JSON") from None
        if not isinstance(answer, dict):
            raise BmcError(f"{method} {path}: the answer is not a JSON object")
        return answer

    def system(self) -> dict[str, Any]:
        if self._system is None:
            members = self._call("GET", "/redfish/v1/Systems").get("Members")
            if not isinstance(members, list) or not members:
                raise BmcError("the BMC lists no system")
            link = members[0].get("@odata.id") if isinstance(members[0], dict) else None
            if not isinstance(link, str):
                raise BmcError("the BMC's system has no @odata.id link")
            self._system = self._call("GET", link)
        return self._system

    def status(self) -> str:
        self._system = None
        return str(self.system().get("PowerState", "unknown")).lower()[:40]

    def reset(self, action: Action, soft: bool) -> None:
        actions = self.system().get("Actions")
        reset = actions.get("#ComputerSystem.Reset") if isinstance(actions, dict) else None
        target = reset.get("target") if isinstance(reset, dict) else None
        if not isinstance(reset, dict) or not isinstance(target, str) or not target:
            raise BmcError("the BMC offers no ComputerSystem.Reset action")
        allowed = reset.get("ResetType@Redfish.AllowableValues") or []
        if not isinstance(allowed, list):
            allowed = []
        allowed = [str(a)[:40] for a in allowed]
        wanted = {
            "on": ["On"],
            "off": ["GracefulShutdown"] if soft else ["ForceOff"],
            "cycle": ["GracefulRestart"] if soft else ["PowerCycle", "ForceRestart"],
        }[action]
        kind = next((w for w in wanted if not allowed or w in allowed), None)
        if kind is None:
            raise BmcError(
                f"the BMC does not offer {' or '.join(wanted)} (it offers {', '.join(allowed)})"
            )
        self._call("POST", target, {"ResetType": kind})


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: urllib would carry the Authorization header to the new place."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _tls_context(ca_file: str | None) -> ssl.SSLContext:
    if ca_file is None:
        return ssl.create_default_context()
    path = Path(ca_file)  # absolute: the spec resolved it (spec/paths.py)
    try:
        return ssl.create_default_context(cafile=str(path))
    except FileNotFoundError:
        raise UsageError(f"network.bmc.ca_file: {path} does not exist") from None
    except (ssl.SSLError, OSError) as exc:
        raise UsageError(
            f"network.bmc.ca_file: {path} holds no usable CA certificate ({exc})"
        ) from None


# --- IPMI ----------------------------------------------------------------------------------


class Ipmi:
    """ipmitool over lanplus; the password goes through its environment (-E)."""

    def __init__(self, address: str, port: int, creds: Credentials) -> None:
        self.address, self.port, self.creds = address, port, creds

    def _run(self, *args: str) -> str:
        tool = shutil.which("ipmitool")
        if tool is None:
            raise BmcError(
                "ipmitool is not installed (apt-get install ipmitool / dnf install ipmitool)"
            )
        argv = [
            tool,
            "-I",
            "lanplus",
            "-H",
            self.address,
            "-p",
            str(self.port),
            "-U",
            self.creds.user,
            "-E",
            "-N",
            "2",
            "-R",
            "2",
            "chassis",
            "power",
            *args,
        ]
        env = {**os.environ, "IPMI_PASSWORD": self.creds.password}
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise BmcError("ipmitool did not finish in 60 s") from None
        if done.returncode != 0:
            message = " ".join((done.stderr or done.stdout).split()) or f"exit {done.returncode}"
            raise BmcError(message.replace(self.creds.password, "<hidden>"))
        return done.stdout

    def status(self) -> str:
        text = self._run("status").strip().lower()
        return "on" if text.endswith(" on") else "off" if text.endswith(" off") else text

    def reset(self, action: Action, soft: bool) -> None:
        self._run({"on": "on", "off": "soft" if soft else "off", "cycle": "cycle"}[action])


# --- the command ---------------------------------------------------------------------------


def client_for(node: Node, settings: BmcNetwork, creds: Credentials) -> Redfish | Ipmi:
    port = settings.port or (443 if settings.protocol == "redfish" else 623)
    if settings.protocol == "redfish":
        return Redfish(str(node.bmc_address), port, creds, settings)
    return Ipmi(str(node.bmc_address), port, creds)


def check_settings(settings: BmcNetwork) -> None:
    """What the user must fix before any BMC is asked: a CA bundle that is missing or bad."""
    if settings.protocol == "redfish" and settings.verify_tls:
        _tls_context(settings.ca_file)


def power(
    nodes: list[Node],
    action: Action,
    settings: BmcNetwork,
    creds: Credentials,
    soft: bool = False,
    deadline_s: float = DEADLINE_S,
) -> list[PowerResult]:
    """Run one action on every node's BMC, 32 at a time; a failed BMC never stops the others,
    and a BMC that has not answered when `deadline_s` is up is reported as such."""
    check_settings(settings)

    def one(node: Node) -> PowerResult:
        bmc = str(node.bmc_address)
        try:
            result = _one(node, bmc)
        except Exception as exc:  # an answer nobody foresaw: this BMC's line, not the command's
            return PowerResult(node.name, bmc, False, f"unexpected answer ({type(exc).__name__})")
        # what a BMC said reaches a terminal: one line, no escape sequences
        return replace(result, state=NOT_ONE_LINE.sub("?", result.state))

    def _one(node: Node, bmc: str) -> PowerResult:
        client = client_for(node, settings, creds)
        try:
            before = client.status()
            if action == "status":
                result = PowerResult(node.name, bmc, True, before)
            elif action in ("on", "off") and before == action:
                result = PowerResult(node.name, bmc, True, f"{before} (already)")
            elif action == "cycle" and before == "off":
                client.reset("on", soft)
                result = PowerResult(node.name, bmc, True, "was off: powered on")
            else:
                client.reset(action, soft)
                verb = {
                    "on": "powered on",
                    "off": "shut down" if soft else "powered off",
                    "cycle": "restarting" if soft else "power cycled",
                }[action]
                result = PowerResult(node.name, bmc, True, verb)
        except BmcError as exc:
            result = PowerResult(node.name, bmc, False, str(exc))
        return result

    finished = _bounded(one, nodes, workers=32, deadline_s=deadline_s)
    return [
        finished.get(i)
        or PowerResult(n.name, str(n.bmc_address), False, f"no answer within {deadline_s:g} s")
        for i, n in enumerate(nodes)
    ]


def _bounded(
    fn: Callable[[Node], PowerResult], nodes: list[Node], workers: int, deadline_s: float
) -> dict[int, PowerResult]:
    """fn over nodes on daemon threads; what has finished when the deadline passes. A BMC that
    trickles its answer byte by byte holds only its own thread, which exit does not wait for."""
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(nodes)):
        todo.put(i)
    done: dict[int, PowerResult] = {}
    changed = threading.Condition()

    def work() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            result = fn(nodes[i])
            with changed:
                done[i] = result
                changed.notify()

    for _ in range(max(1, min(workers, len(nodes)))):
        threading.Thread(target=work, daemon=True).start()
    end = time.monotonic() + deadline_s
    with changed:
        while len(done) < len(nodes) and (left := end - time.monotonic()) > 0:
            changed.wait(left)
        return dict(done)

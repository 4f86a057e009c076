"""Out-of-band power control: `provision power status|on|off|cycle|pxe NODE...` through each
node's BMC, over Redfish (HTTPS, through OpenStack's client library, sushy) or IPMI (ipmitool,
lanplus).

Credentials live in the cluster's secrets (bmc.json, 0600) and reach ipmitool through its
environment (-E), never its command line; no message ever carries them.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import queue
import shutil
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import hostlist
import requests
import sushy

from provision.errors import NOT_ONE_LINE, UsageError

# the BMCs' account is one of the cluster's secrets (secrets.py); here for the CLI
from provision.secrets import CREDENTIALS as CREDENTIALS
from provision.secrets import Credentials as Credentials
from provision.secrets import load_credentials as load_credentials
from provision.secrets import save_credentials as save_credentials
from provision.spec.models import BmcNetwork, Spec
from provision.spec.nodes import Node, metal_lab_pools
from provision.state import State

Action = Literal["status", "on", "off", "cycle", "pxe"]
ACTIONS: tuple[Action, ...] = ("status", "on", "off", "cycle", "pxe")
TIMEOUT_S = 20.0  # one socket operation
DEADLINE_S = 60.0  # the whole command, every BMC together (--timeout)
MAX_ANSWER = 1024 * 1024  # a Redfish answer larger than this is not one power control reads

# sushy says what it retries and where it falls back to Basic authentication as warnings: the
# command says what failed, once, on the node's line
logging.getLogger("sushy").addHandler(logging.NullHandler())
logging.getLogger("sushy").propagate = False


class BmcError(Exception):
    """A BMC refused or did not answer; the message is safe to print."""


@dataclass(frozen=True)
class PowerResult:
    node: str
    bmc: str
    ok: bool
    state: str  # "on", "off", or what went wrong


def bmc_settings(spec: Spec, state: State) -> BmcNetwork | None:
    """The spec's BMC network; the metal lab's BMCs (emulators apply starts) answer with a
    certificate the lab made, which is trusted for them alone (the spec's checks: a metal lab
    has no other BMCs and no ca_file)."""
    settings = spec.network.bmc
    if settings is None or not metal_lab_pools(spec):
        return settings
    from provision.providers.lab.metal import ca_file

    path = ca_file(state.dir)
    if not path.exists():
        raise UsageError(
            f"the metal lab of cluster '{spec.name}' has no BMCs yet: `provision apply` makes them"
        )
    return settings.model_copy(update={"ca_file": str(path)})


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


class _Refused(requests.exceptions.RequestException):
    """An answer power control will not read further: raised inside requests, before it follows
    a redirect or reads a body too large; `reason` is the line the user sees."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _guard(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    """requests' response hook, run before it follows a redirect: a redirect would carry the
    session's token to wherever the BMC points (it drops Basic credentials only for another
    host), and a huge answer would be read whole."""
    where = urllib.parse.urlsplit(response.url).path[:80]
    if response.is_redirect:
        target = str(response.headers.get("Location", "?"))[:120]
        raise _Refused(
            f"{response.request.method} {where}: redirected (HTTP {response.status_code}) to "
            f"{target}: not followed, so the credentials never leave for another address"
        )
    size = response.headers.get("Content-Length", "0")
    if size.isdigit() and int(size) > MAX_ANSWER:
        raise _Refused(f"{response.request.method} {where}: an answer of {int(size):,} bytes")


class _OnlyTheBmc(requests.adapters.BaseAdapter):
    """The session's one way out: a request for any URL but the BMC's own is refused before it
    leaves (sushy follows a link a BMC gives whole, and would send the session's token or the
    Basic credentials to whatever host the link names)."""

    def __init__(self, base: str, inner: requests.adapters.BaseAdapter) -> None:
        super().__init__()
        self.base, self.inner = base, inner

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> Any:
        url = str(request.url)
        if not url.startswith(self.base + "/"):
            raise _Refused(f"the BMC named {url[:120]}, not a path on itself: not followed")
        return self.inner.send(request, *args, **kwargs)

    def close(self) -> None:
        self.inner.close()


class Redfish:
    """Power control through OpenStack's Redfish client, sushy: a session with the BMC (Basic
    authentication where it offers none), its first system, PowerState, Reset and the next
    boot's source."""

    def __init__(self, address: str, port: int, creds: Credentials, settings: BmcNetwork) -> None:
        self.base = f"https://{address}:{port}"
        self.creds = creds
        # a CA bundle's path (absolute: spec/paths.py resolved it), the system's store, or none
        self.verify: bool | str = (settings.ca_file or True) if settings.verify_tls else False
        self._root: sushy.Sushy | None = None
        self._system: Any = None

    def _connect(self) -> Any:
        if self._system is None:
            conn = sushy.connector.Connector(
                self.base,
                verify=self.verify,
                # a BMC's 5xx is retried once, after a second: the command has its deadline
                server_side_retries=1,
                server_side_retries_delay=1,
                default_request_timeout=TIMEOUT_S,
                connect_timeout=TIMEOUT_S / 2,
            )
            session = conn._session  # the requests.Session sushy's connector keeps
            session.hooks["response"].append(_guard)
            only = _OnlyTheBmc(self.base, session.get_adapter(self.base))
            session.mount("https://", only)
            session.mount("http://", only)
            auth = sushy.auth.SessionOrBasicAuth(self.creds.user, self.creds.password)
            self._root = sushy.Sushy(self.base, auth=auth, connector=conn)
            members = self._root.get_system_collection().members_identities
            if not members:
                raise BmcError("the BMC lists no system")
            self._system = self._root.get_system(members[0])
        return self._system

    def close(self) -> None:
        """End the BMC's session: a BMC keeps few, and a new one per command would fill them."""
        root, self._root, self._system = self._root, None, None
        if root is not None and root._auth is not None:
            with contextlib.suppress(sushy.exceptions.SushyError, requests.RequestException):
                root._auth.close()
            root._auth = None

    def status(self) -> str:
        fresh = self._system is None
        system = self._call(self._connect)
        if not fresh:  # read again: an action may have changed it
            self._call(system.refresh)
        if system.power_state is None:  # sushy maps what Redfish does not define to None
            return "unknown (a PowerState Redfish does not define)"
        return str(system.power_state.value).lower()

    def reset(self, action: Action, soft: bool) -> None:
        system = self._call(self._connect)
        allowed = sorted(str(a.value) for a in self._call(system.get_allowed_reset_system_values))
        wanted = {
            "on": ["On"],
            "off": ["GracefulShutdown"] if soft else ["ForceOff"],
            "cycle": ["GracefulRestart"] if soft else ["PowerCycle", "ForceRestart"],
        }[action]
        kind = next((w for w in wanted if w in allowed), None)
        if kind is None:
            raise BmcError(
                f"the BMC does not offer {' or '.join(wanted)} (it offers {', '.join(allowed)})"
            )
        self._call(lambda: system.reset_system(sushy.ResetType(kind)))

    def boot_from_network(self) -> None:
        """The next boot, once, from the network (PXE); later boots as before."""
        system = self._call(self._connect)
        allowed = self._call(system.get_allowed_system_boot_source_values)
        if allowed and sushy.BOOT_SOURCE_TARGET_PXE not in allowed:
            offers = ", ".join(sorted(str(a.value) for a in allowed))
            raise BmcError(f"the BMC does not offer a network boot (it offers {offers})")
        self._call(
            lambda: system.set_system_boot_options(
                target=sushy.BOOT_SOURCE_TARGET_PXE, enabled=sushy.BOOT_SOURCE_ENABLED_ONCE
            )
        )

    def _call(self, fn: Callable[[], Any]) -> Any:
        """fn's answer, or BmcError with one safe line for what sushy or requests raised."""
        try:
            return fn()
        except sushy.exceptions.AccessError as exc:
            raise BmcError(f"credentials refused (HTTP {exc.status_code})") from None
        except sushy.exceptions.HTTPError as exc:
            where = urllib.parse.urlsplit(str(exc.url or "")).path[:80]
            raise BmcError(f"{exc.method} {where}: HTTP {exc.status_code}") from None
        except sushy.exceptions.ConnectionError as exc:
            raise BmcError(_unreachable(exc.__context__)) from None
        except (sushy.exceptions.MissingAttributeError, sushy.exceptions.MalformedAttributeError):
            raise BmcError("the answer lacks a link or field Redfish requires") from None
        except sushy.exceptions.SushyError as exc:
            raise BmcError(f"the BMC's answer was refused ({type(exc).__name__})") from None
        except requests.exceptions.JSONDecodeError:
            raise BmcError("the answer is not JSON") from None


def _unreachable(error: BaseException | None) -> str:
    """Why sushy could not reach the BMC, from the chain of errors requests and urllib3 raised
    under its ConnectionError: the first that says something a user can act on."""
    seen: list[BaseException] = []
    while error is not None and error not in seen and len(seen) < 20:
        seen.append(error)
        if isinstance(error, _Refused):
            return error.reason
        if isinstance(error, ssl.SSLCertVerificationError):
            return (
                f"certificate not trusted ({error.verify_message}): set network.bmc.ca_file, "
                "or verify_tls: false"
            )
        if isinstance(error, requests.exceptions.Timeout | TimeoutError):
            return "unreachable: no answer in time"
        if isinstance(error, OSError) and error.strerror:
            return f"unreachable: {error.strerror}"
        below = error.__cause__ or error.__context__
        if below is None:  # urllib3 keeps its reason as an argument
            below = next((a for a in error.args if isinstance(a, BaseException)), None)
            below = below or getattr(error, "reason", None)
        error = below if isinstance(below, BaseException) else None
    return "unreachable: the connection failed"


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
        text = self._run("power", "status").strip().lower()
        return "on" if text.endswith(" on") else "off" if text.endswith(" off") else text

    def reset(self, action: Action, soft: bool) -> None:
        self._run("power", {"on": "on", "off": "soft" if soft else "off", "cycle": "cycle"}[action])

    def boot_from_network(self) -> None:
        self._run("bootdev", "pxe")  # the next boot only, as ipmitool sets it without options

    def close(self) -> None:
        pass


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
            elif action == "pxe":
                client.boot_from_network()
                result = PowerResult(node.name, bmc, True, f"{before}, next boot from the network")
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
        finally:
            client.close()
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

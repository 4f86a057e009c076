"""`provision power` end to end, as a user runs it, against BMCs on loopback: Redfish's emulator
(sushy-tools) over HTTPS, a small server of our own for BMCs that misbehave (tests/fakebmc.py),
and IPMI over RMCP+ (pyghmi's BMC class, driven by the real ipmitool). The password must never
appear in any output."""

from __future__ import annotations

import contextlib
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision import power as pw
from provision.errors import UsageError
from provision.spec.loader import load_spec
from provision.spec.nodes import expand_nodes

from .conftest import ROOT
from .conftest import run_provision as provision
from .fakebmc import Emulator, FakeRedfish

USER, PASSWORD, OTHER = "admin", "s3cret-Bmc-pass", "an0ther-Bmc-pass"


def _free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spec(tmp_path: Path, bmc: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(f"""\
name: pw
os: debian12
network:
  management: {{cidr: 10.1.0.0/24}}
  bmc:
{bmc}
pools:
  - name: head
    role: head
    profile: cpu-node
    hosts: [{{name: head01, address: 10.1.0.10}}]
  - name: gpu
    role: compute
    profile: cpu-node
    count: 2
    first_address: 10.1.0.20
    first_bmc_address: 127.0.0.2
security:
  admin_cidrs: [10.9.0.0/24]
""")
    return path


def _login(spec: Path, state: Path, password: str = PASSWORD) -> None:
    r = provision(
        "bmc-credentials",
        str(spec),
        "--user",
        USER,
        "--password-stdin",
        "--state-dir",
        str(state),
        stdin=password + "\n",
    )
    assert r.returncode == 0, r.stderr
    assert password not in r.stdout + r.stderr


@pytest.fixture
def redfish(tmp_path: Path) -> Iterator[tuple[Path, Path, list[FakeRedfish]]]:
    port = _free_port()
    bmcs = [FakeRedfish(f"127.0.0.{i}", port, USER, PASSWORD, tmp_path) for i in (2, 3)]
    bundle = tmp_path / "bmc-ca.pem"
    bundle.write_text("".join(b.cert.read_text() for b in bmcs))
    spec = _spec(
        tmp_path,
        f"    cidr: 127.0.0.0/24\n    protocol: redfish\n    port: {port}\n    ca_file: {bundle}",
    )
    for b in bmcs:
        b.__enter__()
    yield spec, tmp_path / "state", bmcs
    for b in bmcs:
        b.__exit__()


@pytest.fixture
def emulated(tmp_path: Path) -> Iterator[tuple[Path, Path, list[Emulator]]]:
    """Two BMCs, each its own sushy-tools emulator; gpu002's account has another password."""
    port = _free_port()
    bmcs = [
        Emulator("127.0.0.2", port, USER, PASSWORD, tmp_path),
        Emulator("127.0.0.3", port, USER, OTHER, tmp_path),
    ]
    bundle = tmp_path / "bmc-ca.pem"
    bundle.write_text("".join(b.cert.read_text() for b in bmcs))
    spec = _spec(
        tmp_path,
        f"    cidr: 127.0.0.0/24\n    protocol: redfish\n    port: {port}\n    ca_file: {bundle}",
    )
    with contextlib.ExitStack() as running:
        for b in bmcs:
            running.enter_context(b)
        yield spec, tmp_path / "state", bmcs


def test_redfish_against_the_emulator(emulated: tuple[Path, Path, list[Emulator]]) -> None:
    spec, state, bmcs = emulated
    _login(spec, state)
    creds = state / "pw" / "secrets" / "bmc.json"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    common = ("-f", str(spec), "--state-dir", str(state))

    # a BMC that refuses the account fails at its node only
    r = provision("power", "status", "gpu[001-002]", *common)
    assert r.returncode == 1, r.stderr
    assert r.stdout.splitlines() == [
        "ok gpu001 (127.0.0.2): off",
        "FAIL gpu002 (127.0.0.3): credentials refused (HTTP 401)",
    ]
    assert "over redfish" in r.stderr and "1 of 2 BMC(s) failed" in r.stderr

    # the next boot from the network, once; the power as it was
    assert bmcs[0].get()["Boot"]["BootSourceOverrideTarget"] == "Hdd"
    r = provision("power", "pxe", "gpu001", *common)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "ok gpu001 (127.0.0.2): off, next boot from the network"
    assert bmcs[0].get()["Boot"]["BootSourceOverrideTarget"] == "Pxe"
    assert bmcs[0].get()["PowerState"] == "Off"

    r = provision("power", "on", "gpu001", *common)
    assert r.returncode == 0 and r.stdout.strip() == "ok gpu001 (127.0.0.2): powered on"
    bmcs[0].wait_for_power("On")
    r = provision("power", "on", "gpu001", *common)
    assert r.stdout.strip() == "ok gpu001 (127.0.0.2): on (already)", r.stdout

    # the emulator offers no PowerCycle: a hard restart instead (off at once, on again 1-11 s
    # later, so its Off may be gone by the time the test reads it: the BMC's log says it came)
    r = provision("power", "cycle", "gpu001", "--yes", *common)
    assert r.returncode == 0 and "power cycled" in r.stdout, r.stdout
    assert bmcs[0].resets() == 2  # on, then the restart
    bmcs[0].wait_for_power("On")

    # off without --yes and no terminal to ask: nothing happens
    r = provision("power", "off", "gpu001", *common)
    assert r.returncode == 1 and "aborted: nothing was changed" in r.stderr
    r = provision("power", "off", "gpu001", "--soft", "--yes", *common)
    assert r.returncode == 0 and "shut down" in r.stdout
    bmcs[0].wait_for_power("Off")
    assert bmcs[0].resets() == 3 and bmcs[1].resets() == 0
    for b in bmcs:
        assert PASSWORD not in b.log.read_text() and OTHER not in b.log.read_text()


def test_redfish_untrusted_certificate_and_no_tls_verification(
    emulated: tuple[Path, Path, list[Emulator]], tmp_path: Path
) -> None:
    _, state, bmcs = emulated
    untrusted = _spec(tmp_path, f"    cidr: 127.0.0.0/24\n    port: {bmcs[0].port}")
    _login(untrusted, state)
    r = provision("power", "status", "gpu001", "-f", str(untrusted), "--state-dir", str(state))
    assert r.returncode == 1 and "certificate not trusted" in r.stdout, r.stdout
    assert "set network.bmc.ca_file, or verify_tls: false" in r.stdout

    spec = _spec(
        tmp_path, f"    cidr: 127.0.0.0/24\n    port: {bmcs[0].port}\n    verify_tls: false"
    )
    r = provision("power", "status", "gpu001", "-f", str(spec), "--state-dir", str(state))
    assert r.returncode == 0 and r.stdout.strip() == "ok gpu001 (127.0.0.2): off", r.stdout

    closed = _spec(tmp_path, f"    cidr: 127.0.0.0/24\n    port: {_free_port()}")
    r = provision("power", "status", "gpu001", "-f", str(closed), "--state-dir", str(state))
    assert r.stdout.strip() == "FAIL gpu001 (127.0.0.2): unreachable: Connection refused"


def test_bad_input_is_exit_2(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "    cidr: 127.0.0.0/24")
    state = ("--state-dir", str(tmp_path / "state"))
    r = provision("power", "status", "gpu001", "-f", str(spec), *state)
    assert r.returncode == 2 and "no BMC credentials for cluster 'pw'" in r.stderr
    _login(spec, tmp_path / "state")
    r = provision("power", "reboot", "gpu001", "-f", str(spec), *state)
    assert r.returncode == 2 and "'reboot' is not a power action" in r.stderr
    r = provision("power", "status", "gpu00[1-3]", "-f", str(spec), *state)
    assert r.returncode == 2 and "'gpu003' is not a node or pool of this cluster" in r.stderr
    r = provision("power", "status", "head01", "-f", str(spec), *state)
    assert r.returncode == 2 and "head01 has no BMC address" in r.stderr
    r = provision("power", "status", "gpu[001-", "-f", str(spec), *state)
    assert r.returncode == 2 and "is not a host list" in r.stderr
    r = provision("power", "status", "lab", "-f", str(ROOT / "examples" / "lab.yaml"), *state)
    assert r.returncode == 2 and "network.bmc is not set" in r.stderr
    assert all("Traceback" not in x for x in (r.stdout, r.stderr))


def test_select_nodes_expands_hostlists_in_spec_order() -> None:
    nodes = expand_nodes(load_spec(ROOT / "examples" / "dgx-superpod.yaml"))
    chosen = pw.select_nodes(nodes, ["gpu[003,001-002]", "login02", "gpu002"])
    assert [n.name for n in chosen] == ["login02", "gpu001", "gpu002", "gpu003"]
    assert len(pw.select_nodes(nodes, ["mig"])) == 2
    with pytest.raises(UsageError, match="did you mean 'gpu032'"):
        pw.select_nodes(nodes, ["gpu033"])


def test_ipmitool_gets_the_password_only_through_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, object] = {}

    def fake_run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen["argv"], seen["env"] = argv, kwargs["env"]
        return subprocess.CompletedProcess(argv, 0, "Chassis Power is on\n", "")

    monkeypatch.setattr(pw.shutil, "which", lambda _: "/usr/bin/ipmitool")
    monkeypatch.setattr(pw.subprocess, "run", fake_run)
    assert pw.Ipmi("10.0.0.5", 623, pw.Credentials(USER, PASSWORD)).status() == "on"
    argv = seen["argv"]
    assert isinstance(argv, list) and "-E" in argv and PASSWORD not in " ".join(argv)
    assert seen["env"]["IPMI_PASSWORD"] == PASSWORD  # type: ignore[index]
    assert PASSWORD not in repr(pw.Credentials(USER, PASSWORD))


def test_ipmi_against_a_fake_bmc(tmp_path: Path) -> None:
    port = _free_port(socket.SOCK_DGRAM)
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.fakebmc", "ipmi", "127.0.0.2", str(port), USER, PASSWORD],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "listening":  # say why, not '' == 'listening'
            server.kill()
            _, stderr = server.communicate(timeout=10)
            pytest.fail(f"the fake IPMI BMC did not start (pyghmi is a dev dependency): {stderr}")
        time.sleep(0.2)
        spec = _spec(tmp_path, f"    cidr: 127.0.0.0/24\n    protocol: ipmi\n    port: {port}")
        state = tmp_path / "state"
        _login(spec, state)
        common = ("-f", str(spec), "--state-dir", str(state))
        r = provision("power", "status", "gpu001", *common)
        assert r.returncode == 0 and r.stdout.strip() == "ok gpu001 (127.0.0.2): off", r.stderr
        r = provision("power", "on", "gpu001", *common)
        assert r.returncode == 0 and "powered on" in r.stdout, r.stdout + r.stderr
        r = provision("power", "status", "gpu001", *common)
        assert r.stdout.strip() == "ok gpu001 (127.0.0.2): on"
        r = provision("power", "cycle", "gpu001", "--yes", *common)
        assert r.returncode == 0 and "power cycled" in r.stdout
        _login(spec, state, password="not-the-password")
        r = provision("power", "status", "gpu001", *common)
        assert r.returncode == 1 and "FAIL gpu001" in r.stdout
        assert "not-the-password" not in r.stdout + r.stderr
    finally:
        server.kill()
        server.wait()


class _Catcher:
    """A plain-HTTP listener on loopback that records any request (a redirect's target)."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, HTTPServer

        seen = self.seen = []  # type: list[str]

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                seen.append(
                    f"{self.headers.get('Authorization')} {self.headers.get('X-Auth-Token')}"
                )
                self.send_response(200)
                self.end_headers()

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/redfish/v1/Systems"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("behaviour", "says"),
    [
        ("redirect", "GET /redfish/v1/Systems: redirected (HTTP 302) to http://127.0.0.1:"),
        ("elsewhere", "the BMC named http://127.0.0.1:"),  # a link to another host
    ],
)
def test_redfish_redirects_are_not_followed_with_the_credentials(
    redfish: tuple[Path, Path, list[FakeRedfish]], behaviour: str, says: str
) -> None:
    spec, state, bmcs = redfish
    _login(spec, state)
    catcher = _Catcher()
    bmcs[0].behaviour, bmcs[0].redirect_to = behaviour, catcher.url
    try:
        r = provision("power", "status", "gpu", "-f", str(spec), "--state-dir", str(state))
    finally:
        catcher.close()
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"FAIL gpu001 (127.0.0.2): {says}"), lines
    assert "not followed" in lines[0]
    assert lines[1] == "ok gpu002 (127.0.0.3): off"
    assert catcher.seen == []  # nothing, and so no credentials, went to the redirect's target
    # each BMC's session, opened with the password, was used and closed again
    assert [list(b.sessions) for b in bmcs] == [["token-0"], ["token-0"]]
    assert [b.closed for b in bmcs] == [["token-0"], ["token-0"]]
    assert bmcs[1].token_uses >= 2  # the Systems collection and the system, with the token


@pytest.mark.parametrize(
    ("behaviour", "says"),
    [
        ("not-json", "the answer is not JSON"),
        ("no-odata", "the BMC lists no system"),  # its member has no @odata.id link
        ("huge", "GET /redfish/v1/Systems: an answer of 2,000,000 bytes"),
    ],
)
def test_a_bmc_answering_nonsense_gets_its_line_and_the_others_theirs(
    redfish: tuple[Path, Path, list[FakeRedfish]], behaviour: str, says: str
) -> None:
    spec, state, bmcs = redfish
    _login(spec, state)
    bmcs[0].behaviour = behaviour
    r = provision("power", "status", "gpu", "-f", str(spec), "--state-dir", str(state))
    assert r.returncode == 1 and "internal error" not in r.stderr, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("FAIL gpu001 (127.0.0.2): ") and says in lines[0], lines
    assert lines[1] == "ok gpu002 (127.0.0.3): off"


def test_a_trickling_bmc_cannot_hold_the_command_past_its_timeout(
    redfish: tuple[Path, Path, list[FakeRedfish]],
) -> None:
    spec, state, bmcs = redfish
    _login(spec, state)
    bmcs[0].behaviour = "trickle"
    # the trickle would take 100,000 s: the run's own timeout fails the test if it is followed
    r = provision(
        "power",
        "status",
        "gpu",
        "--timeout",
        "3",
        "-f",
        str(spec),
        "--state-dir",
        str(state),
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stdout.splitlines() == [
        "FAIL gpu001 (127.0.0.2): no answer within 3 s",
        "ok gpu002 (127.0.0.3): off",
    ]


def test_a_missing_ca_bundle_is_a_usage_error(tmp_path: Path) -> None:
    # a relative path is the spec's directory's, from any working directory
    spec = _spec(tmp_path, "    cidr: 127.0.0.0/24\n    ca_file: certs/bmc-ca.pem")
    state = tmp_path / "state"
    _login(spec, state)
    r = provision("power", "status", "gpu001", "-f", str(spec), "--state-dir", str(state))
    assert r.returncode == 2, r.stdout + r.stderr
    missing = spec.parent / "certs" / "bmc-ca.pem"
    assert r.stderr.strip() == f"error: network.bmc.ca_file: {missing} does not exist"


def test_what_a_bmc_says_reaches_the_terminal_as_one_plain_line(
    redfish: tuple[Path, Path, list[FakeRedfish]],
) -> None:
    spec, state, bmcs = redfish
    _login(spec, state)
    bmcs[0].power = "On\x1b[2J\nok gpu999 (1.2.3.4): on"
    r = provision("power", "status", "gpu", "-f", str(spec), "--state-dir", str(state))
    assert r.stdout.splitlines() == [
        "ok gpu001 (127.0.0.2): unknown (a PowerState Redfish does not define)",
        "ok gpu002 (127.0.0.3): off",
    ]
    # a header the BMC wrote, escape sequences and all, in the line that names it
    bmcs[0].behaviour, bmcs[0].redirect_to = "redirect", "https://x.example/\x1b[2Jgpu999"
    r = provision("power", "status", "gpu001", "-f", str(spec), "--state-dir", str(state))
    assert "\x1b" not in r.stdout and "to https://x.example/?[2Jgpu999: not followed" in r.stdout

"""Bursting without a cluster: hostlists, the rendered power-saving block and burst
configuration, the node-state parser on recorded scontrol output, the programs against a fake
backend and a recording scontrol, the lab backend against a fake podman API on a unix socket,
and the wheel the heads run them from."""

from __future__ import annotations

import io
import json
import os
import socketserver
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from provision.burst import programs, slurm
from provision.burst.backend import Backend
from provision.burst.config import parse_config
from provision.burst.hostlist import compress, expand
from provision.burst.podman_api import PodmanError
from provision.bursting import parse_sinfo
from provision.cluster import Cluster
from provision.render import render
from provision.run.wheel import build_wheel, package_files
from provision.spec import load_spec

from .conftest import ROOT, third_party_imports, with_burst_pool

DATA = ROOT / "tests" / "data" / "burst"
LAB_BURST = ROOT / "examples" / "lab-burst.yaml"


def _settings(path: Path, unbuilt: bool = False) -> dict[str, str]:
    conf = render(Cluster(load_spec(path, unbuilt=unbuilt)))["files/slurm/slurm.conf"]
    return dict(line.split("=", 1) for line in conf.splitlines() if "=" in line and " " not in line)


# --- hostlists --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("burst001", ["burst001"]),
        ("burst[001-003]", ["burst001", "burst002", "burst003"]),
        ("burst[001,003-004],head001", ["burst001", "burst003", "burst004", "head001"]),
        ("gpu-[8-10]", ["gpu-8", "gpu-9", "gpu-10"]),
        ("a[1-2]b", ["a1b", "a2b"]),
    ],
)
def test_hostlists_expand_as_slurm_writes_them(text: str, names: list[str]) -> None:
    assert expand(text) == names


@pytest.mark.parametrize("text", ["burst[001-", "burst[3-1]", "burst[a-b]", "x]"])
def test_a_broken_hostlist_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a hostlist"):
        expand(text)


def test_compress_inverts_expand() -> None:
    names = ["burst001", "burst002", "burst004", "head001", "login"]
    assert compress(names) == "burst[001-002,004],head001,login"
    assert expand(compress(names)) == names


# --- the render -------------------------------------------------------------------------------


def test_lab_burst_renders_the_power_saving_block() -> None:
    settings = _settings(LAB_BURST)
    assert settings["ResumeProgram"] == "/usr/local/libexec/provision/burst-resume"
    assert settings["SuspendProgram"] == "/usr/local/libexec/provision/burst-suspend"
    assert settings["ResumeFailProgram"] == "/usr/local/libexec/provision/burst-resume-fail"
    assert settings["SuspendTime"] == "90"  # slurm.suspend_time
    assert settings["ResumeTimeout"] == "600"
    assert settings["SuspendTimeout"] == "60"
    assert settings["SlurmctldParameters"] == "enable_configless,idle_on_node_suspend"
    assert settings["PrivateData"] == "cloud"
    assert settings["SuspendExcNodes"] == "compute001"  # the lasting node is never powered down
    conf = render(Cluster(load_spec(LAB_BURST)))["files/slurm/slurm.conf"]
    assert "NodeName=compute001 " in conf and "Weight=1 State=UNKNOWN" in conf
    assert "NodeName=burst[001-004] " in conf and "Weight=100 State=CLOUD" in conf


def test_a_cluster_without_elastic_pools_has_no_power_saving() -> None:
    files = render(Cluster(load_spec(ROOT / "examples" / "lab.yaml")))
    assert "ResumeProgram" not in files["files/slurm/slurm.conf"]
    assert "SuspendTime" not in files["files/slurm/slurm.conf"]
    assert "files/burst/burst.json" not in files
    assert "provision_burst" not in files["inventory/group_vars/all.yml"]


def test_cloud_burst_excludes_the_on_premises_nodes() -> None:
    settings = _settings(ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml", unbuilt=True)
    assert settings["SuspendExcNodes"] == "l40s-[001-004]"
    assert settings["SuspendTime"] == "600"
    # the clouds give burst nodes their addresses: Slurm takes them from the registration
    # (a lab pool's reserved addresses are known: not there, see the lab's test above)
    assert settings["SlurmctldParameters"] == (
        "enable_configless,idle_on_node_suspend,cloud_reg_addrs"
    )


def test_the_burst_configuration_names_every_elastic_node() -> None:
    files = render(Cluster(load_spec(LAB_BURST)))
    assert "provision_burst: true" in files["inventory/group_vars/all.yml"]
    config = parse_config(files["files/burst/burst.json"])
    assert config.cluster == "labburst" and config.conf_server == "head001:6817"
    assert config.cooldown == 120  # slurm.burst_cooldown
    pool = config.pools["burst"]
    assert pool.backend == "lab"
    assert pool.nodes == {f"burst00{i}": f"10.78.0.{12 + i}" for i in range(1, 5)}
    assert pool.lab is not None
    assert pool.lab.image == "localhost/provision-labburst-burst:latest"
    assert pool.lab.network == "provision-labburst"
    assert pool.lab.label == "provision.cluster=labburst"
    assert config.pool_of("compute001") is None
    assert config.to_json() == files["files/burst/burst.json"]


def _lab_ha_burst(tmp_path: Path) -> Path:
    spec = tmp_path / "lab-ha-burst.yaml"
    spec.write_text(with_burst_pool((ROOT / "examples" / "lab-ha.yaml").read_text()))
    return spec


def test_an_ha_pair_bursts_from_either_head(tmp_path: Path) -> None:
    """Two heads with an elastic pool: the spec is taken, both heads get the programs (the
    burst play is for every head), and a burst node asks the primary, then the backup."""
    files = render(Cluster(load_spec(_lab_ha_burst(tmp_path))))
    config = parse_config(files["files/burst/burst.json"])
    assert config.conf_server == "head001:6817,head002:6817"
    assert config.controllers == ["head001", "head002"]
    conf = files["files/slurm/slurm.conf"]
    assert "SlurmctldHost=head001\nSlurmctldHost=head002\n" in conf
    assert "ResumeProgram=/usr/local/libexec/provision/burst-resume" in conf


# --- Slurm's view -----------------------------------------------------------------------------


def test_the_controller_in_charge_from_scontrol_ping() -> None:
    both = (DATA / "scontrol-ping-both-up.txt").read_text()
    assert slurm.parse_ping(both) == [("head001", True), ("head002", True)]
    assert slurm.in_control(both) == "head001"
    assert slurm.in_control((DATA / "scontrol-ping-primary-down.txt").read_text()) == "head002"
    assert slurm.in_control("Slurmctld(primary) at head001 is DOWN\n") is None
    assert slurm.in_control("") is None


def test_node_states_from_recorded_scontrol() -> None:
    states = slurm.parse_node_states((DATA / "scontrol-show-node-up.txt").read_text())
    assert states == {"burst001": {"IDLE", "CLOUD"}, "burst002": {"IDLE", "CLOUD"}}
    assert slurm.expected_up(states["burst001"])
    assert not slurm.expected_up({"IDLE", "CLOUD", "POWERED_DOWN"})
    assert slurm.powered_down({"IDLE", "CLOUD", "POWERED_DOWN"})
    assert not slurm.powered_down({"ALLOCATED", "CLOUD", "POWERED_DOWN", "POWERING_UP"})
    down = slurm.parse_node_states((DATA / "scontrol-show-node-powered-down.txt").read_text())
    assert sorted(down) == [f"burst00{i}" for i in range(1, 5)]
    assert all(slurm.powered_down(flags) for flags in down.values())
    assert down["burst001"] == {"IDLE", "CLOUD", "POWERED_DOWN"}


# --- the programs -----------------------------------------------------------------------------


class FakeBackend(Backend):
    """Records what the programs ask; nodes in `broken` fail to start with `error`."""

    def __init__(self, broken: set[str] = frozenset(), error: str = "image missing") -> None:
        super().__init__()
        self.broken, self.error = broken, error
        self.made: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))
        if node in self.broken:
            raise PodmanError(self.error)
        self.made.add(node)

    def suspend(self, node: str) -> bool:
        self.calls.append(("suspend", node))
        there = node in self.made
        self.made.discard(node)
        return there

    def states(self) -> dict[str, str]:
        return dict.fromkeys(self.made, "running")


@pytest.fixture
def config() -> object:
    return parse_config(render(Cluster(load_spec(LAB_BURST)))["files/burst/burst.json"])


def _with_backend(monkeypatch: pytest.MonkeyPatch, backend: FakeBackend) -> list[str]:
    """The programs use `backend`; returns the list their log lines go to."""
    monkeypatch.setattr(programs, "backend_for", lambda pool: backend)
    return []


def test_resume_makes_every_node_and_logs_one_line_each(
    config: object, scontrol: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = FakeBackend()
    log = _with_backend(monkeypatch, backend)
    assert programs.resume(config, expand("burst[001-002]"), log.append) == 0
    assert backend.made == {"burst001", "burst002"}
    assert len(log) == 2 and all(" resume ok (burst, " in line for line in log)
    assert not scontrol.exists()  # nothing marked down


def test_a_failed_resume_marks_the_nodes_down_with_the_cause(
    config: object, scontrol: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = FakeBackend(broken={"burst002", "burst003"}, error="HTTP 404: no such image")
    log = _with_backend(monkeypatch, backend)
    assert programs.resume(config, expand("burst[001-003]"), log.append) == 1
    assert backend.made == {"burst001"}
    assert [line.split()[0:3] for line in log] == [
        ["burst001", "resume", "ok"],
        ["burst002", "resume", "failed"],
        ["burst003", "resume", "failed"],
    ]
    assert scontrol.read_text().splitlines() == [
        "update NodeName=burst[002-003] State=DOWN "
        "Reason=burst resume failed: HTTP 404: no such image"
    ]


def test_suspend_removes_and_says_what_was_not_there(
    config: object, scontrol: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = FakeBackend()
    backend.made = {"burst001"}
    log = _with_backend(monkeypatch, backend)
    assert programs.suspend(config, ["burst001", "burst002", "compute001"], log.append) == 0
    assert backend.made == set()
    assert log == [
        "compute001 skip: not a node of an elastic pool of this cluster",
        "burst001 suspend ok (burst)",
        "burst002 suspend ok (burst, was not there)",
    ]


def test_resume_fail_cleans_up_and_leaves_a_reason(
    config: object, scontrol: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = FakeBackend()
    backend.made = {"burst003"}
    log = _with_backend(monkeypatch, backend)
    programs.resume_fail(config, ["burst003"], log.append)
    assert backend.made == set()
    assert "Reason=burst: no slurmd registration within ResumeTimeout" in scontrol.read_text()


def test_reconcile_removes_orphans_and_marks_vanished_nodes_down(
    config: object, scontrol: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # burst001: Slurm has it powered down, yet a container runs (an orphan);
    # burst002: Slurm runs a job there, its container is gone (killed);
    # burst003: powering up, no container yet (resume in flight: left alone);
    # burst004: powered down, no container (as it should be)
    (tmp_path / "states").write_text(
        "NodeName=burst001 State=IDLE+CLOUD+POWERED_DOWN Weight=100\n"
        "NodeName=burst002 State=ALLOCATED+CLOUD Weight=100\n"
        "NodeName=burst003 State=ALLOCATED+CLOUD+POWERING_UP Weight=100\n"
        "NodeName=burst004 State=IDLE+CLOUD+POWERED_DOWN Weight=100\n"
    )
    backend = FakeBackend()
    backend.made = {"burst001"}
    log = _with_backend(monkeypatch, backend)
    assert programs.reconcile(config, log.append) == 0
    assert backend.made == set()
    assert log == [
        "burst001 reconcile: orphan removed (Slurm has it powered down)",
        "burst002 reconcile: instance or container gone while Slurm has it up",
    ]
    calls = scontrol.read_text().splitlines()
    assert calls[-1] == (
        "update NodeName=burst002 State=DOWN "
        "Reason=burst: node vanished (container or instance gone)"
    )


@pytest.mark.parametrize(
    ("ping", "acting"),
    [
        ("scontrol-ping-both-up.txt", "head001"),
        ("scontrol-ping-primary-down.txt", "head002"),
        (None, None),  # no controller answers: neither head acts
    ],
)
def test_with_two_heads_only_the_controller_in_charge_reconciles(
    ping: str | None,
    acting: str | None,
    scontrol: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    config = parse_config(
        render(Cluster(load_spec(_lab_ha_burst(tmp_path))))["files/burst/burst.json"]
    )
    if ping is not None:
        (tmp_path / "ping").write_text((DATA / ping).read_text())
    (tmp_path / "states").write_text("NodeName=burst001 State=IDLE+CLOUD+POWERED_DOWN Weight=100\n")
    for head in ("head001", "head002"):
        backend = FakeBackend()
        backend.made = {"burst001"}  # an orphan: the head that acts removes it
        log = _with_backend(monkeypatch, backend)
        assert programs.reconcile(config, log.append, host=head) == 0
        if head == acting:
            assert log == ["burst001 reconcile: orphan removed (Slurm has it powered down)"]
            assert backend.made == set()
        else:
            assert log == [] and backend.made == {"burst001"}, head


def test_reconcile_returns_nodes_that_failed_to_start_after_the_cooldown(
    config: object, scontrol: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    recorded = (DATA / "scontrol-show-node-resume-failed.txt").read_text()
    (tmp_path / "states").write_text(recorded)
    reasons = slurm.parse_reasons(recorded)
    assert sorted(reasons) == ["burst002", "burst003"]
    text, since = reasons["burst002"]
    assert text.startswith("burst resume failed: HTTP 500: ") and text.endswith("image not known")
    log = _with_backend(monkeypatch, FakeBackend())
    # within the cooldown (lab-burst.yaml: 120 s): left down
    assert programs.reconcile(config, log.append, now=since + 119) == 0
    assert log == [] and not scontrol.read_text().count("update")
    # after it: powered down to idle~, which clears DOWN and lets Slurm try them again
    assert programs.reconcile(config, log.append, now=since + 120) == 0
    assert log == [
        "burst002 reconcile: cooldown of 120s over, powered down to idle~",
        "burst003 reconcile: cooldown of 120s over, powered down to idle~",
    ]
    assert scontrol.read_text().splitlines()[-1] == (
        "update NodeName=burst[002-003] State=POWER_DOWN_FORCE"
    )


# --- the lab backend against a fake podman API ------------------------------------------------


class _API(BaseHTTPRequestHandler):
    calls: list[tuple[str, str, bytes]]
    fail_start = False

    def _reply(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _record(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.calls.append((self.command, self.path, self.rfile.read(length)))

    def do_POST(self) -> None:
        self._record()
        if self.path.endswith("/start") and self.fail_start:
            self._reply(500, b'{"message": "runc: cannot start"}')
        else:
            self._reply(201 if self.path.endswith("/create") else 204)

    def do_PUT(self) -> None:
        self._record()
        self._reply(200)

    def do_DELETE(self) -> None:
        self._record()
        self._reply(404, b'{"message": "no such container"}')

    def log_message(self, *args: object) -> None:
        pass


class _UnixHTTP(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):  # type: ignore[no-untyped-def]
        request, _ = super().get_request()
        return request, ("local", 0)  # http.server wants a (host, port) client address


@pytest.fixture
def fake_api(tmp_path: Path) -> Iterator[tuple[str, type[_API]]]:
    handler = type("Handler", (_API,), {"calls": [], "fail_start": False})
    path = str(tmp_path / "podman.sock")
    server = _UnixHTTP(path, handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield path, handler
    server.shutdown()
    server.server_close()


def _lab_backend(config: object, socket_path: str, key: Path) -> programs.LabBackend:
    pool = config.pools["burst"]  # type: ignore[attr-defined]
    lab = pool.lab.__class__(**{**pool.lab.__dict__, "socket": socket_path})
    return programs.LabBackend(pool.__class__(pool.name, pool.backend, pool.nodes, lab), key)


def test_lab_resume_creates_uploads_the_key_and_starts(
    config: object, fake_api: tuple[str, type[_API]], tmp_path: Path
) -> None:
    socket_path, handler = fake_api
    key = tmp_path / "munge.key"
    key.write_bytes(b"k" * 1024)
    _lab_backend(config, socket_path, key).resume("burst002")
    methods = [(m, p.split("?")[0]) for m, p, _ in handler.calls]
    assert methods == [
        ("DELETE", "/v4.0.0/libpod/containers/provision-labburst-burst002"),
        ("POST", "/v4.0.0/libpod/containers/create"),
        ("PUT", "/v4.0.0/libpod/containers/provision-labburst-burst002/archive"),
        ("POST", "/v4.0.0/libpod/containers/provision-labburst-burst002/start"),
    ]
    body = json.loads(handler.calls[1][2])
    assert body["name"] == "provision-labburst-burst002" and body["hostname"] == "burst002"
    assert body["image"] == "localhost/provision-labburst-burst:latest"
    assert body["Networks"] == {"provision-labburst": {"static_ips": ["10.78.0.14"]}}
    assert body["labels"]["provision.cluster"] == "labburst"
    assert body["systemd"] == "always" and body["use_image_hosts"] is True
    assert "munge" not in json.dumps(body)  # the key is never in what creates the node
    assert handler.calls[2][1].endswith("archive?path=%2Fetc%2Fmunge")
    with tarfile.open(fileobj=io.BytesIO(handler.calls[2][2])) as tar:
        (member,) = tar.getmembers()
        assert member.name == "munge.key" and member.mode == 0o400
        assert tar.extractfile(member).read() == b"k" * 1024  # type: ignore[union-attr]


def test_lab_resume_that_cannot_start_leaves_nothing(
    config: object, fake_api: tuple[str, type[_API]], tmp_path: Path
) -> None:
    socket_path, handler = fake_api
    handler.fail_start = True
    key = tmp_path / "munge.key"
    key.write_bytes(b"k")
    with pytest.raises(PodmanError, match="HTTP 500: runc: cannot start"):
        _lab_backend(config, socket_path, key).resume("burst001")
    assert handler.calls[-1][0] == "DELETE"  # removed again


def test_no_podman_api_is_a_clear_error(config: object, tmp_path: Path) -> None:
    backend = _lab_backend(config, str(tmp_path / "absent.sock"), tmp_path / "k")
    with pytest.raises(PodmanError, match=r"no podman API at .*absent\.sock"):
        backend.suspend("burst001")


# --- the wheel the heads run --------------------------------------------------------------------


def test_the_wheel_is_the_same_bytes_each_time_and_runs_with_the_standard_library(
    tmp_path: Path,
) -> None:
    first = build_wheel(tmp_path / "a")
    second = build_wheel(tmp_path / "b")
    assert first.name == "gpu_provision-0.1.0-py3-none-any.whl"
    assert first.read_bytes() == second.read_bytes()
    assert third_party_imports(first, "provision.burst.__main__") == []
    usage = subprocess.run(
        [sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "from provision.burst.__main__ import main; sys.exit(main(sys.argv[2:]))",
         str(first), "resume"],
        capture_output=True, text=True, check=False, env={**os.environ},
    )  # fmt: skip
    assert usage.returncode == 2 and usage.stderr.startswith("usage:")


# --- burst status -------------------------------------------------------------------------------


def test_status_from_recorded_sinfo() -> None:
    cluster = Cluster(load_spec(LAB_BURST))
    (pool,) = parse_sinfo((DATA / "sinfo-two-up.txt").read_text(), cluster)
    assert (pool.pool, pool.nodes) == ("burst", 4)
    assert pool.up == ["burst001", "burst002"] and pool.powered_down == ["burst003", "burst004"]
    assert pool.down == {} and pool.usd_per_hour is None  # a lab node has no price
    text = (
        "burst001|burst|down~|burst resume failed: HTTP 404: no such image\n"
        "burst002|burst|alloc#|none\nburst003|burst|idle%|none\nburst004|burst|mix|none\n"
        "burst004|other|mix|none\ncompute001|compute*|idle|none\n"
    )
    (pool,) = parse_sinfo(text, cluster)
    assert pool.down == {"burst001": "burst resume failed: HTTP 404: no such image"}
    assert pool.powering_up == ["burst002"] and pool.powering_down == ["burst003"]
    assert pool.up == ["burst004"]


def test_status_prices_cloud_nodes_that_are_up() -> None:
    cluster = Cluster(
        load_spec(ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml", unbuilt=True)
    )
    text = "aws-h100-001|awsh100|alloc|none\naws-h100-002|awsh100|idle#|none\n"
    aws = next(p for p in parse_sinfo(text, cluster) if p.pool == "awsh100")
    price = cluster.profiles["aws-p5.48xlarge"].price
    assert price is not None and aws.usd_per_hour == pytest.approx(2 * price.usd_per_hour)


SINFO_SSH = """#!/bin/sh
printf '%s\\n' "$@" > "$(dirname "$0")/argv"
cat <<'END'
burst001|burst|alloc|none
burst002|burst|down~|burst resume failed: HTTP 404: no such image
burst003|burst|idle~|none
burst004|burst|idle~|none
compute001|compute*|idle|none
---
2026-11-30T17:04:28+0000 burst001 resume ok (burst, 0.4s)
END
"""


def _burst_status(spec: Path, tmp_path: Path, tools: dict[str, str]) -> CompletedProcess[str]:
    """`provision burst status` with these stand-ins (name -> script) first on PATH, in
    tmp_path/bin."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in tools.items():
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    return subprocess.run(
        [sys.executable, "-m", "provision", "burst", "status", "-f", str(spec),
         "--state-dir", str(tmp_path / "state")],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def test_burst_status_reads_the_head_over_ssh(tmp_path: Path) -> None:
    r = _burst_status(LAB_BURST, tmp_path, {"ssh": SINFO_SSH})
    bindir = tmp_path / "bin"
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("│ burst "))
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert cells[:7] == [
        "burst", "4", "1 burst001", "0", "0", "2 burst[003-004]",
        "burst002 (burst resume failed: HTTP 404: no such image)",
    ]  # fmt: skip
    assert r.stdout.rstrip().endswith("burst001 resume ok (burst, 0.4s)")
    argv = (bindir / "argv").read_text().splitlines()
    assert argv[argv.index("--") + 1] == "10.78.0.11"  # the head
    assert "-oBatchMode=yes" in argv


# ssh that runs what it was asked to in a shell here, with stand-in sinfo and sudo on PATH
SHELL_SSH = """#!/bin/sh
for last; do :; done
printf '%s\\n' "$last" > "$(dirname "$0")/command"
exec sh -c "$last"
"""
SINFO = """#!/bin/sh
echo 'burst001|burst|down~|burst resume failed: [/bold] not a style'
echo 'compute001|compute*|idle|none'
"""
SUDO = """#!/bin/sh
[ "$1" = -n ] && shift
echo sudo >> "$(dirname "$0")/sudo.log"
exec "$@"
"""


def test_burst_status_before_any_log_as_a_non_root_login_with_a_reason_in_brackets(
    tmp_path: Path,
) -> None:
    """No burst log yet (no node resumed) is an empty log, not a failure; the root-only log
    is read through sudo when the head's login user is not root; Slurm's reason is printed as
    text, not read as rich markup."""
    spec = tmp_path / "burst.yaml"
    spec.write_text(
        LAB_BURST.read_text().replace("name: labburst", "name: labburst\nssh: {user: ops}")
    )
    r = _burst_status(spec, tmp_path, {"ssh": SHELL_SSH, "sinfo": SINFO, "sudo": SUDO})
    bindir = tmp_path / "bin"
    assert r.returncode == 0, r.stdout + r.stderr
    assert "burst001 (burst resume failed: [/bold] not a style)" in " ".join(r.stdout.split())
    command = (bindir / "command").read_text()
    assert "sudo -n tail -n" in command, command
    assert (bindir / "sudo.log").read_text() == "sudo\n"  # the log was asked for, through sudo


def test_burst_status_of_a_cluster_without_elastic_pools_says_so(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "provision", "burst", "status", "-f", "examples/lab.yaml",
         "--state-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1 and "no elastic pool" in r.stderr


def test_a_partition_over_several_pools_fills_lasting_nodes_first() -> None:
    conf = render(Cluster(load_spec(LAB_BURST)))["files/slurm/slurm.conf"]
    parts = [line for line in conf.splitlines() if line.startswith("PartitionName=")]
    assert parts == [
        "PartitionName=compute Nodes=compute001 Default=NO MaxTime=INFINITE State=UP",
        "PartitionName=burst Nodes=burst[001-004] Default=NO MaxTime=INFINITE State=UP",
        "PartitionName=all Nodes=compute001,burst[001-004] Default=YES MaxTime=INFINITE State=UP",
    ]


def test_elastic_pools_fill_cheapest_first_after_the_lasting_nodes() -> None:
    conf = render(
        Cluster(load_spec(ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml", unbuilt=True))
    )["files/slurm/slurm.conf"]
    weights = {
        line.split()[0].split("=")[1]: int(line.split("Weight=")[1].split()[0])
        for line in conf.splitlines()
        if line.startswith("NodeName=")
    }
    # on premises 1; AWS p5 at $55.04/h, GCP a3 at $88.25/h, Azure ND H100 v5 at $98.32/h
    assert weights == {
        "l40s-[001-004]": 1,
        "aws-h100-[001-016]": 5604,
        "gcp-h100-[001-008]": 8925,
        "az-h100-[001-008]": 9932,
    }


def test_the_heads_wheel_leaves_out_what_only_the_workstation_runs(tmp_path: Path) -> None:
    """An installed package carries the collection and the templates inside it; the heads'
    wheel is the same without them, from a checkout or from an install."""
    for rel in (
        "ansible_collections/gpu_provision/cluster/roles/x/tasks/main.yml",
        "render/templates/slurm.conf.j2",
        "render/jinja.py",
        "burst/__main__.py",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x\n")
    names = [name for name, _ in package_files(tmp_path)]
    assert names == ["provision/burst/__main__.py", "provision/render/jinja.py"]

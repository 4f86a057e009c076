"""The embedded default end to end, as a user runs it: apply, verify, a second apply that
changes nothing, a node stopped in the middle of an apply, and destroy leaving nothing behind.

The spec is examples/lab.yaml itself, renamed and moved to its own network so a developer's
own lab is never touched.
"""

from __future__ import annotations

import json
import secrets
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jinja2
import pytest
import yaml

from provision import converged
from provision.burst.config import LAB_LABEL, lab_network
from provision.parsers.dcgm import DIAG_TIMEOUT_S
from provision.providers.lab import podman

from ..conftest import COLLECTION, ROOT
from ..conftest import run_provision as provision
from ..fakesmtp import FakeRelay, Mail
from ..test_monitoring import DASHBOARDS, panel_queries
from .conftest import user_login
from .directory import READER, SUFFIX, Directory, Person, ssh_key, start_directory

NAME = "labtest"


def _leftovers() -> tuple[str, bool]:
    containers = podman.text(
        "ps", "-a", "--filter", f"label=provision.cluster={NAME}", "--format", "{{.Names}}"
    )
    return containers, podman.network_exists(f"provision-{NAME}")


class _Receiver(ThreadingHTTPServer):
    """Alertmanager's webhook receiver: every notification it POSTs, with when it came."""

    def __init__(self) -> None:
        self.received: list[tuple[float, dict]] = []  # type: ignore[type-arg]
        super().__init__(("0.0.0.0", 0), _Hook)  # the lab reaches this machine at 10.76.0.1

    def alerts(self, name: str, node: str, status: str = "firing") -> list[float]:
        """When each notification carrying that alert for that node came."""
        return [
            at
            for at, body in self.received
            for alert in body.get("alerts", [])
            if alert["labels"].get("alertname") == name
            and alert["labels"].get("node") == node
            and alert["status"] == status
        ]


class _Hook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # the standard library's name for it
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        assert isinstance(self.server, _Receiver)
        self.server.received.append((time.monotonic(), json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[_Receiver]:
    server = _Receiver()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def relay() -> Iterator[FakeRelay]:
    """The mail receiver's SMTP relay, on this machine (the lab reaches it at 10.76.0.1)."""
    server = FakeRelay().start()
    yield server
    server.stop()


# the relay's password for the mail receiver: a file on the workstation, as a user keeps it
RELAY_PASSWORD = secrets.token_urlsafe(18)


@pytest.fixture(scope="module")
def lab(
    lab_image: str,
    receiver: _Receiver,
    relay: FakeRelay,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Path, Path]]:
    work = tmp_path_factory.mktemp("lab")
    spec = work / "lab.yaml"
    hook = f"http://10.76.0.1:{receiver.server_address[1]}/alerts"
    password_file = work / "relay.password"
    password_file.write_text(RELAY_PASSWORD + "\n")
    password_file.chmod(0o600)
    mail = (
        "{name: mail, email: {to: oncall@lab.test, sender: alertmanager@lab.test, "
        f"smarthost: '10.76.0.1:{relay.server_address[1]}', require_tls: false, "
        f"username: alerts, password_file: '{password_file}'}}}}"
    )
    text = (
        (ROOT / "examples" / "lab.yaml")
        .read_text()
        .replace("name: lab", f"name: {NAME}")
        .replace("10.77.0.", "10.76.0.")
    )
    monitoring = "\nmonitoring: {}"
    assert monitoring in text
    receivers = f"\nmonitoring: {{receivers: [{{name: test, webhook: '{hook}'}}, {mail}]}}"
    assert "\n  interval: 60\n" in text  # health: a shorter interval, for the health test
    admin = f"    - name: {NAME}admin\n"  # labadmin, renamed with the cluster
    assert admin in text  # its home is on the shared /home below: a pinned uid
    accounting = "  accounting: true\n"
    assert accounting in text
    spec.write_text(
        text.replace(monitoring, receivers)
        .replace("\n  interval: 60\n", "\n  interval: 15\n")
        .replace(admin, admin + "      uid: 1500\n")
        .replace(accounting, accounting + ACCOUNTS)
        + _users(work)
    )
    provision("destroy", str(spec), "--yes", cwd=work)  # a crashed earlier run's leftovers
    # the directory before the cluster: on the lab's network, made as the lab provider makes
    # it (it finds the network there, with the spec's subnet, and uses it)
    podman.podman("network", "create", "--subnet", "10.76.0.0/24", "--gateway", "10.76.0.1",
                  "--label", f"{LAB_LABEL}={NAME}", lab_network(NAME))  # fmt: skip
    people = [
        Person("dora", 5001, ("hpc",), ssh_key(work, "dora")),
        Person("eve", 5002, (), ssh_key(work, "eve")),  # outside the allowed group
        # a directory entry by the name of a local admin, with a key of its own
        Person(f"{NAME}admin", 5003, ("hpc",), ssh_key(work, "mallory")),
    ]
    directory = start_directory(
        lab_image, DIRECTORY, lab_network(NAME), DIRECTORY_ADDRESS, work, people, {"hpc": 5100}
    )
    spec.write_text(spec.read_text() + _identity(directory))
    yield spec, work
    provision("destroy", str(spec), "--yes", cwd=work)
    podman.podman("rm", "-f", "-t", "0", DIRECTORY, check=False)


DIRECTORY = f"{NAME}-directory"
DIRECTORY_ADDRESS = "10.76.0.250"


def _identity(directory: Directory) -> str:
    return f"""identity:
  uris: [{directory.uri}]
  base_dn: "{SUFFIX}"
  ca_file: {directory.ca_file.name}
  bind_dn: "{READER}"
  bind_password_file: {directory.password_file.name}
  allowed_groups: [hpc]
"""


def _without_identity(text: str) -> str:
    """The spec without its directory (the last section) and the directory's user dora."""
    return text[: text.index("identity:\n")].replace("[ana, dora]", "[ana]")


def _users(work: Path) -> str:
    """Two users with their own keys, a group, and /home shared by every node (a volume the
    head serves, as an NFS export of the spec would be)."""
    keys = []
    for user in USERS:
        key = work / user
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", user, "-f", str(key)],
                       check=True)  # fmt: skip
        keys.append(key.with_suffix(".pub").read_text().strip())
    return f"""storage:
  exports: [{{pool: head, path: /srv/home}}]
  mounts: [{{source: "head001:/srv/home", path: /home}}]
groups: [{{name: vision, gid: 3000}}]
users:
  - {{name: ana, uid: 2001, groups: [vision], ssh_keys: ["{keys[0]}"]}}
{BEN}: ["{keys[1]}"]}}
  - {{name: cid, uid: 2003}}  # in no account: refused at submit
"""


USERS = ("ana", "ben")
BEN = "  - {name: ben, uid: 2002, ssh_keys"
# ana's account may ask for QoS small, which holds one node at most
ACCOUNTS = """  qos: [{name: small, priority: 10, grp_tres: {node: 1}}]
  accounts:
    - {name: research, fairshare: 100}
    - {name: vision, parent: research, fairshare: 60, users: [ana, dora], qos: [normal, small]}
    - {name: speech, parent: research, fairshare: 40, users: [ben]}
"""


def _report(work: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((work / ".provision" / NAME / "last-apply.json").read_text())


def test_cold_apply(lab: tuple[Path, Path]) -> None:
    spec, work = lab
    r = provision("apply", str(spec), cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "verify: 42 passed, 0 failed" in r.stdout  # users, the directory, MPI
    for line in (
        "PASS srun compute[001-002]: job",
        "PASS sacct job",
        "PASS slurm ports from workstation head001: closed: 6817 filtered, 6818 filtered, "
        "6819 filtered, 3306 filtered",
        "PASS slurmd port from head compute002: 6818 open",
        "PASS munge.key compute001: mode 400 munge:munge",
    ):
        assert line in r.stdout
    report = _report(work)
    assert set(report["phases"]) == {"nodes", "preflight", "ansible", "verify"}
    # each node's first converge: the later roles' packages (munge, Slurm with Open MPI and the
    # runtime, the node exporter, Prometheus and Alertmanager) in one apt transaction, none
    # installed by its role apart
    outcomes: dict[str, dict[str, bool]] = {}
    for event in converged.read_events(Path(report["log_dir"])):
        data = event["event_data"]
        if event["event"] in ("runner_on_ok", "runner_on_skipped"):
            task = outcomes.setdefault(str(data["task"]), {})
            task[str(data["host"])] = event["event"] == "runner_on_ok"
    nodes = {"head001": True, "compute001": True, "compute002": True}
    assert outcomes["Install them in one transaction, without what they only recommend"] == nodes
    for install in (
        "Install munge",
        "Install the Slurm packages, Open MPI and the OCI runtime this node needs (Debian, Ubuntu)",
        "Install the node exporter",
    ):
        assert outcomes[install] == dict.fromkeys(nodes, False), install
    assert outcomes["Install Prometheus and Alertmanager"] == {"head001": False}
    # the firewall's nftables came with chrony, in the first play's one apt run
    assert outcomes["Refresh the apt cache and install chrony"] == nodes
    assert outcomes["Install nftables"] == dict.fromkeys(nodes, False)
    # a daemon the run started from stopped read the files written before it: not restarted
    # (or reloaded) after; the node exporter, which its package started before its drop-in was
    # written, is
    for handler in ("Restart chrony", "Reload nftables", "Restart slurmctld", "Restart slurmd"):
        assert outcomes[handler] == dict.fromkeys(nodes, False), handler
    assert outcomes["Restart slurmdbd"] == {"head001": False}
    assert outcomes["Restart the node exporter"] == nodes
    state = work / ".provision" / NAME
    for secret in ("secrets/munge.key", "secrets/slurmdbd.password", "keys/id_ed25519"):
        assert oct((state / secret).stat().st_mode & 0o777) == "0o600", secret
    # the secrets never reach the output or the run logs
    password = (state / "secrets" / "slurmdbd.password").read_text()
    bind = (work / "directory-bind.password").read_text().strip()
    for secret in (password, RELAY_PASSWORD, bind):
        assert secret not in r.stdout + r.stderr
        for log in (state / "logs").rglob("*"):
            if log.is_file():
                assert secret not in log.read_text(errors="replace"), log
    # the relay's password: Alertmanager's group reads it on the head, its configuration has
    # only the file's name
    copy = podman.text(
        "exec",
        f"provision-{NAME}-head001",
        "stat",
        "-c",
        "%a %U:%G",
        "/etc/prometheus/smtp-mail.password",
    )
    assert copy.strip() == "640 root:prometheus"
    config = podman.text(
        "exec", f"provision-{NAME}-head001", "cat", "/etc/prometheus/alertmanager.yml"
    )
    assert "auth_password_file: /etc/prometheus/smtp-mail.password" in config
    assert RELAY_PASSWORD not in config


@pytest.fixture(scope="module")
def prometheus(lab: tuple[Path, Path]) -> Iterator[int]:
    """head001's Prometheus as an admin reaches it: through `provision ssh --forward`, its
    port on the head's loopback forwarded to one of this machine's; the local port."""
    spec, work = lab
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    forward = subprocess.Popen(
        [sys.executable, "-m", "provision", "ssh", "-f", str(spec), "--forward", f"{port}:9090",
         "head001"],
        cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                break
            except OSError:
                assert forward.poll() is None, forward.communicate()[1]
                assert time.monotonic() < deadline, "the forward never listened"
                time.sleep(0.5)
        yield port
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def _prometheus(port: int, path: str) -> dict:  # type: ignore[type-arg]
    """Prometheus' HTTP API on head001, through the admin's SSH forward."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
        data: dict = json.load(answer)  # type: ignore[type-arg]
    return data["data"]  # type: ignore[no-any-return]


def test_prometheus_and_alertmanager_answer_the_heads_loopback_alone(
    lab: tuple[Path, Path],
) -> None:
    """Not this machine (an admin address), not a compute node where jobs run: no network
    reaches them, so no job can read the receivers or silence an alert."""
    spec, work = lab
    listening = _on(spec, work, "head001", "ss -Hltn '( sport = :9090 or sport = :9093 )'")
    assert sorted(line.split()[3] for line in listening.splitlines()) == [
        "127.0.0.1:9090", "127.0.0.1:9093",
    ], listening  # fmt: skip
    for port in (9090, 9093):
        with pytest.raises(OSError):  # dropped by the firewall, and nothing listens there
            socket.create_connection(("10.76.0.11", port), timeout=3).close()
    probe = (
        'python3 -c "import socket; s = socket.socket(); s.settimeout(3); '
        "print(s.connect_ex(('10.76.0.11', 9093)))\" 2>/dev/null || echo dropped"
    )
    assert _on(spec, work, "compute001", probe) != "0"  # a job's view: refused or dropped
    # on the head itself, its loopback: root (and the admins) connect, any other user is reset
    connect = (
        'python3 -c "import socket; s = socket.socket(); s.settimeout(3); '
        "print(s.connect_ex(('127.0.0.1', 9093)))\""
    )
    assert _on(spec, work, "head001", connect) == "0"
    guest = f"id guest >/dev/null 2>&1 || useradd -m guest; runuser -u guest -- {connect}"
    assert _on(spec, work, "head001", guest) == "111"  # ECONNREFUSED: the guard's reset


def test_prometheus_scrapes_every_node_and_loads_the_rules(
    lab: tuple[Path, Path], prometheus: int
) -> None:
    deadline = time.monotonic() + 60
    while True:
        targets = _prometheus(prometheus, "/api/v1/targets")["activeTargets"]
        # .get: a target without its node label shows in the assertion below, not as a KeyError
        health = {(t["labels"]["job"], t["labels"].get("node")): t["health"] for t in targets}
        if set(health.values()) == {"up"} or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert health == {
        ("prometheus", "head001"): "up",
        ("alertmanager", "head001"): "up",
        ("node", "head001"): "up",
        ("node", "compute001"): "up",
        ("node", "compute002"): "up",
    }
    groups = {
        g["name"]: len(g["rules"]) for g in _prometheus(prometheus, "/api/v1/rules")["groups"]
    }
    assert groups == {
        "provision-node": 6,
        "provision-gpu": 8,
        "provision-fabric": 3,
        "provision-health": 2,
        "provision-slurm": 5,
        "provision-cluster": 3,
    }
    # every scraped series names its node: none from the packages' own configuration (their
    # install starts neither Prometheus nor Alertmanager), whose series a restart leaves behind
    query = urllib.parse.urlencode({"query": '{job!="", node=""}'})
    assert _prometheus(prometheus, f"/api/v1/query?{query}")["result"] == []
    # the head's Slurm metrics name the compute nodes they are about
    expected = {"compute001": ("idle", None), "compute002": ("idle", None)}
    deadline = time.monotonic() + 60
    while True:
        query = urllib.parse.urlencode({"query": "slurm_node_state"})
        series = [m["metric"] for m in _prometheus(prometheus, f"/api/v1/query?{query}")["result"]]
        found = {m.get("node"): (m.get("state"), m.get("pool")) for m in series}
        if found == expected or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert found == expected, series
    # the exporters answer the monitoring node only: from this machine, nothing
    with pytest.raises(TimeoutError):  # dropped by the firewall, not refused
        socket.create_connection(("10.76.0.12", 9100), timeout=3).close()


def test_verify_passes_while_a_job_occupies_a_node_and_speaks_json(lab: tuple[Path, Path]) -> None:
    spec, work = lab
    job = _on(spec, work, "head001", "sbatch --parsable -w compute001 --wrap 'sleep 300'")
    try:
        assert _until(spec, work, f"squeue -h -j {job} -o %T", "RUNNING") == "RUNNING"
        r = provision("verify", str(spec), "--json", cwd=work)
        assert r.returncode == 0, r.stdout + r.stderr
        checks = [json.loads(line) for line in r.stdout.splitlines()]
        # compute001 busy: no pair of held nodes for the MPI all-reduce
        assert len(checks) == 41 and all(c["passed"] for c in checks), r.stdout
        found = {(c["check"], c["target"]): c["evidence"] for c in checks}
        assert found[("sinfo", "compute001")] == "state allocated (running jobs)"
        assert found[("hold", "compute[001-002]")].startswith(
            "reservation provision-verify on the idle nodes; compute001 run jobs"
        )
        assert found[("srun", "compute002")].endswith("ran on compute002 as nobody")
        assert found[("sbatch", "compute002")].endswith(": its step ran on 1 node(s) as nobody")
        # the job it found running still runs, and verify's reservation is gone
        assert _on(spec, work, "head001", f"squeue -h -j {job} -o %T") == "RUNNING"
        assert _on(spec, work, "head001", "scontrol -o show reservation 2>&1 || true") == (
            "No reservations in the system"
        )
    finally:
        _on(spec, work, "head001", f"scancel {job}")
    assert _until(spec, work, "sinfo -h -n compute001 -o %T", "idle") == "idle"


def test_verify_maintenance_waits_for_the_jobs_and_holds_off_new_ones(
    lab: tuple[Path, Path],
) -> None:
    """--maintenance: a MAINT reservation on every compute node, the running job finishes, a
    job submitted meanwhile waits, the whole cluster is tested, and the reservation goes."""
    spec, work = lab
    running = _on(spec, work, "head001", "sbatch --parsable -w compute001 --wrap 'sleep 20'")
    assert _until(spec, work, f"squeue -h -j {running} -o %T", "RUNNING") == "RUNNING"
    proc = subprocess.Popen(
        [sys.executable, "-m", "provision", "verify", str(spec), "--maintenance", "--wait",
         "180", "--json"],
        cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    late = None
    try:
        shown = _until(
            spec, work, "scontrol -o show reservation provision-verify 2>&1 || true", "",
            until=lambda got: "Flags=" in got,
        )  # fmt: skip
        assert "MAINT" in shown and "Nodes=compute[001-002]" in shown, shown
        # a second verify of this state meanwhile is refused at once, its reservation untouched
        second = provision("verify", str(spec), cwd=work)
        assert second.returncode == 1 and "is busy: `provision verify " in second.stderr, (
            second.stdout + second.stderr
        )
        late = _on(spec, work, "head001", "sbatch --parsable -w compute002 --wrap true")
        time.sleep(3)
        assert _on(spec, work, "head001", f"squeue -h -j {late} -o %T") == "PENDING"
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    checks = [json.loads(line) for line in out.splitlines()]
    # every node held: the MPI all-reduce over compute[001-002] too
    assert len(checks) == 42 and all(c["passed"] for c in checks), out
    assert found_mpi(checks) == "2 ranks summed 1 + 2 = 3 as nobody"
    found = {(c["check"], c["target"]): c["evidence"] for c in checks}
    hold = found[("hold", "compute[001-002]")]
    assert hold.startswith("maintenance reservation provision-verify; waited ")
    assert hold.endswith(" for the jobs on compute001")
    assert found[("srun", "compute[001-002]")].endswith("ran on compute[001-002] as nobody")
    assert found[("sbatch", "compute[001-002]")].endswith("its step ran on 2 node(s) as nobody")
    assert "maintenance: waiting for the jobs on compute001 to end" in err
    print(hold)
    assert _on(spec, work, "head001", "scontrol -o show reservation 2>&1 || true") == (
        "No reservations in the system"
    )
    # the job held off runs once the reservation is gone
    assert _until(spec, work, f"sacct -n -X -P -o State -j {late}", "COMPLETED") == "COMPLETED"


def test_a_full_dev_shm_drains_the_node_naming_the_check_and_freeing_it_resumes(
    lab: tuple[Path, Path], prometheus: int
) -> None:
    """slurmd runs the health checks every 15 s here: /dev/shm (64 MB in a lab container)
    filled past its 20% floor drains compute002 with the check in the reason; freed, the node
    comes back; compute001 is never touched."""
    spec, work = lab
    state = "sinfo -h -n compute002 -o '%T|%E'"
    assert _until(spec, work, state, "idle|none") == "idle|none"
    _on(spec, work, "compute002", "head -c 56M /dev/zero > /dev/shm/provision-test")
    broke = time.monotonic()
    try:
        drained = _until(spec, work, state, "", seconds=60, until=lambda s: "drain" in s)
        took = time.monotonic() - broke
        assert drained.startswith("drained|health: disk /dev/shm: "), drained
        assert drained.endswith("% free (at least 20%)"), drained
        print(f"health: compute002 drained {took:.0f} s after /dev/shm filled")
    finally:
        _on(spec, work, "compute002", "rm -f /dev/shm/provision-test")
    freed = time.monotonic()
    assert _until(spec, work, state, "idle|none", seconds=60) == "idle|none"
    print(f"health: compute002 resumed {time.monotonic() - freed:.0f} s after /dev/shm freed")
    assert _on(spec, work, "head001", "sinfo -h -n compute001 -o %T") == "idle"
    query = urllib.parse.urlencode({"query": 'provision_health_check_ok{node="compute002"}'})
    metrics = _prometheus(prometheus, f"/api/v1/query?{query}")
    assert {m["metric"]["check"] for m in metrics["result"]} == {
        "munge",
        "time",
        "disk /",
        "disk /dev/shm",
        "mount /home",  # the fixture's shared /home
    }


def _diag_units(level: int, interval: int) -> dict[str, str]:
    """The health role's service and timer of the long DCGM diagnostic, rendered as the role
    renders them (its own templates and variables)."""
    role = COLLECTION / "roles" / "health"
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    program = yaml.safe_load((role / "vars" / "main.yml").read_text())["_health_program"]
    values = {
        "ansible_managed": "written by the lab test from the health role's templates",
        "_health_diag": {"level": level, "timeout_s": DIAG_TIMEOUT_S[level]},
        "_health_program": program,
        "_health_interval": interval,
    }
    return {
        f"provision-dcgm-diag.{kind}": env.from_string(
            (role / "templates" / f"provision-dcgm-diag.{kind}.j2").read_text()
        ).render(values)
        for kind in ("service", "timer")
    }


def test_a_long_dcgm_diag_runs_from_its_timer_holding_an_idle_node_slurmd_keeps_the_hold(
    lab: tuple[Path, Path],
) -> None:
    """A periodic level 2 diagnostic runs for minutes and slurmd kills its health program after
    60 s, so it runs from the health role's own service: on compute002, with its health file
    naming such a diagnostic and a stand-in dcgmi that answers with DCGM's recorded output after
    25 s (the lab has no GPU), the service holds the idle node with a drain, slurmd's own
    health runs (every 15 s) keep that hold, and the node comes back once it passed; a failure
    keeps it drained through slurmd's runs, naming the failed test."""
    spec, work = lab
    state = "sinfo -h -n compute002 -o '%T|%E'"
    hold = "drained|health: dcgm diag level 2: running (the node is held while it runs)"
    prom = "/var/lib/prometheus/node-exporter/provision-health.prom"
    assert _until(spec, work, state, "idle|none") == "idle|none"
    units = _diag_units(2, 15)
    put = [
        "cp /etc/provision/health.json /etc/provision/health.json.before-test",
        'python3 -c \'import json; p = "/etc/provision/health.json"; c = json.load(open(p)); '
        'c["dcgm_diag"] = {"level": 2, "when": "periodic", "every": 86400, '
        '"last_pass_file": "/var/lib/provision/health/dcgm-diag.passed", '
        '"timeout_s": 1200}; json.dump(c, open(p, "w"))\'',
        "printf '#!/bin/sh\\nsleep 25\\ncat /root/dcgm-diag.txt\\n' > /usr/local/bin/dcgmi",
        "chmod 755 /usr/local/bin/dcgmi",
    ]
    for name, text in units.items():
        put.append(f"printf %s {shlex.quote(text)} > /etc/systemd/system/{name}")
    _on(spec, work, "compute002", " && ".join([*put, "systemctl daemon-reload"]))

    def diag(recorded: str) -> str:
        text = (ROOT / "tests" / "data" / "dcgm" / recorded).read_text()
        _on(spec, work, "compute002", f"printf %s {shlex.quote(text)} > /root/dcgm-diag.txt")
        _on(spec, work, "compute002", "systemctl start --no-block provision-dcgm-diag.service")
        return _until(spec, work, state, hold, seconds=30)

    try:
        assert diag("diag-r1-pass-dcgm3.txt") == hold
        held = time.monotonic()
        since = _on(spec, work, "compute002", f"stat -c %Y {prom}")
        # slurmd's runs meanwhile: they see the hold and keep it (and write no finding of it)
        while time.monotonic() - held < 18:
            assert _on(spec, work, "head001", state) == hold
            time.sleep(3)
        assert _on(spec, work, "compute002", f"stat -c %Y {prom}") != since
        assert "dcgm" not in _on(spec, work, "compute002", f"cat {prom}")
        assert _until(spec, work, state, "idle|none", seconds=60) == "idle|none"
        print(f"health: the diagnostic held compute002 for {time.monotonic() - held:.0f} s")
        result = "systemctl show -p Result --value provision-dcgm-diag.service"
        assert _on(spec, work, "compute002", result) == "success"
        passed = "test -e /var/lib/provision/health/dcgm-diag.passed && echo passed"
        assert _on(spec, work, "compute002", passed) == "passed"
        assert "not due" in _on(spec, work, "compute002", "/usr/local/sbin/provision-health --diag")
        # a failure: drained naming the failed test, and slurmd's runs leave it so
        _on(spec, work, "compute002", "rm /var/lib/provision/health/dcgm-diag.passed")
        assert diag("diag-r2-fail-dcgm4.txt") == hold
        failed = _until(spec, work, state, "", seconds=60, until=lambda s: s != hold)
        assert failed.startswith("drained|health: dcgm diag level 2: "), failed
        since = _on(spec, work, "compute002", f"stat -c %Y {prom}")
        time.sleep(20)  # slurmd runs its health program every 15 s here
        assert _on(spec, work, "compute002", f"stat -c %Y {prom}") != since
        assert _on(spec, work, "head001", state) == failed
    finally:
        _on(
            spec, work, "compute002",
            "mv /etc/provision/health.json.before-test /etc/provision/health.json; "
            "rm -f /usr/local/bin/dcgmi /root/dcgm-diag.txt /var/lib/provision/health/dcgm-diag.*"
            " /etc/systemd/system/provision-dcgm-diag.*; systemctl daemon-reload",
        )  # fmt: skip
    # without the diagnostic in its file, slurmd's next run resumes its own drain
    assert _until(spec, work, state, "idle|none", seconds=60) == "idle|none"


def test_every_dashboard_query_is_answered_by_the_lab_prometheus(
    lab: tuple[Path, Path], prometheus: int
) -> None:
    """Grafana itself comes from its own repository, which is out of reach here; the queries of
    its panels and variables go to the lab's Prometheus: each one is answered, and every one of
    the cluster and Slurm dashboards shows data (the lab has no GPU and no fabric)."""
    queries = [
        (path.name, title, expr) for path in DASHBOARDS for title, expr in panel_queries(path)
    ]
    # a rate over a minute needs two scrapes of a target in that minute: a fresh node's rates
    # come a scrape interval or two after its first
    deadline = time.monotonic() + 90
    waiting = queries
    while True:
        empty = []
        for board, title, expr in waiting:
            result = _prometheus(
                prometheus, "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            )
            if board in ("cluster.json", "slurm.json") and not result["result"]:
                empty.append((board, title, expr))
        if not empty or time.monotonic() > deadline:
            break
        waiting = empty
        time.sleep(5)
    assert not empty, "\n".join(f"{b}: {t}: {e}" for b, t, e in empty)
    print(f"{len(queries)} dashboard queries answered")


def test_ssh_reaches_the_head_as_a_user_would(lab: tuple[Path, Path]) -> None:
    spec, work = lab
    r = provision(
        "ssh", "-f", str(spec), "head001", "--", "sinfo", "-h", "-o", "'%P %D %t'", cwd=work
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "compute* 2 idle\n"
    # the node's shell runs the words; its exit code comes back unchanged
    r = provision("ssh", "-f", str(spec), "compute001", "--", "hostname;", "exit", "3", cwd=work)
    assert r.returncode == 3 and r.stdout == "compute001\n", r.stderr


def test_second_apply_changes_nothing(lab: tuple[Path, Path]) -> None:
    spec, work = lab
    # --full: the roles run on every node, and change nothing
    r = provision("apply", str(spec), "--full", cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    hosts = _report(work)["hosts"]
    assert sorted(hosts) == ["compute001", "compute002", "head001"]
    changed = {h: s["changed_tasks"] for h, s in hosts.items() if s["changed_tasks"]}
    assert {h: s["changed"] for h, s in hosts.items()} == dict.fromkeys(hosts, 0), changed
    # a plain apply with nothing changed: every node probed and skipped, Ansible never runs
    r = provision("apply", str(spec), cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "converge: compute[001-002],head001 as the last apply left them" in r.stdout
    assert "ansible:" not in r.stdout and "verify: 42 passed, 0 failed" in r.stdout
    assert _report(work)["hosts"] == {}


def test_apply_converges_only_the_nodes_that_drifted(lab: tuple[Path, Path]) -> None:
    spec, work = lab
    _on(spec, work, "compute001", "echo '# a hand edit' >> /etc/chrony/chrony.conf")
    _on(spec, work, "compute002", "systemctl stop chrony")
    plan = provision("plan", str(spec), cwd=work)
    assert "converge: compute[001-002],head001 probed for drift" in plan.stdout, plan.stdout
    r = provision("apply", str(spec), cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "drift: compute001: /etc/chrony/chrony.conf: FAILED" in r.stdout, r.stdout
    assert "drift: compute002: chrony: not running" in r.stdout
    assert "converge: head001 as the last apply left them" in r.stdout
    hosts = _report(work)["hosts"]
    assert sorted(hosts) == ["compute001", "compute002"]
    assert hosts["compute001"]["changed"] >= 1 and hosts["compute002"]["changed"] >= 1
    assert "# a hand edit" not in _on(spec, work, "compute001", "cat /etc/chrony/chrony.conf")
    assert _on(spec, work, "compute002", "systemctl is-active chrony") == "active"
    r = provision("apply", str(spec), cwd=work)  # put right: nothing left to converge
    assert "converge: compute[001-002],head001 as the last apply left them" in r.stdout


def test_a_drifted_compute_node_converges_itself_in_pull_mode(lab: tuple[Path, Path]) -> None:
    """apply --mode pull: the node runs the roles with its own Ansible (sent by the
    workstation), its events reach the same report and record, and it keeps no secret of
    the run and none that is not its own."""
    spec, work = lab
    _on(spec, work, "compute001", "echo '# a hand edit' >> /etc/chrony/chrony.conf")
    r = provision("apply", str(spec), "--mode", "pull", cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "converge: pull: compute001 converge themselves" in r.stdout, r.stdout
    assert "ansible: playbooks/site.yml (pull) on 1 host(s)" in r.stdout
    assert "verify: 42 passed, 0 failed" in r.stdout
    report = _report(work)
    assert sorted(report["hosts"]) == ["compute001"]
    assert (
        "common : Write the chrony configuration" in report["hosts"]["compute001"]["changed_tasks"]
    )
    assert "# a hand edit" not in _on(spec, work, "compute001", "cat /etc/chrony/chrony.conf")
    events = Path(report["log_dir"]) / "job_events"
    assert list(events.glob("pull-compute001-*.json"))
    # the runtime and the content, kept for the next run; the run's secrets gone
    kept = _on(spec, work, "compute001", "cd /var/lib/provision/pull && stat -c %a . && ls")
    assert kept.split()[0] == "700", kept
    assert sorted(n.split("-")[0] for n in kept.split()[1:]) == ["content", "home", "runtime"]
    # the record holds what the node's own run left: the next apply probes and skips it
    r = provision("apply", str(spec), cwd=work)
    assert "converge: compute[001-002],head001 as the last apply left them" in r.stdout, r.stdout


def test_a_port_opened_on_one_pool_converges_that_pool_alone(lab: tuple[Path, Path]) -> None:
    """A change to one pool's files (its nftables rules) runs the role that reads them (the
    firewall's) on that pool's nodes alone and probes the others; plan says so first. The
    rule stays (admins' port 8888 on compute)."""
    spec, work = lab
    rule = "  firewall_rules: [{name: jupyter, port: 8888, sources: [admin], pools: [compute]}]\n"
    spec.write_text(spec.read_text().replace("security:\n", "security:\n" + rule, 1))
    plan = provision("plan", str(spec), cwd=work)
    assert (
        "converge: head001 probed for drift and skipped if their files and services are as the "
        "last apply left them (apply --full converges them); the others converge: "
        "compute[001-002]: firewall (files/nftables/compute.nft) changed since the last "
        "converge: that role alone runs"
    ) in " ".join(plan.stdout.split()), plan.stdout
    r = provision("apply", str(spec), cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "converge: head001 as the last apply left them" in r.stdout, r.stdout
    assert "converge: compute[001-002]: roles firewall" in r.stdout, r.stdout
    report = _report(work)
    assert sorted(report["hosts"]) == ["compute001", "compute002"]
    # the firewall's tasks alone ran (and the facts every run reads; Ansible checks the
    # arguments of every role of the play whatever the tags)
    ran = {
        (e["event_data"].get("role") or "", e["event_data"].get("task") or "")
        for e in converged.read_events(Path(report["log_dir"]))
        if e.get("event") == "runner_on_ok"
    }
    checks = "Validating arguments against arg spec"
    assert {role for role, task in ran if not task.startswith(checks)} == {"", "firewall"}, ran
    jupyter = "nft list ruleset | grep -c 'tcp dport 8888 accept' || true"
    assert [_on(spec, work, n, jupyter) for n in ("compute001", "compute002", "head001")] == [
        "1", "1", "0",
    ]  # fmt: skip
    r = provision("apply", str(spec), cwd=work)  # recorded: nothing left to converge
    assert "converge: compute[001-002],head001 as the last apply left them" in r.stdout


def test_users_log_in_run_jobs_as_themselves_and_one_dropped_from_the_spec_is_locked_out(
    lab: tuple[Path, Path],
) -> None:
    """The spec's users log in to the head (the lab has no login pool) with their own keys and
    run a 2-node job each, charged to their account; what the job writes in the shared /home
    has the same owner on every node; the compute nodes take no user's key; a job over its
    QoS' limit waits naming it, a user in no account is refused; a user taken out of the spec
    cannot log in after the next apply, keeps their home, and leaves slurmdbd."""
    spec, work = lab
    job = (
        "cd && sbatch --parsable -W -N2 -o job.txt --wrap "
        # each node its name; 2 s, so that the job's usage is not 0 (sreport leaves 0 out)
        + shlex.quote("srun sh -c 'id -un; touch ~/from-$(hostname); sleep 2'")
        + " >/dev/null && sort job.txt | uniq -c | tr -s ' '"
    )
    for user in USERS:
        ran = user_login(work, user, "10.76.0.11", job)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert ran.stdout.strip() == f"2 {user}", ran.stdout
    owners = "stat -c '%n %u:%g' /home/ana/from-compute001 /home/ana/from-compute002"
    for node in ("head001", "compute001", "compute002"):
        assert _on(spec, work, node, owners).split("\n") == [
            "/home/ana/from-compute001 2001:2001",
            "/home/ana/from-compute002 2001:2001",
        ], node
    assert _on(spec, work, "compute002", "id -Gn ana") == "ana vision"
    # a user's first distributed job: an MPI all-reduce over two nodes, Slurm's PMIx starting
    # Open MPI's ranks
    mpi = "srun --mpi=pmix -N2 --ntasks-per-node=1 /usr/local/libexec/provision/mpi-allreduce"
    summed = user_login(work, "ana", "10.76.0.11", mpi)
    assert sorted(summed.stdout.split("\n")[:2]) == [
        "0 2 3 compute001", "1 2 3 compute002",
    ], summed.stdout + summed.stderr  # fmt: skip
    refused = user_login(work, "ana", "10.76.0.12", "true")
    assert refused.returncode == 255 and "Permission denied" in refused.stderr
    # logged in on the head, a user cannot reach Alertmanager on its loopback (the guard)
    silence = (
        'python3 -c "import socket; s = socket.socket(); s.settimeout(3); '
        "print(s.connect_ex(('127.0.0.1', 9093)))\""
    )
    assert user_login(work, "ana", "10.76.0.11", silence).stdout.strip() == "111"

    # Slurm: each job charged to its user's account; a job over its QoS' limit waits, naming
    # it; a user in no account is refused at submit
    charged = "sacct -X -n -P -u ana,ben -o User,Account,QOS,State | sort -u"
    assert _on(spec, work, "head001", charged).split("\n") == [
        "ana|vision|normal|COMPLETED",
        "ben|speech|normal|COMPLETED",
    ]
    # sreport: each user's usage under their account, from slurmdbd's hourly roll-up, which an
    # admin's `sacctmgr rollup` makes at once
    used: dict[tuple[str, ...], int] = {}
    for row in _on(spec, work, "head001", SREPORT).splitlines():  # the two windows' rows
        fields = row.split("|")
        used[tuple(fields[1:3])] = used.get(tuple(fields[1:3]), 0) + int(fields[4])
    assert used.get(("vision", "ana"), 0) > 0 and used.get(("speech", "ben"), 0) > 0, used
    wide = user_login(work, "ana", "10.76.0.11", "sbatch --parsable -q small -N2 --wrap true")
    job = wide.stdout.strip()
    try:
        reason = _until(spec, work, f"squeue -h -j {job} -o '%T %r'", "PENDING QOSGrpNodeLimit")
        assert reason == "PENDING QOSGrpNodeLimit", reason
    finally:
        _on(spec, work, "head001", f"scancel {job}")
    refused = _on(spec, work, "head001", "runuser -u cid -- sbatch --wrap true 2>&1; echo $?")
    assert "Invalid account or account/partition combination" in refused, refused
    assert refused.endswith("\n1")

    spec.write_text("\n".join(ln for ln in spec.read_text().splitlines()
                              if not ln.startswith(BEN)).replace("users: [ben]", "users: []")
                    + "\n")  # fmt: skip
    plan = provision("plan", str(spec), cwd=work)
    assert "running cluster: users locked out: ben" in plan.stdout, plan.stdout
    assert "running cluster: slurmdbd: account speech: users ben -> -" in plan.stdout
    r = provision("apply", str(spec), cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    locked = user_login(work, "ben", "10.76.0.11", "true")
    assert locked.returncode == 255 and "Permission denied" in locked.stderr
    assert _on(spec, work, "head001", "getent passwd ben | cut -d: -f7; chage -l ben").startswith(
        "/usr/sbin/nologin"
    )
    assert _on(spec, work, "compute001", "cat /home/ben/job.txt").split() == ["ben", "ben"]
    assert user_login(work, "ana", "10.76.0.11", "id -un").stdout.strip() == "ana"
    assert _on(spec, work, "head001", "sacctmgr -nP show assoc user=ben format=Account") == ""


# The hour before this one and this one (the jobs may straddle the hour), rolled up and
# reported one by one: sreport clamps a window's end to now and rounds both ends to the
# nearest hour, so a window from the last hour to now leaves this hour out in its first half
# (an empty report in CI once). A window that starts on this hour is stretched to a whole hour.
SREPORT = r"""set -e
now=$(date '+%F %H:00')
last=$(date -d "$now 1 hour ago" +%FT%H:%M) this=$(date -d "$now" +%FT%H:%M)
next=$(date -d "$now 1 hour" +%FT%H:%M)
sacctmgr -i rollup "$last" "$next" >/dev/null
report="sreport -n -P -t seconds cluster AccountUtilizationByUser"
$report start="$last" end="$this"
$report start="$this" end=now
"""


# A user's OCI bundle, made on the head in the shared /home: a root file system of a few of
# the node's own programs and their libraries, an os-release of its own, and the config.json
# of `runc spec --rootless` (runc is on the compute nodes: made there, through Slurm)
BUNDLE = r"""set -e
b=$HOME/bundle
rm -rf "$b"; mkdir -p "$b/rootfs"; cd "$b/rootfs"
mkdir -p etc proc sys dev tmp
for f in /bin/sh /usr/bin/cat /usr/bin/head /usr/bin/id /usr/bin/ls; do
  cp --parents -L "$f" .
  for lib in $(ldd "$f" | grep -o '/[^ ]*'); do cp --parents -L -n "$lib" .; done
done
echo 'PRETTY_NAME="ana bundle"' > etc/os-release
srun -N1 runc spec --rootless --bundle "$b" </dev/null
"""
# The lab's nodes are containers themselves: a container in them cannot mount a new /proc or
# cgroup file system, nor set its host name, so the bundle binds the node's /proc instead
# (a cluster of machines takes `runc spec --rootless` as it is)
NESTED = r"""python3 - "$HOME/bundle/config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
for mount in config["mounts"]:
    if mount["destination"] == "/proc":
        mount.update(type="bind", source="/proc", options=["rbind", "nosuid", "nodev", "noexec"])
config["mounts"] = [m for m in config["mounts"] if m["destination"] != "/sys/fs/cgroup"]
config.pop("hostname", None)
json.dump(config, open(sys.argv[1], "w"), indent=2)
PY
"""


def test_a_users_job_runs_in_an_oci_bundle_of_their_own(lab: tuple[Path, Path]) -> None:
    """slurm.oci_runtime: a user's `srun --container` runs each task in the user's bundle
    through runc, rootless (the user is root inside, no one outside), on both nodes; its exit
    code is the job's; a batch script runs inside too; the steps leave no container, runtime
    or directory behind."""
    spec, work = lab
    made = user_login(work, "ana", "10.76.0.11", BUNDLE + NESTED)
    assert made.returncode == 0, made.stdout + made.stderr
    inside = "srun -N2 --container=$HOME/bundle sh -c 'head -1 /etc/os-release; id -u; ls /'"
    ran = user_login(work, "ana", "10.76.0.11", inside)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.split("\n")
    assert lines.count('PRETTY_NAME="ana bundle"') == 2, ran.stdout  # not the node's Debian
    assert lines.count("0") == 2, ran.stdout
    assert lines.count("usr") == 2 and "home" not in lines, ran.stdout  # the bundle's root alone
    exit3 = "srun -N2 --container=$HOME/bundle sh -c 'exit 3'"
    failed = user_login(work, "ana", "10.76.0.11", exit3)
    assert failed.returncode == 3, failed.stdout + failed.stderr
    # a batch script runs inside too (Slurm binds it in), its output in ana's file
    batch = "cd && sbatch -W -o oci.txt --container=$HOME/bundle --wrap 'head -1 /etc/os-release'"
    assert user_login(work, "ana", "10.76.0.11", batch).returncode == 0
    assert _on(spec, work, "head001", "cat /home/ana/oci.txt") == 'PRETTY_NAME="ana bundle"'
    left = "ls -d /var/spool/slurmd/oci-* 2>/dev/null; pgrep -c runc || true"
    for node in ("compute001", "compute002"):
        assert _on(spec, work, node, left) == "0", node


def found_mpi(checks: list[dict]) -> str:  # type: ignore[type-arg]
    """verify's MPI all-reduce evidence, from its JSON lines."""
    return next(c["evidence"] for c in checks if c["check"] == "mpi all-reduce")


def _on(spec: Path, work: Path, node: str, command: str) -> str:
    r = provision("ssh", "-f", str(spec), node, "--", command, cwd=work)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _until(
    spec: Path,
    work: Path,
    command: str,
    expected: str,
    seconds: float = 60,
    until: Callable[[str], bool] | None = None,
) -> str:
    """The head's answer to command once it is `expected` (or `until` holds for it), or the
    last one after `seconds` (a node slurmctld has not pinged since a change shows `*` for a
    while)."""
    deadline = time.monotonic() + seconds
    while True:
        got = _on(spec, work, "head001", command)
        done = until(got) if until is not None else got == expected
        if done or time.monotonic() > deadline:
            return got
        time.sleep(2)


def test_a_scheduler_change_is_read_without_restarting_anything(lab: tuple[Path, Path]) -> None:
    """A key `scontrol reconfigure` applies: apply says so, slurmctld and slurmd keep their
    processes, and a job running through the change completes."""
    spec, work = lab
    pid = "systemctl show -p MainPID --value"
    before = (
        _on(spec, work, "head001", f"{pid} slurmctld"),
        _on(spec, work, "compute001", f"{pid} slurmd"),
    )
    job = _on(spec, work, "head001", "sbatch --parsable -w compute001 --wrap 'sleep 600'")
    changed = spec.with_name("lab-scheduler.yaml")
    changed.write_text(
        spec.read_text().replace(
            "    TaskPlugin: task/affinity\n",
            "    TaskPlugin: task/affinity\n    SchedulerParameters: bf_continue\n",
        )
    )
    r = provision("apply", str(changed), "--no-verify", cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "slurm: reconfigure: SchedulerParameters: (unset) -> bf_continue" in r.stdout
    after = (
        _on(spec, work, "head001", f"{pid} slurmctld"),
        _on(spec, work, "compute001", f"{pid} slurmd"),
    )
    assert after == before
    config = _on(spec, work, "head001", "scontrol show config | grep ^SchedulerParameters")
    assert config.split("=", 1)[1].strip() == "bf_continue"
    assert _on(spec, work, "head001", f"squeue -h -j {job} -o %T") == "RUNNING"
    _on(spec, work, "head001", f"scancel {job}")


def test_drain_waits_for_the_running_job_then_resume_gives_the_node_back(
    lab: tuple[Path, Path],
) -> None:
    spec, work = lab
    job = _on(spec, work, "head001", "sbatch --parsable -w compute002 --wrap 'sleep 15'")
    # a job still pending when the drain lands would never start there: wait for it to run
    assert _until(spec, work, f"squeue -h -j {job} -o %T", "RUNNING") == "RUNNING"
    try:
        r = provision("drain", "compute002", "-f", str(spec), "--reason", "test drain", cwd=work)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"drain: compute002: 1 job(s) still running: {job} compute002" in r.stdout
        assert "drain: compute002: drained, no job runs there" in r.stdout
        state = _on(spec, work, "head001", "sinfo -h -n compute002 -o '%T|%E'")
        assert state == "drained|test drain"
    finally:  # a failure here must not leave the node drained for the tests after it
        r = provision("resume", "compute", "-f", str(spec), cwd=work)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _until(spec, work, "sinfo -h -n compute002 -o %T", "idle") == "idle"


def test_scale_up_then_down_drains_the_leaving_nodes_first(lab: tuple[Path, Path]) -> None:
    """2 -> 4 -> 2 compute nodes: the new nodes join; when they leave, apply waits for their
    jobs, stops within --drain-timeout having changed nothing, and with --force requeues what
    still runs; a job on a node that stays runs on, and the containers go."""
    spec, work = lab
    grown = spec.with_name("lab-4.yaml")
    grown.write_text(spec.read_text().replace("count: 2", "count: 4"))
    r = provision("apply", str(grown), "--no-verify", cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "slurm: restart: " in r.stdout, r.stdout[:3000]
    assert "nodes added to slurm.conf: compute[003-004] (needs a restart)" in r.stdout, r.stdout[
        :3000
    ]
    assert "starting stopped node" not in r.stdout, r.stdout[:3000]
    nodes = "compute001 idle\ncompute002 idle\ncompute003 idle\ncompute004 idle"
    assert _until(spec, work, "sinfo -h -N -o '%N %T' | sort", nodes) == nodes
    staying = _on(grown, work, "head001", "sbatch --parsable -w compute001 --wrap 'sleep 90'")
    leaving = _on(grown, work, "head001", "sbatch --parsable -w compute003 --wrap 'sleep 15'")
    stuck = _on(grown, work, "head001", "sbatch --parsable -w compute004 --wrap 'sleep 600'")
    # all running before the shrink (a job still pending is on no node yet)
    jobs = f"{staying},{leaving},{stuck}"
    started = _until(spec, work, f"squeue -h -j {jobs} -o %T", "RUNNING\nRUNNING\nRUNNING")
    assert started == "RUNNING\nRUNNING\nRUNNING"
    # the job on compute004 outlasts the drain timeout: apply stops, nothing removed
    r = provision("apply", str(spec), "--no-verify", "--drain-timeout", "25", cwd=work)
    assert r.returncode != 0, r.stdout[-3000:]
    assert "drain: compute[003-004] leave the spec: drained before they go" in r.stdout
    assert "run apply --force to requeue them" in r.stdout + r.stderr, r.stderr
    assert "lab: removed" not in r.stdout
    assert {"compute003", "compute004"} <= set(
        _on(grown, work, "head001", "sinfo -h -N -o %N").split()
    )
    # --force: what still runs there goes back to the queue, and the nodes go
    r = provision("apply", str(spec), "--no-verify", "--force", cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert f"drain: compute[003-004]: requeued (or cancelled) job(s) {stuck}" in r.stdout, r.stdout
    assert "lab: removed compute[003-004] (left the spec)" in r.stdout
    assert "compute003" not in _leftovers()[0] and "compute004" not in _leftovers()[0]
    states = _on(spec, work, "head001", f"sacct -n -X -P -j {staying},{leaving} -o JobID,State")
    found = dict(line.split("|") for line in states.splitlines())
    assert found[leaving] == "COMPLETED"
    assert found[staying] in ("RUNNING", "COMPLETED")  # never killed, requeued or failed
    # requeued, not killed (its first run's record says so; asked for compute004 alone, it
    # cannot run again once that node is gone, so Slurm ends it there)
    runs = _on(spec, work, "head001", f"sacct -n -X -D -P -j {stuck} -o State").split()
    assert runs[:1] == ["REQUEUED"], runs
    _on(spec, work, "head001", f"scancel {stuck}")
    assert _until(spec, work, f"squeue -h -j {stuck} -o %T", "") == ""


def test_a_rolling_restart_keeps_a_job_array_running(lab: tuple[Path, Path]) -> None:
    """A change that restarts the daemons, in batches of one: the head first, then each compute
    node drained, changed (slurmd restarted), checked and resumed in turn, while a job array
    runs on the other node; no task fails."""
    spec, work = lab
    pid = "systemctl show -p MainPID --value"
    before = {n: _on(spec, work, n, f"{pid} slurmd") for n in ("compute001", "compute002")}
    # at most two tasks at once, 10 s each: the array runs through the whole roll
    array = _on(spec, work, "head001", "sbatch --parsable --array=1-16%2 --wrap 'sleep 10'")
    changed = spec.with_name("lab-tcp.yaml")
    changed.write_text(
        spec.read_text().replace(
            "    TaskPlugin: task/affinity\n", "    TaskPlugin: task/affinity\n    TCPTimeout: 3\n"
        )
    )
    r = provision("apply", str(changed), "--batch", "1", cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    out = r.stdout
    assert "slurm: restart: TCPTimeout: (unset) -> 3 (needs a restart)" in out, out[:3000]
    steps = [
        "ansible: playbooks/site.yml on 1 host(s)",  # head001
        "rolling: compute[001-002] in batches of 1",
        "rolling: batch 1/2: compute001",
        "drain: compute001: no new job starts there",
        "drain: compute001: drained, no job runs there",
        "rolling: compute001: slurmd answering",
        "resume: compute001: jobs may start there again",
        "rolling: batch 2/2: compute002",
        "drain: compute002: drained, no job runs there",
        "resume: compute002: jobs may start there again",
        "verify: skipped after a partial or rolling apply",
    ]
    at = [out.find(step) for step in steps]
    assert -1 not in at and at == sorted(at), list(zip(steps, at, strict=True))
    after = {n: _on(spec, work, n, f"{pid} slurmd") for n in ("compute001", "compute002")}
    assert all(after[n] != before[n] for n in after), (before, after)  # each restarted
    assert _on(spec, work, "head001", "scontrol show config | grep ^TCPTimeout").endswith("3 sec")
    _until(spec, work, f"squeue -h -j {array} -o %i", "", seconds=240)
    states = _on(spec, work, "head001", f"sacct -n -X -P -j {array} -o JobID,State")
    tasks = dict(line.split("|") for line in states.splitlines())
    assert len(tasks) == 16 and set(tasks.values()) == {"COMPLETED"}, tasks
    nodes = "compute001 idle\ncompute002 idle"
    assert _until(spec, work, "sinfo -h -N -o '%N %T' | sort", nodes) == nodes


def test_an_elastic_pool_added_to_a_running_lab_needs_a_new_head(lab: tuple[Path, Path]) -> None:
    """The head reaches podman through a mount made when it is created: apply says so, and
    changes no node."""
    spec, work = lab
    burst = spec.with_name("lab-plus-burst.yaml")
    burst.write_text(  # without the directory: elastic pools beside one are not supported yet
        _without_identity(spec.read_text()).replace(
            "    count: 2\n",  # the compute pool, the last of the pools
            "    count: 2\n  - {name: burst, role: compute, profile: lab-container, provider: lab,"
            " count: 2, elastic: true}\n",
        )
    )
    r = provision("apply", str(burst), cwd=work)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert "head001 was created before the spec had an elastic lab pool" in r.stderr
    assert "ansible:" not in r.stdout


def _mails(relay: FakeRelay, alert: str, node: str) -> list[Mail]:
    return [m for m in relay.mails if alert in m.data and node in m.data]


def _events(run: Path) -> list[str]:
    """The texts of a running apply's events so far. Ansible Runner writes a partial file for an
    event and deletes it once the whole event is written, so a file listed may be gone when
    read: it is skipped (the whole event is read on the next look)."""
    texts = []
    for event in (run / "job_events").glob("*.json"):
        try:
            texts.append(event.read_text())
        except FileNotFoundError:
            continue
    return texts


def test_node_stopped_mid_apply(
    lab: tuple[Path, Path], receiver: _Receiver, relay: FakeRelay
) -> None:
    """Apply finishes the other nodes, names the lost one, exits 1; Alertmanager tells the
    webhook receiver and the mail receiver the node is down; a rerun converges."""
    spec, work = lab
    logs = work / ".provision" / NAME / "logs"
    before = set(logs.iterdir())
    proc = subprocess.Popen(
        [sys.executable, "-m", "provision", "apply", str(spec), "--full"],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    victim = f"provision-{NAME}-compute002"
    deadline = time.monotonic() + 300
    stopped = False
    stopped_at = 0.0
    try:
        while time.monotonic() < deadline and proc.poll() is None and not stopped:
            for run in set(logs.iterdir()) - before:
                if any('"task": "Install chrony"' in text for text in _events(run)):
                    podman.podman("stop", "-t", "0", victim)
                    stopped = True
                    stopped_at = time.monotonic()
            time.sleep(0.2)
    finally:  # whatever happened, the apply ends here: no later test finds the cluster busy
        out, err = proc.communicate(timeout=600)
    assert stopped, "the apply ended before the node could be stopped"
    assert proc.returncode == 1, out[-2000:] + err
    assert "apply failed on: compute002" in err
    hosts = _report(work)["hosts"]
    # stopped between two tasks the node is unreachable; stopped inside one (its command killed
    # with the container) that task fails first: either way it is lost and ends there
    lost = hosts["compute002"]
    assert lost["unreachable"] + lost["failed"] >= 1, lost
    assert lost["ok"] < hosts["compute001"]["ok"], (lost, hosts["compute001"])
    for done in ("head001", "compute001"):
        assert hosts[done]["failed"] == 0 and hosts[done]["unreachable"] == 0, hosts[done]
        assert hosts[done]["ok"] >= 29  # they ran to the end of the play
    # NodeDown fires after a minute without a scrape; Alertmanager posts it to the receiver
    while not receiver.alerts("NodeDown", "compute002") and time.monotonic() < stopped_at + 180:
        time.sleep(1)
    fired = receiver.alerts("NodeDown", "compute002")
    assert fired, [body for _, body in receiver.received]
    print(f"NodeDown reached the webhook {fired[0] - stopped_at:.0f} s after the node stopped")
    assert not receiver.alerts("NodeDown", "compute001")
    # the same alert by mail, through the relay, logged in with the password from the file
    while time.monotonic() < stopped_at + 200 and not _mails(relay, "NodeDown", "compute002"):
        time.sleep(1)
    mails = _mails(relay, "NodeDown", "compute002")
    assert mails, [m.data[:300] for m in relay.mails]
    assert mails[0].recipients == ["oncall@lab.test"]
    assert mails[0].sender == "alertmanager@lab.test"
    assert mails[0].login == ("alerts", RELAY_PASSWORD)
    print(f"NodeDown reached the mailbox {mails[0].at - stopped_at:.0f} s after the node stopped")

    rerun = provision("apply", str(spec), cwd=work)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr
    assert "lab: starting stopped node compute002" in rerun.stdout
    assert "verify: 42 passed, 0 failed" in rerun.stdout


def test_directory_users_log_in_where_allowed_and_their_jobs_outlive_the_directory(
    lab: tuple[Path, Path],
) -> None:
    """A directory user in the allowed group logs in to the head (the users' door: the lab has
    no login pool) with the key the directory holds, and runs a 2-node job with the directory's
    uid on every node; a directory user outside the group is refused, and so is the key the
    directory holds for a local admin's name. The directory stopped, a logged-in user's job
    still runs (SSSD's cache) and verify says the directory is down; started again, verify
    finds it. Taken out of the spec, the directory's users are gone from every node."""
    spec, work = lab
    job = (
        "cd && sbatch --parsable -W -N2 -o job.txt --wrap "
        + shlex.quote("srun sh -c 'id -u; touch ~/from-$(hostname)'")
        + " >/dev/null && sort job.txt | uniq -c | tr -s ' '"
    )
    ran = user_login(work, "dora", "10.76.0.11", job)  # her home made at this first login
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.strip() == "2 5001", ran.stdout
    for node in ("compute001", "compute002"):
        assert _on(spec, work, node, "id dora") == (
            "uid=5001(dora) gid=5001(dora) groups=5001(dora),5100(hpc)"
        )
        owner = _on(spec, work, node, f"stat -c %u:%g /home/dora/from-{node}")
        assert owner == "5001:5001", (node, owner)
    # eve's key is the directory's, but she is not in the allowed group: SSSD's access check
    # (PAM's account phase) ends the connection
    refused = user_login(work, "eve", "10.76.0.11", "true")
    assert refused.returncode == 255, refused.stdout
    denied = (
        "journalctl -u ssh --no-pager | grep -c 'pam_sss(sshd:account): Access denied for user eve'"
    )
    # journald may write it a moment after the connection ended (seen under CI's load)
    assert _until(spec, work, denied + " || true", "1", seconds=30) == "1"
    # the directory's key for the local admin's name is never asked for
    impostor = user_login(work, f"{NAME}admin", "10.76.0.11", "true", key="mallory")
    assert impostor.returncode == 255 and "Permission denied (publickey)" in impostor.stderr
    assert _on(spec, work, "head001", "stat -c '%a %U' /etc/sssd/conf.d/50-provision-bind.conf"
               ) == "600 root"  # fmt: skip

    control = work / "dora.control"  # dora stays logged in over one connection
    held = [f"ControlPath={control}", "BatchMode=yes", "StrictHostKeyChecking=no",
            "UserKnownHostsFile=/dev/null", "LogLevel=ERROR"]  # fmt: skip
    options = [word for option in held for word in ("-o", option)]
    subprocess.run(["ssh", "-i", str(work / "dora"), "-o", "ControlMaster=yes", *options,
                    "-fN", "dora@10.76.0.11"], check=True, timeout=60)  # fmt: skip
    directory = Directory(DIRECTORY, DIRECTORY_ADDRESS, work / "directory-ca.pem",
                          work / "directory-bind.password")  # fmt: skip
    try:
        directory.stop()
        ran = subprocess.run(["ssh", *options, "dora@10.76.0.11", job], capture_output=True,
                             text=True, check=False, timeout=180)  # fmt: skip
        assert ran.stdout.strip() == "2 5001", ran.stdout + ran.stderr
        r = provision("verify", str(spec), "--json", cwd=work)
        assert r.returncode == 1, r.stdout + r.stderr
        failed = {
            (c["check"], c["target"]): c["evidence"]
            for c in map(json.loads, r.stdout.splitlines())
            if not c["passed"]
        }
        assert set(failed) == {
            ("directory", node) for node in ("head001", "compute001", "compute002")
        }, failed
        assert failed[("directory", "head001")].startswith(
            "the directory is down or unreachable: SSSD is offline"
        ), failed
    finally:
        directory.start()
        subprocess.run(["ssh", *options, "-O", "exit", "dora@10.76.0.11"], check=False,
                       capture_output=True, timeout=30)  # fmt: skip
    r = provision("verify", str(spec), cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "PASS directory compute002: online; hpc gid 5100 (2 member(s) by name)" in r.stdout

    # the directory taken out of the spec: what the sssd role set up goes, and the directory's
    # users can no longer log in
    spec.write_text(_without_identity(spec.read_text()))
    r = provision("apply", str(spec), cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    gone = user_login(work, "dora", "10.76.0.11", "true")
    assert gone.returncode == 255 and "Permission denied (publickey)" in gone.stderr
    left = (
        "systemctl is-active sssd; for f in /etc/sssd/sssd.conf /etc/sssd/conf.d/*provision* "
        "/usr/local/libexec/provision/directory-keys; do test -e $f && echo $f; done; "
        "getent passwd dora || echo unknown"
    )
    assert _on(spec, work, "head001", left).split("\n") == ["inactive", "unknown"]


def test_destroy_leaves_nothing(lab: tuple[Path, Path]) -> None:
    spec, work = lab
    r = provision("destroy", str(spec), "--yes", cwd=work)
    assert r.returncode == 0, r.stderr
    assert "3 node(s) deleted" in r.stdout
    assert _leftovers() == ("", False)
    assert not (work / ".provision").exists()

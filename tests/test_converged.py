"""What a converge left on each node, its drift probe (run by a real shell against real files,
with a stand-in systemctl) and the fingerprint that decides whether a node may be skipped."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from provision import converged
from provision.converged import Left, Record
from provision.state import State


def _sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _probe(
    left: Left, tmp_path: Path, running: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    systemctl = bindir / "systemctl"
    # `systemctl is-active --quiet -- NAME`: 0 for the running ones
    cases = "|".join(running) or "__none__"
    systemctl.write_text(f'#!/bin/sh\ncase "$4" in {cases}) exit 0;; esac\nexit 3\n')
    systemctl.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    return subprocess.run(
        ["sh", "-c", left.probe()], env=env, capture_output=True, text=True, check=False
    )


def test_probe_passes_while_files_and_services_are_as_left(tmp_path: Path) -> None:
    conf = tmp_path / "chrony.conf"
    conf.write_text("pool 10.77.0.1 iburst\n")
    odd = tmp_path / 'it\'s a "name" with $(spaces).conf'  # quoted, never run
    odd.write_text("x\n")
    left = Left({str(conf): _sha1(conf), str(odd): _sha1(odd)}, ["chrony", "munge"])
    r = _probe(left, tmp_path, running=("chrony", "munge"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == ""


def test_probe_names_a_changed_or_missing_file(tmp_path: Path) -> None:
    conf, gone = tmp_path / "slurm.conf", tmp_path / "gres.conf"
    conf.write_text("ClusterName=lab\n")
    gone.write_text("\n")
    left = Left({str(conf): _sha1(conf), str(gone): _sha1(gone)}, [])
    conf.write_text("ClusterName=lab\n# a hand edit\n")
    gone.unlink()
    r = _probe(left, tmp_path)
    assert r.returncode == 1
    assert f"{conf}: FAILED" in r.stdout and str(gone) in r.stdout


def test_probe_names_a_stopped_service(tmp_path: Path) -> None:
    r = _probe(Left({}, ["slurmd", "munge"]), tmp_path, running=("munge",))
    assert r.returncode == 1
    assert r.stdout.strip() == "slurmd: not running"


def test_an_empty_record_probes_true(tmp_path: Path) -> None:
    assert _probe(Left(), tmp_path).returncode == 0


def _ok(host: str, action: str, **res: object) -> dict[str, object]:
    return {
        "event": "runner_on_ok",
        "event_data": {"host": host, "resolved_action": action, "res": res},
    }


def test_what_a_run_left_comes_from_its_results() -> None:
    events = [
        _ok("h1", "ansible.builtin.template", dest="/etc/chrony.conf", checksum="a" * 40),
        _ok(
            "h1",
            "ansible.builtin.copy",
            results=[
                {"dest": "/etc/slurm/slurm.conf", "checksum": "b" * 40},
                {"skipped": True, "dest": "/etc/slurm/gres.conf"},
            ],
        ),
        _ok("h1", "ansible.builtin.copy", censored="hidden", dest="/etc/munge/munge.key"),
        _ok("h1", "ansible.builtin.systemd_service", name="munge", state="started"),
        _ok("h1", "ansible.builtin.systemd_service", name="munge", state="started"),
        _ok("h1", "ansible.builtin.systemd_service", name="slurmd", enabled=True),  # not started
        _ok("h2", "ansible.builtin.file", path="/etc/slurm", state="directory"),  # not read
        {"event": "runner_on_skipped", "event_data": {"host": "h2"}},
    ]
    left = converged.from_events(events)
    assert left["h1"].files == {"/etc/chrony.conf": "a" * 40, "/etc/slurm/slurm.conf": "b" * 40}
    assert left["h1"].services == ["munge"]
    assert "h2" not in left


def test_fingerprint_follows_the_render_and_the_secrets(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "munge.key").write_bytes(b"k" * 32)
    render = {"inventory/hosts.yml": "all: {}\n", "files/slurm/slurm.conf": "A=1\n"}
    first = converged.fingerprint(render, secrets)
    assert converged.fingerprint(dict(render), secrets) == first
    assert converged.fingerprint({**render, "files/slurm/slurm.conf": "A=2\n"}, secrets) != first
    (secrets / "munge.key").write_bytes(b"j" * 32)
    second = converged.fingerprint(render, secrets)
    assert second != first
    assert "k" * 32 not in first
    # a key in a subdirectory (the tunnel's) counts as much: rotated, the nodes converge again
    (secrets / "wireguard").mkdir()
    (secrets / "wireguard" / "cpu1.key").write_bytes(b"w" * 45)
    third = converged.fingerprint(render, secrets)
    assert third != second
    (secrets / "wireguard" / "cpu1.key").write_bytes(b"v" * 45)
    assert converged.fingerprint(render, secrets) != third


def test_a_record_skips_only_its_hosts_and_only_for_its_fingerprint(tmp_path: Path) -> None:
    state = State(tmp_path, "lab")
    state.ensure()
    assert converged.load(state) is None
    left = Left({"/etc/a": "c" * 40}, ["munge"])
    converged.save(state, Record("f1", {"head001": left, "compute001": Left()}))
    record = converged.load(state)
    assert record is not None and record.hosts["head001"] == left
    assert converged.unchanged(record, "f1", ["head001", "compute002"]) == {"head001": left}
    assert converged.unchanged(record, "f2", ["head001"]) == {}
    converged.forget(state)
    assert converged.load(state) is None
    (state.dir / converged.RECORD).write_text("{not json")
    assert converged.load(state) is None  # a broken record converges every node


def test_a_hosts_failure_is_the_one_that_stopped_it() -> None:
    """A failure its block rescued is followed by the rescue's own (a message naming what to
    do): the host's result, and apply's last line, show that one."""
    from provision.run.ansible import RunResult, _count

    result = RunResult(rc=2, status="failed")
    fetch = {"task": "Fetch the signing key", "res": {"msg": "Request failed: <urlopen error>"}}
    say = {"task": "Say which repository", "res": {"msg": "cp001 cannot reach https://repo/"}}
    for data in (fetch, say):
        _count(result, {"event": "runner_on_failed", "event_data": {"host": "cp001", **data}})
    _count(
        result,
        {
            "event": "runner_on_failed",
            "event_data": {"host": "cp002", "ignore_errors": True, **say},
        },
    )
    assert result.hosts["cp001"].failure == "Say which repository: cp001 cannot reach https://repo/"
    assert "cp002" not in result.hosts


def test_a_hosts_result_names_the_tasks_that_changed_something() -> None:
    """The record of an apply says which tasks changed each host, in order, with their role;
    an ok that changed nothing and a failure are not among them."""
    from provision.run.ansible import RunResult, _count

    result = RunResult(rc=0, status="successful")
    events = [
        ("runner_on_ok", {"task": "Write chrony.conf", "role": "chrony", "res": {"changed": True}}),
        ("runner_on_ok", {"task": "Start chrony", "role": "chrony", "res": {"changed": False}}),
        ("runner_on_failed", {"task": "Probe", "res": {"msg": "no"}, "ignore_errors": True}),
        ("runner_on_ok", {"task": "Restart chrony", "res": {"changed": True}}),
    ]
    for kind, data in events:
        _count(result, {"event": kind, "event_data": {"host": "cp001", **data}})
    assert result.hosts["cp001"].changed_tasks == ["chrony : Write chrony.conf", "Restart chrony"]

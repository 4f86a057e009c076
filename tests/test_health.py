"""The health checks (provision/health/) on recorded GPU and InfiniBand outputs, and their drain
and resume through a fake scontrol. Live in the lab: tests/integration/test_lab.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from provision.cluster import Cluster
from provision.health import (
    PREFIX,
    Result,
    decide,
    mount_points,
    parse_node,
    prometheus_text,
    reason_for,
    run_checks,
)
from provision.render import render
from provision.render.health import health_config
from provision.run.wheel import build_wheel
from provision.spec import load_spec

from .conftest import ROOT, third_party_imports

NVIDIA = ROOT / "tests" / "data" / "nvidia"
FABRIC = ROOT / "tests" / "data" / "fabric"
CHRONY_OK = (
    "Reference ID    : 0A4D000B (10.77.0.11)\nStratum         : 11\nLeap status     : Normal\n"
)
MUNGE_OK = "STATUS:          Success (0)\nENCODE_HOST:     gpu001\n"
# recorded on a lab node (Slurm 22.05): the reason comes last, with who set it and when
SHOW_NODE = (
    "NodeName=compute001 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 "
    "Partitions=compute  BootTime=2026-11-30T10:27:52 State={state} ThreadsPerCore=1 "
    "CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 "
    "ExtSensorsTemp=n/s{reason}"
)


def _node(state: str, reason: str = "") -> str:
    return SHOW_NODE.format(
        state=state, reason=f" Reason={reason} [root@2026-12-01T06:53:48]" if reason else ""
    )


def _dgx_config() -> dict[str, object]:
    cluster = Cluster(load_spec(ROOT / "examples" / "dgx-superpod.yaml"))
    spec = cluster.spec.model_copy(update={"health": {"interval": 300}})
    spec = type(spec).model_validate(spec.model_dump())
    cluster = Cluster(spec)
    view = next(v for v in cluster.pools if v.name == "gpu")
    return health_config(cluster, view)


def _fake_run(files: dict[str, str | tuple[int, str]]):  # type: ignore[no-untyped-def]
    """A shell: each command answered from recorded output, by the command's first words."""

    def run(command: str, timeout: float = 60) -> tuple[int, str]:
        for prefix, answer in files.items():
            if command.startswith(prefix):
                return answer if isinstance(answer, tuple) else (0, answer)
        raise AssertionError(f"unexpected command: {command}")

    return run


def _healthy_outputs() -> dict[str, str | tuple[int, str]]:
    return {
        "munge -n": MUNGE_OK,
        "chronyc": CHRONY_OK,
        "nvidia-smi --query-gpu": (NVIDIA / "query-gpu-h100-healthy.csv").read_text(),
        "nvidia-smi --query-remapped-rows": (NVIDIA / "remapped-rows-healthy.csv").read_text(),
        "nvidia-smi nvlink": (NVIDIA / "nvlink-status-h100.txt").read_text(),
        "systemctl is-active nvidia-fabricmanager": "active\n",
        "ibstat": (FABRIC / "ibstat-dgx-healthy.txt").read_text(),
    }


def test_a_healthy_dgx_node_passes_every_check() -> None:
    config = _dgx_config()
    assert config["gpu"] and config["fabric"]
    config["disks"] = []
    results = run_checks(config, _fake_run(_healthy_outputs()), mounts_text="")
    failed = [r for r in results if not r.ok]
    assert not failed, failed
    names = [r.check for r in results]
    assert names[:2] == ["munge", "time"]
    assert {"gpu.count", "gpu.memory-errors", "gpu.nvlink", "hca count"} <= set(names)


@pytest.mark.parametrize(
    ("command", "recording", "check", "detail"),
    [
        ("nvidia-smi --query-gpu", "query-gpu-h100-degraded.csv", "gpu.", "7 of 8"),
        ("nvidia-smi --query-remapped-rows", "remapped-rows-pending.csv", "gpu.memory-errors",
         "row remap pending"),
        ("nvidia-smi nvlink", "nvlink-status-h100-two-down.txt", "gpu.nvlink", "of 18 up"),
        ("ibstat", "ibstat-dgx-degraded.txt", "hca", ""),
    ],
)  # fmt: skip
def test_each_recorded_failure_fails_its_check(
    command: str, recording: str, check: str, detail: str
) -> None:
    config = _dgx_config()
    config["disks"] = []
    outputs = _healthy_outputs()
    folder = FABRIC if command == "ibstat" else NVIDIA
    outputs[command] = (folder / recording).read_text()
    failed = [r for r in run_checks(config, _fake_run(outputs), "") if not r.ok]
    assert failed and all(r.check.startswith(check) for r in failed), failed
    assert detail in failed[0].detail, failed


def test_a_node_whose_gpus_nvidia_smi_cannot_reach_fails_once_saying_why() -> None:
    """nvidia-smi failing: the driver's state asked after it (not before: a healthy node never
    runs it), and one GPU failure that says why, not one per GPU check."""
    from provision.parsers.gpu import DRIVER_STATE_COMMAND

    config = _dgx_config()
    config["disks"] = []
    outputs = _healthy_outputs()
    outputs["nvidia-smi --query-gpu"] = (9, "NVIDIA-SMI has failed because it couldn't\n")
    outputs[DRIVER_STATE_COMMAND] = (NVIDIA / "driver-state-container-recorded.txt").read_text()
    failed = [r for r in run_checks(config, _fake_run(outputs), "") if not r.ok]
    assert [r.check for r in failed] == ["gpu.count"], failed
    assert failed[0].detail.startswith("no NVIDIA GPU on the PCI bus (the profile promises 8)")
    asked: list[str] = []
    healthy = _fake_run(_healthy_outputs())

    def run(command: str, timeout: float = 60) -> tuple[int, str]:
        asked.append(command)
        return healthy(command, timeout)

    run_checks(config, run, "")
    assert DRIVER_STATE_COMMAND not in asked


def test_munge_time_disk_and_mount_failures() -> None:
    outputs = {
        "munge -n": (1, 'munge: Error: Failed to access "/run/munge/munge.socket.2"\n'),
        "chronyc": (1, "506 Cannot talk to daemon\n"),
    }
    config = {"disks": [{"path": "/", "min_free_percent": 99}], "mounts": ["/home", "/"]}
    results = {r.check: r for r in run_checks(config, _fake_run(outputs), "rootfs / ext4 rw 0 0\n")}
    assert not results["munge"].ok and "munge.socket" in results["munge"].detail
    assert not results["time"].ok and "chronyd does not answer" in results["time"].detail
    assert not results["disk /"].ok and "(at least 99%)" in results["disk /"].detail
    assert not results["mount /home"].ok and results["mount /"].ok
    unsynced = {"munge -n": MUNGE_OK, "chronyc": "Leap status     : Not synchronised\n"}
    time = next(r for r in run_checks({}, _fake_run(unsynced), "") if r.check == "time")
    assert not time.ok and time.detail == "chrony: Not synchronised"


def test_mount_points_undo_the_kernels_escapes() -> None:
    text = "server:/a\\040b /mnt/a\\040b nfs4 rw 0 0\n/dev/sda1 / ext4 rw 0 0\n"
    assert mount_points(text) == {"/mnt/a b", "/"}


def test_parse_node_reads_state_flags_and_reason_without_its_stamp() -> None:
    assert parse_node(_node("IDLE")) == ({"IDLE"}, "")
    flags, reason = parse_node(_node("IDLE+DRAIN", "health: disk /: 3.0% free"))
    assert flags == {"IDLE", "DRAIN"} and reason == "health: disk /: 3.0% free"
    text = "NodeName=a State=MIXED+DRAIN Reason=maintenance window [alice@2026-12-01T00:00:00]"
    assert parse_node(text) == ({"MIXED", "DRAIN"}, "maintenance window")


BAD = [Result("disk /dev/shm", False, "3.1% free (at least 20%)")]
GOOD = [Result("munge", True, "a credential decodes")]


def test_decide_drains_a_failing_node_and_resumes_only_its_own_drains() -> None:
    why = reason_for(BAD)
    assert why == "health: disk /dev/shm: 3.1% free (at least 20%)"
    assert decide(BAD, {"IDLE"}, "") == ("drain", why)
    assert decide(BAD, {"IDLE", "DRAIN"}, why, own=why) is None  # already drained for that
    old = PREFIX + "time: x"
    assert decide(BAD, {"IDLE", "DRAIN"}, old, own=old) == ("drain", why)  # new reason
    assert decide(BAD, {"IDLE", "DRAIN"}, "maintenance", own=old) is None  # not ours to touch
    assert decide(GOOD, {"IDLE", "DRAIN"}, why, own=why) == ("resume", "")
    assert decide(GOOD, {"IDLE", "DRAIN"}, "maintenance", own=why) is None
    # an operator's drain that starts like ours is still the operator's: no record, or another
    assert decide(GOOD, {"IDLE", "DRAIN"}, "health: checking the DIMMs") is None
    assert decide(GOOD, {"IDLE", "DRAIN"}, "health: checking the DIMMs", own=why) is None
    assert decide(BAD, {"IDLE", "DRAIN"}, "health: checking the DIMMs") is None
    assert decide(GOOD, {"ALLOCATED"}, "") is None
    long = [Result(f"check{i}", False, "x" * 50) for i in range(10)]
    assert len(reason_for(long)) == 200 and reason_for(long).endswith("...")
    assert '"' not in reason_for([Result("a", False, 'say "no"\nnow')])


def test_metrics_for_the_textfile_collector() -> None:
    text = prometheus_text([*BAD, *GOOD], 1796108028.0)
    assert 'provision_health_check_ok{check="disk /dev/shm"} 0' in text
    assert 'provision_health_check_ok{check="munge"} 1' in text
    assert "provision_health_last_run_timestamp_seconds 1796108028" in text


def _fake_scontrol(tmp_path: Path, node_text: str) -> tuple[Path, Path]:
    log = tmp_path / "scontrol.log"
    program = tmp_path / "scontrol"
    program.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\nif [ "$1" = "-o" ]; then cat {tmp_path / "node.txt"}; fi\n'
    )
    (tmp_path / "node.txt").write_text(node_text + "\n")
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    return program, log


def _stateful_scontrol(tmp_path: Path, state: str) -> tuple[Path, Path]:
    """A stand-in for slurmctld's side of scontrol that keeps the node's state from call to
    call: `update` drains (State=DRAIN Reason=...) and resumes it, `-o show node` answers as
    Slurm 22.05 does. `state`: the node's base state at first, IDLE or ALLOCATED ("IDLE>MIXED":
    a job starts on the node as it is drained)."""
    log = tmp_path / "scontrol.log"
    node = tmp_path / "node.json"
    base, _, arrives = state.partition(">")
    if not node.exists():
        node.write_text(json.dumps({"state": base, "drain": False, "reason": "", "then": arrives}))
    program = tmp_path / "scontrol"
    program.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"log, path, show = {str(log)!r}, {str(node)!r}, {SHOW_NODE!r}\n"
        "args = sys.argv[1:]\n"
        "open(log, 'a').write(' '.join(args) + '\\n')\n"
        "node = json.load(open(path))\n"
        "if args[0] == '-o':\n"
        "    state = node['state'] + ('+DRAIN' if node['drain'] else '')\n"
        "    why = f\" Reason={node['reason']} [root@2026-12-01T06:53:48]\"\n"
        "    why = why if node['drain'] else ''\n"
        "    print(show.format(state=state, reason=why))\n"
        "elif 'State=DRAIN' in args:\n"
        "    why = next(a for a in args if a.startswith('Reason='))\n"
        "    node.update(drain=True, reason=why.removeprefix('Reason='))\n"
        "    node['state'] = node['then'] or node['state']\n"
        "elif 'State=RESUME' in args:\n"
        "    node.update(drain=False, reason='')\n"
        "json.dump(node, open(path, 'w'))\n"
    )
    program.chmod(0o755)
    return program, log


def _program(
    tmp_path: Path,
    config: dict[str, object],
    node_text: str,
    *extra: str,
    stateful: bool = False,
) -> tuple[str, str]:
    """The program from this project's wheel, as the role installs it, with a fake scontrol;
    munge and chronyc answer from stand-ins on PATH."""
    wheel = build_wheel(tmp_path / "wheel")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)  # a test may have put a stand-in there already
    for name, body in {
        "munge": "cat /dev/null",
        "unmunge": f"printf '{MUNGE_OK}'",
        "chronyc": f"printf '{CHRONY_OK}'",
    }.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    if stateful:
        scontrol, log = _stateful_scontrol(tmp_path, node_text)
    else:
        scontrol, log = _fake_scontrol(tmp_path, node_text)
    # the record of the program's own drain: here, never on this machine's /var/lib
    config = {"drain_record": str(tmp_path / "drained"), **config}
    (tmp_path / "health.json").write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-I", "-c",
         "import sys; sys.path.insert(0, sys.argv[1]); "
         "from provision.health.__main__ import main; sys.exit(main(sys.argv[2:]))",
         str(wheel), "--config", str(tmp_path / "health.json"), "--node", "compute001",
         "--scontrol", str(scontrol), *extra],
        capture_output=True, text=True, check=False,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )  # fmt: skip
    calls = log.read_text() if log.exists() else ""
    return done.stdout + done.stderr + f"rc={done.returncode}", calls


def test_the_program_drains_through_scontrol_and_writes_metrics(tmp_path: Path) -> None:
    config = {
        "disks": [{"path": "/", "min_free_percent": 100}],  # never met: / is never empty
        "mounts": [],
        "textfile_dir": str(tmp_path / "textfile"),
    }
    out, calls = _program(tmp_path, config, _node("IDLE"))
    assert "PASS munge: a credential decodes" in out and "FAIL disk /:" in out, out
    assert out.endswith("rc=1")
    assert calls.splitlines()[0] == "-o show node compute001"
    drain = calls.splitlines()[1]
    assert drain.startswith("update NodeName=compute001 State=DRAIN Reason=health: disk /: ")
    metrics = (tmp_path / "textfile" / "provision-health.prom").read_text()
    assert 'provision_health_check_ok{check="disk /"} 0' in metrics


def test_the_program_resumes_its_own_drain_once_well(tmp_path: Path) -> None:
    """Its own: the drain whose reason it recorded when it made it; the record goes with the
    resume."""
    config = {"disks": [{"path": "/", "min_free_percent": 1}], "mounts": []}
    sick = tmp_path / "sick"
    sick.mkdir()
    out, calls = _program(
        sick, {**config, "disks": [{"path": "/", "min_free_percent": 99}]}, _node("IDLE")
    )
    why = (sick / "drained").read_text().strip()
    assert why.startswith("health: disk /: ") and f"Reason={why}" in calls, (out, calls)
    well = tmp_path / "well"
    well.mkdir()
    (well / "drained").write_text(why + "\n")
    out, calls = _program(well, config, _node("IDLE+DRAIN", why))
    assert out.endswith("rc=0") and "health: compute001: resumed" in out, out
    assert calls.splitlines()[1] == "update NodeName=compute001 State=RESUME"
    assert not (well / "drained").exists()


def test_the_program_leaves_an_operators_drain_that_looks_like_its_own(tmp_path: Path) -> None:
    """An operator drained with a reason that starts `health: `: not the program's to undo,
    whether it never drained the node or drained it for something else before."""
    config = {"disks": [], "mounts": []}
    node = _node("IDLE+DRAIN", "health: swapping the DIMMs")
    out, calls = _program(tmp_path, config, node)
    assert "left as it is (DRAIN+IDLE)" in out and "State=" not in calls, (out, calls)
    (tmp_path / "drained").write_text("health: disk /: 0.5% free\n")
    out, calls = _program(tmp_path, config, node)
    assert "left as it is (DRAIN+IDLE)" in out and "State=" not in calls, (out, calls)


def test_the_program_leaves_an_operators_drain(tmp_path: Path) -> None:
    config = {"disks": [], "mounts": []}
    out, calls = _program(tmp_path, config, _node("IDLE+DRAIN", "bad fan"))
    assert "left as it is (DRAIN+IDLE)" in out and len(calls.splitlines()) == 1, (out, calls)


def test_rendered_for_every_compute_pool_and_named_in_slurm_conf() -> None:
    files = render(Cluster(load_spec(ROOT / "examples" / "lab.yaml")))
    config = json.loads(files["files/health/compute.json"])
    assert config == {
        "disks": [
            {"path": "/", "min_free_percent": 5},
            {"path": "/dev/shm", "min_free_percent": 20},
        ],
        "mounts": [],
        "prolog": False,  # no GPUs in the lab
        "textfile_dir": "/var/lib/prometheus/node-exporter",
        "drain_record": "/var/lib/provision/health/drained",
        "interval": 60,
    }
    conf = files["files/slurm/slurm.conf"]
    for line in (
        "HealthCheckProgram=/usr/local/sbin/provision-health",
        "HealthCheckInterval=60",
        "HealthCheckNodeState=ANY",
    ):
        assert line in conf.splitlines()
    assert "files/health/head.json" not in files  # slurmd runs on compute nodes only
    assert "Prolog=" not in conf  # no GPU pool: no prolog


def test_gpu_pools_run_the_checks_in_the_prolog_too() -> None:
    spec = load_spec(ROOT / "examples" / "dgx-superpod.yaml")
    spec = type(spec).model_validate({**spec.model_dump(), "health": {}})
    cluster = Cluster(spec)
    files = render(cluster)
    assert (
        "Prolog=/usr/local/sbin/provision-health-prolog"
        in files["files/slurm/slurm.conf"].splitlines()
    )
    assert json.loads(files["files/health/gpu.json"])["prolog"] is True
    off = type(spec).model_validate({**spec.model_dump(), "health": {"prolog": False}})
    assert "Prolog=" not in render(Cluster(off))["files/slurm/slurm.conf"]


def test_a_prolog_error_drain_is_the_prologs_own_when_the_prolog_is_ours() -> None:
    assert decide(GOOD, {"IDLE", "DRAIN"}, "Prolog error", prolog=True) == ("resume", "")
    assert decide(GOOD, {"IDLE", "DRAIN"}, "Prolog error") is None  # someone else's prolog
    assert decide(BAD, {"IDLE", "DRAIN"}, "Prolog error", prolog=True) == (
        "drain",
        reason_for(BAD),
    )


@pytest.mark.parametrize("module", ["provision.health.__main__", "provision.health.slurm_metrics"])
def test_the_programs_import_nothing_beyond_the_standard_library(
    tmp_path: Path, module: str
) -> None:
    assert third_party_imports(build_wheel(tmp_path), module) == []


def test_slurm_metrics_from_sinfo_and_squeue() -> None:
    from provision.health.slurm_metrics import metrics

    sinfo = (0, "compute001 idle\ncompute002 drained*\nburst001 idle~\ncompute001 idle\n")
    squeue = (0, "RUNNING|None\nPENDING|Resources\nPENDING|Dependency\nPENDING|Priority\n")
    text = metrics(sinfo, squeue, 1796108028.0)
    lines = set(text.splitlines())
    assert "slurm_controller_up 1" in lines
    assert 'slurm_node_state{slurm_node="compute002",state="drained"} 1' in lines
    assert 'slurm_node_state{slurm_node="burst001",state="idle"} 1' in lines
    assert 'slurm_nodes{state="idle"} 2' in lines and 'slurm_nodes{state="drained"} 1' in lines
    assert 'slurm_jobs{state="pending"} 3' in lines and 'slurm_jobs{state="running"} 1' in lines
    assert "slurm_jobs_pending_on_resources 2" in lines  # not the one waiting on a dependency
    down = metrics((1, "slurm_load_partitions: Unable to contact slurm controller"), (1, ""), 0)
    assert "slurm_controller_up 0" in down and "slurm_node_state" not in down


def test_the_prolog_checks_gpu_nodes_only_and_fails_the_job_on_a_sick_one(tmp_path: Path) -> None:
    sick = {"disks": [{"path": "/", "min_free_percent": 100}], "mounts": []}
    out, calls = _program(tmp_path, {**sick, "prolog": False}, _node("IDLE"), "--prolog")
    assert out == "rc=0" and calls == ""  # not a GPU pool's node: nothing checked
    (tmp_path / "scontrol.log").unlink(missing_ok=True)
    out, calls = _program(
        tmp_path / "gpu", {**sick, "prolog": True}, _node("ALLOCATED"), "--prolog"
    )
    assert out.endswith("rc=1") and "FAIL disk /:" in out, out
    assert "State=DRAIN Reason=health: disk /:" in calls.splitlines()[1]


# --- DCGM's diagnostics -----------------------------------------------------------------------

DCGM = ROOT / "tests" / "data" / "dcgm"


def test_dcgm_diag_reports_parse_in_both_document_shapes() -> None:
    from provision.parsers.dcgm import parse_diag

    passing = parse_diag((DCGM / "diag-r1-pass-dcgm3.txt").read_text())
    assert passing is not None
    assert (passing.tests, passing.failures, passing.version) == (9, [], "3.3.9")
    failing = parse_diag((DCGM / "diag-r2-fail-dcgm4.txt").read_text())
    assert failing is not None and failing.version == "4.1.1"
    assert failing.tests == 16  # the null result of GPU 6 is no result; Warn is no failure
    assert failing.failures == [
        "pcie (GPU 3): GPU 3 Error using CUDA API cudaMemcpy: PCIe replay count 412 exceeds "
        "the threshold 8",
        "memory (GPU 5): GPU 5 A double-bit ECC error was detected",
    ]
    assert parse_diag((DCGM / "diag-no-hostengine.txt").read_text()) is None
    assert parse_diag('{"something": "else"}') is None


def test_dcgm_diag_as_a_health_check() -> None:
    from provision.health import check_dcgm_diag

    ok = check_dcgm_diag(
        1, _fake_run({"dcgmi diag -r 1 -j": (DCGM / "diag-r1-pass-dcgm3.txt").read_text()})
    )
    assert ok == ok.__class__("dcgm diag level 1", True, "9 results passed (DCGM 3.3.9)")
    bad = check_dcgm_diag(
        2, _fake_run({"dcgmi diag -r 2 -j": (1, (DCGM / "diag-r2-fail-dcgm4.txt").read_text())})
    )
    assert not bad.ok and bad.detail.startswith("pcie (GPU 3): GPU 3 Error using CUDA API")
    assert "; memory (GPU 5): GPU 5 A double-bit ECC error was detected" in bad.detail
    down = check_dcgm_diag(
        1, _fake_run({"dcgmi": (255, (DCGM / "diag-no-hostengine.txt").read_text())})
    )
    assert (down.ok, down.detail) == (
        False,
        "did not run (rc 255): Error: unable to establish a connection to the specified host: "
        "localhost",
    )
    missing = check_dcgm_diag(1, _fake_run({"dcgmi": (127, "sh: 1: dcgmi: not found")}))
    assert "dcgmi not found" in missing.detail


def test_periodic_dcgm_diag_is_due_once_every_period_after_it_passed(tmp_path: Path) -> None:
    from provision.health import Result, diag_due, diag_passed

    marker = tmp_path / "state" / "dcgm-diag.passed"
    config: dict[str, object] = {
        "dcgm_diag": {"level": 3, "when": "periodic", "every": 3600, "last_pass_file": str(marker)}
    }
    assert diag_due(config, "prolog") is None
    assert diag_due(config, "periodic") == 3  # never passed
    diag_passed(config, [Result("dcgm diag level 3", False, "memory (GPU 5): ...")])
    assert not marker.exists() and diag_due(config, "periodic") == 3  # failing: again next run
    diag_passed(config, [Result("dcgm diag level 3", True, "passed")])
    now = marker.stat().st_mtime
    assert diag_due(config, "periodic", now + 60) is None
    assert diag_due(config, "periodic", now + 3601) == 3
    prolog = {
        "dcgm_diag": {"level": 1, "when": "prolog", "every": 86400, "last_pass_file": str(marker)}
    }
    assert diag_due(prolog, "prolog") == 1 and diag_due(prolog, "periodic") is None


def _fake_dcgmi(tmp_path: Path, output: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "dcgmi").write_text(
        f'#!/bin/sh\necho "$*" >> {tmp_path / "dcgmi.log"}\ncat {output}\n'
    )
    (bin_dir / "dcgmi").chmod(0o755)


def _long_diag(tmp_path: Path, level: int = 2) -> dict[str, object]:
    return {
        "disks": [],
        "mounts": [],
        "dcgm_diag": {
            "level": level,
            "when": "periodic",
            "every": 86400,
            "last_pass_file": str(tmp_path / "dcgm-diag.passed"),
            "state_file": str(tmp_path / "dcgm-diag.state"),
            "lock_file": str(tmp_path / "dcgm-diag.lock"),
            "timeout_s": 1200,
        },
    }


def _drain_calls(calls: str) -> list[str]:
    return [c for c in calls.splitlines() if c.startswith("update ")]


def test_slurmds_health_program_leaves_a_long_diag_to_its_timer(tmp_path: Path) -> None:
    """slurmd kills its HealthCheckProgram after 60 s: a periodic level 2 diagnostic is never
    run by it, on an idle node either; the node is left in service."""
    _fake_dcgmi(tmp_path, DCGM / "diag-r2-fail-dcgm4.txt")
    out, calls = _program(tmp_path, _long_diag(tmp_path), "IDLE", stateful=True)
    assert not (tmp_path / "dcgmi.log").exists(), out
    assert "dcgm diag" not in out and out.endswith("rc=0") and not _drain_calls(calls), out


def test_the_timer_holds_an_idle_node_runs_the_diag_and_resumes_it_once_passed(
    tmp_path: Path,
) -> None:
    _fake_dcgmi(tmp_path, DCGM / "diag-r1-pass-dcgm3.txt")
    out, calls = _program(tmp_path, _long_diag(tmp_path), "IDLE", "--diag", stateful=True)
    assert "PASS dcgm diag level 2: 9 results passed (DCGM 3.3.9) (the timer's run)" in out, out
    assert (tmp_path / "dcgmi.log").read_text() == "diag -r 2 -j\n"
    assert _drain_calls(calls) == [
        "update NodeName=compute001 State=DRAIN Reason=health: dcgm diag level 2: running (the "
        "node is held while it runs)",
        "update NodeName=compute001 State=RESUME",
    ]
    assert (tmp_path / "dcgm-diag.passed").exists() and not (tmp_path / "dcgm-diag.state").exists()
    assert not (tmp_path / "drained").exists() and out.endswith("rc=0")
    # passed: not due again for a day, the node is not held again
    (tmp_path / "dcgmi.log").unlink()
    (tmp_path / "scontrol.log").unlink()
    out, calls = _program(tmp_path, _long_diag(tmp_path), "IDLE", "--diag", stateful=True)
    assert "dcgm diag level 2: not due: it passed less than 86400 s ago" in out, out
    assert not (tmp_path / "dcgmi.log").exists() and not _drain_calls(calls)


def test_a_failed_long_diag_keeps_the_node_drained_through_slurmds_runs(tmp_path: Path) -> None:
    _fake_dcgmi(tmp_path, DCGM / "diag-r2-fail-dcgm4.txt")
    out, calls = _program(tmp_path, _long_diag(tmp_path), "IDLE", "--diag", stateful=True)
    assert "FAIL dcgm diag level 2:" in out and out.endswith("rc=1"), out
    drains = _drain_calls(calls)
    assert len(drains) == 2 and drains[1].startswith(
        "update NodeName=compute001 State=DRAIN Reason=health: dcgm diag level 2: "
    ), drains
    failed = json.loads((tmp_path / "node.json").read_text())["reason"]
    assert "running" not in failed and not (tmp_path / "dcgm-diag.passed").exists()
    # slurmd's periodic run: every other check passes, but the node stays drained with the
    # diagnostic's failure (the program's own drain, which it would resume otherwise)
    (tmp_path / "scontrol.log").unlink()
    out, calls = _program(tmp_path, _long_diag(tmp_path), "IDLE", stateful=True)
    assert "FAIL dcgm diag level 2:" in out and "left as it is (DRAIN+IDLE)" in out, out
    assert not _drain_calls(calls) and not (tmp_path / "dcgmi.log").read_text().count("\n") > 1


def test_while_the_long_diag_runs_slurmds_runs_keep_the_hold(tmp_path: Path) -> None:
    from provision.health import RUNNING, diag_lock, write_diag_state

    config = {**_long_diag(tmp_path), "textfile_dir": str(tmp_path / "textfile")}
    config["disks"] = [{"path": "/", "min_free_percent": 1}]
    write_diag_state(config, 2, RUNNING)
    hold = "health: dcgm diag level 2: " + RUNNING
    with diag_lock(config) as mine:  # the timer's run, under way
        assert mine
        out, calls = _program(tmp_path, config, _node("IDLE+DRAIN", hold))
        assert f"FAIL dcgm diag level 2: {RUNNING}" in out, out
        assert "State=RESUME" not in calls  # the node was not in the record yet: not ours
        (tmp_path / "drained").write_text(hold + "\n")
        (tmp_path / "scontrol.log").unlink()
        out, calls = _program(tmp_path, config, _node("IDLE+DRAIN", hold))
        assert _drain_calls(calls) == [] and "left as it is" in out, out
        # no metric while it runs: it is no finding yet
        metrics = (tmp_path / "textfile" / "provision-health.prom").read_text()
        assert "provision_health_check_ok" in metrics and "dcgm" not in metrics, metrics
    # the run was killed midway (its lock went with it): the node stays drained, saying so
    (tmp_path / "scontrol.log").unlink()
    out, calls = _program(tmp_path, config, _node("IDLE+DRAIN", hold))
    assert "did not finish (killed, or past its time limit)" in out, out
    assert _drain_calls(calls)[0].startswith(
        "update NodeName=compute001 State=DRAIN Reason=health: dcgm diag level 2: did not finish"
    )


def test_the_timer_skips_a_busy_node_and_an_operators_drain(tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    _fake_dcgmi(busy, DCGM / "diag-r1-pass-dcgm3.txt")
    out, calls = _program(busy, _long_diag(busy), "ALLOCATED", "--diag", stateful=True)
    assert "dcgm diag level 2: not run: jobs on compute001" in out and out.endswith("rc=0"), out
    assert not (busy / "dcgmi.log").exists() and not _drain_calls(calls)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    _fake_dcgmi(theirs, DCGM / "diag-r1-pass-dcgm3.txt")
    out, calls = _program(
        theirs, _long_diag(theirs), _node("IDLE+DRAIN", "health: swap the PSU"), "--diag"
    )
    assert "not run: compute001 is drained by someone else (health: swap the PSU)" in out, out
    assert not (theirs / "dcgmi.log").exists() and not _drain_calls(calls)


def test_a_job_that_lands_before_the_hold_goes_first(tmp_path: Path) -> None:
    """The drain made while a job was starting: the node shows DRAINING with the job; the
    diagnostic is not run, and the hold is let go."""
    _fake_dcgmi(tmp_path, DCGM / "diag-r1-pass-dcgm3.txt")
    out, calls = _program(tmp_path, _long_diag(tmp_path), "IDLE>MIXED", "--diag", stateful=True)
    assert "not run: a job started on compute001" in out, out
    assert not (tmp_path / "dcgmi.log").exists() and not (tmp_path / "dcgm-diag.state").exists()
    assert _drain_calls(calls)[-1] == "update NodeName=compute001 State=RESUME", calls


def test_dcgm_diag_is_rendered_for_gpu_pools_only() -> None:
    from provision.health import DIAG_STATE
    from provision.render.health import DIAG_LAST_PASS

    files = render(Cluster(load_spec(ROOT / "examples" / "dgx-8.yaml")))
    dgx = json.loads(files["files/health/dgx.json"])
    assert dgx["dcgm_diag"] == {
        "level": 1, "when": "prolog", "every": 86400, "last_pass_file": DIAG_LAST_PASS,
        "state_file": DIAG_STATE, "timeout_s": 300,
    }  # fmt: skip
    assert "files/health/head.json" not in files  # the head is no compute pool
    lab = render(Cluster(load_spec(ROOT / "examples" / "lab.yaml")))
    assert all(
        "dcgm_diag" not in json.loads(text)
        for name, text in lab.items()
        if name.startswith("files/health/")
    )

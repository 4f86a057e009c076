"""Node health checks that act: Slurm's HealthCheckProgram on every compute node.

slurmd runs `provision-health` every HealthCheckInterval seconds. It checks what a job on the
node needs (munge, the clock, free disk, the spec's mounts, the GPUs and fabric ports the
profile promises), drains the node with a reason naming the failed check, and resumes a node
that it drained itself once every check passes again: the reason of its last drain is kept on
the node, and a drain with any other reason (an operator's, even one that starts `health: `)
stays. Each run writes its results for the node exporter's textfile
collector, so Prometheus sees them too.

Standard library only: it runs from this project's wheel on the node (see run/wheel.py), with
the parsers of provision/parsers/.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from provision.parsers import fabric as fp
from provision.parsers.dcgm import DIAG_TIMEOUT_S, LONG_DIAG_FROM, diag_command, parse_diag
from provision.parsers.gpu import (
    DRIVER_STATE,
    DRIVER_STATE_COMMAND,
    QUERY_GPU,
    GpuExpect,
    findings_from,
    gpu_commands,
)

CONFIG = Path("/etc/provision/health.json")
PREFIX = "health: "  # what the reason of a drain this program makes starts with
# the reason of the drain this program made last, kept on the node: only a drain with that very
# reason is its own to undo (an operator's "health: ..." is the operator's)
DRAIN_RECORD = "/var/lib/provision/health/drained"
# Slurm's own reason when a Prolog fails: with the health prolog, that prolog is this program
PROLOG_ERROR = "Prolog error"
# node state flags of a node running jobs: a diagnostic that loads the GPUs waits for idle
BUSY_FLAGS = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
# node state flags of a drained (or draining) node
DRAIN_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING"})
REASON_MAX = 200  # characters of a Slurm reason kept; the rest of a long finding is cut
# A periodic DCGM diagnostic from LONG_DIAG_FROM on runs for minutes: slurmd kills its
# HealthCheckProgram after 60 s, so it runs from its own timer (provision-dcgm-diag.timer,
# `provision-health --diag`), on an idle node held by a drain, and the health program reads what
# it left: running (its lock held), or failed with the failed tests, until a run passes.
DIAG_STATE = "/var/lib/provision/health/dcgm-diag.state"
DIAG_LOCK = "/run/provision/dcgm-diag.lock"
RUNNING = "running (the node is held while it runs)"
UNFINISHED = "did not finish (killed, or past its time limit): the timer runs it again"


@dataclass(frozen=True)
class Result:
    check: str
    ok: bool
    detail: str
    running: bool = False  # a long diagnostic under way: holds the node, but is no finding


class Run(Protocol):
    """A shell: command -> (exit code, stdout and stderr), given up after `timeout` seconds."""

    def __call__(self, command: str, timeout: float = ...) -> tuple[int, str]: ...


def shell(command: str, timeout: float = 60) -> tuple[int, str]:
    try:
        done = subprocess.run(
            command,
            shell=True,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s"
    return done.returncode, done.stdout + done.stderr


def check_munge(run: Run) -> Result:
    code, out = run("munge -n | unmunge")
    status = next((ln for ln in out.splitlines() if ln.startswith("STATUS:")), "")
    ok = code == 0 and "Success" in status
    first = out.strip().splitlines()[:1]
    return Result("munge", ok, "a credential decodes" if ok else (first[0] if first else "failed"))


def check_time(run: Run) -> Result:
    code, out = run("chronyc -n tracking")
    if code != 0:
        first = out.strip().splitlines()[:1]
        return Result("time", False, f"chronyd does not answer: {first[0] if first else code}")
    fields = dict(
        (k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in out.splitlines()) if v
    )
    leap = fields.get("Leap status", "")
    ok = leap != "" and leap != "Not synchronised"
    return Result("time", ok, f"chrony: {leap or 'no leap status'}")


def check_disk(path: str, min_free_percent: float) -> Result:
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return Result(f"disk {path}", False, f"cannot read: {exc.strerror}")
    free = 100.0 * st.f_bavail / st.f_blocks if st.f_blocks else 0.0
    return Result(
        f"disk {path}",
        free >= min_free_percent,
        f"{free:.1f}% free (at least {min_free_percent:g}%)",
    )


def mount_points(mounts_text: str) -> set[str]:
    """Mount points of /proc/self/mounts (octal escapes undone)."""
    points = set()
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            points.add(parts[1].encode().decode("unicode_escape"))
    return points


def check_mounts(paths: list[str], mounts_text: str) -> list[Result]:
    points = mount_points(mounts_text)
    return [
        Result(f"mount {p}", p in points, "mounted" if p in points else "not mounted")
        for p in paths
    ]


def check_gpus(want: GpuExpect, run: Run) -> list[Result]:
    """The GPU checks of verify, without the NCCL test: count, model and memory, driver pin,
    persistence, memory errors (ECC, pending retirement, row remapping), PCIe, NVLink."""
    outputs = {name: run(cmd) for name, cmd in gpu_commands(want, all_reduce=None).items()}
    if outputs[QUERY_GPU][0] != 0:  # why nvidia-smi cannot reach the GPUs
        outputs[DRIVER_STATE] = run(DRIVER_STATE_COMMAND)
    return [Result(c, ok, d) for c, ok, d in findings_from(want, outputs)]


def check_fabric(fabric: dict[str, object], run: Run) -> list[Result]:
    code, out = run("ibstat")
    if code != 0:
        first = out.strip().splitlines()[:1]
        return [Result("hca count", False, f"ibstat failed: {first[0] if first else code}")]
    devices = [str(d) for d in fabric.get("devices", [])]  # type: ignore[attr-defined]
    found = fp.hca_findings(
        fp.parse_ibstat(out),
        devices,
        int(fabric["count"]),  # type: ignore[call-overload]
        int(fabric["rate_gbps"]),  # type: ignore[call-overload]
        str(fabric["link_layer"]),
    )
    return [Result(c, ok, d) for c, ok, d in found]


def check_dcgm_diag(level: int, run: Run) -> Result:
    """DCGM's own diagnostics at `level`: every result passes, or the failed tests by name."""
    check = f"dcgm diag level {level}"
    code, out = run(diag_command(level), DIAG_TIMEOUT_S[level])
    report = parse_diag(out)
    if report is None:
        first = next((line for line in out.splitlines() if line.strip()), "no output")
        if code == 127:
            first = "dcgmi not found (the dcgm role installs it: nvidia.dcgm)"
        return Result(check, False, f"did not run (rc {code}): {first.strip()[:120]}")
    if report.failures:
        more = f" (+{len(report.failures) - 2} more)" if len(report.failures) > 2 else ""
        return Result(check, False, "; ".join(report.failures[:2]) + more)
    return Result(check, True, f"{report.tests} results passed (DCGM {report.version or '?'})")


def diag_due(config: dict[str, object], stage: str, now: float | None = None) -> int | None:
    """The DCGM diagnostic level to run at this stage ("periodic" or "prolog"), if any: in
    the prolog every time, periodically once `every` seconds have passed since it last passed
    (a failing one runs again each time, to resume the node once it passes)."""
    diag = config.get("dcgm_diag")
    if not isinstance(diag, dict) or diag.get("when") != stage:
        return None
    if stage == "periodic":
        try:
            last = Path(str(diag["last_pass_file"])).stat().st_mtime
        except OSError:
            last = 0.0
        if (time.time() if now is None else now) - last < float(diag["every"]):
            return None
    return int(diag["level"])


def diag_passed(config: dict[str, object], results: list[Result]) -> None:
    """Remember when the periodic DCGM diagnostic passed (the file's modification time)."""
    diag = config.get("dcgm_diag")
    if not isinstance(diag, dict) or diag.get("when") != "periodic":
        return
    ran = [r for r in results if r.check.startswith("dcgm diag")]
    if ran and all(r.ok for r in ran):
        marker = Path(str(diag["last_pass_file"]))
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()


def long_diag(config: dict[str, object]) -> int | None:
    """The level of this node's long diagnostic (a periodic level 2 or 3), if it has one."""
    diag = config.get("dcgm_diag")
    if not isinstance(diag, dict) or diag.get("when") != "periodic":
        return None
    level = int(diag["level"])
    return level if level >= LONG_DIAG_FROM else None


def _diag_files(config: dict[str, object]) -> tuple[Path, Path]:
    diag = config.get("dcgm_diag")
    diag = diag if isinstance(diag, dict) else {}
    state, lock = diag.get("state_file", DIAG_STATE), diag.get("lock_file", DIAG_LOCK)
    return Path(str(state)), Path(str(lock))


@contextlib.contextmanager
def diag_lock(config: dict[str, object]) -> Iterator[bool]:
    """Hold the long diagnostic's lock while the block runs: True if this process got it (a
    lock dies with its process, so a killed run leaves none behind)."""
    path = _diag_files(config)[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def _lock_held(config: dict[str, object]) -> bool:
    path = _diag_files(config)[1]
    try:
        with path.open("r") as handle:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def write_diag_state(config: dict[str, object], level: int, detail: str | None) -> None:
    """Record the long diagnostic's state: RUNNING, its failure, or None once it passed."""
    state = _diag_files(config)[0]
    if detail is None:
        state.unlink(missing_ok=True)
        return
    state.parent.mkdir(parents=True, exist_ok=True)
    tmp = state.with_name(f".{state.name}.tmp")
    tmp.write_text(json.dumps({"level": level, "detail": detail}) + "\n")
    tmp.replace(state)


def long_diag_result(config: dict[str, object]) -> Result | None:
    """What the long diagnostic left for the health program: None when its last run passed (or
    none ran yet), else a failing result: it runs now, it failed, or it was killed midway."""
    level = long_diag(config)
    if level is None:
        return None
    try:
        state = json.loads(_diag_files(config)[0].read_text())
    except (OSError, ValueError):
        return None
    check = f"dcgm diag level {level}"
    detail = str(state.get("detail", "")) if isinstance(state, dict) else ""
    if detail == RUNNING:
        if _lock_held(config):
            return Result(check, False, RUNNING, running=True)
        return Result(check, False, UNFINISHED)
    return Result(check, False, detail or UNFINISHED)


def run_checks(
    config: dict[str, object],
    run: Run = shell,
    mounts_text: str | None = None,
    diag_level: int | None = None,
) -> list[Result]:
    """Every check the configuration names; `diag_level`: DCGM's diagnostics too (the caller
    decides when: they load the GPUs from level 2 on)."""
    results = [check_munge(run), check_time(run)]
    for disk in config.get("disks", []):  # type: ignore[attr-defined]
        results.append(check_disk(str(disk["path"]), float(disk["min_free_percent"])))
    mounts = [str(p) for p in config.get("mounts", [])]  # type: ignore[attr-defined]
    if mounts:
        text = mounts_text if mounts_text is not None else Path("/proc/self/mounts").read_text()
        results += check_mounts(mounts, text)
    gpu = config.get("gpu")
    if isinstance(gpu, dict):
        results += check_gpus(GpuExpect(**gpu), run)
    fabric = config.get("fabric")
    if isinstance(fabric, dict):
        results += check_fabric(fabric, run)
    if diag_level is not None:
        results.append(check_dcgm_diag(diag_level, run))
    return results


# --- what slurmctld knows of the node, and what to do about it --------------------------------


def parse_node(text: str) -> tuple[set[str], str]:
    """State flags and reason from `scontrol -o show node NAME` (one line of Key=Value)."""
    state = ""
    reason = ""
    # Reason= runs to the next known key (its value may hold spaces)
    if " Reason=" in text:
        tail = text.split(" Reason=", 1)[1]
        reason = tail.split(" Comment=")[0].split(" ExtSensors")[0].split(" CapWatts")[0]
        reason = reason.strip()
        if reason.endswith("]") and " [" in reason:  # "why [user@time]"
            reason = reason[: reason.rindex(" [")]
    for word in text.split():
        if word.startswith("State="):
            state = word.removeprefix("State=")
    return set(state.replace("+", " ").split()), reason


def reason_for(failed: list[Result]) -> str:
    text = PREFIX + "; ".join(f"{r.check}: {r.detail}" for r in failed)
    # a reason is one line of plain text on the scontrol command line
    text = " ".join(text.replace('"', "'").split())
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def own_drain(config: dict[str, object]) -> str | None:
    """The reason of the drain this program made last on this node, if it made one."""
    try:
        return Path(str(config.get("drain_record", DRAIN_RECORD))).read_text().strip() or None
    except OSError:
        return None


def record_drain(config: dict[str, object], reason: str | None) -> None:
    """Remember the reason of the drain this program just made (None: it resumed the node)."""
    record = Path(str(config.get("drain_record", DRAIN_RECORD)))
    if reason is None:
        record.unlink(missing_ok=True)
        return
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = record.with_name(f".{record.name}.tmp")
    tmp.write_text(reason + "\n")
    tmp.replace(record)


def decide(
    results: list[Result],
    flags: set[str],
    reason: str,
    prolog: bool = False,
    own: str | None = None,
) -> tuple[str, str] | None:
    """(action, reason) for scontrol: ("drain", why) or ("resume", ""), or None to leave the
    node as it is. `own`: the reason of the drain this program made last (own_drain);
    `prolog`: this program is Slurm's Prolog too, so a "Prolog error" drain is its own."""
    failed = [r for r in results if not r.ok]
    drained = bool(flags & DRAIN_FLAGS)
    ours = (own is not None and reason == own) or (prolog and reason == PROLOG_ERROR)
    if failed:
        why = reason_for(failed)
        if drained and not ours:
            return None  # an operator's or a rolling change's drain: theirs to undo
        if drained and reason == why:
            return None
        return ("drain", why)
    if drained and ours:
        return ("resume", "")
    return None


def act(node: str, action: tuple[str, str], scontrol: str) -> tuple[int, str]:
    verb, why = action
    argv = [scontrol, "update", f"NodeName={node}"]
    argv += ["State=DRAIN", f"Reason={why}"] if verb == "drain" else ["State=RESUME"]
    return shell(shlex.join(argv))


def prometheus_text(results: list[Result], now: float) -> str:
    lines = [
        "# HELP provision_health_check_ok 1 when the health check passed on its last run",
        "# TYPE provision_health_check_ok gauge",
    ]
    for r in results:
        if r.running:  # no finding yet: left out until it ends
            continue
        lines.append(f'provision_health_check_ok{{check="{label_value(r.check)}"}} {int(r.ok)}')
    lines += [
        "# HELP provision_health_last_run_timestamp_seconds when the health checks last ran",
        "# TYPE provision_health_last_run_timestamp_seconds gauge",
        f"provision_health_last_run_timestamp_seconds {now:.0f}",
    ]
    return "\n".join(lines) + "\n"


def label_value(text: str) -> str:
    """A label value in Prometheus' text format: backslash, quote and line break escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_textfile(directory: Path, name: str, text: str) -> None:
    """A file for the node exporter's textfile collector, atomically: the collector never
    reads half a file."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    tmp.write_text(text)
    tmp.chmod(0o644)
    tmp.replace(directory / name)


def write_metrics(directory: Path, results: list[Result]) -> None:
    write_textfile(directory, "provision-health.prom", prometheus_text(results, time.time()))


def load_config(path: Path) -> dict[str, object]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data

"""Run a playbook through ansible-runner against a rendered inventory, with live progress."""

from __future__ import annotations

import json
import os
import resource
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision import assets
from provision.errors import OperationError
from provision.secrets import write_private
from provision.sshkeys import host_key_options
from provision.state import State

# plugins/strategy/lean.py, the collection's strategy (push here, and pull on the nodes)
LEAN_STRATEGY = "gpu_provision.cluster.lean"

EventHandler = Callable[[dict[str, Any]], None]


@dataclass
class HostResult:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    # the failure that stopped the host: its last (a rescued one is followed by the rescue's)
    failure: str = ""
    # the tasks that changed something on the host, in order (the record says what an apply
    # did, and a re-apply that should change nothing says what it did change)
    changed_tasks: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        return "ok"


@dataclass
class RunResult:
    rc: int
    status: str
    hosts: dict[str, HostResult] = field(default_factory=dict)
    seconds: float = 0.0
    log_dir: Path | None = None
    cpu_seconds: float = 0.0  # user + system CPU of this workstation while Ansible ran
    node_cpu_seconds: float = 0.0  # pull mode: the CPU the nodes' own Ansible used, summed

    @property
    def failed_hosts(self) -> list[str]:
        return sorted(h for h, r in self.hosts.items() if r.status != "ok")

    @property
    def changed(self) -> int:
        return sum(r.changed for r in self.hosts.values())


def playbook_tags(playbook: str) -> list[str]:
    """The tags of a playbook's plays and roles (what --tags may name)."""
    import yaml

    tags: set[str] = set()
    for play in yaml.safe_load(assets.playbook(playbook).read_text()) or []:
        items = [play, *(play.get("roles") or []), *(play.get("tasks") or [])]
        for item in items:
            if isinstance(item, dict):
                tags.update(item.get("tags") or [])
    return sorted(tags)


def strategy_env() -> dict[str, str]:
    """The collection's `lean` strategy (Mitogen's linear, with the task runs a worker need not
    be forked for answered by the controller: plugins/strategy/lean.py says which).
    ANSIBLE_STRATEGY in the environment wins (bench/apply.py compares it with Ansible's own
    linear strategy)."""
    if "ANSIBLE_STRATEGY" in os.environ:
        return {}
    return {"ANSIBLE_STRATEGY": LEAN_STRATEGY}


def cpu_seconds() -> float:
    """CPU used so far by this process and the children it has waited for."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def ssh_common_args(state: State) -> str:
    """Host keys: learned on first contact, checked ever after, kept per cluster."""
    return shlex.join(host_key_options(state))


def run_playbook(
    playbook: str,
    state: State,
    private_key: Path | None,
    on_event: EventHandler | None = None,
    limit: str | None = None,
    tags: str | None = None,
    extra_env: dict[str, str] | None = None,
    extra_vars: dict[str, object] | None = None,
    extra_inventory: list[Path] | None = None,
) -> RunResult:
    """Run one playbook of playbooks/. extra_vars carry paths and switches, never secrets
    (they appear on Ansible's command line)."""
    import ansible_runner  # heavy import; only the verbs that run Ansible pay for it

    state.ensure()
    inventory = state.build / "inventory" / "hosts.yml"
    if not inventory.exists():
        raise OperationError(f"no rendered inventory at {inventory}: run `provision render` first")
    ident = time.strftime("%Y%m%d-%H%M%S") + f"-{playbook.removesuffix('.yml')}"
    # ansible-playbook lives beside the Python running provision (a venv need not be active)
    bindir = str(Path(sys.executable).parent)
    envvars = {
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_CONFIG": str(assets.ansible_cfg()),
        # the roles, playbooks and modules: the package's collection, gpu_provision.cluster
        "ANSIBLE_COLLECTIONS_PATH": str(assets.collections_path()),
        # Ansible's own files (local temp, caches) under the state directory, not ~ or the cwd
        "ANSIBLE_HOME": str((state.dir / "ansible").resolve()),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_SSH_COMMON_ARGS": ssh_common_args(state),
        "ANSIBLE_NOCOLOR": "1",
        **strategy_env(),
        **(extra_env or {}),
    }
    cmdline = []
    if private_key is not None:
        cmdline += ["--private-key", shlex.quote(str(private_key.resolve()))]
    if tags:
        cmdline += ["--tags", shlex.quote(tags)]
    if extra_vars:
        cmdline += ["-e", shlex.quote(json.dumps(extra_vars, sort_keys=True))]

    result = RunResult(rc=-1, status="starting")
    events = state.logs / ident / "job_events"

    def handle(event: dict[str, Any]) -> bool:
        count_event(result, event)
        if on_event is not None:
            on_event(event)
        keep_event(events, event)
        return False  # kept: ansible-runner need not write it again

    started, cpu_started = time.monotonic(), cpu_seconds()
    private_data_dir = state.dir / "runner"
    private_data_dir.mkdir(mode=0o700, exist_ok=True)
    os.chmod(state.logs, 0o700)  # run logs may hold host details: keep them to the owner
    # a run that was killed (SIGKILL, a crash) left its environment in its record: scrub first
    for earlier in state.logs.iterdir():
        if earlier.is_dir():
            _scrub_environment(earlier)
    try:
        runner = ansible_runner.run(
            private_data_dir=str(private_data_dir.resolve()),
            artifact_dir=str(state.logs.resolve()),
            ident=ident,
            project_dir=str(assets.playbook(playbook).parent),
            playbook=playbook,
            inventory=[str(p.resolve()) for p in [inventory, *(extra_inventory or [])]]
            if extra_inventory
            else str(inventory.resolve()),
            envvars=envvars,
            cmdline=" ".join(cmdline) or None,
            limit=limit,
            fact_cache=str(state.facts.resolve()),
            # ANSIBLE_CACHE_PLUGIN=memory in the environment turns the cache off
            fact_cache_type="memory"
            if os.environ.get("ANSIBLE_CACHE_PLUGIN") == "memory"
            else "jsonfile",
            event_handler=handle,
            quiet=True,
            suppress_env_files=True,
            rotate_artifacts=20,
        )
    finally:  # a failure or an interrupt too: the record never keeps the environment
        _scrub_environment(state.logs / ident)
    result.rc = runner.rc
    result.status = runner.status
    result.seconds = time.monotonic() - started
    result.cpu_seconds = cpu_seconds() - cpu_started
    result.log_dir = state.logs / ident
    if runner.rc != 0 and not result.hosts and not _stats(runner):
        raise OperationError(
            f"Ansible did not run: {_tail(result.log_dir / 'stdout')} (log: {result.log_dir})"
        )
    for host, stats in _stats(runner).items():
        entry = result.hosts.setdefault(host, HostResult())
        entry.ok, entry.changed = stats["ok"], stats["changed"]
        entry.failed, entry.unreachable = stats["failures"], stats["dark"]
        entry.skipped = stats["skipped"]
    return result


def keep_event(folder: Path, event: dict[str, Any]) -> None:
    """An event into the run's record as ansible-runner writes it (job_events/COUNTER-UUID.json,
    0600, whole or not at all), encoded at once: ansible-runner's own json.dump writes through a
    codecs writer piece by piece (a tenth of this process's CPU in a 12-node converge)."""
    name = f"{event['counter']}-{event['uuid']}.json"
    partial = folder / f"{name}.tmp"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(json.dumps(event).encode())
    os.replace(partial, folder / name)


def _scrub_environment(log_dir: Path) -> None:
    """ansible-runner records the whole environment of the run; keep only Ansible's settings,
    so credentials in the user's environment never land in a log."""
    command = log_dir / "command"
    try:
        data = json.loads(command.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return
    except (OSError, ValueError):  # cut short while written: nothing in it is kept
        command.unlink(missing_ok=True)
        return
    env = data.get("env") or {}
    kept = {k: v for k, v in env.items() if k.startswith("ANSIBLE_") or k == "PATH"}
    if kept != env:
        data["env"] = kept
        write_private(command, json.dumps(data).encode())


def _tail(path: Path) -> str:
    if not path.exists():
        return "no output"
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return " ".join(lines[-3:])[:300] or "no output"


def _stats(runner: Any) -> dict[str, dict[str, int]]:
    raw = runner.stats or {}
    out: dict[str, dict[str, int]] = {}
    for key in ("ok", "changed", "failures", "dark", "skipped"):
        for host, count in (raw.get(key) or {}).items():
            out.setdefault(host, {"ok": 0, "changed": 0, "failures": 0, "dark": 0, "skipped": 0})
            out[host][key] = count
    return out


def count_event(result: RunResult, event: dict[str, Any]) -> None:
    """A host's changed tasks and its failure, from one event."""
    kind = event.get("event", "")
    data = event.get("event_data", {})
    host = data.get("host")
    if host and kind == "runner_on_ok" and (data.get("res") or {}).get("changed"):
        task = str(data.get("task", "?"))
        role = data.get("role")
        result.hosts.setdefault(host, HostResult()).changed_tasks.append(
            f"{role} : {task}" if role else task
        )
        return
    if not host or kind not in ("runner_on_failed", "runner_on_unreachable"):
        return
    if kind == "runner_on_failed" and data.get("ignore_errors"):
        return
    result.hosts.setdefault(host, HostResult()).failure = failure_message(data)


HIDDEN = "output hidden because the task handles secrets (no_log)"


def failure_message(data: dict[str, Any]) -> str:
    """One line saying which task failed and why (no_log results stay censored): a command's
    own error where it printed one, and in a loop the first failed item's."""
    res = data.get("res") or {}
    msg = _why(res)
    failed = [r for r in res.get("results") or [] if isinstance(r, dict) and r.get("failed")]
    if failed and not res.get("censored"):
        first = failed[0]
        label = first.get("_ansible_item_label", first.get("item"))
        msg = f"{msg}; first {label}: {_why(first)}"
    msg = " ".join(msg.split())
    return f"{data.get('task', '?')}: {msg[:300]}" if msg else str(data.get("task", "?"))


def _why(res: dict[str, Any]) -> str:
    if res.get("censored"):
        return HIDDEN
    msg, stderr = str(res.get("msg") or ""), str(res.get("stderr") or "")
    if stderr and msg in ("", "non-zero return code"):  # the command's own words
        return stderr
    return msg or stderr or str(res.get("reason") or "")

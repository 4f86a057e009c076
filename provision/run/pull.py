"""Pull mode: the compute and login nodes converge themselves, with the same roles.

In push mode the workstation runs every task of every node: Ansible's controller runs a task
executor for each task and host, so its CPU grows with the node count (about 2 CPU-seconds a
node for a run that changes nothing, docs/speed.md). In pull mode the heads converge first by
push (the nodes need their controller, NFS server and directory up), then every compute and
login node runs the playbook itself, all at once, with `connection: local`; the workstation
only sends what they need and reads back what they did:

- the runtime, once per node and version: Ansible's own Python packages (ansible-core, Jinja2,
  PyYAML, MarkupSafe, packaging, resolvelib) and the few plugins of other collections the roles
  name, from this workstation's environment; kept on the node under PULL_ROOT, by digest;
- the content, once per node and change: this collection (roles, playbooks, plugins), the
  render (inventory and files) and this project's wheel where the roles install it; by digest;
- per run: the extra variables, and the node's own secrets alone (the munge key, the
  directory's CA and bind password, its WireGuard key), 0700 root's, removed when the run ends.

Each node's Ansible writes its events as JSON lines (the collection's `events` callback) and
the workstation hands them to the same progress table, report and record as push mode's; they
are kept in the run's log folder beside ansible-runner's (job_events/pull-HOST-N.json).

The nodes need python3 of 3.11 or later (Ansible 2.19's controller): Debian 12, Ubuntu 24.04.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shlex
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision import assets
from provision.run.ansible import (
    LEAN_STRATEGY,
    EventHandler,
    HostResult,
    RunResult,
    count_event,
    cpu_seconds,
)
from provision.secrets import MUNGE_KEY, write_private
from provision.spec.models import Spec
from provision.spec.nodes import Node as SpecNode
from provision.spec.nodes import expand_nodes
from provision.spec.unbuilt import pull_problems
from provision.state import State, private_dir

PULL_ROOT = "/var/lib/provision/pull"
EVENT_PREFIX = "PROVISION-EVENT "  # plugins/callback/events.py
# the import names of what Ansible's controller needs (ansible-core's requirements; cryptography
# is needed by vault alone, which the roles do not use)
RUNTIME_PACKAGES = (
    *("ansible", "jinja2", "markupsafe", "yaml", "_yaml", "packaging", "resolvelib"),
    # Mitogen's strategy, as on the workstation: each task's module runs in one interpreter
    # kept for the run, instead of a new Python per task
    *("ansible_mitogen", "mitogen"),
)
# their metadata (Ansible reads its own version from it)
RUNTIME_DISTS = ("ansible_core", "jinja2", "markupsafe", "pyyaml", "packaging", "resolvelib")
# the secrets a compute or login node's roles read (munge, sssd, tunnel); a node's WireGuard key
# is its own alone, the public keys are every member's
NODE_SECRETS = (MUNGE_KEY, "directory-ca.pem", "directory-bind.password")
TUNNEL_DIR = "wireguard"
# a plugin of another collection: namespace.collection.name, as the roles write it
_FQCN = re.compile(r"\b(ansible\.posix|community\.[a-z_]+)\.([a-z_0-9]+)\b")
_SKIP_PARTS = {"__pycache__", "tests"}
# the CPU of the run, all its processes (Mitogen's interpreters outlive Ansible's own count):
# the cgroup v2 the command runs in, a container's (the lab) or the SSH session's scope
CPU_PREFIX = "PROVISION-CPU "
CPU_READ = (
    "cpu=$(awk '/^usage_usec/ {print $2}' "
    '"/sys/fs/cgroup$(sed -n "s/^0:://p" /proc/self/cgroup)/cpu.stat" 2>/dev/null || true)'
)
PULL_CFG = """# Ansible on a node that converges itself (provision's pull mode)
[defaults]
stdout_callback = gpu_provision.cluster.events
forks = 5
gathering = smart
gather_subset = !all,min
interpreter_python = auto_silent
retry_files_enabled = false
deprecation_warnings = false
inject_facts_as_vars = false
localhost_warning = false
host_key_checking = false
"""


# auto: pull from this many compute and login nodes (push costs the workstation about 2
# CPU-seconds a node for a run that changes nothing; pull about a quarter of one: docs/speed.md)
PULL_FROM = 50
PULLED_ROLES = ("compute", "login")


def refusal(spec: Spec) -> str | None:
    """Why these nodes cannot converge themselves, if they cannot."""
    found = [message for _, message in pull_problems(spec)]
    return found[0] if found else None


def converge_mode(spec: Spec, override: str | None = None) -> str:
    """push or pull: the command line's choice, else the spec's; auto pulls a big fleet where
    it can."""
    wanted = override or spec.converge.mode
    if wanted != "auto":
        return wanted
    nodes = expand_nodes(spec)
    fleet = pulled(nodes, [n.name for n in nodes])
    return "pull" if len(fleet) >= PULL_FROM and refusal(spec) is None else "push"


def pulled(nodes: Iterable[SpecNode], hosts: Iterable[str]) -> list[str]:
    """Of these hosts, the ones that converge themselves in pull mode: the compute and login
    nodes (the heads and storage nodes serve them, so they go first, by push)."""
    fleet = {n.name for n in nodes if n.role in PULLED_ROLES and not n.elastic}
    return [h for h in hosts if h in fleet]


@dataclass(frozen=True)
class Archive:
    """A tar.gz of the workstation, named by what it holds; kept on the node under that name."""

    name: str  # runtime-DIGEST or content-DIGEST
    path: Path


def _site_packages() -> Path:
    import ansible

    return Path(ansible.__file__).resolve().parent.parent


def _walk(root: Path) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    for path in sorted(root.rglob("*")):
        parts = set(path.relative_to(root).parts)
        if path.is_file() and not _SKIP_PARTS & parts and path.suffix != ".pyc":
            yield path


def other_plugins(texts: Iterable[str]) -> set[tuple[str, str]]:
    """The plugins of other collections the roles name: (namespace.collection, name)."""
    found = set()
    for text in texts:
        found.update(_FQCN.findall(text))
    return found


def runtime_files() -> list[tuple[str, Path]]:
    """(name in the archive, file): Ansible's packages, and of each other collection the roles
    use its metadata, its module_utils and the plugins named (any plugin type of that name)."""
    site = _site_packages()
    files: list[tuple[str, Path]] = []
    for package in RUNTIME_PACKAGES:
        for top in (site / package, site / f"{package}.py"):
            if top.exists():
                files += [(str(p.relative_to(site)), p) for p in _walk(top)]
    for dist in RUNTIME_DISTS:
        for meta in sorted(site.glob(f"{dist}-*.dist-info")):
            files += [(str(p.relative_to(site)), p) for p in _walk(meta)]
    collection = assets.collection_dir()
    texts = (
        p.read_text(encoding="utf-8", errors="replace")
        for part in ("roles", "playbooks")
        for p in _walk(collection / part)
        if p.suffix in (".yml", ".yaml", ".j2")
    )
    wanted: dict[str, set[str]] = {}
    for name, plugin in other_plugins(texts):
        wanted.setdefault(name, set()).add(plugin)
    for name, plugins in sorted(wanted.items()):
        base = site / "ansible_collections" / name.replace(".", "/")
        parts = [
            base / "meta",
            base / "plugins" / "module_utils",
            base / "plugins" / "doc_fragments",
        ]
        kinds = base / "plugins"
        for kind in sorted(kinds.iterdir()) if kinds.is_dir() else []:
            parts += [kind / f"{plugin}.py" for plugin in sorted(plugins)]
        for part in parts:
            if part.exists():
                files += [(str(p.relative_to(site)), p) for p in _walk(part)]
    return files


def _tar(entries: Iterable[tuple[str, bytes | Path]]) -> bytes:
    """A reproducible tar.gz: sorted names, no owners, no times."""
    buf = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name, data in sorted(entries, key=lambda e: e[0]):
            raw = data.read_bytes() if isinstance(data, Path) else data
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            executable = isinstance(data, Path) and os.access(data, os.X_OK)
            info.mode = 0o755 if executable else 0o644
            tar.addfile(info, io.BytesIO(raw))
    return buf.getvalue()


def runtime_archive(state: State) -> Archive:
    """Ansible's runtime for the nodes, made once per version of what it holds (keyed by the
    files' names, sizes and times; the archive's name is the digest of its bytes)."""
    files = runtime_files()
    key = hashlib.sha256()
    for name, path in files:
        info = path.stat()
        key.update(f"{name}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    folder = private_dir(state.dir / "pull")
    index = folder / f"runtime-key-{key.hexdigest()[:16]}"
    if index.exists():
        name = index.read_text(encoding="ascii").strip()
        if (folder / f"{name}.tar.gz").exists():
            return Archive(name, folder / f"{name}.tar.gz")
    data = _tar(files)
    name = "runtime-" + hashlib.sha256(data).hexdigest()[:16]
    for old in folder.glob("runtime-*"):
        old.unlink()
    write_private(folder / f"{name}.tar.gz", data)
    index.write_text(name + "\n", encoding="ascii")
    return Archive(name, folder / f"{name}.tar.gz")


def content_archive(state: State, wheel: Path | None) -> Archive:
    """This collection, the render and the wheel: what every pulling node runs."""
    entries: list[tuple[str, bytes | Path]] = [("ansible.cfg", PULL_CFG.encode())]
    collection = assets.collection_dir()
    prefix = "collections/ansible_collections/gpu_provision/cluster/"
    entries += [(prefix + str(p.relative_to(collection)), p) for p in assets.collection_files()]
    entries += [
        ("build/" + str(p.relative_to(state.build)), p)
        for p in _walk(state.build)
        if p.name != ".provision-render.json"
    ]
    if wheel is not None:
        entries.append((f"wheel/{wheel.name}", wheel))
    data = _tar(entries)
    name = "content-" + hashlib.sha256(data).hexdigest()[:16]
    folder = private_dir(state.dir / "pull")
    path = folder / f"{name}.tar.gz"
    if not path.exists():
        for old in folder.glob("content-*"):
            old.unlink()
        write_private(path, data)
    return Archive(name, path)


def node_secrets(secrets_dir: Path, host: str) -> list[tuple[str, bytes]]:
    """The secrets this node's roles read, and no other node's."""
    found = []
    for name in NODE_SECRETS:
        if (secrets_dir / name).is_file():
            found.append((f"secrets/{name}", (secrets_dir / name).read_bytes()))
    tunnel = secrets_dir / TUNNEL_DIR
    if tunnel.is_dir():
        for path in sorted(tunnel.iterdir()):
            if path.suffix == ".pub" or path.name == f"{host}.key":
                found.append((f"secrets/{TUNNEL_DIR}/{path.name}", path.read_bytes()))
    return found


def node_vars(
    extra_vars: dict[str, object], content: Archive, wheel: Path | None
) -> dict[str, object]:
    """The run's extra variables as the node sees them: its paths, local connection."""
    here = f"{PULL_ROOT}/{content.name}"
    out = dict(extra_vars)
    out["provision_secrets_dir"] = f"{PULL_ROOT}/run/secrets"
    if wheel is not None:
        out["provision_wheel"] = f"{here}/wheel/{wheel.name}"
    out.update(ansible_connection="local", ansible_become=False)
    out["ansible_python_interpreter"] = "{{ ansible_playbook_python }}"
    return out


def run_command(host: str, runtime: Archive, content: Archive, tags: str | None) -> str:
    """The node's run: its Ansible, the content's playbook, this node alone; the secrets go when
    it ends, whatever its outcome."""
    here = f"{PULL_ROOT}/{content.name}"
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "PYTHONPATH": f"{PULL_ROOT}/{runtime.name}",
        "ANSIBLE_CONFIG": f"{here}/ansible.cfg",
        "ANSIBLE_COLLECTIONS_PATH": f"{here}/collections:{PULL_ROOT}/{runtime.name}",
        "ANSIBLE_HOME": f"{PULL_ROOT}/home",
        "ANSIBLE_STRATEGY": LEAN_STRATEGY,
    }
    argv = [
        "python3", "-m", "ansible", "playbook",
        "-i", f"{here}/build/inventory/hosts.yml",
        "--limit", host,
        "-e", f"@{PULL_ROOT}/run/vars.json",
        f"{here}/collections/ansible_collections/gpu_provision/cluster/playbooks/site.yml",
    ]  # fmt: skip
    if tags:
        argv[4:4] = ["--tags", tags]
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return (
        f"{CPU_READ}; before=$cpu; "
        f"cd {shlex.quote(here)} && env -i {assignments} {shlex.join(argv)}; "
        f"rc=$?; rm -rf {PULL_ROOT}/run; {CPU_READ}; "
        f'echo "{CPU_PREFIX}$before $cpu"; exit $rc'
    )


def unpack_command(name: str) -> str:
    """Unpack stdin's tar.gz as PULL_ROOT/NAME, whole or not at all."""
    target = f"{PULL_ROOT}/{name}"
    return (
        f"set -e; umask 077; mkdir -p {PULL_ROOT}; chmod 700 {PULL_ROOT}; "
        f"rm -rf {target}.part; mkdir {target}.part; tar -xzf - -C {target}.part; "
        f"rm -rf {target}; mv {target}.part {target}"
    )


def prune_command(keep: list[str]) -> str:
    """Remove the runtimes and contents of earlier runs (the newest of each kind is kept)."""
    names = " ".join(f"! -name {shlex.quote(n)}" for n in keep)
    return (
        f"find {PULL_ROOT} -mindepth 1 -maxdepth 1 \\( -name 'runtime-*' -o -name 'content-*' \\) "
        f"{names} -exec rm -rf {{}} +"
    )


class _Events:
    """What the nodes report, in order per node: handed on one at a time, kept as files."""

    def __init__(self, log_dir: Path, on_event: EventHandler | None, result: RunResult) -> None:
        self.folder = log_dir / "job_events"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.on_event = on_event
        self.result = result
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.node_cpu: dict[str, float] = {}

    def __call__(self, host: str, event: dict[str, Any]) -> None:
        with self.lock:
            n = self.counts[host] = self.counts.get(host, 0) + 1
            write_private(self.folder / f"pull-{host}-{n:06d}.json", json.dumps(event).encode())
            data = event.get("event_data") or {}
            if event.get("event") == "playbook_on_stats":
                self._stats(host, data)
                return
            count_event(self.result, event)
            if self.on_event is not None:
                self.on_event(event)

    def _stats(self, host: str, data: dict[str, Any]) -> None:
        entry = self.result.hosts.setdefault(host, HostResult())
        entry.ok = int((data.get("ok") or {}).get(host, 0))
        entry.changed = int((data.get("changed") or {}).get(host, 0))
        entry.failed = int((data.get("failures") or {}).get(host, 0))
        entry.unreachable = int((data.get("dark") or {}).get(host, 0))
        entry.skipped = int((data.get("skipped") or {}).get(host, 0))

    def cpu(self, host: str, line: str) -> None:
        """The node's CPU microseconds before and after its run (nothing where it has no
        cgroup v2 to read)."""
        parts = line.split()
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            with self.lock:
                self.node_cpu[host] = (int(parts[1]) - int(parts[0])) / 1e6


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    user: str


def pull(
    nodes: list[Node],
    state: State,
    connect: Callable[[Node], Any],
    secrets_dir: Path,
    extra_vars: dict[str, object],
    log_dir: Path,
    on_event: EventHandler | None = None,
    tags: str | None = None,
) -> RunResult:
    """Have these nodes converge themselves, all at once; their events go to on_event and into
    log_dir, their outcome into the result (rc 0 when every node's run went well). connect:
    an SSH session to a node, opened (verify's Remote: run, client, user, close)."""
    started, cpu_started = time.monotonic(), cpu_seconds()
    wheel_var = extra_vars.get("provision_wheel")
    wheel = Path(str(wheel_var)) if wheel_var else None
    runtime = runtime_archive(state)
    content = content_archive(state, wheel)
    variables = json.dumps(node_vars(extra_vars, content, wheel), sort_keys=True).encode()
    result = RunResult(rc=0, status="running", log_dir=log_dir)
    events = _Events(log_dir, on_event, result)

    def one(node: Node) -> None:
        output = _PullOutput(log_dir / f"pull-{node.name}.log")
        remote = None
        try:
            remote = connect(node)
            have = _sudo(remote, f"ls {PULL_ROOT} 2>/dev/null || true").split()
            for archive in (runtime, content):
                if archive.name not in have:
                    _send(remote, unpack_command(archive.name), archive.path.read_bytes())
            run_dir = [("vars.json", variables), *node_secrets(secrets_dir, node.name)]
            _send(remote, unpack_command("run"), _tar(run_dir))
            _sudo(remote, prune_command([runtime.name, content.name]))
            rc = _stream(
                remote, run_command(node.name, runtime, content, tags), node.name, events, output
            )
        except Exception as exc:  # an unreachable node is its own outcome, never the others'
            with events.lock:
                entry = result.hosts.setdefault(node.name, HostResult())
                entry.unreachable += 1
                entry.failure = f"pull: {' '.join(str(exc).split())[:300]}"
            return
        finally:
            output.close()
            if remote is not None:
                remote.close()
        with events.lock:
            entry = result.hosts.setdefault(node.name, HostResult())
            if rc != 0 and not entry.failure:
                entry.failed = max(entry.failed, 1)
                entry.failure = f"pull: Ansible on the node exited {rc}: {output.tail()}"

    with ThreadPoolExecutor(max_workers=min(64, max(1, len(nodes)))) as workers:
        list(workers.map(one, nodes))
    result.rc = 2 if any(r.status != "ok" for r in result.hosts.values()) else 0
    result.status = "failed" if result.rc else "successful"
    result.seconds = time.monotonic() - started
    result.cpu_seconds = cpu_seconds() - cpu_started
    result.node_cpu_seconds = sum(events.node_cpu.values())
    return result


class _PullOutput:
    """A node's own output that is not an event (Ansible's warnings, a crash), kept in the log
    folder; its last lines name a failure that left no event."""

    def __init__(self, path: Path) -> None:
        self.fh = path.open("w", encoding="utf-8")
        self.last: list[str] = []

    def write(self, line: str) -> None:
        self.fh.write(line + "\n")
        if line.strip():
            self.last = [*self.last[-2:], line.strip()]

    def tail(self) -> str:
        return " ".join(self.last)[-300:] or "no output"

    def close(self) -> None:
        self.fh.close()


def _sudo(remote: Any, command: str) -> str:
    out = remote.run(command, sudo=True, timeout=120)
    if out.rc != 0:
        raise RuntimeError(
            f"{command.split(';')[0][:60]}: exit {out.rc}: {out.stderr.strip()[-200:]}"
        )
    return str(out.stdout)


def _wrap(remote: Any, command: str) -> str:
    return command if remote.user == "root" else "sudo -n sh -c " + shlex.quote(command)


def _send(remote: Any, command: str, data: bytes) -> None:
    """Run command on the node with data on its stdin."""
    assert remote.client is not None
    stdin, stdout, stderr = remote.client.exec_command(_wrap(remote, command), timeout=600)
    stdin.write(data)
    stdin.channel.shutdown_write()
    rc = stdout.channel.recv_exit_status()
    if rc != 0:
        err = stderr.read().decode(errors="replace").strip()[-200:]
        raise RuntimeError(f"sending {len(data)} bytes failed: exit {rc}: {err}")


def _stream(remote: Any, command: str, host: str, events: _Events, output: _PullOutput) -> int:
    """Run the node's Ansible, each event line handed on as it comes; its exit code."""
    assert remote.client is not None
    _, stdout, stderr = remote.client.exec_command(_wrap(remote, command), get_pty=False)
    for raw in stdout:
        line = raw.rstrip("\n")
        if line.startswith(EVENT_PREFIX):
            try:
                event = json.loads(line[len(EVENT_PREFIX) :])
            except ValueError:
                output.write(line)
                continue
            events(host, event)
        elif line.startswith(CPU_PREFIX):
            events.cpu(host, line[len(CPU_PREFIX) :])
        else:
            output.write(line)
    for line in stderr.read().decode(errors="replace").splitlines():
        output.write(line)
    return int(stdout.channel.recv_exit_status())

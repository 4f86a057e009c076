"""Pull mode (provision/run/pull.py): what the workstation sends a node that converges itself,
the command the node runs, which nodes pull, and the events callback run by a real Ansible."""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from provision import assets
from provision.run import pull
from provision.run.ansible import RunResult
from provision.spec import load_spec
from provision.spec.nodes import expand_nodes
from provision.state import State

from .conftest import ROOT, collection_module

LAB = ROOT / "examples" / "lab.yaml"


def _names(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        return tar.getnames()


def _state(tmp_path: Path) -> State:
    state = State(tmp_path / "state", "t")
    (state.build / "inventory").mkdir(parents=True)
    (state.build / "inventory" / "hosts.yml").write_text("all: {}\n")
    (state.build / "files").mkdir()
    (state.build / "files" / "hosts").write_text("10.0.0.1 head001\n")
    (state.build / ".provision-render.json").write_text("{}\n")
    return state


def test_the_runtime_holds_ansible_and_every_plugin_of_other_collections_the_roles_name() -> None:
    names = {name for name, _ in pull.runtime_files()}
    for module in ("ansible/cli/playbook.py", "jinja2/environment.py", "yaml/__init__.py"):
        assert module in names
    assert any(n.startswith("ansible_core-") and n.endswith("/METADATA") for n in names)
    assert "ansible_mitogen/plugins/strategy/mitogen_linear.py" in names
    texts = [
        p.read_text(encoding="utf-8")
        for part in ("roles", "playbooks")
        for p in (assets.collection_dir() / part).rglob("*.yml")
    ]
    named = pull.other_plugins(texts)
    assert ("community.general", "modprobe") in named and ("ansible.posix", "mount") in named
    for collection, plugin in named:
        path = f"ansible_collections/{collection.replace('.', '/')}/plugins/modules/{plugin}.py"
        assert path in names, f"{collection}.{plugin} is not in the runtime"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    # of community.general, what the roles name: not its hundreds of other modules
    general = [
        n for n in names if n.startswith("ansible_collections/community/general/plugins/modules/")
    ]
    assert len(general) < 10, general


def test_the_content_is_the_collection_and_the_render_with_no_secret(tmp_path: Path) -> None:
    state = _state(tmp_path)
    wheel = tmp_path / "gpu_provision-1.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    first = pull.content_archive(state, wheel)
    names = _names(first.path)
    prefix = "collections/ansible_collections/gpu_provision/cluster/"
    assert f"{prefix}playbooks/site.yml" in names
    assert f"{prefix}plugins/callback/events.py" in names
    assert "build/inventory/hosts.yml" in names and "build/files/hosts" in names
    assert "build/.provision-render.json" not in names
    assert "wheel/gpu_provision-1.0-py3-none-any.whl" in names and "ansible.cfg" in names
    assert not [n for n in names if "secret" in n or n.endswith(".key")]
    assert oct(first.path.stat().st_mode & 0o777) == "0o600"
    # the same content, the same name: a node that has it is sent nothing
    assert pull.content_archive(state, wheel) == first
    (state.build / "files" / "hosts").write_text("10.0.0.2 head001\n")
    second = pull.content_archive(state, wheel)
    assert second.name != first.name and not first.path.exists()


def test_a_node_is_sent_its_own_secrets_alone(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    (secrets / "wireguard").mkdir(parents=True)
    for name in ("munge.key", "slurmdbd.password", "grafana-admin.password", "directory-ca.pem"):
        (secrets / name).write_text(name)
    for node in ("hub001", "compute001", "compute002"):
        (secrets / "wireguard" / f"{node}.key").write_text(f"private {node}")
        (secrets / "wireguard" / f"{node}.pub").write_text(f"public {node}")
    sent = dict(pull.node_secrets(secrets, "compute001"))
    assert sorted(sent) == [
        "secrets/directory-ca.pem",
        "secrets/munge.key",
        "secrets/wireguard/compute001.key",
        "secrets/wireguard/compute001.pub",
        "secrets/wireguard/compute002.pub",
        "secrets/wireguard/hub001.pub",
    ]


def test_the_node_runs_its_own_ansible_on_itself_and_the_secrets_go_after(tmp_path: Path) -> None:
    runtime, content = pull.Archive("runtime-aa", tmp_path), pull.Archive("content-bb", tmp_path)
    command = pull.run_command("compute001", runtime, content, "slurm,firewall")
    assert "--limit compute001" in command and "--tags slurm,firewall" in command
    assert f"PYTHONPATH={pull.PULL_ROOT}/runtime-aa" in command
    assert command.index("ansible playbook") < command.index(f"rm -rf {pull.PULL_ROOT}/run")
    # a shell parses it: nothing of it is a second command by accident
    subprocess.run(["sh", "-n", "-c", command], check=True)
    variables = pull.node_vars(
        {"provision_secrets_dir": "/home/me/state/secrets", "provision_wheel": "/w/x.whl"},
        content,
        Path("/w/x.whl"),
    )
    assert variables["provision_secrets_dir"] == f"{pull.PULL_ROOT}/run/secrets"
    assert variables["provision_wheel"] == f"{pull.PULL_ROOT}/content-bb/wheel/x.whl"
    assert variables["ansible_connection"] == "local" and variables["ansible_become"] is False


def test_unpack_is_whole_or_nothing(tmp_path: Path) -> None:
    root = tmp_path / "pull"
    command = pull.unpack_command("content-cc").replace(pull.PULL_ROOT, str(root))
    good = pull._tar([("a/b.txt", b"hello")])
    subprocess.run(["sh", "-c", command], input=good, check=True)
    assert (root / "content-cc" / "a" / "b.txt").read_bytes() == b"hello"
    assert oct(root.stat().st_mode & 0o777) == "0o700"
    cut = subprocess.run(["sh", "-c", command], input=good[: len(good) // 2], check=False)
    assert cut.returncode != 0
    assert (root / "content-cc" / "a" / "b.txt").read_bytes() == b"hello"  # the old one kept


def test_pull_is_for_big_fleets_and_the_compute_and_login_nodes() -> None:
    lab = load_spec(LAB)
    assert pull.converge_mode(lab) == "push"  # 2 compute nodes
    assert pull.converge_mode(lab, "pull") == "pull"
    big = lab.model_copy(
        update={
            "pools": [
                p.model_copy(update={"count": pull.PULL_FROM}) if p.role == "compute" else p
                for p in lab.pools
            ]
        }
    )
    assert pull.converge_mode(big) == "pull"
    assert pull.converge_mode(big, "push") == "push"
    pushed_by_spec = big.model_copy(
        update={"converge": big.converge.model_copy(update={"mode": "push"})}
    )
    assert pull.converge_mode(pushed_by_spec) == "push"
    rocky = big.model_copy(update={"os": "rocky9"})
    assert pull.converge_mode(rocky) == "push"  # auto: where it can
    assert "rocky9" in str(pull.refusal(rocky))
    nodes = expand_nodes(lab)
    assert pull.pulled(nodes, ["head001", "compute002", "compute001"]) == [
        "compute002", "compute001",
    ]  # fmt: skip


def test_apply_mode_pull_where_it_cannot_is_refused_before_anything(tmp_path: Path) -> None:
    spec = tmp_path / "k.yaml"
    spec.write_text((ROOT / "examples" / "lab-k8s.yaml").read_text())
    r = subprocess.run(
        [sys.executable, "-m", "provision", "apply", str(spec), "--mode", "pull"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--mode pull: not supported yet: pull with Kubernetes" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / ".provision").exists()


def test_the_events_callback_speaks_ansible_runners_shape(tmp_path: Path) -> None:
    """A real ansible-playbook on this machine, connection local, the callback on stdout."""
    played = tmp_path / "play.yml"
    played.write_text(
        """- name: Events
  hosts: all
  gather_facts: false
  tasks:
    - name: Write a file
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: "hello\\n"
        mode: "0644"
    - name: A secret
      ansible.builtin.command: echo s3cret
      no_log: true
      changed_when: false
    - name: Not here
      ansible.builtin.debug:
        msg: never
      when: false
    - name: Fails, ignored
      ansible.builtin.command: "false"
      ignore_errors: true
"""
    )
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "gpu_provision.cluster.events",
        "ANSIBLE_COLLECTIONS_PATH": str(assets.collections_path()),
        "ANSIBLE_HOME": str(tmp_path / "home"),
        "ANSIBLE_LOCALHOST_WARNING": "false",
    }
    bindir = Path(sys.executable).parent
    r = subprocess.run(
        [
            str(bindir / "ansible-playbook"), "-i", "node001,", "-c", "local",
            "-e", f"out={shlex.quote(str(tmp_path / 'out.txt'))}",
            "-e", f"ansible_python_interpreter={sys.executable}",
            str(played),
        ],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    lines = r.stdout.splitlines()
    assert lines and all(line.startswith(pull.EVENT_PREFIX) for line in lines), r.stdout[-2000:]
    events = [json.loads(line[len(pull.EVENT_PREFIX) :]) for line in lines]
    kinds = [e["event"] for e in events]
    assert kinds.count("playbook_on_task_start") == 4 and kinds[-1] == "playbook_on_stats"
    wrote = next(e for e in events if e["event"] == "runner_on_ok")["event_data"]
    assert wrote["host"] == "node001" and wrote["task"] == "Write a file"
    assert wrote["res"]["changed"] is True and wrote["res"]["dest"] == str(tmp_path / "out.txt")
    assert wrote["resolved_action"] == "ansible.builtin.copy"
    assert "s3cret" not in r.stdout
    secret = [e for e in events if e["event_data"].get("task") == "A secret"][-1]
    assert secret["event_data"]["res"].get("censored")
    assert [e["event_data"]["task"] for e in events if e["event"] == "runner_on_skipped"] == [
        "Not here"
    ]
    failed = next(e for e in events if e["event"] == "runner_on_failed")["event_data"]
    assert failed["ignore_errors"] is True
    # handed to what reads ansible-runner's events: counts, the record, nothing failed
    result = RunResult(rc=0, status="running")
    folder = tmp_path / "log"
    sink = pull._Events(folder, None, result)
    for event in events:
        sink("node001", event)
    host = result.hosts["node001"]
    # Ansible counts the ignored failure as changed (a command ran), not as failed
    assert (host.ok, host.changed, host.skipped, host.failed) == (3, 2, 1, 0)
    assert host.failure == ""  # an ignored failure stops nothing
    assert host.changed_tasks == ["Write a file"]
    assert len(list((folder / "job_events").glob("pull-node001-*.json"))) == len(events)


def test_the_nodes_cpu_is_read_from_the_line_the_run_ends_with(tmp_path: Path) -> None:
    sink = pull._Events(tmp_path, None, RunResult(rc=0, status="running"))
    sink.cpu("compute001", "1000000 3500000")
    sink.cpu("compute002", " ")  # no cgroup v2 to read there: nothing said
    assert sink.node_cpu == {"compute001": 2.5}


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (
            "installed munge\nconfig-files old-thing\ninstalled slurmd\nhalf-installed x\n",
            ["munge", "slurmd"],
        ),
    ],
)
def test_installed_packages_reads_dpkg(text: str, names: list[str]) -> None:
    module = collection_module("installed_packages")
    assert module.parse_dpkg(text) == names
    assert module.parse_rpm("munge\ngpg-pubkey\nslurm\nmunge\n") == ["munge", "slurm"]


def test_installed_packages_reads_the_apt_lists_age_as_the_apt_module(tmp_path: Path) -> None:
    module: Any = collection_module("installed_packages")
    stamp, lists = tmp_path / "update-success-stamp", tmp_path / "lists"
    lists.mkdir()
    os.utime(lists, (1000, 1000))
    # no stamp: the lists' folder, as ansible.builtin.apt's cache_valid_time reads it
    assert module.apt_cache_age(4600.0, (str(stamp), str(lists))) == 3600
    stamp.touch()
    os.utime(stamp, (4000, 4000))
    assert module.apt_cache_age(4600.0, (str(stamp), str(lists))) == 600
    # never fetched: older than any cache_valid_time
    assert module.apt_cache_age(4600.0, (str(tmp_path / "none"),)) > 10**8


def test_tar_is_reproducible() -> None:
    entries: list[tuple[str, bytes | Path]] = [("b", b"2"), ("a", b"1")]
    assert pull._tar(entries) == pull._tar(list(reversed(entries)))
    with tarfile.open(fileobj=io.BytesIO(pull._tar(entries))) as tar:
        assert tar.getnames() == ["a", "b"]

"""gpu_provision.cluster.files: a node's directories, files and links from one list in one module
run. The module's work on this machine's file system (as root in CI, as the roles run it), then
the module with its action run by a real ansible-playbook: a role's templates and files come out
byte for byte as ansible.builtin.template and copy write them, and a second run changes nothing."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provision import assets
from provision.run import pull

from .conftest import collection_module

files = collection_module("files")
ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name


class Module:
    """What make() asks of AnsibleModule."""

    def __init__(self) -> None:
        self.contexts: list[str] = []

    def run_command(self, command: str) -> tuple[int, str, str]:
        r = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)
        return r.returncode, r.stdout, r.stderr

    def set_default_selinux_context(self, path: str, changed: bool) -> bool:
        self.contexts.append(path)
        return changed


def _make(paths: list[dict[str, Any]], check: bool = False) -> list[dict[str, Any]]:
    return files.make(Module(), paths, ME, MY_GROUP, check)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_list_made_in_order_then_left_alone(tmp_path: Path) -> None:
    conf = tmp_path / "etc" / "app"
    paths = [
        {"path": str(conf), "state": "directory", "mode": "0750"},
        {"path": str(conf / "app.conf"), "content": "port = 1\n", "mode": "0640"},
        {"path": str(conf / "current"), "state": "link", "src": "app.conf"},
    ]
    done = _make(paths)
    assert [d["changed"] for d in done] == [True, True, True]
    # a file's SHA-1, as copy returns it: the record of what the roles left is probed with it
    assert done[1]["checksum"] == hashlib.sha1((conf / "app.conf").read_bytes()).hexdigest()
    assert "checksum" not in done[0] and "checksum" not in done[2]
    assert _mode(conf) == 0o750 and _mode(conf / "app.conf") == 0o640
    assert (conf / "app.conf").read_text() == "port = 1\n"
    assert os.readlink(conf / "current") == "app.conf"
    assert [d["changed"] for d in _make(paths)] == [False, False, False]
    assert sorted(p.name for p in conf.iterdir()) == ["app.conf", "current"]  # no temporary left


def test_a_changed_file_is_replaced_whole_and_a_mode_alone_set(tmp_path: Path) -> None:
    path = tmp_path / "a.conf"
    path.write_text("old\n")
    before = path.stat().st_ino
    assert _make([{"path": str(path), "content": "new\n", "mode": "0644"}])[0]["changed"]
    assert path.read_text() == "new\n" and path.stat().st_ino != before  # renamed over it
    assert _make([{"path": str(path), "content": "new\n", "mode": "0600"}])[0]["changed"]
    assert _mode(path) == 0o600 and path.read_text() == "new\n"
    # the same length, other bytes
    assert _make([{"path": str(path), "content": "wen\n", "mode": "0600"}])[0]["changed"]
    assert path.read_text() == "wen\n"


def test_a_new_file_has_its_mode_before_it_appears(tmp_path: Path) -> None:
    """Written to a temporary file given its mode, then renamed: never readable by others."""
    secret = tmp_path / "secret"
    _make([{"path": str(secret), "content": "s3cret\n", "mode": "0600"}])
    assert _mode(secret) == 0o600
    # the defaults: 0644 a new file, 0755 a new directory
    _make([{"path": str(tmp_path / "d"), "state": "directory"}])
    _make([{"path": str(tmp_path / "d" / "f"), "content": ""}])
    assert _mode(tmp_path / "d") == 0o755 and _mode(tmp_path / "d" / "f") == 0o644


def test_validate_refuses_and_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "rules"
    path.write_text("good\n")
    check = "grep -q good %s"
    with pytest.raises(files.Refused) as refused:
        _make([{"path": str(path), "content": "bad\n", "validate": check}])
    assert str(refused.value).startswith(f"{path}: failed its check (grep -q good %s)")
    assert path.read_text() == "good\n" and [p.name for p in tmp_path.iterdir()] == ["rules"]
    assert _make([{"path": str(path), "content": "good too\n", "validate": check}])[0]["changed"]
    with pytest.raises(files.Refused, match="validate must name the file as %s"):
        _make([{"path": str(path), "content": "other\n", "validate": "true"}])


def test_check_mode_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("x\n")
    os.chmod(path, 0o644)
    done = files.make(
        Module(),
        [
            {"path": str(tmp_path / "new"), "state": "directory"},
            {"path": str(path), "content": "y\n"},
            {"path": str(tmp_path / "l"), "state": "link", "src": "f"},
            {"path": str(path), "content": "x\n", "mode": "0600"},
        ],
        ME,
        MY_GROUP,
        True,
    )
    assert [d["changed"] for d in done] == [True, True, True, True]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
    assert path.read_text() == "x\n" and _mode(path) == 0o644


def test_a_directory_another_node_makes_at_the_same_moment_is_taken_as_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two heads make the Slurm state directory on their shared file system at once: the
    other's mkdir lands between this one's look and its own (a run failed "File exists")."""
    state = tmp_path / "shared" / "slurm" / "state"
    looked = os.path.isdir

    def other_head_first(path: Any) -> bool:
        found = looked(path)
        if str(path) == str(state) and not found:
            state.mkdir(parents=True, mode=0o700)  # the other head, between the look and mkdir
        return found

    monkeypatch.setattr(files.os.path, "isdir", other_head_first)
    results = _make([{"path": str(state), "state": "directory", "mode": "0755"}])
    assert [r["changed"] for r in results] == [True]
    assert _mode(state) == 0o755


def test_a_link_is_pointed_again(tmp_path: Path) -> None:
    link = tmp_path / "libpmix.so"
    link.symlink_to("libpmix.so.1")
    assert _make([{"path": str(link), "state": "link", "src": "libpmix.so.2"}])[0]["changed"]
    assert os.readlink(link) == "libpmix.so.2"


def test_an_entry_whose_when_is_false_is_left_out(tmp_path: Path) -> None:
    done = _make(
        [
            {"path": str(tmp_path / "yes"), "content": "1\n"},
            {"path": str(tmp_path / "no"), "content": "2\n", "when": False},
        ]
    )
    assert [d["path"] for d in done] == [str(tmp_path / "yes")]
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"path": "relative/file", "content": ""}, "relative/file: is not an absolute path"),
        ({"path": "{tmp}/missing/file", "content": ""}, "its directory {tmp}/missing does not"),
        ({"path": "{tmp}", "content": ""}, "{tmp}: exists and is not a regular file"),
        ({"path": "{tmp}/f", "state": "directory"}, "{tmp}/f: exists and is not a directory"),
        ({"path": "{tmp}", "state": "link", "src": "x"}, "{tmp}: is a directory"),
        ({"path": "{tmp}/g"}, "{tmp}/g: a file needs content"),
        ({"path": "{tmp}/g", "state": "link"}, "{tmp}/g: a link needs src"),
        ({"path": "{tmp}/g", "content": "", "owner": "nobody-here"}, "no user nobody-here"),
        ({"path": "{tmp}/g", "content": "", "group": "nogroup-here"}, "no group nogroup-here"),
        ({"path": "{tmp}/g", "content": "", "mode": "rw-"}, "mode 'rw-' is not octal"),
        ({"path": "{tmp}/g", "template": "t.j2"}, "read on the controller, by the action"),
    ],
)
def test_what_it_refuses_names_the_entry(tmp_path: Path, entry: dict, says: str) -> None:
    (tmp_path / "f").write_text("")
    entry = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in entry.items()}
    with pytest.raises(files.Refused) as refused:
        _make([entry])
    assert says.format(tmp=tmp_path) in str(refused.value)
    assert not (tmp_path / "g").exists()


# ansible-playbook on this machine: the same role files written by Ansible's own actions and by
# this one, then this one again
ROLE_TEMPLATE = """# {{ ansible_managed }}
{% for name in names %}
allow {{ name }}
{% endfor %}
{% include 'part.j2' %}
port = {{ port }}
"""
PLAY = """- name: Files
  hosts: localhost
  gather_facts: false
  vars:
    names: [a, b]
    port: 6817
    out: "{{ playbook_dir }}/out"
  roles:
    - role: tiny
"""
TASKS = """- name: Ansible's own
  when: not again | default(false) | bool
  block:
    - name: Directory
      ansible.builtin.file: {path: "{{ out }}/own", state: directory, mode: "0750"}
    - name: Template
      ansible.builtin.template: {src: app.conf.j2, dest: "{{ out }}/own/app.conf", mode: "0640"}
    - name: Copy
      ansible.builtin.copy: {src: static.txt, dest: "{{ out }}/own/static.txt", mode: "0644"}
- name: One module run
  gpu_provision.cluster.files:
    paths:
      - {path: "{{ out }}/files", state: directory, mode: "0750"}
      - {path: "{{ out }}/files/app.conf", template: app.conf.j2, mode: "0640"}
      - {path: "{{ out }}/files/static.txt", source: static.txt, mode: "0644"}
      - {path: "{{ out }}/files/absent", content: "", when: "{{ port == 1 }}"}
  register: written
- name: What changed
  ansible.builtin.debug:
    msg: "{{ written.paths | selectattr('changed') | map(attribute='path') | list }}"
"""


FILES = ("", "app.conf", "static.txt")  # the entry whose when is false never reaches the node


def _playbook(run: Path, *extra: str) -> list[dict[str, Any]]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")},
        "ANSIBLE_STDOUT_CALLBACK": "gpu_provision.cluster.events",
        "ANSIBLE_COLLECTIONS_PATH": str(assets.collections_path()),
        "ANSIBLE_HOME": str(run / "home"),
        "ANSIBLE_LOCALHOST_WARNING": "false",
    }
    r = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c",
            "local", "-e", f"ansible_python_interpreter={sys.executable}", *extra,
            str(run / "play.yml"),
        ],
        capture_output=True, text=True, check=False, env=env, cwd=run,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [
        json.loads(line[len(pull.EVENT_PREFIX) :])
        for line in r.stdout.splitlines()
        if line.startswith(pull.EVENT_PREFIX)
    ]


def _result(events: list[dict[str, Any]], task: str) -> dict[str, Any]:
    (res,) = [
        e["event_data"]["res"]
        for e in events
        if e["event"] == "runner_on_ok" and e["event_data"]["task"] == task
    ]
    return res  # type: ignore[no-any-return]


def test_a_roles_files_as_ansibles_own_actions_write_them(tmp_path: Path) -> None:
    role = tmp_path / "roles" / "tiny"
    for folder, name, text in (
        ("tasks", "main.yml", TASKS),
        ("templates", "app.conf.j2", ROLE_TEMPLATE),
        ("templates", "part.j2", "included {{ port }}\n"),
        ("files", "static.txt", "static\n\n"),
    ):
        (role / folder).mkdir(parents=True, exist_ok=True)
        (role / folder / name).write_text(text)
    (tmp_path / "play.yml").write_text(PLAY)
    events = _playbook(tmp_path, "-vvv")  # results with the modules' invocations
    out = tmp_path / "out"
    for name in ("app.conf", "static.txt"):
        own, ours = out / "own" / name, out / "files" / name
        assert ours.read_bytes() == own.read_bytes(), name
        assert _mode(ours) == _mode(own)
    assert "allow a\nallow b\nincluded 6817" in (out / "files" / "app.conf").read_text()
    assert _mode(out / "files") == 0o750 and not (out / "files" / "absent").exists()
    assert _result(events, "What changed")["msg"] == [
        str(out / "files"), str(out / "files" / "app.conf"), str(out / "files" / "static.txt")
    ]  # fmt: skip
    # the result names the paths; the files' content stays out of it and out of the events
    written = _result(events, "One module run")
    assert written["invocation"] == {
        "module_args": {"paths": [{"path": str(out / "files" / n)} for n in FILES]}
    }
    assert "allow a" not in json.dumps(events)
    again = _playbook(tmp_path, "-e", "again=true")
    assert _result(again, "One module run")["changed"] is False
    assert _result(again, "What changed")["msg"] == []


REFUSED = """- name: Refused
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Two contents
      gpu_provision.cluster.files:
        paths: [{path: {x}, content: "a", template: app.conf.j2}]
      ignore_errors: true
    - name: No such template
      gpu_provision.cluster.files:
        paths: [{path: {x}, template: missing.j2}]
      ignore_errors: true
    - name: A when that is not true or false
      gpu_provision.cluster.files:
        paths: [{path: {x}, content: "a", when: "maybe"}]
      ignore_errors: true
    - name: Not a list
      gpu_provision.cluster.files:
        paths: "{x}"
      ignore_errors: true
"""


def test_what_the_action_refuses_names_the_entry(tmp_path: Path) -> None:
    x = tmp_path / "x"
    (tmp_path / "play.yml").write_text(REFUSED.replace("{x}", str(x)))
    failed = {
        e["event_data"]["task"]: e["event_data"]["res"]["msg"]
        for e in _playbook(tmp_path)
        if e["event"] == "runner_on_failed"
    }
    assert failed["Two contents"] == f"{x}: content and template: name one"
    assert failed["No such template"].startswith(f"{x}: Could not find or access 'missing.j2'")
    assert failed["A when that is not true or false"] == f"{x}: when is not true or false"
    assert failed["Not a list"] == "paths must be a list of entries (dictionaries)"
    assert not x.exists()


def test_the_nodes_journal_and_the_result_get_paths_not_contents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """AnsibleModule logs a module's arguments to the node's journal ("Invoked with ...") and
    returns them in the result: here the paths alone, whatever the files hold."""
    from ansible.module_utils import basic
    from ansible.module_utils.common.text.converters import to_bytes

    logged: list[str] = []
    monkeypatch.setattr(
        basic.AnsibleModule, "log", lambda self, msg, log_args=None: logged.append(msg)
    )
    conf = tmp_path / "app.conf"
    args = {"ANSIBLE_MODULE_ARGS": {"paths": [{"path": str(conf), "content": "s3cret\n"}]}}
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps(args)))
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")
    with pytest.raises(SystemExit):
        files.main()
    result = json.loads(capsys.readouterr().out)
    assert result["changed"] and conf.read_text() == "s3cret\n"
    assert logged == [f"Invoked with paths {conf}"]
    assert result["invocation"] == {"module_args": {"paths": [{"path": str(conf)}]}}
    assert "s3cret" not in json.dumps(result)

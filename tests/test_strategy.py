"""The collection's strategy (plugins/strategy/lean.py), run by a real ansible-playbook on this
machine against Mitogen's linear strategy it builds on: the same events, results and registered
values, with the skips, includes and connection-less actions it answers in the controller made
without forking a worker, and every other task run by the controller's threads (through
Mitogen's multiplexer, as a worker would) except those it must fork for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import ansible_mitogen
import pytest

from provision import assets
from provision.run import pull
from provision.run.ansible import LEAN_STRATEGY, strategy_env

# one play on two hosts: node001 runs what node002 skips
PLAY = """- name: Conditions
  hosts: all
  gather_facts: false
  vars:
    here: "{{ inventory_hostname == 'node001' }}"
  handlers:
    - name: Said
      ansible.builtin.debug:
        msg: handled
      when: here | bool
  tasks:
    - name: Runs on node001 alone
      ansible.builtin.command: "true"
      changed_when: true
      notify: Said
      when: here | bool
    - name: A module's result, registered
      ansible.builtin.command: echo "from {{ inventory_hostname }}"
      register: echoed
      changed_when: false
    - name: Read by the next task
      ansible.builtin.assert:
        that: echoed.stdout == "from " ~ inventory_hostname
    - name: Throttled (a worker each)
      ansible.builtin.command: "true"
      changed_when: false
      throttle: 1
    - name: Skipped everywhere, registered
      ansible.builtin.debug:
        msg: never
      register: never
      when: not here | bool and here | bool
    - name: The skip was registered
      ansible.builtin.assert:
        that:
          - never is skipped
          - never.false_condition == "not here | bool and here | bool"
    - name: A secret, skipped
      ansible.builtin.debug:
        msg: s3cret
      no_log: true
      when: false
    - name: The play context's variables in a condition (local connection)
      ansible.builtin.debug:
        msg: remote
      when: ansible_connection != 'local' and 'mitogen' not in ansible_connection
    - name: A loop, its condition per item (the worker's)
      ansible.builtin.debug:
        msg: "{{ item }}"
      loop: [1, 2, 3]
      when: item != 2
    - name: A loop over an empty list on node001, registered
      ansible.builtin.debug:
        msg: "{{ item }}"
      loop: "{{ [] if here | bool else [1] }}"
      register: looped
    - name: Its skip was registered
      ansible.builtin.assert:
        that: (looped is skipped and looped.results == []) if here | bool else looped is not skipped
    - name: Delegated (the worker's)
      ansible.builtin.debug:
        msg: delegated
      delegate_to: localhost
      when: false
    - name: A condition that fails to evaluate (the worker reports it)
      ansible.builtin.debug:
        msg: undefined
      when: no_such_variable | bool
      ignore_errors: true
    - name: Fails on node001, ignored
      ansible.builtin.fail:
        msg: stopped here
      ignore_errors: true
      when: here | bool
    - name: Skipped tasks of a block
      when: not here | bool
      block:
        - name: First of the block
          ansible.builtin.debug:
            msg: block one
        - name: Second of the block
          ansible.builtin.debug:
            msg: block two
    - name: An include, skipped
      ansible.builtin.include_tasks: missing.yml
      when: false
    - name: An include on node001
      ansible.builtin.include_tasks: included.yml
      when: here | bool
    - name: An include everywhere
      ansible.builtin.include_tasks:
        file: included.yml
    - name: A role on node001
      ansible.builtin.include_role:
        name: tiny
      when: here | bool
"""
INCLUDED = """- name: Included
  ansible.builtin.debug:
    msg: "included on {{ inventory_hostname }}"
"""
# task runs the strategy answers without a worker: on both hosts the registered skip, the
# secret, the play context's, the skipped include, the two includes and the role (skipped on
# node002); node002's first task; node001's two of the block (17 in all); and the actions that
# need no connection, run in the controller: the assert on both, node002's two of the block,
# the included debug where it ran (three times on node001, once on node002), the handler, the
# failure on node001 (10); and that failure's skip on node002; node001's empty loop and the
# assert after it on both
HERE = 2 * 7 + 1 + 2 + 2 + 2 + 4 + 1 + 1 + 1 + 1 + 2 + 2  # + the assert of the registered echo
# what the strategy forks with its threads on: Mitogen's multiplexer, and a worker for each task
# run a thread does not take: the delegated task and the throttled one, on both hosts
FORKED = 1 + 2 + 2

# counts the forks of ansible-playbook's own process (the workers, Mitogen's multiplexer)
SITECUSTOMIZE = """import atexit, os, sys
if sys.argv and sys.argv[0].endswith("ansible-playbook"):
    _forks = [0]
    _pid = os.getpid()
    os.register_at_fork(after_in_parent=lambda: _forks.__setitem__(0, _forks[0] + 1))

    def _write():
        if os.getpid() == _pid:
            with open(os.environ["FORKS_OUT"], "w") as out:
                out.write(str(_forks[0]))

    atexit.register(_write)
"""


def _play(tmp_path: Path, name: str, strategy: dict[str, str]) -> tuple[list[dict], int]:
    run = tmp_path / name
    run.mkdir()
    (run / "site").mkdir()
    (run / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    played = run / "play.yml"
    played.write_text(PLAY)
    (run / "included.yml").write_text(INCLUDED)
    (run / "roles" / "tiny" / "tasks").mkdir(parents=True)
    (run / "roles" / "tiny" / "tasks" / "main.yml").write_text(INCLUDED)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")},
        **strategy,
        "ANSIBLE_STDOUT_CALLBACK": "gpu_provision.cluster.events",
        "ANSIBLE_COLLECTIONS_PATH": str(assets.collections_path()),
        "ANSIBLE_HOME": str(run / "home"),
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "PYTHONPATH": str(run / "site"),
        "FORKS_OUT": str(run / "forks"),
    }
    bindir = Path(sys.executable).parent
    r = subprocess.run(
        [
            str(bindir / "ansible-playbook"), "-i", "node001,node002,", "-c", "local",
            "-e", f"ansible_python_interpreter={sys.executable}", str(played),
        ],
        capture_output=True, text=True, check=False, env=env, cwd=run,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    events = [
        json.loads(line[len(pull.EVENT_PREFIX) :])
        for line in r.stdout.splitlines()
        if line.startswith(pull.EVENT_PREFIX)
    ]
    return events, int((run / "forks").read_text())


def _seen(events: list[dict]) -> list[tuple]:
    """What a reader of the events sees, less what differs between any two runs (times, ids)."""
    seen = []
    for event in events:
        data = event["event_data"]
        res = data.get("res") or {}
        if not event["event"].startswith("runner_"):
            continue
        seen.append(
            (
                event["event"], data.get("host"), data.get("task"), data.get("item"),
                res.get("changed"), res.get("skipped"), res.get("false_condition"),
                res.get("censored"), res.get("msg") if event["event"] != "runner_on_failed"
                else str(res.get("msg"))[-40:],
            )
        )  # fmt: skip
    return sorted(seen, key=repr)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[dict], int]]:
    tmp = tmp_path_factory.mktemp("strategy")
    mitogen = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    return {
        "mitogen": _play(
            tmp,
            "mitogen",
            {"ANSIBLE_STRATEGY_PLUGINS": str(mitogen), "ANSIBLE_STRATEGY": "mitogen_linear"},
        ),
        "lean": _play(tmp, "lean", {"ANSIBLE_STRATEGY": LEAN_STRATEGY}),
        "forked": _play(
            tmp, "forked", {"ANSIBLE_STRATEGY": LEAN_STRATEGY, "PROVISION_LEAN_THREADS": "0"}
        ),
    }


def test_the_same_events_as_mitogens_linear(runs: dict) -> None:
    lean, mitogen = _seen(runs["lean"][0]), _seen(runs["mitogen"][0])
    assert lean == mitogen
    assert _seen(runs["forked"][0]) == mitogen  # its threads off: a worker for every other task
    skipped = [(s[1], s[2]) for s in lean if s[0] == "runner_on_skipped"]
    assert ("node002", "Runs on node001 alone") in skipped
    assert ("node001", "Runs on node001 alone") not in skipped
    ran = [(s[1], s[2]) for s in lean if s[0] == "runner_on_ok"]
    assert ("node001", "Second of the block") in skipped and ("node001", "Said") in ran
    # the included tasks ran where their includes were answered: the file on both, twice on
    # node001; the role's on node001
    assert ran.count(("node001", "Included")) == 3 and ran.count(("node002", "Included")) == 1
    # the secret's skip is censored as the worker's is; the failing condition reported as failed
    assert "s3cret" not in json.dumps(runs["lean"][0])
    failed = [(s[1], s[2], s[-1]) for s in lean if s[0] == "runner_on_failed"]
    assert ("node001", "Fails on node001, ignored", "stopped here") in failed
    assert ("node002", "A condition that fails to evaluate (the worker reports it)",
            "itional: 'no_such_variable' is undefined") in failed  # fmt: skip


def test_what_the_controller_answers_forks_no_worker(runs: dict) -> None:
    assert runs["mitogen"][1] - runs["forked"][1] == HERE


def test_the_controllers_threads_run_the_rest(runs: dict) -> None:
    assert runs["lean"][1] == FORKED


def test_apply_and_pull_run_the_lean_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANSIBLE_STRATEGY", raising=False)
    assert strategy_env() == {"ANSIBLE_STRATEGY": "gpu_provision.cluster.lean"}
    monkeypatch.setenv("ANSIBLE_STRATEGY", "linear")
    assert strategy_env() == {}  # the environment wins (bench/apply.py)
    assert (assets.collection_dir() / "plugins" / "strategy" / "lean.py").is_file()


def test_a_text_is_compiled_once_and_a_broken_one_each_time() -> None:
    """The strategy keeps what Jinja compiled for a template's or a condition's text, for every
    templar of the process: the same text rendered with other variables gives their value, a
    header's overrides are compiled apart, a text that fails to compile is never kept."""
    import importlib.util

    from ansible._internal._templating._engine import TemplateEngine
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    spec = importlib.util.spec_from_file_location(
        "lean_under_test", assets.collection_dir() / "plugins" / "strategy" / "lean.py"
    )
    assert spec and spec.loader
    lean = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lean)
    saved = {k: TemplateEngine.__dict__[k] for k in ("_compile_template", "_compile_expression")}
    try:
        lean._compile_once()
        lean._COMPILED.clear()

        def templar(x: int) -> Templar:
            return Templar(loader=DataLoader(), variables={"x": x})

        assert templar(2).template(trust_as_template("{{ x + 1 }}")) == 3
        assert len(lean._COMPILED) == 1
        assert templar(5).template(trust_as_template("{{ x + 1 }}")) == 6
        assert templar(5).evaluate_conditional(trust_as_template("x > 4"))
        assert not templar(2).evaluate_conditional(trust_as_template("x > 4"))
        assert len(lean._COMPILED) == 2  # the template and the condition, each once
        header = "#jinja2: variable_start_string:'[[', variable_end_string:']]'\n[[ x ]] {{ x }}"
        assert templar(7).template(trust_as_template(header)) == "7 {{ x }}"
        assert len(lean._COMPILED) == 3
        for _ in range(2):
            with pytest.raises(Exception, match="Syntax error in template"):
                templar(2).template(trust_as_template("{{ x + }}"))
        assert len(lean._COMPILED) == 3
    finally:
        for name, method in saved.items():
            setattr(TemplateEngine, name, method)
        TemplateEngine._lean_compiled = False


def test_the_multiplexers_module_scan_compiles_a_source_once() -> None:
    """Mitogen's scan of a module for the module_utils it imports, through the strategy's
    compile: the same files found as by its own, and a second module compiles only itself and
    the files the first did not reach (each scan compiled them all again)."""
    import importlib.util

    import ansible.modules
    from ansible.executor.module_common import _MODULE_UTILS_PATH
    from ansible_mitogen import module_finder

    spec = importlib.util.spec_from_file_location(
        "lean_under_test", assets.collection_dir() / "plugins" / "strategy" / "lean.py"
    )
    assert spec and spec.loader
    lean = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lean)
    modules = Path(ansible.modules.__file__).parent

    def scan(name: str) -> list[tuple[str, str, bool]]:
        return module_finder.scan(f"ansible_module_{name}", str(modules / f"{name}.py"),
                                  (_MODULE_UTILS_PATH,))  # fmt: skip

    assert "compile" not in vars(module_finder)
    plain = {name: scan(name) for name in ("copy", "file")}
    try:
        lean._SCANNED.clear()
        lean._scan_once()
        assert scan("copy") == plain["copy"]
        after_copy = len(lean._SCANNED)
        assert after_copy == 1 + len(plain["copy"])  # the module and each file it reaches
        assert scan("file") == plain["file"]
        after_file = len(lean._SCANNED)
        assert after_file - after_copy == 1 + len(set(plain["file"]) - set(plain["copy"]))
        assert after_file - after_copy < 1 + len(plain["file"])  # they share module_utils
        assert scan("copy") == plain["copy"] and len(lean._SCANNED) == after_file
    finally:
        vars(module_finder).pop("compile", None)

"""What apply says when a task stopped a node (run/ansible.py's failure_message), read from the
events a real Ansible run gives: the command's own error rather than "non-zero return code",
the first failed item of a loop rather than "One or more items failed", and nothing of a task
that handles secrets."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import ansible_runner
import pytest

from provision.run.ansible import HIDDEN, failure_message

PLAY = """\
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: {name}
      ansible.builtin.command: "{command}"
      no_log: {no_log}{loop}
"""


@pytest.fixture(autouse=True)
def _ansible_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = str(Path(sys.executable).parent)  # ansible-playbook beside this Python
    monkeypatch.setenv("PATH", bindir + os.pathsep + os.environ.get("PATH", ""))


def _failed(
    tmp_path: Path, name: str, command: str, loop: object = None, no_log: bool = False
) -> str:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "play.yml").write_text(
        PLAY.format(
            name=name,
            command=command,
            no_log=str(no_log).lower(),
            loop="" if loop is None else f"\n      loop: {loop}",
        )
    )
    events: list[dict[str, Any]] = []
    ansible_runner.run(
        private_data_dir=str(tmp_path),
        project_dir=str(project),
        playbook="play.yml",
        inventory="localhost,",
        quiet=True,
        event_handler=lambda e: events.append(e) or False,
        envvars={"ANSIBLE_PYTHON_INTERPRETER": "auto_silent"},
    )
    (failed,) = [e["event_data"] for e in events if e.get("event") == "runner_on_failed"]
    return failure_message(failed)


def test_a_loop_names_its_first_failed_item_with_the_commands_own_words(tmp_path: Path) -> None:
    command = "sh -c 'test {{ item }} = ok || echo {{ item }} is down >&2; test {{ item }} = ok'"
    said = _failed(tmp_path, "Bring up the links", command, ["ok", "eth1", "eth2"])
    assert said == "Bring up the links: One or more items failed; first eth1: eth1 is down"


def test_a_command_says_its_error_and_a_secret_task_nothing(tmp_path: Path) -> None:
    said = _failed(tmp_path, "Check", "sh -c 'echo no such device >&2; exit 3'")
    assert said == "Check: no such device"
    hidden = _failed(tmp_path, "Key", "sh -c 'echo s3cr3t >&2; exit 3'", no_log=True)
    assert hidden == f"Key: {HIDDEN}"
    looped = _failed(tmp_path, "Keys", "sh -c 'echo s3cr3t >&2; exit 3'", "[1]", no_log=True)
    assert "s3cr3t" not in looped and HIDDEN in looped, looped

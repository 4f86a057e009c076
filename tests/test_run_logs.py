"""The run logs keep no environment: ansible-runner records the whole environment of a run
(cloud credentials included) in logs/<id>/command when the run starts; provision scrubs it when
the run ends, fails or is interrupted, and a run killed outright (SIGKILL) is scrubbed by the
next one before it starts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import ansible_runner
import pytest

from provision.run.ansible import run_playbook
from provision.state import State

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def _state(tmp_path: Path) -> State:
    state = State(tmp_path, "c")
    state.ensure()
    inventory = state.build / "inventory"
    inventory.mkdir(parents=True)
    (inventory / "hosts.yml").write_text("all: {}\n")
    return state


def _recording_then(raising: BaseException) -> Any:
    """ansible_runner.run as it starts a run (its record, with the whole environment), then
    the run interrupted or broken."""

    def run(**kwargs: Any) -> None:
        record = Path(kwargs["artifact_dir"]) / kwargs["ident"]
        record.mkdir(parents=True)
        env = {**os.environ, **kwargs["envvars"]}
        (record / "command").write_text(json.dumps({"command": ["ansible-playbook"], "env": env}))
        raise raising

    return run


def _records(state: State) -> list[str]:
    return [p.read_text() for p in state.logs.glob("*/command")]


@pytest.mark.parametrize("raising", [KeyboardInterrupt(), RuntimeError("runner broke")])
def test_an_interrupted_or_failed_run_keeps_no_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raising: BaseException
) -> None:
    state = _state(tmp_path)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setattr(ansible_runner, "run", _recording_then(raising))
    with pytest.raises(type(raising)):
        run_playbook("site.yml", state, None)
    (record,) = _records(state)
    env = json.loads(record)["env"]
    assert SECRET not in record and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["ANSIBLE_NOCOLOR"] == "1"  # Ansible's own settings stay, for the record


def test_a_record_left_by_a_killed_run_is_scrubbed_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _state(tmp_path)
    killed = state.logs / "20261202-000000-site"
    killed.mkdir()
    (killed / "command").write_text(json.dumps({"env": {"AWS_SECRET_ACCESS_KEY": SECRET}}))
    cut = state.logs / "20261202-000001-site"
    cut.mkdir()
    (cut / "command").write_text('{"env": {"AWS_SECRET_ACCESS_KEY": "' + SECRET[:12])
    (state.logs / "stray-file").write_text("not a run")
    monkeypatch.setattr(ansible_runner, "run", _recording_then(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run_playbook("site.yml", state, None)
    assert not any(SECRET[:12] in r for r in _records(state))
    assert json.loads((killed / "command").read_text())["env"] == {}
    assert oct(state.logs.stat().st_mode & 0o777) == "0o700"

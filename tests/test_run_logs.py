"""The run logs keep no environment: ansible-runner records the whole environment of a run
(cloud credentials included) in logs/<id>/command when the run starts; provision scrubs it when
the run ends, fails or is interrupted, and a run killed outright (SIGKILL) is scrubbed by the
next one before it starts."""

from __future__ import annotations

import json
import os
import sys
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


def _events_kept(tmp_path: Path, name: str, ours: bool) -> dict[str, dict[str, Any]]:
    """A real ansible-runner run of a two-task play on this machine (no connection), its events
    written by ansible-runner or by keep_event; each event file's content by its event and
    task, less what differs between any two runs (ids, times, process numbers)."""
    from provision.run.ansible import keep_event

    project = tmp_path / name / "project"
    project.mkdir(parents=True)
    (project / "play.yml").write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug:\n        msg: kept\n"
        "    - ansible.builtin.set_fact:\n        said: kept\n"
    )
    artifacts = tmp_path / name / "artifacts"
    folder = artifacts / name / "job_events"

    def handle(event: dict[str, Any]) -> bool:
        if not ours:
            return True
        keep_event(folder, event)
        return False

    bindir = str(Path(sys.executable).parent)
    runner = ansible_runner.run(
        private_data_dir=str(tmp_path / name),
        artifact_dir=str(artifacts),
        ident=name,
        project_dir=str(project),
        playbook="play.yml",
        inventory="localhost ansible_connection=local",
        envvars={"PATH": bindir + os.pathsep + os.environ["PATH"], "ANSIBLE_NOCOLOR": "1"},
        event_handler=handle,
        quiet=True,
    )
    assert runner.rc == 0
    kept: dict[str, dict[str, Any]] = {}
    for path in folder.iterdir():
        assert path.suffix == ".json" and path.stat().st_mode & 0o777 == 0o600, path
        event = json.loads(path.read_bytes())
        assert path.name == f"{event['counter']}-{event['uuid']}.json"
        data = event["event_data"]
        for key in ("uuid", "parent_uuid", "created", "pid", "runner_ident"):
            event.pop(key, None)
        for key in ("uuid", "playbook_uuid", "play_uuid", "task_uuid", "start", "end",
                    "duration", "pid", "task_path", "playbook", "play_pattern"):  # fmt: skip
            data.pop(key, None)
        kept[f"{event['counter']} {event['event']} {data.get('task', '')}"] = event
    return kept


def test_the_run_record_keeps_each_event_as_ansible_runner_writes_it(tmp_path: Path) -> None:
    """The events provision writes into a run's record (job_events/, which apply reads back for
    what each node was left with) are ansible-runner's own files: the same names, mode and
    content, with no partial file left."""
    theirs = _events_kept(tmp_path, "theirs", ours=False)
    ours = _events_kept(tmp_path, "ours", ours=True)
    assert any("runner_on_ok" in key for key in theirs)
    assert ours.keys() == theirs.keys()
    for key, event in theirs.items():
        stdout = (event.pop("stdout"), ours[key].pop("stdout"))
        assert stdout[0].split("*")[0] == stdout[1].split("*")[0], key  # banners: times differ
        assert ours[key] == event, key

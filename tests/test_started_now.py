"""The `started_now` test the roles' restart handlers read: a unit their start task found stopped
and started read the files written before it, so its restart is skipped. The results here have
ansible.builtin.systemd_service's shape (its `status`: the unit's properties as `systemctl show`
gave them before the module acted); the lab's cold apply shows the handlers skipped live
(tests/integration/test_lab.py)."""

from __future__ import annotations

import pytest

from .conftest import ROLES_DIR, collection_plugin

started_now = collection_plugin("test", "started_now").started_now


def _result(active: str, changed: bool, state: str | None = "started") -> dict[str, object]:
    result: dict[str, object] = {
        "changed": changed,
        "name": "slurmctld",
        "status": {"ActiveState": active, "SubState": "dead", "LoadState": "loaded"},
    }
    if state is not None:
        result["state"] = state
    return result


@pytest.mark.parametrize("before", ["inactive", "failed"])
def test_a_unit_started_from_stopped_is_started_now(before: str) -> None:
    assert started_now(_result(before, changed=True))


@pytest.mark.parametrize(
    "result",
    [
        _result("active", changed=False),  # running before: it read older files, restart it
        _result("active", changed=True),  # only enabled now: still running on the older files
        _result("activating", changed=True),
        _result("inactive", changed=False),  # check mode's or a failed start's leftovers
        _result("inactive", changed=True, state=None),  # enabled only (state omitted)
        {"changed": False, "skipped": True, "skip_reason": "Conditional result was False"},
        {"changed": True},  # another module's result
        {"changed": True, "status": "active"},
        None,
        "",
    ],
)
def test_anything_else_is_not(result: object) -> None:
    assert not started_now(result)


def test_each_guard_reads_a_start_task_its_role_registers() -> None:
    """A restart guarded by started_now names a result its role's tasks register: a misspelt
    name would be undefined, never started now, and the restart would always run."""
    import re

    guarded = set()
    for role in sorted(p.parent for p in ROLES_DIR.glob("*/tasks")):
        tasks = "".join(p.read_text() for p in sorted((role / "tasks").glob("*.yml")))
        handlers = role / "handlers" / "main.yml"
        text = tasks + (handlers.read_text() if handlers.is_file() else "")
        for name in re.findall(r"(\w+) is not gpu_provision\.cluster\.started_now", text):
            assert f"register: {name}\n" in tasks, (role.name, name)
            guarded.add((role.name, name))
    assert {role for role, _ in guarded} == {
        "common",
        "firewall",
        "monitoring",
        "netboot",
        "node_exporter",
        "slurm",
    }

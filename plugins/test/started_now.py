"""Jinja test `started_now`: did this systemd_service result start its unit from stopped?

    - name: Restart chrony
      ansible.builtin.systemd_service:
        name: chrony
        state: restarted
      when: _common_chrony_start is not gpu_provision.cluster.started_now

A role writes a daemon's files, then starts it, and a changed file notifies a restart. Where the
start task found the unit stopped and started it, the daemon read the files as it started: the
restart after it only stops and starts it again (slurmctld: 2.6 s of a cold apply's 12 nodes,
its state saved and read back). ansible.builtin.systemd_service reads the unit's properties
before it acts and returns them as `status`, so its ActiveState is the state the task found.
A result without them (the task skipped, check mode's unknown unit, another module) is not
started now: the restart runs as before.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: started_now
short_description: Whether a systemd_service task started its unit from stopped
description:
  - True when the registered result of ansible.builtin.systemd_service changed and the unit's
    C(ActiveState), as the module read it before it acted, was C(inactive) or C(failed).
  - False for anything else, a skipped task or a result without the unit's status among them.
options:
  _input:
    description: The registered result of the start task.
    type: raw
    required: true
"""

EXAMPLES = r"""
- name: Restart slurmctld
  ansible.builtin.systemd_service:
    name: slurmctld
    state: restarted
  when: _slurm_slurmctld_start is not gpu_provision.cluster.started_now
"""

RETURN = r"""
_value:
  description: Whether the task started the unit, which then read its files.
  type: bool
"""

STOPPED = frozenset({"inactive", "failed"})


def started_now(result: object) -> bool:
    if not isinstance(result, dict) or not result.get("changed"):
        return False
    status = result.get("status")
    if not isinstance(status, dict):
        return False
    return status.get("ActiveState") in STOPPED and result.get("state") == "started"


class TestModule:
    def tests(self) -> dict[str, object]:
        return {"started_now": started_now}

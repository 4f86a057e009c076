"""Ansible callback: the run's events as JSON lines on stdout, for a node that converges itself.

In pull mode (provision/run/pull.py) each node runs the roles with its own Ansible and this as
its stdout callback; the workstation reads the lines back over SSH and hands each event to the
same code that reads ansible-runner's events in push mode (the progress table, the report, the
record of what each node was left with). So an event keeps ansible-runner's shape:
{"event": "runner_on_ok", "event_data": {"host", "task", "role", "task_action",
"resolved_action", "res", "ignore_errors"}}. A task that handles secrets (no_log) sends its
censored result only. The last event, playbook_on_stats, carries the run's counts per host.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: events
type: stdout
short_description: Each event of the run as one JSON line, prefixed, on stdout
description:
  - For provision's pull mode. Every line starts with C(PROVISION-EVENT ) and holds one event in
    ansible-runner's shape; nothing else is written to stdout.
author: provision
"""

PREFIX = "PROVISION-EVENT "


class CallbackModule(CallbackBase):  # type: ignore[misc]
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "gpu_provision.cluster.events"

    def _emit(self, event: str, data: dict[str, Any]) -> None:
        line = json.dumps({"event": event, "event_data": data}, default=str, sort_keys=True)
        sys.stdout.write(PREFIX + line + "\n")
        sys.stdout.flush()

    def _task_data(self, task: Any) -> dict[str, Any]:
        role = getattr(task, "_role", None)
        name = task.name or task.action  # as ansible-runner names it: without the role's
        return {
            "task": name,
            "role": role.get_name(include_role_fqcn=False) if role is not None else None,
            "task_action": task.action,
            "resolved_action": getattr(task, "resolved_action", None) or task.action,
        }

    def _result(self, event: str, result: Any, **extra: Any) -> None:
        res = json.loads(self._dump_results(result.result))
        data = {"host": result.host.get_name(), "res": res, **self._task_data(result.task)}
        self._emit(event, {**data, **extra})

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._emit("playbook_on_task_start", self._task_data(task))

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self._emit("playbook_on_task_start", self._task_data(task))

    def v2_runner_on_ok(self, result: Any) -> None:
        self._result("runner_on_ok", result)

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        self._result("runner_on_failed", result, ignore_errors=ignore_errors)

    def v2_runner_on_skipped(self, result: Any) -> None:
        self._result("runner_on_skipped", result)

    def v2_runner_on_unreachable(self, result: Any) -> None:
        self._result("runner_on_unreachable", result)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        counts = {
            "ok": stats.ok,
            "changed": stats.changed,
            "failures": stats.failures,
            "dark": stats.dark,
            "skipped": stats.skipped,
        }
        self._emit("playbook_on_stats", counts)

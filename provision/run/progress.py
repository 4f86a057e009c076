"""Per-host progress of an Ansible run, drawn from ansible-runner events."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from provision.run.ansible import HostResult, RunResult, failure_message


class HostProgress:
    """A live table (one row per host) on a terminal; plain lines otherwise (logs, CI)."""

    def __init__(self, console: Console, hosts: list[str]) -> None:
        self.console = console
        self.rows: dict[str, dict[str, Any]] = {
            h: {"done": 0, "changed": 0, "state": "waiting", "task": ""} for h in hosts
        }
        self.task = ""
        self.live: Live | None = None

    def __enter__(self) -> HostProgress:
        if self.console.is_terminal:
            self.live = Live(self._table(), console=self.console, refresh_per_second=4)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self._table())
            self.live.__exit__(None, None, None)

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        if kind == "playbook_on_task_start":
            task = data.get("task", "")
            if self.live is None and task != self.task:
                self.console.print(f"  task: {task}", highlight=False)
            self.task = task
            return
        host = data.get("host")
        if not host or not kind.startswith("runner_on_") or kind == "runner_on_start":
            return
        row = self.rows.setdefault(host, {"done": 0, "changed": 0, "state": "", "task": ""})
        row["done"] += 1
        row["task"] = data.get("task", "")
        outcome = kind.removeprefix("runner_on_")
        if outcome == "ok" and (data.get("res") or {}).get("changed"):
            row["changed"] += 1
            outcome = "changed"
        if outcome in ("failed", "unreachable") and not data.get("ignore_errors"):
            row["state"] = outcome
            if self.live is None:
                self.console.print(
                    f"    {host}: {outcome.upper()} {failure_message(data)}", highlight=False
                )
        elif row["state"] not in ("failed", "unreachable"):
            row["state"] = "running"
            if self.live is None and outcome == "changed":
                self.console.print(f"    {host}: changed", highlight=False)
        if self.live is not None:
            self.live.update(self._table())

    def _table(self) -> Table:
        table = Table(title=f"task: {self.task}" if self.task else None, expand=False)
        for col in ("host", "tasks", "changed", "state", "last task"):
            table.add_column(col)
        for host, row in sorted(self.rows.items()):
            style = {"failed": "red", "unreachable": "red"}.get(row["state"], "")
            table.add_row(
                host,
                str(row["done"]),
                str(row["changed"]),
                row["state"],
                row["task"][:50],
                style=style,
            )
        return table


def summary_table(result: RunResult) -> Table:
    table = Table(title=f"Ansible: {result.status} in {result.seconds:.1f}s")
    for col in ("host", "ok", "changed", "failed", "unreachable", "skipped", "result"):
        table.add_column(col)
    for host, r in sorted(result.hosts.items()):
        table.add_row(
            host,
            str(r.ok),
            str(r.changed),
            str(r.failed),
            str(r.unreachable),
            str(r.skipped),
            _result(r),
            style="red" if r.status != "ok" else "",
        )
    return table


def _result(r: HostResult) -> str:
    return r.failure[:80] if r.status != "ok" else "ok"

"""Mitogen's linear strategy (Ansible's own where Mitogen is missing), with a task whose
condition is false, a loop over an empty list, an include, and an action that needs no
connection answered by the controller instead of a worker.

Ansible forks a worker process for every task and host, also for a task its `when` skips (the
worker works out the condition and sends back "skipped"), for a loop over nothing, for an
include (the worker reads its arguments and sends them back for the controller to expand) and
for an action that runs in the controller anyway (a role's argument check, include_vars,
assert, debug, set_fact, fail). In a converge of this collection's roles more than half of a
node's task runs are such, and each fork of the controller costs it tens of milliseconds of
CPU. This strategy answers them where the task is queued: a condition with the variables the
worker would use (the play context's as well), a loop's list, an include's arguments as the
worker reads them, an action by Ansible's own task executor on copies of the task and its
variables; the result goes to the same results queue, so callbacks, `register`, includes and
the counts see what the worker would have sent. Only where the answer cannot differ from the
worker's: no delegation (other variables), no `run_once`, no `with_*` lookup, a loop only where
its list is empty (a loop's condition is per item); whatever fails to evaluate, and every other
task, goes to a worker as before.
"""

from __future__ import annotations

from typing import Any

from ansible import constants as C
from ansible._internal._templating._engine import TemplateEngine
from ansible.executor.task_executor import TaskExecutor
from ansible.executor.task_result import _RawTaskResult
from ansible.plugins import loader as plugin_loader

try:
    from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule as _Base
except ImportError:  # Ansible's own linear strategy, at its speed
    from ansible.plugins.strategy.linear import StrategyModule as _Base

DOCUMENTATION = """
name: lean
short_description: linear, with skips, includes and local actions answered without a worker
description:
  - Runs like Mitogen's linear strategy (Ansible's linear where Mitogen is not installed).
  - A task without a loop, delegation or run_once whose condition is false for a host is
    reported skipped by the controller (and a loop over an empty list), such an include read,
    and such an action that needs no connection (validate_argument_spec, include_vars, assert,
    fail, debug, set_fact) run, without forking a worker for it.
author: provision
"""


# actions that run in the controller alone (their plugins say they need no connection): a
# worker forked for them only runs them there
_CONTROLLER_ACTIONS = frozenset(
    f"{prefix}{name}"
    for prefix in ("", "ansible.builtin.", "ansible.legacy.")
    for name in ("validate_argument_spec", "include_vars", "assert", "fail", "debug", "set_fact")
)


class StrategyModule(_Base):  # type: ignore[misc]
    """Linear, with skips, includes and connection-less actions answered in the controller."""

    def _queue_task(
        self, host: Any, task: Any, task_vars: dict[str, Any], play_context: Any
    ) -> None:
        answer = self._answer_here(host, task, task_vars, play_context)
        if answer is None:
            super()._queue_task(host, task, task_vars, play_context)
            return
        result, fields = answer
        # what a worker does: the start callback, then the result through the results queue
        # (the results thread and _process_pending_results take it from there)
        self._queued_task_cache[(host.name, task._uuid)] = {
            "host": host,
            "task": task,
            "task_vars": task_vars,
            "play_context": play_context,
        }
        self._tqm.send_callback("v2_runner_on_start", host, task)
        self._final_q.send_task_result(
            _RawTaskResult(host=host, task=task, return_data=result, task_fields=fields)
        )
        self._pending_results += 1

    def _answer_here(
        self, host: Any, task: Any, task_vars: dict[str, Any], play_context: Any
    ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The worker's result and task fields where the controller can tell them (a false
        condition; a loop over nothing; an include, whose worker only reads its arguments for
        the controller to expand; an action that needs no connection); None where a worker must
        run the task (or may: when in doubt, the worker decides, as it always did)."""
        if task.delegate_to or task.run_once or task.loop_with:
            return None
        if task.loop is not None:
            return self._empty_loop(task, task_vars)
        include = task.action in C._ACTION_INCLUDE_TASKS or task.action in C._ACTION_INCLUDE_ROLE
        local = task.action in _CONTROLLER_ACTIONS
        if not (task.when or include or local):
            return None
        try:
            # the worker's variables: the task's search path; the play context's for the condition
            job_vars = self._job_vars(task, task_vars)
            templar = TemplateEngine(loader=self._loader, variables=job_vars)
            variables = job_vars.copy()
            context = play_context.set_task_and_variable_override(
                task=task, variables=job_vars, templar=templar
            )
            context.post_validate(templar=templar)
            if not context.remote_addr:
                context.remote_addr = host.address
            context.update_vars(variables)
            found: dict[str, Any] = {}
            if task.when and not task._resolve_conditional(
                task.when, variables, result_context=found
            ):
                result: dict[str, Any] = {
                    "changed": False,
                    "skipped": True,
                    "skip_reason": "Conditional result was False",
                    **found,
                }
                fields = task.dump_attrs()
                task.update_result_no_log(templar, result)
                return result, fields
            if local:
                return self._run_here(host, task, task_vars, play_context)
            if not include:
                return None
            # as the worker: the task's fields made final with these variables (on a copy:
            # the worker's is its own), then its arguments handed back
            final = task.copy()
            templar.available_variables = variables
            final.post_validate(templar=templar)
            arguments = final.args.copy()
            if task.action in C._ACTION_INCLUDE_TASKS:
                name = arguments.pop("_raw_params", None)
                if not name:
                    return None
                result = {"include": name, "include_args": arguments, "changed": False}
            else:
                result = {"include_args": arguments, "changed": False}
            final.update_result_no_log(templar, result)
            return result, final.dump_attrs()
        except Exception:  # the worker reports it, as it always did
            return None

    def _job_vars(self, task: Any, task_vars: dict[str, Any]) -> dict[str, Any]:
        """The variables a worker's task executor starts from: the task's, and its search path."""
        job_vars = dict(task_vars)
        search_path = task.get_search_path()
        if self._loader.get_basedir() not in search_path:
            search_path.append(self._loader.get_basedir())
        job_vars["ansible_search_path"] = search_path
        return job_vars

    def _empty_loop(
        self, task: Any, task_vars: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """A loop (`loop:`) whose list is empty for this host: skipped, as the worker's task
        executor says before it looks at anything else; None for any other loop."""
        try:
            templar = TemplateEngine(loader=self._loader, variables=self._job_vars(task, task_vars))
            items = templar.template(task.loop)
        except Exception:  # the worker reports it, as it always did
            return None
        if not isinstance(items, list) or items:
            return None
        result = {
            "changed": False,
            "skipped": True,
            "skipped_reason": "No items in the list",
            "results": [],
        }
        return result, task.dump_attrs()

    def _run_here(
        self, host: Any, task: Any, task_vars: dict[str, Any], play_context: Any
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """What a worker runs, run here: Ansible's task executor, on copies of the task and its
        variables (a worker's are its own), for an action that needs no connection."""
        executor = TaskExecutor(
            host,
            task.copy(),
            dict(task_vars),
            play_context,
            self._loader,
            plugin_loader.get_plugin_loader_namespace(),
            self._final_q,
            self._variable_manager,
        )
        result = executor.run()
        return result, executor._task.dump_attrs()

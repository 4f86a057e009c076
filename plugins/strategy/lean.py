"""Mitogen's linear strategy (Ansible's own where Mitogen is missing), with a task whose
condition is false, a loop over an empty list, an include, and an action that needs no
connection answered by the controller, and every other task run by a thread of the controller
instead of a forked worker.

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
its list is empty (a loop's condition is per item); whatever fails to evaluate goes on as below.

The other tasks, where Mitogen carries them, run in the controller too: the same task executor
in a thread (as many as the forks setting), on copies of the task and its variables, talking to
Mitogen's connection multiplexer over one connection the controller keeps for the play (a forked
worker opens and closes its own for each task: a broker thread, a socket, a handshake); Mitogen's
router is thread-safe, and the remote side is the same interpreter a worker would reach. A task
is still forked where a thread could differ from a worker: delegation, `run_once`, a
`throttle`, the task's own `timeout` (an alarm signal, which only the main thread can take),
`async`, and the actions that prompt, reset or wait for the connection or change the inventory.
PROVISION_LEAN_THREADS=0 turns the threads off (a worker for each of those tasks, as before).
"""

from __future__ import annotations

import functools
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from ansible import constants as C
from ansible._internal import _task
from ansible._internal._errors import _error_utils
from ansible._internal._templating._engine import TemplateEngine
from ansible._internal._templating._jinja_bits import (
    AnsibleEnvironment,
    AnsibleTemplate,
    AnsibleTemplateExpression,
)
from ansible.executor.task_executor import TaskExecutor
from ansible.executor.task_result import _RawTaskResult
from ansible.plugins import loader as plugin_loader

try:
    import ansible_mitogen.process as _mitogen_process
    import mitogen.fork
    import mitogen.unix
    from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule as _Base
except ImportError:  # Ansible's own linear strategy, at its speed
    from ansible.plugins.strategy.linear import StrategyModule as _Base

DOCUMENTATION = """
name: lean
short_description: linear, without forking a worker for each task and host
description:
  - Runs like Mitogen's linear strategy (Ansible's linear where Mitogen is not installed).
  - A task without a loop, delegation or run_once whose condition is false for a host is
    reported skipped by the controller (and a loop over an empty list), such an include read,
    and such an action that needs no connection (validate_argument_spec, include_vars, assert,
    fail, debug, set_fact) run, without forking a worker for it.
  - With Mitogen, the other tasks run in threads of the controller through its connection
    multiplexer, except delegated, run_once, throttled, async and timed-out tasks and the
    actions that prompt, reset the connection or change the inventory (environment variable
    PROVISION_LEAN_THREADS=0 turns this off).
author: provision
"""


# actions that run in the controller alone (their plugins say they need no connection): a
# worker forked for them only runs them there
_CONTROLLER_ACTIONS = frozenset(
    f"{prefix}{name}"
    for prefix in ("", "ansible.builtin.", "ansible.legacy.")
    for name in ("validate_argument_spec", "include_vars", "assert", "fail", "debug", "set_fact")
)


# tasks a thread of the controller does not run (a worker is forked for them, as always): those
# that prompt through the worker's queue, reset or wait for the connection, or change the
# inventory
_FORKED_ACTIONS = frozenset(
    f"{prefix}{name}"
    for prefix in ("", "ansible.builtin.", "ansible.legacy.")
    for name in ("pause", "reboot", "wait_for_connection", "add_host", "group_by", "meta")
)


def _own(task: Any) -> Any:
    """A copy of the task for one host's executor (it makes the task's and its blocks' fields
    final with that host's variables): the blocks above it copied without their task lists,
    which the executor does not read (copying them was most of a copy's cost)."""
    return task.copy(exclude_tasks=True)


_AT_FORK: list[bool] = []


def _forget_mitogen_in_forked_workers() -> None:
    """A worker forked after the controller used Mitogen keeps none of its latches or streams
    (Mitogen's own rule for a process forked after use), nor the plugin loader's lock."""
    if not _AT_FORK:
        os.register_at_fork(after_in_child=_after_fork)
        _AT_FORK.append(True)


def _after_fork() -> None:
    global _LOADING
    mitogen.fork.on_fork()
    _LOADING = threading.RLock()


# Ansible's plugin loader is not thread-safe: a plugin's module under import is already in
# sys.modules, and another thread that asks for it gets it half-made ("has no attribute
# FilterModule"). One thread loads plugins at a time.
_LOADING = threading.RLock()
_LOADER_METHODS = ("find_plugin", "find_plugin_with_context", "get_with_context", "all")


def _one_loader_at_a_time() -> None:
    for cls in (plugin_loader.PluginLoader, plugin_loader.Jinja2Loader):
        if getattr(cls, "_lean_locked", False) is cls:
            continue
        for name in (*_LOADER_METHODS, "_load_module_source"):
            method = vars(cls).get(name)
            if method is not None:
                setattr(cls, name, _locked(method, listed=name == "all"))
        cls._lean_locked = cls


def _locked(method: Callable[..., Any], listed: bool) -> Callable[..., Any]:
    @functools.wraps(method)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _LOADING:
            if listed:  # a generator: the loading happens as it is read
                return iter(list(method(*args, **kwargs)))
            return method(*args, **kwargs)

    return locked


# Ansible compiles a template's or a condition's text each time it renders it (Jinja caches only
# the templates it loads by name): in a converge the same conditions and arguments are compiled
# again for every host and task run (a 12-node no-op: 4,390 compiles of 205 texts, about a tenth
# of the controller's CPU). Here a text is compiled once per process with what its compiling
# reads (the overrides a template's header or its caller set, backslash escaping, the folder its
# includes are read from). A text that fails to compile is not kept: its error is the caller's,
# made again each time.
_COMPILED: dict[tuple[Any, ...], Any] = {}
_COMPILED_MAX = 20_000


def _compile_once() -> None:
    if getattr(TemplateEngine, "_lean_compiled", False):
        return
    template, expression = TemplateEngine._compile_template, TemplateEngine._compile_expression

    def compile_template(self: TemplateEngine, text: str, options: Any) -> Any:
        key = ("t", self.basedir, text, options.overrides, options.escape_backslashes)
        return _kept(key, AnsibleTemplate, template, self, text, options)

    def compile_expression(self: TemplateEngine, text: str, options: Any) -> Any:
        key = ("e", self.basedir, text, options.escape_backslashes)
        return _kept(key, AnsibleTemplateExpression, expression, self, text, options)

    TemplateEngine._compile_template = compile_template
    TemplateEngine._compile_expression = compile_expression
    TemplateEngine._lean_compiled = True


def _kept(key: tuple[Any, ...], kind: type, compile_: Callable[..., Any], *args: Any) -> Any:
    if AnsibleEnvironment._debuggable_template_source:  # each compile writes its own source
        return compile_(*args)
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = compile_(*args)
        if isinstance(compiled, kind):
            if len(_COMPILED) >= _COMPILED_MAX:
                _COMPILED.clear()
            _COMPILED[key] = compiled
    return compiled


# Mitogen's connection multiplexer finds the module_utils a module imports by compiling the module,
# then each module_utils file it reaches, and so on; it keeps the answer per module, so every
# module that reaches ansible.module_utils.basic compiled basic and the files basic imports again
# (a 12-node `--full` no-op: about 1.2 CPU-seconds of its run in these compiles). Its scan
# compiles through this instead: a source, with its name, compiled once per process (a code
# object is never changed). Without inheriting this file's future imports, like the scan's own
# call (its file's are those Python 3 always has).
_SCANNED: dict[tuple[bytes | str, str, str], Any] = {}
_SCANNED_MAX = 5_000


def _compile_scanned(
    source: bytes | str, filename: str, mode: str, *args: Any, **kwargs: Any
) -> Any:
    if args or kwargs:  # not the scan's call: compiled as asked
        return compile(source, filename, mode, *args, **kwargs)
    key = (source, filename, mode)
    code = _SCANNED.get(key)
    if code is None:
        code = compile(source, filename, mode, dont_inherit=True)
        if len(_SCANNED) >= _SCANNED_MAX:
            _SCANNED.clear()
        _SCANNED[key] = code
    return code


def _scan_once() -> None:
    """Before Mitogen's multiplexer is forked (it inherits this): its module scan's compile."""
    try:
        from ansible_mitogen import module_finder
    except ImportError:
        return
    module_finder.compile = _compile_scanned


class _Bindings:
    """Mitogen's classic worker model, with one connection to its multiplexer that the
    controller keeps for the task executors it runs in threads (Mitogen's router is thread-safe;
    a forked worker connects and disconnects for each task). A forked worker gets the classic
    model's own binding, as before."""

    def __init__(self, classic: Any) -> None:
        self._classic = classic
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._broker: Any = None
        self._parent: Any = None

    @property
    def usable(self) -> bool:
        """One multiplexer (Mitogen's default): a process talks to one parent context."""
        return len(getattr(self._classic, "_muxes", ())) == 1

    def on_strategy_start(self) -> None:
        self._classic.on_strategy_start()

    def on_strategy_complete(self) -> None:
        self._close()
        self._classic.on_strategy_complete()

    def _close(self) -> None:
        with self._lock:
            if self._broker is not None:
                self._broker.shutdown()
                self._broker.join()
            self._broker = self._parent = None

    def get_binding(self, inventory_name: str) -> Any:
        if os.getpid() != self._pid:  # a forked worker
            return self._classic.get_binding(inventory_name)
        if threading.current_thread() is threading.main_thread():
            # a connection reset between tasks (meta: reset_connection): the classic binding's
            # close resets Mitogen's state in this process, streams included, so the kept
            # connection goes first (no task runs in a thread then: linear waits for each)
            self._close()
            return self._classic.get_binding(inventory_name)
        with self._lock:
            if self._broker is None:
                broker = _mitogen_process.Broker()
                router, parent = mitogen.unix.connect(
                    path=self._classic._listener_for_name(inventory_name), broker=broker
                )
                router.max_message_size = _mitogen_process.MAX_MESSAGE_SIZE
                self._broker, self._parent = broker, parent
            return _Kept(self._parent)


class _Kept:
    """A binding to the controller's connection to the multiplexer, which outlives the task."""

    def __init__(self, parent: Any) -> None:
        self._parent = parent

    def get_service_context(self) -> Any:
        return self._parent

    def get_child_service_context(self) -> Any:
        return self._parent

    def close(self) -> None:
        """Kept for the next task (closed when the strategy completes)."""


class _Threads:
    """Daemon threads that run jobs from one queue, started as jobs find none idle."""

    def __init__(self, limit: int) -> None:
        self._jobs: queue.SimpleQueue[tuple[Any, tuple[Any, ...]]] = queue.SimpleQueue()
        self._limit = max(1, limit)
        self._lock = threading.Lock()
        self._started = 0
        self._idle = 0

    def submit(self, job: Any, *args: Any) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # taken by this job
            elif self._started < self._limit:
                self._started += 1
                threading.Thread(target=self._work, name="lean-task", daemon=True).start()
        self._jobs.put((job, args))

    def stop(self) -> None:
        """Each thread ends when it comes to its stop (after the jobs queued before it)."""
        with self._lock:
            for _ in range(self._started):
                self._jobs.put((None, ()))
            self._started = self._idle = 0

    def _work(self) -> None:
        while True:
            job, args = self._jobs.get()
            if job is None:
                return
            job(*args)
            with self._lock:
                self._idle += 1


class StrategyModule(_Base):  # type: ignore[misc]
    """Linear, with skips, includes and connection-less actions answered in the controller, and
    the other tasks run by its threads where Mitogen carries them."""

    def __init__(self, tqm: Any) -> None:
        super().__init__(tqm)
        self._threads: _Threads | None = None
        _compile_once()
        _scan_once()

    def _get_worker_model(self) -> Any:
        # Mitogen's strategy asks for its worker model when it starts its run
        classic = super()._get_worker_model()
        bindings = _Bindings(classic)
        if not bindings.usable or os.environ.get("PROVISION_LEAN_THREADS", "1") == "0":
            self._threads = None
            return classic
        _one_loader_at_a_time()
        _forget_mitogen_in_forked_workers()
        self._threads = _Threads(len(self._workers))
        return bindings

    def run(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().run(*args, **kwargs)
        finally:
            if self._threads is not None:
                self._threads.stop()

    def _queue_task(
        self, host: Any, task: Any, task_vars: dict[str, Any], play_context: Any
    ) -> None:
        answer = self._answer_here(host, task, task_vars, play_context)
        if answer is None:
            if self._threads is not None and self._threaded(task):
                self._queue_in_thread(host, task, task_vars, play_context)
            else:
                super()._queue_task(host, task, task_vars, play_context)
            return
        result, fields = answer
        # what a worker does: the start callback, then the result through the results queue
        # (the results thread and _process_pending_results take it from there)
        self._started(host, task, task_vars, play_context)
        self._final_q.send_task_result(
            _RawTaskResult(host=host, task=task, return_data=result, task_fields=fields)
        )
        self._pending_results += 1

    def _started(self, host: Any, task: Any, task_vars: dict[str, Any], play_context: Any) -> None:
        """What _queue_task does before a worker starts: the task kept for its result, and the
        start callback."""
        self._queued_task_cache[(host.name, task._uuid)] = {
            "host": host,
            "task": task,
            "task_vars": task_vars,
            "play_context": play_context,
        }
        self._tqm.send_callback("v2_runner_on_start", host, task)

    @staticmethod
    def _threaded(task: Any) -> bool:
        """Whether a thread of the controller runs the task: not where its connection or
        variables are another host's, nor an action above, nor one with the task's own timeout
        (an alarm signal, the main thread's alone), a throttle (the workers' count limits it)
        or running in the background."""
        return not (
            task.delegate_to
            or task.run_once
            or task.timeout
            or task.throttle
            or task.async_val
            or task.action in _FORKED_ACTIONS
        )

    def _queue_in_thread(
        self, host: Any, task: Any, task_vars: dict[str, Any], play_context: Any
    ) -> None:
        """What _queue_task does with a worker, with a thread: the start callback, then the
        task executor on copies of the task and its variables (a worker's are its own), its
        result through the results queue."""
        self._started(host, task, task_vars, play_context)
        self._pending_results += 1
        assert self._threads is not None
        self._threads.submit(self._run_in_thread, host, _own(task), dict(task_vars), play_context)

    def _run_in_thread(
        self, host: Any, task: Any, task_vars: dict[str, Any], play_context: Any
    ) -> None:
        try:
            result, fields = self._execute(host, task, task_vars, play_context)
            raw = _RawTaskResult(host=host, task=task, return_data=result, task_fields=fields)
        except BaseException as ex:  # the result must reach the strategy, whatever happened
            raw = _RawTaskResult(
                host=host,
                task=task,
                return_data=_error_utils.result_dict_from_exception(ex),
                task_fields={},
            )
        self._final_q.send_task_result(raw)

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
        if isinstance(task.loop, list):  # written out in the task: empty only if written so
            if task.loop:
                return None
            items: Any = []
        else:
            try:
                templar = TemplateEngine(
                    loader=self._loader, variables=self._job_vars(task, task_vars)
                )
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
        return self._execute(host, _own(task), dict(task_vars), play_context)

    def _execute(
        self, host: Any, task: Any, task_vars: dict[str, Any], play_context: Any
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """A worker's run of the task (its own copy) in this process: Ansible's task executor in
        the task's context; its result and the task's fields."""
        with _task.TaskContext(task):
            result = TaskExecutor(
                host,
                task,
                task_vars,
                play_context,
                self._loader,
                plugin_loader.get_plugin_loader_namespace(),
                self._final_q,
                self._variable_manager,
            ).run()
        return result, task.dump_attrs()

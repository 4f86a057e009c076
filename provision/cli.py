"""`provision`: the command line. Arguments in, a verb of the library called, its result printed;
one decorator (`guarded`) holds the exit codes: 0 ok, 1 operation failed, 2 invalid input."""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ParamSpec

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from provision import __version__
from provision.assets import example
from provision.errors import Issue, ProvisionError, SpecError

if TYPE_CHECKING:
    from provision.spec import Spec

P = ParamSpec("P")

DEFAULT_SPEC = example("lab.yaml")

app = typer.Typer(
    name="provision",
    help="Build, run and verify GPU clusters from one declarative spec.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _console(stderr: bool) -> Console:
    # Lines never wrap (an error is one line, whatever the width); tables get room in logs.
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 160
    # no emoji codes: a MAC address like 52:54:00:ab:00:21 holds ":ab:"
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width, emoji=False)


out = _console(stderr=False)
err = _console(stderr=True)


def _say(line: str) -> None:
    out.print(line, markup=False)


def _load_warning(spec: Path) -> Spec:
    """The spec, loaded as every verb loads it, each warning about it said on stderr first."""
    from provision.spec import load_spec

    warnings: list[Issue] = []
    loaded = load_spec(spec, warnings=warnings)
    for warning in warnings:
        err.print(f"warning: {warning}", markup=False)
    return loaded


SpecArg = Annotated[
    Path,
    typer.Argument(
        help="cluster spec (YAML); default: the embedded lab, examples/lab.yaml", show_default=False
    ),
]


# the spec as an option, for verbs whose argument is something else (a node, a hostlist)
class ConvergeMode(StrEnum):
    """How the roles reach the nodes (apply --mode)."""

    push = "push"
    pull = "pull"


SpecOpt = Annotated[Path, typer.Option("--spec", "-f", help="cluster spec", show_default=False)]
NodesArg = Annotated[
    str, typer.Argument(help="compute nodes (a hostlist) or a pool name", show_default=False)
]
StateOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="root of the per-cluster state directories "
        "[default: $PROVISION_STATE_DIR, or .provision beside the spec; for the examples this "
        "package carries, ~/.local/state/provision]",
        show_default=False,
    ),
]


def _state_root(value: Path | None, spec: Path) -> Path:
    """--state-dir, or where the spec's cluster keeps its state (provision/state.py)."""
    from provision.spec import load_spec
    from provision.state import default_root, refuse_lost_state

    if value is not None:
        return value
    root = default_root(spec)
    refuse_lost_state(root, load_spec(spec).name)
    return root


def guarded(verb: Callable[P, None]) -> Callable[P, None]:
    """The error contract of every verb: our errors in one line each with their exit code
    (2 invalid input, 1 an operation failed), never a traceback."""

    @functools.wraps(verb)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            verb(*args, **kwargs)
        except SpecError as exc:
            for issue in exc.issues:
                err.print(str(issue), markup=False)
            raise typer.Exit(2) from None
        except ProvisionError as exc:
            err.print(f"error: {exc}", markup=False)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err.print("interrupted: run the same command again to continue")
            raise typer.Exit(1) from None
        except typer.Exit:
            raise
        except typer.Abort:  # a question answered with end of input (no terminal)
            err.print("aborted: nothing was changed (pass --yes where there is no terminal)")
            raise typer.Exit(1) from None
        except Exception as exc:
            if os.environ.get("PROVISION_DEBUG"):
                traceback.print_exc()
            else:
                err.print(
                    f"internal error: {type(exc).__name__}: {exc} "
                    "(set PROVISION_DEBUG=1 for the traceback)",
                    markup=False,
                )
            raise typer.Exit(1) from None

    return run


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="print the version and exit")] = False,
) -> None:
    if version:
        out.print(f"provision {__version__}")
        raise typer.Exit(0)


@app.command()
@guarded
def validate(spec: SpecArg = DEFAULT_SPEC) -> None:
    """Check a spec; print one line saying what the cluster is."""
    from provision.cluster import Cluster
    from provision.providers.cloud import refuse_api_address

    cluster = Cluster(_load_warning(spec))
    refuse_api_address(spec, cluster)
    out.print(f"{spec}: valid: {cluster.describe()}", markup=False)


@app.command()
@guarded
def render(
    spec: SpecArg = DEFAULT_SPEC,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="where to write [default: the cluster's state dir, <state>/<name>/build]",
            show_default=False,
        ),
    ] = None,
    state_dir: StateOpt = None,
) -> None:
    """Render the inventory, group_vars and every config file, touching no host."""
    from provision.cluster import Cluster
    from provision.render import render as render_files
    from provision.render import write_render
    from provision.spec import load_spec
    from provision.state import State, command_line

    loaded = load_spec(spec)
    files = render_files(Cluster(loaded))
    if out_dir is not None:
        target = out_dir
        changed = write_render(files, target)
    else:
        state = State(_state_root(state_dir, spec), loaded.name)
        target = state.build
        with state.locked(command_line()):
            changed = write_render(files, target)
    out.print(f"rendered {len(files)} files into {target} ({len(changed)} changed)", markup=False)
    for path in changed:
        out.print(f"  {path}", markup=False)


@app.command()
@guarded
def plan(
    spec: SpecArg = DEFAULT_SPEC,
    diff: Annotated[
        bool, typer.Option("--diff", help="show unified diffs of changed files")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="the same plan as one JSON document, for automation")
    ] = False,
    state_dir: StateOpt = None,
) -> None:
    """Show what apply would create and change, the peak power and the cloud cost."""
    import json

    from provision.changes import refuse_unsupported_changes
    from provision.cluster import Cluster
    from provision.drain import running_jobs
    from provision.head import Handle
    from provision.plan import ask_leaving_jobs, make_plan, plan_json
    from provision.providers.cloud import refuse_api_address, refuse_recarve
    from provision.render import read_render
    from provision.state import State
    from provision.views import print_plan

    loaded = _load_warning(spec)
    cluster = Cluster(loaded)
    root = _state_root(state_dir, spec)
    state = State(root, loaded.name)
    refuse_unsupported_changes(spec, read_render(state.applied), cluster)
    refuse_api_address(spec, cluster)
    refuse_recarve(spec, state, cluster)
    p = make_plan(cluster, state)
    head = Handle(spec, loaded, cluster, state)  # asked only when nodes with jobs would leave
    ask_leaving_jobs(p, lambda nodes: running_jobs(head, nodes))
    if as_json:
        print(json.dumps(plan_json(p, cluster), indent=1, sort_keys=True))
        return
    out.print(f"[bold]{cluster.describe()}[/bold]")
    print_plan(p, cluster, out, diff)


@app.command()
@guarded
def apply(
    spec: SpecArg = DEFAULT_SPEC,
    state_dir: StateOpt = None,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="skip verify after apply")] = False,
    drain_timeout: Annotated[
        float,
        typer.Option(
            "--drain-timeout",
            min=1,
            help="seconds to wait for the jobs of compute nodes that leave the spec",
        ),
    ] = 24 * 3600,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="requeue the jobs of compute nodes that leave the spec (or of a --batch) "
            "instead of waiting",
        ),
    ] = False,
    limit: Annotated[
        str | None,
        typer.Option(
            "--limit",
            help="run the roles on these nodes only: a hostlist (compute[001-004]) or a pool",
        ),
    ] = None,
    tags: Annotated[
        str | None,
        typer.Option("--tags", help="run only these roles' tasks (Ansible tags: slurm,nvidia)"),
    ] = None,
    batch: Annotated[
        str | None,
        typer.Option(
            "--batch",
            help="rolling change: compute nodes N at a time (or N%), each batch drained, "
            "changed, checked and resumed; heads first",
        ),
    ] = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="run the roles on every node, also those nothing changed for since the last "
            "apply (by default those are probed for drift and skipped)",
        ),
    ] = False,
    mode: Annotated[
        ConvergeMode | None,
        typer.Option(
            "--mode",
            help="push: this machine runs every node's tasks; pull: the heads by push, then "
            "the compute and login nodes run the roles themselves (default: the spec's "
            "converge.mode)",
        ),
    ] = None,
) -> None:
    """Create the nodes, render, run the roles (gpu_provision.cluster.site) and verify."""
    from provision.lifecycle import Leaving, Scope
    from provision.lifecycle import apply as do_apply
    from provision.views import Reports, print_checks

    _load_warning(spec)  # apply loads it again: a bad spec stops here, before anything
    reports = Reports(out)
    try:
        report = do_apply(
            spec,
            _state_root(state_dir, spec),
            reports,
            verify=not no_verify,
            leaving=Leaving(timeout=drain_timeout, force=force),
            scope=Scope(
                limit=limit,
                tags=tags,
                batch=batch,
                full=full,
                mode=mode.value if mode is not None else None,
            ),
        )
    finally:
        reports.close()
    failed = print_checks(report.checks, out) if report.checks else 0
    if failed:
        raise typer.Exit(1)
    changes = report.run.changed if report.run else 0
    out.print(
        f"apply: done ({changes} change(s)) in {sum(report.phases.values()):.0f}s: "
        + ", ".join(f"{k} {v:.1f}s" for k, v in report.phases.items())
        + (f" (Ansible's CPU {report.run.cpu_seconds:.1f}s" if report.run else "")
        + (
            f"; the nodes' own {report.run.node_cpu_seconds:.1f}s"
            if report.run and report.run.node_cpu_seconds
            else ""
        )
        + (")" if report.run else "")
    )


@app.command()
@guarded
def verify(
    spec: SpecArg = DEFAULT_SPEC,
    state_dir: StateOpt = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="one JSON object per check, a line each, for automation"),
    ] = False,
    maintenance: Annotated[
        bool,
        typer.Option(
            "--maintenance",
            help="hold every compute node in a maintenance reservation, wait for its jobs to "
            "end, and test them all under load (NCCL, ib_write_bw); the reservation goes after",
        ),
    ] = False,
    wait: Annotated[
        int,
        typer.Option(
            "--wait", min=0, metavar="SECONDS", help="with --maintenance: how long to wait for jobs"
        ),
    ] = 3600,
) -> None:
    """Run the live acceptance checks against the cluster. Jobs may be running: busy nodes are
    only read; the idle ones are held in a reservation of verify's own while the test job, NCCL
    and ib_write_bw run there, and given back after."""
    from provision.lifecycle import verify as do_verify
    from provision.verify import json_lines
    from provision.views import print_checks

    def say(line: str) -> None:
        err.print(line, markup=False)

    results = do_verify(spec, _state_root(state_dir, spec), maintenance, wait, say)
    if as_json:
        sys.stdout.write(json_lines(results))
        failed = sum(not r.passed for r in results)
    else:
        failed = print_checks(results, out)
    if failed:
        raise typer.Exit(1)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@guarded
def ssh(
    node: Annotated[str, typer.Argument(help="node name", show_default=False)],
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="after --: the command, run by the node's shell (its words joined with "
            "spaces, as ssh does); none: an interactive shell",
            show_default=False,
        ),
    ] = None,
    spec: SpecOpt = DEFAULT_SPEC,
    state_dir: StateOpt = None,
    forward: Annotated[
        list[str] | None,
        typer.Option(
            "--forward",
            "-L",
            help="PORT or LOCAL:PORT: this machine's port LOCAL (default: PORT) reaches the "
            "node's loopback port PORT, as long as the command runs (none: until Ctrl-C); "
            "how admins reach Prometheus (9090) and Alertmanager (9093)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run a command on a node (or open a shell there) with the cluster's key and host keys;
    its output and exit code pass through unchanged."""
    from provision.head import forward_options, ssh_argv

    argv = ssh_argv(spec, _state_root(state_dir, spec), node, list(command or []))
    if forward:
        at = argv.index("--")
        argv[at:at] = forward_options(forward, bool(command))
    sys.stdout.flush()
    os.execvp(argv[0], argv)


@app.command()
@guarded
def destroy(
    spec: SpecArg = DEFAULT_SPEC,
    state_dir: StateOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
) -> None:
    """Remove what apply created (lab containers, cloud instances) and the cluster's state."""
    from provision.lifecycle import destroy as do_destroy
    from provision.spec import load_spec

    name = load_spec(spec).name
    if not yes and not typer.confirm(f"destroy cluster '{name}' and its state?"):
        raise typer.Exit(1)
    removed = do_destroy(spec, _state_root(state_dir, spec), _say)
    out.print(f"destroy: cluster '{name}' removed ({len(removed)} node(s) deleted)")


@app.command()
@guarded
def power(
    action: Annotated[
        str,
        typer.Argument(
            help="status, on, off, cycle, or pxe (the next boot, once, from the network)",
            show_default=False,
        ),
    ],
    nodes: Annotated[
        list[str],
        typer.Argument(
            help="node names, host lists like gpu[001-032], or pool names", show_default=False
        ),
    ],
    spec: SpecOpt = DEFAULT_SPEC,
    state_dir: StateOpt = None,
    soft: Annotated[
        bool, typer.Option("--soft", help="off: ACPI shutdown; cycle: graceful restart")
    ] = False,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="do not ask before off or cycle")
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", min=1, help="seconds for the whole command; BMCs still silent then fail"
        ),
    ] = 60.0,
) -> None:
    """Power status, on, off or cycle through the nodes' BMCs (Redfish or IPMI), or boot them
    from the network next time."""
    from provision import power as pw
    from provision.cluster import compress
    from provision.errors import UsageError
    from provision.spec import load_spec
    from provision.spec.nodes import expand_nodes
    from provision.state import State

    if action not in pw.ACTIONS:
        raise UsageError(f"'{action}' is not a power action: use one of {', '.join(pw.ACTIONS)}")
    cluster = load_spec(spec)
    if cluster.network.bmc is None:
        raise UsageError(f"{spec}: network.bmc is not set: the spec names no BMC network")
    chosen = pw.select_nodes(expand_nodes(cluster), nodes)
    state = State(_state_root(state_dir, spec), cluster.name)
    settings = pw.bmc_settings(cluster, state)
    assert settings is not None
    creds = pw.load_credentials(state)
    pw.check_settings(settings)
    names = compress([n.name for n in chosen])
    if action in ("off", "cycle") and not yes:
        verb = f"{'soft ' if soft else ''}{'power off' if action == 'off' else 'power cycle'}"
        if not typer.confirm(f"{verb} {len(chosen)} node(s): {names}?"):
            raise typer.Exit(1)
    err.print(f"power {action}: {len(chosen)} node(s) {names} over {settings.protocol}")
    results = pw.power(chosen, action, settings, creds, soft=soft, deadline_s=timeout)
    for r in results:
        mark = "[green]ok[/green]" if r.ok else "[red]FAIL[/red]"
        out.print(f"{mark} {r.node} ({r.bmc}): ", end="")
        out.print(r.state, markup=False)
    failed = sum(not r.ok for r in results)
    if failed:
        err.print(f"power {action}: {failed} of {len(results)} BMC(s) failed")
        raise typer.Exit(1)


@app.command("bmc-credentials")
@guarded
def bmc_credentials(
    spec: SpecArg = DEFAULT_SPEC,
    user: Annotated[
        str, typer.Option("--user", "-u", help="BMC user name", show_default=False)
    ] = "",
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="read the password from standard input")
    ] = False,
    state_dir: StateOpt = None,
) -> None:
    """Store the BMCs' user and password in the cluster's secrets (0600, never printed)."""
    from provision import power as pw
    from provision.errors import UsageError
    from provision.spec import load_spec
    from provision.state import State

    if not user:
        raise UsageError("--user is required: the BMC account power control logs in as")
    name = load_spec(spec).name
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = typer.prompt("BMC password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise UsageError("the password is empty")
    from provision.state import command_line

    state = State(_state_root(state_dir, spec), name)
    with state.locked(command_line()):
        path = pw.save_credentials(state, pw.Credentials(user, password))
    out.print(f"bmc-credentials: saved for user {user} in {path} (0600)")


@app.command("drain")
@guarded
def drain_nodes(
    nodes: NodesArg,
    spec: SpecOpt = DEFAULT_SPEC,
    reason: Annotated[
        str | None,
        typer.Option("--reason", help="what sinfo -R shows (default: provision drain by USER)"),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="wait until no job runs on them")
    ] = True,
    timeout: Annotated[
        float, typer.Option("--timeout", help="seconds to wait for their jobs", min=1)
    ] = 24 * 3600,
    state_dir: StateOpt = None,
) -> None:
    """Take compute nodes out of scheduling and wait until their jobs have ended."""
    from provision.drain import drain
    from provision.head import Handle

    drain(Handle.open(spec, _state_root(state_dir, spec)), nodes, reason, wait, timeout, _say)


@app.command("resume")
@guarded
def resume_nodes(
    nodes: NodesArg,
    spec: SpecOpt = DEFAULT_SPEC,
    state_dir: StateOpt = None,
) -> None:
    """Give drained compute nodes back to the scheduler."""
    from provision.drain import resume
    from provision.head import Handle

    resume(Handle.open(spec, _state_root(state_dir, spec)), nodes, _say)


burst_app = typer.Typer(help="Elastic pools: what Slurm has up, powering up and down.")
app.add_typer(burst_app, name="burst")


@burst_app.command("status")
@guarded
def burst_status(
    spec: SpecOpt = DEFAULT_SPEC,
    state_dir: StateOpt = None,
) -> None:
    """Each elastic pool as the head's Slurm sees it, its cost per hour now, and the burst
    programs' last log lines."""
    from provision.bursting import burst_status as read_status
    from provision.head import Handle

    pools, log = read_status(Handle.open(spec, _state_root(state_dir, spec)))
    table = Table(title="Elastic pools")
    for col in ("pool", "nodes", "up", "powering up", "powering down", "powered down", "down"):
        table.add_column(col)
    table.add_column("USD/h now")
    for p in pools:
        down = ", ".join(f"{n} ({reason})" for n, reason in sorted(p.down.items()))
        cost = "-" if p.usd_per_hour is None else f"{p.usd_per_hour:.2f}"
        cells = (
            p.pool,
            str(p.nodes),
            *(compress_names(x) for x in (p.up, p.powering_up, p.powering_down, p.powered_down)),
            down or "-",
            cost,
        )
        # Slurm's reasons are the nodes' text, not rich markup ("[/...]" would end a style)
        table.add_row(*(Text(cell) for cell in cells))
    out.print(table)
    for line in log:
        out.print(line, markup=False)


image_app = typer.Typer(help="Elastic pools' images: what their nodes boot from.")
app.add_typer(image_app, name="image")


@image_app.command("build")
@guarded
def image_build(
    pools: Annotated[
        list[str] | None,
        typer.Argument(
            help="elastic pools to make again, whatever their image; default: those whose image "
            "is missing or stale",
            show_default=False,
        ),
    ] = None,
    spec: SpecOpt = DEFAULT_SPEC,
    state_dir: StateOpt = None,
) -> None:
    """Bake the elastic pools' images: a builder per pool, the compute roles applied, sealed
    (no key, no Slurm files) and captured; the pool's template then starts it. Needs an apply
    first (the render, and a cloud pool's template)."""
    from provision.lifecycle import build_images
    from provision.views import Reports

    _load_warning(spec)
    reports = Reports(out)
    try:
        made = build_images(spec, _state_root(state_dir, spec), pools or None, reports)
    finally:
        reports.close()
    if made:
        out.print(f"image build: done: {', '.join(made)}", markup=False)


def compress_names(names: list[str]) -> str:
    from provision.cluster import compress

    return f"{len(names)} {compress(names)}" if names else "0"


@app.command()
@guarded
def schema(
    markdown: Annotated[
        bool, typer.Option("--markdown", help="the spec reference as Markdown")
    ] = False,
) -> None:
    """Print the spec's JSON Schema (for editor completion) or its Markdown reference."""
    from provision.spec import Spec
    from provision.spec.reference import markdown as reference

    if markdown:
        sys.stdout.write(reference())
    else:
        sys.stdout.write(json.dumps(Spec.model_json_schema(), indent=2, sort_keys=True) + "\n")


@app.command()
@guarded
def profiles() -> None:
    """List the built-in hardware profiles."""
    from provision.spec.profiles import builtin_profiles

    table = Table(title="Hardware profiles")
    for col in ("profile", "providers", "GPUs", "max kW", "USD/h"):
        table.add_column(col)
    for name, p in builtin_profiles().items():
        gpu = f"{p.gpu.count}x {p.gpu.model}" if p.gpu else "-"
        price = f"{p.price.usd_per_hour:.2f}" if p.price else "-"
        table.add_row(name, ",".join(p.providers), gpu, f"{p.max_power_w / 1000:.1f}", price)
    out.print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

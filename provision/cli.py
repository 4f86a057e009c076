"""`provision`: thin CLI over the library. Exit codes: 0 ok, 1 operation failed, 2 invalid input."""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from provision import REPO_ROOT, __version__
from provision.errors import ProvisionError, SpecError

if TYPE_CHECKING:
    from provision.verify import CheckResult

T = TypeVar("T")

DEFAULT_SPEC = REPO_ROOT / "examples" / "lab.yaml"

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
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


out = _console(stderr=False)
err = _console(stderr=True)

SpecArg = Annotated[
    Path,
    typer.Argument(
        help="cluster spec (YAML); default: the embedded lab, examples/lab.yaml", show_default=False
    ),
]
StateOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="root of the per-cluster state directories "
        "[default: $PROVISION_STATE_DIR or .provision]",
        show_default=False,
    ),
]


def _state_root(value: Path | None) -> Path:
    from provision.state import default_root

    return value if value is not None else default_root()


def _guard(fn: Callable[[], T]) -> T:
    """Run a verb; report our errors in one line each with the right exit code, no traceback."""
    try:
        return fn()
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


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="print the version and exit")] = False,
) -> None:
    if version:
        out.print(f"provision {__version__}")
        raise typer.Exit(0)


@app.command()
def validate(spec: SpecArg = DEFAULT_SPEC) -> None:
    """Check a spec; print one line saying what the cluster is."""

    def run() -> None:
        from provision.render.context import Cluster
        from provision.spec import load_spec

        cluster = Cluster(load_spec(spec))
        out.print(f"{spec}: valid: {describe(cluster)}", markup=False)

    _guard(run)


def describe(cluster: object) -> str:
    from provision.render.context import Cluster

    assert isinstance(cluster, Cluster)
    s = cluster.spec
    roles: dict[str, int] = {}
    for n in cluster.nodes:
        roles[n.role] = roles.get(n.role, 0) + 1
    role_text = ", ".join(f"{c} {r}" for r, c in roles.items())
    gpus = sum((v.profile.gpu.count if v.profile.gpu else 0) * len(v.nodes) for v in cluster.pools)
    providers = ", ".join(sorted({p.provider for p in s.pools}))
    elastic = sum(1 for n in cluster.nodes if n.elastic)
    extra = f", {elastic} of them elastic" if elastic else ""
    return (
        f"cluster '{s.name}': {s.scheduler} on {s.os}, {len(cluster.nodes)} nodes "
        f"({role_text}{extra}) in {len(s.pools)} pools on {providers}, {gpus} GPUs, "
        f"{s.network.fabric.kind} fabric"
    )


@app.command()
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

    def run() -> None:
        from provision.render import render as render_files
        from provision.render import write_render
        from provision.render.context import Cluster
        from provision.spec import load_spec
        from provision.state import State, command_line

        loaded = load_spec(spec)
        files = render_files(Cluster(loaded))
        if out_dir is not None:
            target = out_dir
            changed = write_render(files, target)
        else:
            state = State(_state_root(state_dir), loaded.name)
            target = state.build
            with state.locked(command_line()):
                changed = write_render(files, target)
        out.print(
            f"rendered {len(files)} files into {target} ({len(changed)} changed)", markup=False
        )
        for path in changed:
            out.print(f"  {path}", markup=False)

    _guard(run)


@app.command()
def plan(
    spec: SpecArg = DEFAULT_SPEC,
    diff: Annotated[
        bool, typer.Option("--diff", help="show unified diffs of changed files")
    ] = False,
    state_dir: StateOpt = None,
) -> None:
    """Show what apply would create and change, the peak power and the cloud cost."""

    def run() -> None:
        from provision.plan import HOURS_PER_MONTH, make_plan
        from provision.render.context import Cluster
        from provision.spec import load_spec
        from provision.state import State

        loaded = load_spec(spec)
        cluster = Cluster(loaded)
        p = make_plan(cluster, State(_state_root(state_dir), loaded.name))
        out.print(f"[bold]{describe(cluster)}[/bold]")

        nodes = Table(title="Nodes")
        for col in ("provider", "create", "existing", "on demand (elastic)"):
            nodes.add_column(col)
        from provision.render.context import compress

        for pp in p.providers:
            nodes.add_row(
                pp.provider,
                f"{len(pp.create)} {pp.what}(s) {compress(pp.create)}" if pp.create else "-",
                f"{len(pp.existing)} {compress(pp.existing)}" if pp.existing else "-",
                f"up to {len(pp.on_demand)} {compress(pp.on_demand)}" if pp.on_demand else "-",
            )
        out.print(nodes)
        for line in (r for pp in p.providers for r in pp.resources):
            out.print(f"cloud: {line}", markup=False)

        groups = Table(title="Ansible groups")
        groups.add_column("group")
        groups.add_column("hosts")
        for group, hosts in p.groups.items():
            groups.add_row(group, hosts)
        out.print(groups)

        base = "the last apply" if not p.first_apply else "nothing (first apply)"
        files = Table(title=f"Rendered files compared with {base}")
        files.add_column("file")
        files.add_column("change")
        for change in p.changes:
            files.add_row(change.path, change.kind)
        out.print(files)
        out.print(f"{len(p.changes)} file(s) would change, {p.unchanged} unchanged")
        if diff:
            for change in p.changes:
                out.print(change.diff, markup=False, end="")

        if p.exposed:
            exposed = Table(title="Open to the internet (sources beyond private address space)")
            for col in ("pool", "enforced by", "service", "port", "sources", "public addresses"):
                exposed.add_column(col)
            for o in p.exposed:
                exposed.add_row(
                    o.pool,
                    o.where,
                    o.rule.service,
                    f"{o.rule.protocol} {o.rule.ports}",
                    ", ".join(o.cidrs),
                    f"{o.public:,}",
                )
            out.print(exposed)
        else:
            out.print("open to the internet: nothing (every source is private address space)")

        power = Table(title="Peak power")
        for col in ("pool", "profile", "nodes", "kW/node", "kW"):
            power.add_column(col, justify="right" if col != "pool" else "left")
        for pw in p.power:
            power.add_row(
                pw.pool + (" (elastic, at most)" if pw.elastic else ""),
                pw.profile,
                str(pw.nodes),
                f"{pw.kw_per_node:.2f}",
                f"{pw.kw:.2f}",
            )
        power.add_row("total", "", "", "", f"{p.total_kw:.2f}", style="bold")
        out.print(power)

        if p.cost:
            cost = Table(title=f"Cloud cost at on-demand list prices ({HOURS_PER_MONTH} h/month)")
            for col in ("pool", "instance", "nodes", "USD/node-h", "USD/h", "USD/month", "price"):
                cost.add_column(col)
            for c in p.cost:
                cost.add_row(
                    c.pool + (" (elastic, at most)" if c.elastic else ""),
                    c.instance_type,
                    str(c.nodes),
                    f"{c.usd_per_node_hour:,.2f}",
                    f"{c.usd_per_hour:,.2f}",
                    f"{c.usd_per_month:,.0f}",
                    f"{c.price_region}, {c.price_as_of}",
                )
            total_h = sum(c.usd_per_hour for c in p.cost)
            cost.add_row(
                "total",
                "",
                "",
                "",
                f"{total_h:,.2f}",
                f"{total_h * HOURS_PER_MONTH:,.0f}",
                "",
                style="bold",
            )
            out.print(cost)

    _guard(run)


@app.command()
def apply(
    spec: SpecArg = DEFAULT_SPEC,
    state_dir: StateOpt = None,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="skip verify after apply")] = False,
) -> None:
    """Create the nodes, render, run the roles (playbooks/site.yml) and verify."""

    def run() -> None:
        from provision.lifecycle import apply as do_apply

        report = do_apply(spec, _state_root(state_dir), out, verify=not no_verify)
        failed = _print_checks(report.checks) if report.checks else 0
        if failed:
            raise typer.Exit(1)
        changes = report.run.changed if report.run else 0
        out.print(
            f"apply: done ({changes} change(s)) in {sum(report.phases.values()):.0f}s: "
            + ", ".join(f"{k} {v:.1f}s" for k, v in report.phases.items())
        )

    _guard(run)


@app.command()
def verify(spec: SpecArg = DEFAULT_SPEC, state_dir: StateOpt = None) -> None:
    """Run the live acceptance checks against the cluster."""

    def run() -> None:
        from provision.lifecycle import verify as do_verify

        failed = _print_checks(do_verify(spec, _state_root(state_dir)))
        if failed:
            raise typer.Exit(1)

    _guard(run)


def _print_checks(results: Sequence[CheckResult]) -> int:
    failed = 0
    for r in results:
        mark = "[green]PASS[/green]" if r.passed else "[red]FAIL[/red]"
        failed += not r.passed
        out.print(f"{mark} {r.check} {r.target}: ", end="")
        out.print(r.evidence, markup=False)
    out.print(f"verify: {len(results) - failed} passed, {failed} failed")
    return failed


@app.command()
def destroy(
    spec: SpecArg = DEFAULT_SPEC,
    state_dir: StateOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
) -> None:
    """Remove what apply created (lab containers, cloud instances) and the cluster's state."""

    def run() -> None:
        from provision.lifecycle import destroy as do_destroy
        from provision.spec import load_spec

        name = load_spec(spec).name
        if not yes and not typer.confirm(f"destroy cluster '{name}' and its state?"):
            raise typer.Exit(1)
        removed = do_destroy(spec, _state_root(state_dir), out)
        out.print(f"destroy: cluster '{name}' removed ({len(removed)} node(s) deleted)")

    _guard(run)


@app.command()
def power(
    action: Annotated[str, typer.Argument(help="status, on, off or cycle", show_default=False)],
    nodes: Annotated[
        list[str],
        typer.Argument(
            help="node names, host lists like gpu[001-032], or pool names", show_default=False
        ),
    ],
    spec: Annotated[
        Path, typer.Option("--spec", "-f", help="cluster spec", show_default=False)
    ] = DEFAULT_SPEC,
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
    """Power status, on, off or cycle through the nodes' BMCs (Redfish or IPMI)."""

    def run() -> None:
        from provision import power as pw
        from provision.errors import UsageError
        from provision.render.context import compress
        from provision.spec import load_spec
        from provision.spec.nodes import expand_nodes
        from provision.state import State

        if action not in pw.ACTIONS:
            raise UsageError(
                f"'{action}' is not a power action: use one of {', '.join(pw.ACTIONS)}"
            )
        cluster = load_spec(spec)
        settings = cluster.network.bmc
        if settings is None:
            raise UsageError(f"{spec}: network.bmc is not set: the spec names no BMC network")
        chosen = pw.select_nodes(expand_nodes(cluster), nodes)
        creds = pw.load_credentials(State(_state_root(state_dir), cluster.name))
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

    _guard(run)


@app.command("bmc-credentials")
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

    def run() -> None:
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

        state = State(_state_root(state_dir), name)
        with state.locked(command_line()):
            path = pw.save_credentials(state, pw.Credentials(user, password))
        out.print(f"bmc-credentials: saved for user {user} in {path} (0600)")

    _guard(run)


@app.command()
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
def profiles() -> None:
    """List the built-in hardware profiles."""

    def run() -> None:
        from provision.spec.loader import builtin_profiles

        table = Table(title="Hardware profiles")
        for col in ("profile", "providers", "GPUs", "max kW", "USD/h"):
            table.add_column(col)
        for name, p in builtin_profiles().items():
            gpu = f"{p.gpu.count}x {p.gpu.model}" if p.gpu else "-"
            price = f"{p.price.usd_per_hour:.2f}" if p.price else "-"
            table.add_row(name, ",".join(p.providers), gpu, f"{p.max_power_w / 1000:.1f}", price)
        out.print(table)

    _guard(run)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

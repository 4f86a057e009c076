"""provision-health: run the node's health checks, drain or resume it, record the results.

    provision-health [--config /etc/provision/health.json] [--report-only] [--node NAME]
    provision-health --prolog     (Slurm's Prolog, through provision-health-prolog)
    provision-health --diag       (the long DCGM diagnostic, from provision-dcgm-diag.timer)

One line per check (PASS/FAIL name: detail), then what it did to the node. Exit 0 when every
check passes, 1 when one fails, 2 on a usage or configuration error. As the Prolog, on a node
whose pool has no GPUs it checks nothing; on a GPU node a failing check drains the node with
its reason and exits 1, which sends the job back to the queue. With --diag, when the pool's
periodic level 2 or 3 diagnostic is due and the node is idle: the node is held by a drain of
this program's own, the diagnostic runs, and the checks then drain or resume the node as a
periodic run does; the periodic runs meanwhile keep the hold and, after a failure, the drain.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from provision.health import (
    BUSY_FLAGS,
    CONFIG,
    DRAIN_FLAGS,
    RUNNING,
    act,
    check_dcgm_diag,
    decide,
    diag_due,
    diag_lock,
    diag_passed,
    load_config,
    long_diag,
    long_diag_result,
    own_drain,
    parse_node,
    record_drain,
    run_checks,
    shell,
    write_diag_state,
    write_metrics,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="provision-health", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument(
        "--report-only", action="store_true", help="check and print; drain and resume nothing"
    )
    parser.add_argument("--node", help="the node's Slurm name (default: the short host name)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--prolog", action="store_true", help="run as Slurm's Prolog")
    mode.add_argument(
        "--diag", action="store_true", help="run the long DCGM diagnostic if due (its timer's)"
    )
    parser.add_argument("--scontrol", default="scontrol", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except (OSError, ValueError) as exc:
        print(f"provision-health: {exc}", file=sys.stderr)
        return 2
    if args.prolog and not config.get("prolog"):
        return 0  # not a GPU pool's node: the periodic checks cover it
    node = args.node or socket.gethostname().split(".")[0]
    if args.diag:
        return run_long_diag(config, node, args.scontrol)
    level = diag_due(config, "prolog" if args.prolog else "periodic")
    if level is not None and long_diag(config) is not None:
        level = None  # its timer runs it: slurmd would kill this program within 60 s
    return check_and_act(config, node, args.scontrol, level, args.report_only, args.prolog)


def check_and_act(
    config: dict[str, object],
    node: str,
    scontrol: str,
    level: int | None,
    report_only: bool = False,
    prolog: bool = False,
) -> int:
    """Run the checks (with DCGM's diagnostic at `level`, and what the long one left), print
    them, write the metrics, then drain or resume the node: 0 when every check passed."""
    results = run_checks(config, diag_level=level)
    if not report_only:
        diag_passed(config, results)
    held = long_diag_result(config) if not prolog else None
    if held is not None:
        results.append(held)
    for r in results:
        print(f"{'PASS' if r.ok else 'FAIL'} {r.check}: {r.detail}")
    textfile = config.get("textfile_dir")
    if isinstance(textfile, str):
        try:
            write_metrics(Path(textfile), results)
        except OSError as exc:
            print(f"provision-health: metrics not written: {exc}", file=sys.stderr)
    failed = any(not r.ok for r in results)
    if report_only:
        return 1 if failed else 0
    code, out = shell(f"{scontrol} -o show node {node}")
    if code != 0:
        print(f"provision-health: slurmctld does not answer for {node}: {out.strip()[:200]}")
        return 1 if failed else 0
    flags, reason = parse_node(out)
    own = own_drain(config)
    action = decide(results, flags, reason, prolog=bool(config.get("prolog")), own=own)
    if action is None:
        print(f"health: {node}: left as it is ({'+'.join(sorted(flags)) or 'no state'})")
    else:
        code, out = act(node, action, scontrol)
        done = "drained" if action[0] == "drain" else "resumed"
        if code == 0:
            record_drain(config, action[1] if action[0] == "drain" else None)
            print(f"health: {node}: {done}" + (f" ({action[1]})" if action[1] else ""))
        else:
            print(f"provision-health: {node} not {done}: {out.strip()[:200]}", file=sys.stderr)
    return 1 if failed else 0


def _node(scontrol: str, node: str) -> tuple[set[str], str] | None:
    code, out = shell(f"{scontrol} -o show node {node}")
    return parse_node(out) if code == 0 else None


def run_long_diag(config: dict[str, object], node: str, scontrol: str) -> int:
    """The timer's run: the long diagnostic on an idle node, held by this program's own drain
    while it runs; then the checks drain or resume the node. 0 also when it was not due, or
    the node was busy or someone else's (the next run tries again)."""
    level = long_diag(config)
    if level is None:
        print(f"provision-health: {node} has no periodic level 2 or 3 DCGM diagnostic")
        return 0
    check = f"dcgm diag level {level}"
    if diag_due(config, "periodic") is None:
        print(f"{check}: not due: it passed less than {config['dcgm_diag']['every']} s ago")  # type: ignore[index]
        return 0
    with diag_lock(config) as mine:
        if not mine:
            print(f"{check}: already running on {node}")
            return 0
        state = _node(scontrol, node)
        if state is None:
            print(f"provision-health: slurmctld does not answer for {node}: {check} not run")
            return 1
        flags, reason = state
        if flags & BUSY_FLAGS:
            print(f"{check}: not run: jobs on {node}; the timer tries again on an idle node")
            return 0
        if flags & DRAIN_FLAGS and reason != own_drain(config):
            print(f"{check}: not run: {node} is drained by someone else ({reason})")
            return 0
        write_diag_state(config, level, RUNNING)
        check_and_act(config, node, scontrol, None)  # the hold: a drain of this program's own
        state = _node(scontrol, node)
        if state is None or not state[0] & DRAIN_FLAGS or state[1] != own_drain(config):
            write_diag_state(config, level, None)
            print(f"{check}: not run: {node} could not be held by a drain")
            return 1
        if state[0] & BUSY_FLAGS:  # a job started before the drain took: it goes first
            write_diag_state(config, level, None)
            check_and_act(config, node, scontrol, None)
            print(f"{check}: not run: a job started on {node}; the timer tries again")
            return 0
        result = check_dcgm_diag(level, shell)
        print(f"{'PASS' if result.ok else 'FAIL'} {check}: {result.detail} (the timer's run)")
        if result.ok:
            diag_passed(config, [result])
        write_diag_state(config, level, None if result.ok else result.detail)
        return check_and_act(config, node, scontrol, None)


if __name__ == "__main__":
    sys.exit(main())

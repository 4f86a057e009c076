"""provision-health: run the node's health checks, drain or resume it, record the results.

    provision-health [--config /etc/provision/health.json] [--report-only] [--node NAME]
    provision-health --prolog     (Slurm's Prolog, through provision-health-prolog)

One line per check (PASS/FAIL name: detail), then what it did to the node. Exit 0 when every
check passes, 1 when one fails, 2 on a usage or configuration error. As the Prolog, on a node
whose pool has no GPUs it checks nothing; on a GPU node a failing check drains the node with
its reason and exits 1, which sends the job back to the queue.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from provision.health import (
    BUSY_FLAGS,
    CONFIG,
    PREFIX,
    act,
    decide,
    diag_due,
    diag_passed,
    load_config,
    own_drain,
    parse_node,
    record_drain,
    run_checks,
    shell,
    write_metrics,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="provision-health", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument(
        "--report-only", action="store_true", help="check and print; drain and resume nothing"
    )
    parser.add_argument("--node", help="the node's Slurm name (default: the short host name)")
    parser.add_argument("--prolog", action="store_true", help="run as Slurm's Prolog")
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
    level = diag_due(config, "prolog" if args.prolog else "periodic")
    if level is not None and level >= 2 and not args.prolog:
        # levels 2 and 3 load the GPUs for minutes: on an idle node only, held by a drain of
        # this program's own while they run (resumed below when they pass)
        level = _hold_for_diag(config, node, level, args.scontrol, args.report_only)
    results = run_checks(config, diag_level=level)
    if not args.report_only:
        diag_passed(config, results)
    for r in results:
        print(f"{'PASS' if r.ok else 'FAIL'} {r.check}: {r.detail}")
    textfile = config.get("textfile_dir")
    if isinstance(textfile, str):
        try:
            write_metrics(Path(textfile), results)
        except OSError as exc:
            print(f"provision-health: metrics not written: {exc}", file=sys.stderr)
    failed = any(not r.ok for r in results)
    if args.report_only:
        return 1 if failed else 0
    code, out = shell(f"{args.scontrol} -o show node {node}")
    if code != 0:
        print(f"provision-health: slurmctld does not answer for {node}: {out.strip()[:200]}")
        return 1 if failed else 0
    flags, reason = parse_node(out)
    action = decide(
        results, flags, reason, prolog=bool(config.get("prolog")), own=own_drain(config)
    )
    if action is None:
        print(f"health: {node}: left as it is ({'+'.join(sorted(flags)) or 'no state'})")
    else:
        code, out = act(node, action, args.scontrol)
        done = "drained" if action[0] == "drain" else "resumed"
        if code == 0:
            record_drain(config, action[1] if action[0] == "drain" else None)
            print(f"health: {node}: {done}" + (f" ({action[1]})" if action[1] else ""))
        else:
            print(f"provision-health: {node} not {done}: {out.strip()[:200]}", file=sys.stderr)
    return 1 if failed else 0


def _hold_for_diag(
    config: dict[str, object], node: str, level: int, scontrol: str, report_only: bool
) -> int | None:
    """The level to run now, or None: the node runs jobs, or someone else drained it."""
    if report_only:
        return level
    code, out = shell(f"{scontrol} -o show node {node}")
    if code != 0:
        return None
    flags, reason = parse_node(out)
    if flags & BUSY_FLAGS:
        print(f"dcgm diag level {level}: not run: jobs on {node}; the next idle run does it")
        return None
    if flags & {"DRAIN", "DRAINED", "DRAINING"} and reason != own_drain(config):
        return None  # an operator's drain: the node is theirs
    hold = f"{PREFIX}dcgm diag level {level} running"
    code, out = act(node, ("drain", hold), scontrol)
    if code != 0:
        return None
    record_drain(config, hold)
    return level


if __name__ == "__main__":
    sys.exit(main())

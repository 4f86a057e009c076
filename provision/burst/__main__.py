"""python3 -m provision.burst resume|suspend|resume-fail HOSTLIST, reconcile, or
tunnel-restore; on a burst node, python3 -m provision.burst join [CONFIG], and on a spot one
notice (the watch the join starts).

Run by slurmctld through the wrappers the burst role installs (as root, through sudo), and by
the reconciler's systemd timer; `tunnel-restore` by the hub's WireGuard unit after it starts or
reloads (tunnel.py); `join` by cloud-init at a burst node's first boot (see join.py).
Exit 0 when every node was handled (or the node joined), 1 otherwise, 2 on bad use.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from provision.burst.backend import BurstError, one_line
from provision.burst.config import CONFIG_PATH, load_config
from provision.burst.hostlist import expand
from provision.burst.join import JOIN_CONFIG, Metadata, join, parse_join_config
from provision.burst.programs import reconcile, resume, resume_fail, suspend
from provision.burst.tunnel import Hub

USAGE = (
    "usage: python3 -m provision.burst {resume|suspend|resume-fail} HOSTLIST | reconcile"
    " | tunnel-restore | join [CONFIG] | notice"
)


def join_main(args: list[str]) -> int:
    """The node's join, its steps said on stdout (cloud-init's log, the serial console)."""
    path = Path(args[0]) if args else JOIN_CONFIG

    def say(line: str) -> None:
        print(f"provision: {line}", flush=True)

    try:
        config = parse_join_config(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError) as exc:
        say(f"join: {path}: {one_line(exc)}")
        return 2
    started = time.monotonic()
    metadata = Metadata(config.cloud, os.environ.get("PROVISION_METADATA_URL"))
    try:
        node = join(config, metadata, say)
    except BurstError as exc:
        say(f"join failed: {exc}; slurmd not started, the node will not register")
        return 1
    say(f"join: {node} joined {config.cluster} in {time.monotonic() - started:.1f}s")
    return 0


def notice_main() -> int:
    """A spot node's watch (notice.py): until the cloud's notice, then the node is down."""
    from provision.burst.notice import watch

    def say(line: str) -> None:
        print(f"provision: {line}", flush=True)

    try:
        config = parse_join_config(JOIN_CONFIG.read_text(encoding="utf-8"))
        metadata = Metadata(config.cloud, os.environ.get("PROVISION_METADATA_URL"))
        node = metadata.name(wait_s=0)
        watch(metadata, node, say)
    except (OSError, ValueError, BurstError) as exc:
        say(f"notice: {one_line(exc)}")
        return 1
    return 0


def tunnel_restore() -> int:
    """The burst nodes' peers back on the hub's interface; a line for each that failed."""
    try:
        errors = Hub().restore()
    except BurstError as exc:
        print(f"provision.burst: {exc}", file=sys.stderr)
        return 1
    for node, error in sorted(errors.items()):
        print(f"provision.burst: {node}: {error}", file=sys.stderr)
    return 1 if errors else 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["join"] and len(args) <= 2:
        return join_main(args[1:])
    if args == ["tunnel-restore"]:
        return tunnel_restore()
    if args == ["notice"]:
        return notice_main()
    config_path = Path(os.environ.get("PROVISION_BURST_CONFIG", str(CONFIG_PATH)))
    if not args or args[0] not in ("resume", "suspend", "resume-fail", "reconcile"):
        print(USAGE, file=sys.stderr)
        return 2
    verb = args[0]
    if (verb == "reconcile") != (len(args) == 1) or len(args) > 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        config = load_config(config_path)
        nodes = expand(args[1]) if len(args) == 2 else []
    except (OSError, ValueError, KeyError) as exc:
        print(f"provision.burst: {config_path}: {exc}", file=sys.stderr)
        return 2
    log_path = Path(os.environ.get("PROVISION_BURST_LOG", str(config.log_path)))
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        line = f"{stamp} {' '.join(message.split())}\n"
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(line)

    if verb == "resume":
        return resume(config, nodes, log)
    if verb == "suspend":
        return suspend(config, nodes, log)
    if verb == "resume-fail":
        return resume_fail(config, nodes, log)
    return reconcile(config, log)


if __name__ == "__main__":
    sys.exit(main())

"""python3 -m provision.burst resume|suspend|resume-fail HOSTLIST, or reconcile.

Run by slurmctld through the wrappers the burst role installs (as root, through sudo), and by
the reconciler's systemd timer. Exit 0 when every node was handled, 1 otherwise, 2 on bad use.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from provision.burst.config import CONFIG_PATH, load_config
from provision.burst.hostlist import expand
from provision.burst.programs import reconcile, resume, resume_fail, suspend

USAGE = "usage: python3 -m provision.burst {resume|suspend|resume-fail} HOSTLIST | reconcile"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
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

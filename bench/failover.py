"""Controller failover on examples/lab-ha.yaml: the primary head's container is stopped with a
job running; prints the seconds until the backup answers `scontrol ping` as the one in control
and until the first new job runs, then the same for the primary coming back.

Run as root with podman (make bench). It makes and destroys its own cluster (benchha, on
10.71.0.0/24); about 5 minutes. `--keep` leaves it up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import ROOT, provision

NAME = "benchha"
POLL_S = 0.5


def on(spec: Path, work: Path, node: str, command: str) -> tuple[int, str]:
    r = subprocess.run(
        [sys.executable, "-m", "provision", "ssh", "-f", str(spec), node, "--", command],
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
    )
    return r.returncode, r.stdout.strip()


def until(spec: Path, work: Path, node: str, command: str, want: str, limit: float) -> float:
    """Seconds until the node's answer to command contains want (SystemExit past limit)."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        rc, out = on(spec, work, node, command)
        if rc == 0 and want in out:
            return time.monotonic() - started
        time.sleep(POLL_S)
    raise SystemExit(f"{node}: {command!r} never gave {want!r} in {limit:.0f}s")


def main() -> int:
    from provision.providers.lab import container_name, podman

    keep = "--keep" in sys.argv
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spec = work / "lab-ha.yaml"
        text = (ROOT / "examples" / "lab-ha.yaml").read_text()
        spec.write_text(
            text.replace("name: lab-ha", f"name: {NAME}").replace("10.79.0.", "10.71.0.")
        )
        env = dict(os.environ)
        try:
            wall, _ = provision(["apply", str(spec), "--no-verify"], work, env)
            print(f"cold apply, 2 heads and 2 compute nodes: {wall:.0f}s")
            until(
                spec, work, "head001", "sbatch --parsable -w compute001 --wrap 'sleep 60'", "", 30
            )
            primary = container_name(NAME, "head001")
            podman.podman("stop", "-t", "0", primary)
            stopped = time.monotonic()
            # the backup answers ping before it takes control; a job shows it has control
            job = "timeout 10 srun -N1 -w compute002 true && echo ran"
            ping = until(spec, work, "head002", "scontrol ping", "backup) at head002 is UP", 120)
            ran = until(spec, work, "head002", job, "ran", 180)
            print(
                f"primary stopped: backup answers scontrol ping after {ping:.1f}s, the first "
                f"new job ran {time.monotonic() - stopped:.1f}s after the stop "
                f"(SlurmctldTimeout 10 s; srun's own wait included: {ran:.1f}s of polling)"
            )
            podman.podman("start", primary)
            started = time.monotonic()
            back = until(spec, work, "head001", "scontrol ping", "primary) at head001 is UP", 180)
            ran = until(spec, work, "head001", job, "ran", 180)
            print(
                f"primary started: it answers scontrol ping {back:.1f}s after its container "
                f"started, and runs a new job {time.monotonic() - started:.1f}s after"
            )
        finally:
            if not keep:
                provision(["destroy", str(spec), "--yes"], work, env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The metal lab (examples/metal-lab.yaml: a head and two QEMU machines without a disk, each with
a Redfish BMC): one `provision apply` from power-off to a verified cluster, timed by what it
says as it goes. Prints the node image's making, each machine's power-on to SSH, power-on to
verified, the RDMA write between the two machines over the lab's soft RoCE (verify's
ib_write_bw: a figure for the path in QEMU's software emulation, not for hardware), and the same
for one machine powered off through its BMC and booted again by the next apply.

Run as root with podman and QEMU (make bench). It makes and destroys its own cluster
(benchmetal, on 10.72.0.0/24, its BMCs on 127.0.72.0/24); about 10 minutes on two cores.
`--keep` leaves it up.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import ROOT, provision

NAME = "benchmetal"


WRITE_BW = re.compile(r"ib_write_bw (\S+) (\S+) \S+: ([\d.]+) Gb/s average")


def timed_apply(
    spec: Path, work: Path
) -> tuple[float, dict[str, float], dict[str, float], list[str]]:
    """apply's wall time, the seconds from its first power-on to its end, each booted
    machine's power-on to SSH as apply said it, and what it said; SystemExit where it failed."""
    started = time.monotonic()
    powered: float | None = None
    ssh: dict[str, float] = {}
    lines: list[str] = []
    with subprocess.Popen(
        [sys.executable, "-m", "provision", "apply", str(spec)],
        cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as run:  # fmt: skip
        assert run.stdout is not None
        for line in run.stdout:
            lines.append(line.rstrip())
            if powered is None and re.match(r"boot: \S+: (powered on|power cycled)", line):
                powered = time.monotonic()
            answered = re.match(r"boot: (\S+) answers SSH, (\d+) s after its power-on", line)
            if answered:
                ssh[answered[1]] = float(answered[2])
    ended = time.monotonic()
    if run.returncode != 0:
        print("\n".join(lines[-40:]), file=sys.stderr)
        raise SystemExit("provision apply failed")
    report = json.loads((work / ".provision" / NAME / "last-apply.json").read_text())
    phases = {k: float(v) for k, v in report.get("phases", {}).items()}
    phases["power-on to verified"] = ended - powered if powered is not None else 0.0
    return ended - started, phases, ssh, lines


def write_bw(lines: list[str]) -> str:
    found = [WRITE_BW.search(line) for line in lines]
    return ", ".join(f"{m[1]} on {m[2]} {m[3]} Gb/s" for m in found if m) or "not run"


def main() -> int:
    keep = "--keep" in sys.argv
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = dict(os.environ)
        spec = work / "metal-lab.yaml"
        text = (ROOT / "examples" / "metal-lab.yaml").read_text()
        spec.write_text(
            text.replace("name: metal", f"name: {NAME}")
            .replace("10.78.0.", "10.72.0.")
            .replace("127.0.78.", "127.0.72.")
        )

        try:
            wall, phases, ssh, said = timed_apply(spec, work)
            print(f"apply from power-off, 1 head and 2 machines: {wall:.0f} s")
            print(f"  the node image: {phases.get('images', 0):.0f} s (kept by its inputs)")
            print(f"  power-on to SSH: {', '.join(f'{n} {s:.0f} s' for n, s in ssh.items())}")
            print(f"  power-on to verified: {phases['power-on to verified']:.0f} s")
            print("  phases: " + ", ".join(f"{k} {v:.0f} s" for k, v in phases.items()))
            print(f"  ib_write_bw over soft RoCE (QEMU in software): {write_bw(said)}")
            provision(["power", "off", "cpu001", "-f", str(spec), "--yes"], work, env)
            time.sleep(15)  # the emulator applies a change 1-11 s late
            wall, phases, ssh, said = timed_apply(spec, work)
            print(f"cpu001 powered off through its BMC, the next apply: {wall:.0f} s")
            print(f"  power-on to SSH: {', '.join(f'{n} {s:.0f} s' for n, s in ssh.items())}")
            print(f"  power-on to verified: {phases['power-on to verified']:.0f} s")
        finally:
            if not keep:
                provision(["destroy", str(spec), "--yes"], work, env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

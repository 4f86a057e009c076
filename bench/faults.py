"""Faults on a running lab, and what a re-run of the same command leaves: a compute node killed,
the head restarted, the network to one node cut and restored, the workstation interrupted
(SIGINT, SIGKILL) during an apply and during a rolling apply.

Prints, for each fault: what became of the job on a node the fault did not touch and of the
job on the node it did, whether the same command run again converged, how long until the
cluster was whole again (every compute node serving, the head answering), and any node left
drained that no operator drained.

Run as root with podman (make bench). It makes and destroys its own cluster (benchfault: a head
and three compute nodes on 10.81.0.0/24); about 20 minutes. `--keep` leaves it up; `--cut S`
holds the network cut for S seconds (default 60; past SlurmdTimeout, 300 s, Slurm marks the
node down and takes it back when it answers again: ReturnToService=2).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import ROOT
from apply import spec as lab_spec
from failover import on

NAME = "benchfault"
COMPUTE = ["compute001", "compute002", "compute003"]
WHOLE_LIMIT_S = 900
# nft on the node itself: everything in and out dropped but the loopback (podman exec restores)
CUT = (
    "nft add table inet faultcut && nft add chain inet faultcut in "
    "'{ type filter hook input priority -10; policy drop; }' && nft add chain inet faultcut out "
    "'{ type filter hook output priority -10; policy drop; }' && nft add rule inet faultcut in "
    "iif lo accept && nft add rule inet faultcut out oif lo accept"
)


@dataclass
class Outcome:
    fault: str
    untouched: str  # the job on a node the fault did not touch
    touched: str  # the job on the node it did, or "-"
    rerun: str  # the same command again
    whole_s: float  # seconds from the fault's end until the cluster was whole
    left_drained: str  # nodes drained that no operator drained


class Lab:
    def __init__(self, spec: Path, work: Path) -> None:
        self.spec, self.work = spec, work

    def provision(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "provision", *args],
            cwd=self.work, capture_output=True, text=True, check=False,
        )  # fmt: skip

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "provision", *args],
            cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    def head(self, command: str) -> str:
        return on(self.spec, self.work, "head001", command)[1]

    def job(self, node: str, seconds: int = 1200) -> str:
        return self.head(f"sbatch --parsable --requeue -w {node} --wrap 'sleep {seconds}'")

    def job_state(self, job: str) -> str:
        shown = self.head(f"sacct -n -X -P -o State,NodeList -j {job}") or "unknown"
        return shown.splitlines()[-1].replace("|", " on ")

    def serving(self) -> bool:
        shown = self.head("sinfo -h -N -o '%N %T'")
        states = dict(line.split() for line in shown.splitlines() if len(line.split()) == 2)
        good = ("idle", "allocated", "mixed", "completing")
        return all(states.get(n, "absent") in good for n in COMPUTE)

    def whole_after(self, since: float) -> float:
        """Seconds from `since` until every compute node serves and the head answers."""
        while time.monotonic() - since < WHOLE_LIMIT_S:
            if self.head("scontrol ping").count("UP") and self.serving():
                return time.monotonic() - since
            time.sleep(2)
        return float("inf")

    def drained_by_nobody(self) -> str:
        """Drained or down nodes and why, but for an operator's drain (none is made here)."""
        shown = self.head("sinfo -h -R -o '%n|%E'")
        return ", ".join(line.replace("|", ": ") for line in shown.splitlines()) or "none"

    def cancel_all(self) -> None:
        self.head("scancel --user=root; sleep 2")


def node_fault(lab: Lab, name: str, touched: str, act: list[list[str]]) -> Outcome:
    """Jobs on compute001 (untouched) and on `touched`; `act`: the podman commands that make
    the fault; then `provision apply` again (a stopped lab node is started by it)."""
    from provision.providers.lab import podman

    keep, hit = lab.job("compute001"), lab.job(touched)
    time.sleep(5)
    for command in act:
        podman.podman(*command)
    ended = time.monotonic()
    rerun = lab.provision("apply", str(lab.spec), "--no-verify")
    whole = lab.whole_after(ended)
    out = Outcome(
        name, lab.job_state(keep), lab.job_state(hit),
        f"apply rc {rerun.returncode}", whole, lab.drained_by_nobody(),
    )  # fmt: skip
    lab.cancel_all()
    return out


def network_cut(lab: Lab, seconds: float) -> Outcome:
    from provision.providers.lab import container_name, podman

    keep, hit = lab.job("compute001"), lab.job("compute003")
    time.sleep(5)
    node = container_name(NAME, "compute003")
    podman.podman("exec", node, "sh", "-c", CUT)
    time.sleep(seconds)
    podman.podman("exec", node, "nft", "delete", "table", "inet", "faultcut")
    ended = time.monotonic()
    whole = lab.whole_after(ended)
    rerun = lab.provision("apply", str(lab.spec), "--no-verify")
    out = Outcome(
        f"network to compute003 cut for {seconds:.0f}s", lab.job_state(keep), lab.job_state(hit),
        f"apply rc {rerun.returncode}", whole, lab.drained_by_nobody(),
    )  # fmt: skip
    lab.cancel_all()
    return out


def interrupted(
    lab: Lab, how: signal.Signals, args: list[str], after: str, untouched: str
) -> Outcome:
    """`provision ARGS` interrupted by `how` once its output shows `after`, with a job on the
    node `untouched` (one the interrupted run had not reached); then the same command again."""
    keep = lab.job(untouched)
    time.sleep(3)
    proc = lab.popen(*args)
    assert proc.stdout is not None
    seen = ""
    for line in proc.stdout:
        seen += line
        if after in line:
            break
    proc.send_signal(how)
    proc.wait(timeout=120)
    ended = time.monotonic()
    left = lab.drained_by_nobody()
    rerun = lab.provision(*args)
    whole = lab.whole_after(ended)
    what = " ".join(a for a in args if not a.endswith(".yaml"))
    out = Outcome(
        f"{how.name} during `{what}` (at '{after}')", lab.job_state(keep), "-",
        f"same command rc {rerun.returncode}; before it: {left}", whole,
        lab.drained_by_nobody(),
    )  # fmt: skip
    lab.cancel_all()
    return out


def main() -> int:
    keep = "--keep" in sys.argv
    cut = float(sys.argv[sys.argv.index("--cut") + 1]) if "--cut" in sys.argv else 60.0
    from provision.providers.lab import container_name

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spec = lab_spec(work, NAME, "10.81.0.", len(COMPUTE))
        lab = Lab(spec, work)
        lab.provision("destroy", str(spec), "--yes")  # an interrupted earlier run's leftovers
        try:
            env_ok = lab.provision("apply", str(spec), "--no-verify")
            if env_ok.returncode != 0:
                print(env_ok.stdout[-3000:], env_ok.stderr, file=sys.stderr)
                raise SystemExit("the lab did not come up")
            results = [
                node_fault(
                    lab, "compute003 killed", "compute003",
                    [["kill", container_name(NAME, "compute003")]],
                ),
                node_fault(
                    lab, "head001 restarted", "compute002",
                    [["restart", "-t", "0", container_name(NAME, "head001")]],
                ),
                network_cut(lab, cut),
            ]  # fmt: skip
            # `ansible:` starts with the first task; `rolling: batch 2/` after the first batch
            full = ["apply", str(spec), "--full", "--no-verify"]
            roll = ["apply", str(spec), "--batch", "1", "--force", "--no-verify"]
            # a rolling apply with --force requeues the jobs of each batch it drains, the re-run's
            # included: compute003's job is untouched by the interrupted run, not by the re-run
            for how in (signal.SIGINT, signal.SIGKILL):
                results.append(interrupted(lab, how, full, "ansible", "compute001"))
                results.append(interrupted(lab, how, roll, "drain: compute002", "compute003"))
            for r in results:
                print(f"{r.fault}:")
                print(f"  job on an untouched node: {r.untouched}; on the node hit: {r.touched}")
                print(f"  re-run: {r.rerun}")
                print(
                    f"  whole again after {r.whole_s:.0f}s; drained or down now: {r.left_drained}"
                )
        finally:
            if not keep:
                lab.provision("destroy", str(spec), "--yes")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "provision/providers/lab/containers.conf"))
    sys.exit(main())

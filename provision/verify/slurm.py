"""Slurm acceptance: every compute node in service (idle, or running jobs), a job on every idle
one and a batch job on them, both as a user without rights (as the cluster's users run them),
the jobs in accounting, NCCL across two idle nodes of each GPU pool, munge keys right, and the
firewall admitting only what the spec allows."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import provision.verify.gpu as gpu_checks
from provision.cluster import compress
from provision.parsers.node import parse_stat
from provision.parsers.slurm import (
    allreduce_problem,
    parse_drained,
    parse_sacct_steps,
    parse_sinfo_nodes,
    parse_srun_hosts,
    parse_srun_users,
    without_flags,
)
from provision.render.slurm import JOB_USER
from provision.spec.nodes import Node
from provision.spec.ports import service_ports
from provision.verify.base import CheckResult, VerifyContext, closed_ports, probe_ports
from provision.verify.remote import Output, Remote

IDLE_WAIT_S = 90  # nodes register with slurmctld on their own schedule after a restart
RESERVATION = "provision-verify"  # verify's own; another verify's is never touched
# in the state directory while this state's verify holds RESERVATION: a verify that finds it
# was killed before its release (the state's lock keeps a second one of this state out), so
# the reservation is its own to remove
MARK = "verify-reservation"
RESERVATION_MINUTES = 60  # a verify killed before its release frees the nodes after this
# node states (sinfo %T) of a node in service: idle, or running jobs
BUSY = frozenset({"allocated", "mixed", "completing"})
SERVING = BUSY | {"idle"}
# states (without flags) of a node no job runs on, in a reservation or not
FREE = frozenset({"idle", "maint", "reserved", "resv", "planned"})
# the slurm role's MPI all-reduce program (slurm_mpi_allreduce_path)
MPI_ALLREDUCE = "/usr/local/libexec/provision/mpi-allreduce"
RELEASE_TRIES = 30  # seconds for a cancelled test job to leave before the release gives up


def check_munge_key(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    out = remote.run("stat -c '%a %U:%G' /etc/munge/munge.key", sudo=True)
    mode, owner = parse_stat(out.stdout)
    ok = out.rc == 0 and (mode, owner) == ("400", "munge:munge")
    return [
        CheckResult(
            "munge.key", node.name, ok, f"mode {mode} {owner}" if out.rc == 0 else "missing"
        )
    ]


def check_munge_same_key(
    ctx: VerifyContext, remotes: dict[str, Remote], nodes: list[Node]
) -> list[CheckResult]:
    """A credential made on the head decodes on every node: one key everywhere."""
    head = _head(ctx, remotes)
    if head is None:
        return []
    cred = head.run("munge -n").stdout.strip()
    results = []
    for node in nodes:
        if node.name not in remotes:
            continue
        out = remotes[node.name].run(f"echo {shlex.quote(cred)} | unmunge >/dev/null")
        results.append(
            CheckResult(
                "munge credential",
                node.name,
                out.rc == 0,
                "decodes the head's credential"
                if out.rc == 0
                else f"cannot decode it: {out.stderr.strip()[:80]}",
            )
        )
    return results


def _head(ctx: VerifyContext, remotes: dict[str, Remote]) -> Remote | None:
    for node in ctx.cluster.head_nodes:
        if node.name in remotes:
            return remotes[node.name]
    return None


@dataclass
class Hold:
    """The compute nodes verify holds in a reservation of its own while it tests them: no job
    starts there meanwhile, so NCCL and ib_write_bw (run outside Slurm) share them with nobody."""

    states: dict[str, str]  # each compute node's state before the hold (sinfo %T)
    in_service: bool  # every compute node idle or running jobs
    quiet: list[str] = field(default_factory=list)  # held, no job running: the ones to test
    reservation: str | None = None  # made by this verify; removed by release()
    results: list[CheckResult] = field(default_factory=list)


def _states(head: Remote) -> dict[str, str]:
    return parse_sinfo_nodes(head.run("sinfo -h -N -o '%.64N %.32T'").stdout)


def _base(state: str) -> str:
    """'idle+maint' -> idle, 'allocated*' -> allocated: the base state, nothing appended."""
    return without_flags(state.split("+")[0])


def hold_nodes(
    ctx: VerifyContext,
    remotes: dict[str, Remote],
    maintenance: bool = False,
    wait_s: float = 3600.0,
    say: Callable[[str], None] = lambda _: None,
) -> Hold:
    """Wait for the compute nodes to be in service, then hold the ones to test.

    Without maintenance, the idle nodes are held (a job landing meanwhile is waited for by a
    retry, never preempted) and busy nodes are only read. With maintenance, every compute
    node is held (MAINT: no new job starts; the running ones finish), and verify waits up to
    `wait_s` for their jobs to end.
    """
    head = _head(ctx, remotes)
    if head is None:
        return Hold(
            {}, False, results=[CheckResult("slurm", "cluster", False, "no head node reachable")]
        )
    compute = [n.name for n in ctx.cluster.lasting_nodes if n.role == "compute"]
    mark = ctx.state.dir / MARK
    if mark.exists():  # this state's verify was killed before its release: its own goes first
        head.run(f"scontrol delete reservation {RESERVATION}", sudo=True)
        mark.unlink()
    other = head.run(f"scontrol -o show reservation {RESERVATION}")
    if other.rc == 0 and f"ReservationName={RESERVATION} " in other.stdout:
        return Hold({}, False, results=[_held_by_another(compute, other.stdout)])
    deadline = time.monotonic() + IDLE_WAIT_S
    while True:
        states = _states(head)
        out_of_service = [n for n in compute if states.get(n, "absent") not in SERVING]
        # a node completing a job is idle in a moment (one whose test job a verify before
        # cancelled may take a little longer to say so): tested then, not left as busy
        completing = [n for n in compute if _base(states.get(n, "")) == "completing"]
        if not (out_of_service or completing) or time.monotonic() > deadline:
            break
        time.sleep(2)
    hold = Hold(states, not out_of_service)
    for name in compute:
        state = states.get(name, "absent")
        note = " (running jobs)" if state in BUSY else ""
        hold.results.append(CheckResult("sinfo", name, state in SERVING, f"state {state}{note}"))
    if out_of_service or not compute:
        return hold
    user = shlex.quote(f"{head.user},{JOB_USER}")  # the login's, and the jobs' user
    if maintenance:
        out = _reserve(
            head, mark, f"Users={user} Nodes={compress(compute)} Flags=MAINT,IGNORE_JOBS"
        )
        if out.rc != 0:
            hold.results.append(_not_held(compute, out.stderr or out.stdout))
            return hold
        hold.reservation = RESERVATION
        started = time.monotonic()
        waited_for: set[str] = set()
        while True:
            now = _states(head)
            busy = [n for n in compute if _base(now.get(n, "absent")) not in FREE]
            waited_for |= set(busy)
            if not busy or time.monotonic() - started > wait_s:
                break
            say(
                f"maintenance: waiting for the jobs on {compress(busy)} to end "
                f"({time.monotonic() - started:.0f} s)"
            )
            time.sleep(5)
        hold.quiet = [n for n in compute if n not in busy]
        waited = (
            f"waited {time.monotonic() - started:.0f} s for the jobs on "
            f"{compress(sorted(waited_for))}"
            if waited_for
            else "no job was running"
        )
        hold.results.append(
            CheckResult(
                "hold",
                compress(compute),
                not busy,
                f"maintenance reservation {RESERVATION}; {waited}"
                if not busy
                else f"{compress(busy)} still ran jobs after {wait_s:.0f} s: not tested under load",
            )
        )
        return hold
    for _ in range(3):  # a job may take an idle node between sinfo and the reservation
        idle = [n for n in compute if states.get(n) == "idle"]
        if not idle:
            break
        out = _reserve(head, mark, f"Users={user} Nodes={compress(idle)}")
        if out.rc == 0:
            hold.reservation = RESERVATION
            hold.quiet = idle
            break
        time.sleep(1)
        states = _states(head)
    else:
        hold.results.append(_not_held(compute, out.stderr or out.stdout))
        return hold
    busy = [n for n in compute if n not in hold.quiet]
    evidence = f"reservation {RESERVATION} on the idle nodes" if hold.quiet else "no node idle"
    if busy:
        evidence += (
            f"; {compress(busy)} run jobs: read only, not tested under load "
            "(--maintenance tests them)"
        )
    hold.results.append(CheckResult("hold", compress(compute), True, evidence))
    return hold


def _reserve(head: Remote, mark: Path, what: str) -> Output:
    """Create RESERVATION (for an hour at most) with the state's mark set first, so a verify
    killed in between still leaves it; a reservation not made takes the mark away again."""
    mark.touch(mode=0o600)
    out = head.run(
        f"scontrol create reservation ReservationName={RESERVATION} StartTime=now "
        f"Duration={RESERVATION_MINUTES} {what}",
        sudo=True,
    )
    if out.rc != 0:
        mark.unlink(missing_ok=True)
    return out


def _held_by_another(compute: list[str], shown: str) -> CheckResult:
    """RESERVATION exists and is not this state's: another verify (another workstation, or
    another state of this cluster) is testing the nodes; never removed from under it."""
    fields = dict(w.split("=", 1) for w in shown.split() if "=" in w)
    since = fields.get("StartTime", "?")
    nodes = fields.get("Nodes", "?")
    return CheckResult(
        "hold",
        compress(compute),
        False,
        f"reservation {RESERVATION} is another verify's ({nodes} since {since}, "
        f"{fields.get('Flags', 'no flags')}): wait for it to end; if that verify was killed, "
        f"`scontrol delete reservation {RESERVATION}` on a head",
    )


def _not_held(compute: list[str], why: str) -> CheckResult:
    return CheckResult("hold", compress(compute), False, f"no reservation: {why.strip()[:160]}")


def release(remotes: dict[str, Remote], ctx: VerifyContext, hold: Hold) -> list[CheckResult]:
    """Remove verify's reservation: the nodes take jobs again."""
    head = _head(ctx, remotes)
    if hold.reservation is None or head is None:
        return []
    # a test job that has not ended (a node that cannot run it) would keep the reservation:
    # verify's own jobs in it go first (its user's; no one else's job can be in it)
    head.run(f"scancel --reservation={hold.reservation} --user={JOB_USER}", sudo=True)
    for _ in range(RELEASE_TRIES):  # a cancelled job takes a moment to leave its nodes
        out = head.run(f"scontrol delete reservation {hold.reservation}", sudo=True)
        if out.rc == 0 or "busy" not in (out.stderr + out.stdout).lower():
            break
        time.sleep(1)
    if out.rc == 0:
        (ctx.state.dir / MARK).unlink(missing_ok=True)
        return []
    return [
        CheckResult(
            "release",
            hold.reservation,
            False,
            f"not removed ({(out.stderr or out.stdout).strip()[:120]}): "
            f"`scontrol delete reservation {hold.reservation}` on a head",
        )
    ]


def check_scheduler(
    ctx: VerifyContext, remotes: dict[str, Remote], hold: Hold
) -> list[CheckResult]:
    head = _head(ctx, remotes)
    if head is None or not hold.in_service:
        return []
    compute = [n.name for n in ctx.cluster.lasting_nodes if n.role == "compute"]
    results = []
    # the test job goes to the held nodes only: jobs running elsewhere are left alone
    idle = hold.quiet
    if not idle:
        results.append(
            CheckResult("srun", compress(compute), True, "not run: every compute node runs jobs")
        )
        return results

    # one job per pool: a job runs in one partition, and each pool is its own
    by_pool: dict[str, list[str]] = {}
    for node in ctx.cluster.lasting_nodes:
        if node.role == "compute":
            by_pool.setdefault(node.pool, [])
            if node.name in idle:
                by_pool[node.pool].append(node.name)
    for pool, names in by_pool.items():
        if names:
            results += _test_job(ctx, head, hold, pool, sorted(names))
            results += _network_all_reduce(ctx, head, hold, pool, sorted(names))
        else:
            members = compress([n.name for n in ctx.cluster.lasting_nodes if n.pool == pool])
            results.append(
                CheckResult("srun", members, True, "not run: every node of the pool runs jobs")
            )
    return results


def _network_all_reduce(
    ctx: VerifyContext, head: Remote, hold: Hold, pool: str, names: list[str]
) -> list[CheckResult]:
    """NCCL across the first two held nodes of a GPU pool (nccl-tests built), over its fabric."""
    view = next(v for v in ctx.cluster.pools if v.name == pool)
    gpu = view.profile.gpu
    if gpu is None or view.pool.provider == "lab" or not ctx.cluster.spec.nvidia.nccl_tests:
        return []
    if hold.reservation is None:
        return []
    if view.pool.mig:
        return [
            CheckResult(
                "nccl.all_reduce.network",
                compress(names),
                True,
                "not run: the GPUs are split into MIG instances (NCCL does not span them)",
            )
        ]
    if len(names) < 2:
        return [
            CheckResult(
                "nccl.all_reduce.network",
                compress(names),
                True,
                "not run: fewer than two of the pool's nodes are free of jobs",
            )
        ]
    pair = names[:2]
    threshold, whence = gpu_checks.network_threshold(ctx.cluster, view)
    out = head.run(
        gpu_checks.network_command(hold.reservation, pool, pair, gpu.count),
        timeout=gpu_checks.NETWORK_SECONDS + 60,
    )
    return [gpu_checks.network_finding(pair, out.rc, out.stdout + out.stderr, threshold, whence)]


def _test_job(
    ctx: VerifyContext, head: Remote, hold: Hold, pool: str, names: list[str]
) -> list[CheckResult]:
    """A job on these held nodes of one pool, and a batch job, both as JOB_USER, and their
    records in accounting."""
    results = []
    hostlist = compress(names)
    where = f"--reservation={hold.reservation} -p {pool} -N{len(names)} -w {hostlist} --time=2"
    out = head.run(
        f"runuser -u {JOB_USER} -- timeout 120 srun --chdir=/tmp {where} "
        "sh -c 'echo $SLURM_JOB_ID $(hostname) $(id -un)'",
        timeout=150,
        sudo=True,
    )
    job, hosts = parse_srun_hosts(out.stdout)
    users = parse_srun_users(out.stdout)
    ran = out.rc == 0 and hosts == names and users == {JOB_USER}
    if ran:
        evidence = f"job {job} ran on {compress(hosts)} as {JOB_USER}"
    elif out.rc == 0 and hosts == names:
        evidence = f"job {job} ran as {', '.join(sorted(users)) or 'no one'}, not {JOB_USER}"
    else:
        evidence = f"rc {out.rc}: {(out.stderr or out.stdout).strip()[:160]}"
    results.append(CheckResult("srun", hostlist, ran, evidence))
    if ctx.cluster.spec.slurm.accounting and job:
        acct = _accounted(head, job, lambda rows: rows.get(job, ("", 0))[0] == "COMPLETED")
        state = acct.get(job, ("not recorded", 0))[0]
        results.append(CheckResult("sacct", f"job {job}", state == "COMPLETED", f"state {state}"))
    results.append(_batch_job(ctx, head, where, names))
    if len(names) >= 2:
        results.append(_all_reduce(head, hold, pool, names[:2]))
    return results


def _all_reduce(head: Remote, hold: Hold, pool: str, pair: list[str]) -> CheckResult:
    """An MPI all-reduce over two held nodes, one rank each, as JOB_USER: Slurm's PMIx
    starting Open MPI's ranks, which reach each other over the management network."""
    hostlist = compress(pair)
    out = head.run(
        f"runuser -u {JOB_USER} -- timeout 120 srun --chdir=/tmp --mpi=pmix "
        f"--reservation={hold.reservation} -p {pool} -N2 --ntasks-per-node=1 -w {hostlist} "
        f"--time=2 {MPI_ALLREDUCE}",
        timeout=150,
        sudo=True,
    )
    problem = allreduce_problem(out.stdout, pair)
    if out.rc == 0 and problem is None:
        return CheckResult(
            "mpi all-reduce", hostlist, True, f"2 ranks summed 1 + 2 = 3 as {JOB_USER}"
        )
    said = " ".join((out.stderr or out.stdout).split())[:200]
    return CheckResult("mpi all-reduce", hostlist, False, f"rc {out.rc}: {problem}; {said}")


def _batch_job(ctx: VerifyContext, head: Remote, where: str, names: list[str]) -> CheckResult:
    """`sbatch -W` as JOB_USER, its script one step over the nodes: it passes when sbatch says
    the job ended well, no node was drained by it (a batch script that could not start drains
    its node, "batch job complete failure", while the job may still read COMPLETED) and, with
    accounting, its step ran on every node."""
    hostlist = compress(names)
    out = head.run(
        f"runuser -u {JOB_USER} -- timeout 150 sbatch -W --parsable --chdir=/tmp "
        f"-o /dev/null -e /dev/null {where} --wrap 'srun true'",
        timeout=180,
        sudo=True,
    )
    job = out.stdout.strip().split(";")[0]
    if out.rc != 0 or not job.isdigit():
        why = (out.stderr or out.stdout).strip()[:160]
        if job.isdigit():  # submitted, and not ended well: it goes (sbatch -W may time out)
            head.run(f"scancel {job}", sudo=True)
        return CheckResult("sbatch", hostlist, False, f"rc {out.rc}: {why}")
    drained = parse_drained(head.run(f"scontrol -o show node {hostlist}").stdout)
    if drained:
        return CheckResult(
            "sbatch", hostlist, False, f"batch job {job} drained {compress(drained)}"
        )
    if not ctx.cluster.spec.slurm.accounting:
        return CheckResult("sbatch", hostlist, True, f"batch job {job} ended, no node drained")
    step = f"{job}.0"
    acct = _accounted(head, job, lambda rows: rows.get(step, ("", 0))[0] == "COMPLETED")
    state, nodes = acct.get(step, ("not recorded", 0))
    ok = state == "COMPLETED" and nodes == len(names)
    return CheckResult(
        "sbatch",
        hostlist,
        ok,
        f"batch job {job}: its step ran on {nodes} node(s) as {JOB_USER}"
        if ok
        else f"batch job {job}: its step {state} on {nodes} of {len(names)} node(s)",
    )


def _accounted(
    head: Remote, job: str, done: Callable[[dict[str, tuple[str, int]]], bool]
) -> dict[str, tuple[str, int]]:
    """The job's (and its steps') records in accounting, read until `done` says they are in,
    for 30 s at most (slurmdbd takes them after the job ends)."""
    deadline = time.monotonic() + 30
    while True:
        rows = parse_sacct_steps(head.run(f"sacct -n -P -o JobID,State,NNodes -j {job}").stdout)
        if done(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(2)


def check_ports(ctx: VerifyContext, remotes: dict[str, Remote]) -> list[CheckResult]:
    """From this machine (an admin address): SSH open, every Slurm and database port closed.
    From the head: slurmd's port open on every compute node."""
    results = []
    ports = service_ports(ctx.cluster.spec)
    ports_shut = [
        int(p) for p in (ports.slurmctld_first, ports.slurmd, ports.slurmdbd, ports.mariadb)
    ]
    nodes = [n for n in ctx.cluster.lasting_nodes if n.address is not None]
    ssh_port = int(ports.ssh)
    probes = [(n, p) for n in nodes for p in [ssh_port, *ports_shut]]
    states = probe_ports(probes)
    for node in nodes:
        ssh = states[(node, ssh_port)]
        results.append(CheckResult("ssh from workstation", node.name, ssh == "open", ssh))
        results.append(closed_ports("slurm ports from workstation", node, states, ports_shut))
    head = _head(ctx, remotes)
    if head is not None:
        for node in ctx.cluster.lasting_nodes:
            if node.role != "compute":
                continue
            out = head.run(
                f"timeout 3 bash -c '</dev/tcp/{node.address}/{ports.slurmd}' "
                "&& echo open || echo closed"
            )
            state = out.stdout.strip() or "closed"
            results.append(
                CheckResult(
                    "slurmd port from head", node.name, state == "open", f"{ports.slurmd} {state}"
                )
            )
    return results

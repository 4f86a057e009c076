"""Slurm acceptance: every compute node in service (idle, or running jobs), a job on every idle
one, the job in accounting, munge keys right, and the firewall admitting only what the spec
allows."""

from __future__ import annotations

import shlex
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from provision.cluster import compress
from provision.parsers.node import parse_stat
from provision.parsers.slurm import parse_sacct_states, parse_sinfo_nodes, parse_srun_hosts
from provision.spec.nodes import Node
from provision.spec.ports import service_ports
from provision.verify import CheckResult, VerifyContext
from provision.verify.remote import Remote

IDLE_WAIT_S = 90  # nodes register with slurmctld on their own schedule after a restart
# node states (sinfo %T) of a node in service: idle, or running jobs
BUSY = frozenset({"allocated", "mixed", "completing"})
SERVING = BUSY | {"idle"}


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


def check_scheduler(ctx: VerifyContext, remotes: dict[str, Remote]) -> list[CheckResult]:
    head = _head(ctx, remotes)
    if head is None:
        return [CheckResult("slurm", "cluster", False, "no head node reachable")]
    compute = [n.name for n in ctx.cluster.lasting_nodes if n.role == "compute"]
    results = []

    deadline = time.monotonic() + IDLE_WAIT_S
    while True:
        states = parse_sinfo_nodes(head.run("sinfo -h -N -o '%.64N %.32T'").stdout)
        out_of_service = [n for n in compute if states.get(n, "absent") not in SERVING]
        if not out_of_service or time.monotonic() > deadline:
            break
        time.sleep(2)
    for name in compute:
        state = states.get(name, "absent")
        busy = " (running jobs)" if state in BUSY else ""
        results.append(CheckResult("sinfo", name, state in SERVING, f"state {state}{busy}"))
    if out_of_service:
        return results
    # the test job goes to the idle nodes only: jobs running elsewhere are left alone
    idle = [n for n in compute if states[n] == "idle"]
    if not idle:
        results.append(
            CheckResult("srun", compress(compute), True, "not run: every compute node runs jobs")
        )
        return results

    hostlist = compress(idle)
    out = head.run(
        f"timeout 120 srun -N{len(idle)} -w {hostlist} --time=2 "
        "sh -c 'echo $SLURM_JOB_ID $(hostname)'",
        timeout=150,
    )
    job, hosts = parse_srun_hosts(out.stdout)
    ran = out.rc == 0 and hosts == sorted(idle)
    results.append(
        CheckResult(
            "srun",
            hostlist,
            ran,
            f"job {job} ran on {compress(hosts)}"
            if ran
            else f"rc {out.rc}: {(out.stderr or out.stdout).strip()[:160]}",
        )
    )

    if ctx.cluster.spec.slurm.accounting and job:
        deadline = time.monotonic() + 30
        while True:
            acct = parse_sacct_states(head.run(f"sacct -n -X -P -o JobID,State -j {job}").stdout)
            if acct.get(job) == "COMPLETED" or time.monotonic() > deadline:
                break
            time.sleep(2)
        results.append(
            CheckResult(
                "sacct",
                f"job {job}",
                acct.get(job) == "COMPLETED",
                f"state {acct.get(job, 'not recorded')}",
            )
        )
    return results


def check_ports(ctx: VerifyContext, remotes: dict[str, Remote]) -> list[CheckResult]:
    """From this machine (an admin address): SSH open, every Slurm and database port closed.
    From the head: slurmd's port open on every compute node."""
    results = []
    ports = service_ports(ctx.cluster.spec)
    closed_ports = [ports.slurmctld_first, ports.slurmd, ports.slurmdbd, ports.mariadb]
    nodes = [n for n in ctx.cluster.lasting_nodes if n.address is not None]
    ssh_port = ports.ssh
    probes = [(n, p) for n in nodes for p in [ssh_port, *closed_ports]]
    # a filtered port costs a whole timeout: probe them all at once
    with ThreadPoolExecutor(max_workers=min(64, len(probes) or 1)) as pool:
        states = dict(
            zip(
                probes,
                pool.map(lambda np: _tcp_open(str(np[0].address), int(np[1])), probes),
                strict=True,
            )
        )
    for node in nodes:
        ssh = states[(node, ssh_port)]
        results.append(CheckResult("ssh from workstation", node.name, ssh == "open", ssh))
        opened = {p: states[(node, p)] for p in closed_ports}
        leaks = [p for p, state in opened.items() if state == "open"]
        evidence = ", ".join(f"{p} {state}" for p, state in opened.items())
        results.append(
            CheckResult(
                "slurm ports from workstation",
                node.name,
                not leaks,
                ("closed: " if not leaks else "OPEN: ") + evidence,
            )
        )
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


def _tcp_open(address: str, port: int, timeout: float = 1.5) -> str:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "filtered"
    except OSError as exc:
        return f"unreachable ({exc.strerror or exc})"

"""slurm.conf, gres.conf and cgroup.conf from the spec: one NodeName and one PartitionName line
per pool, with compressed hostlists, so the files grow with pools, not with nodes."""

from __future__ import annotations

from collections import Counter

from provision.cluster import Cluster, PoolView, compress
from provision.spec.ports import HEALTH_PROGRAM, HEALTH_PROLOG, SLURM_DIRECTORIES, service_ports

# Memory Slurm may hand to jobs: what the profile lists, less what the OS and daemons keep.
# A node whose RealMemory is above what slurmd finds is drained, so stay under.
REAL_MEMORY_FRACTION = 0.95

# Elastic nodes: Slurm's power-saving hooks are the burst programs the burst role installs on
# every head (python3 -m provision.burst, as root through sudo; see provision/burst/).
BURST_PROGRAMS = "/usr/local/libexec/provision"
# seconds a removed node may take to leave (the programs return at once; the container or
# instance is gone within this)
SUSPEND_TIMEOUT_S = 60
# Node weights: Slurm fills the lowest weight first, so lasting nodes before burst nodes, and
# among elastic pools the cheapest first: 100 plus the profile's list price in cents per hour
WEIGHT_LASTING = 1
WEIGHT_ELASTIC = 100
# who verify's test jobs run as: a user every node has, with no rights and no home, as the
# cluster's users are not root (their tasks are pinned, their files theirs, their jobs theirs);
# with accounts it is kept in the root account, as the admins are
JOB_USER = "nobody"


def node_weight(view: PoolView) -> int:
    if not view.pool.elastic:
        return WEIGHT_LASTING
    price = view.profile.price
    return WEIGHT_ELASTIC + (round(price.usd_per_hour * 100) if price else 0)


def _fmt(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "YES" if value else "NO"
    return str(value)


def slurm_settings(cluster: Cluster) -> list[tuple[str, str]]:
    """Global slurm.conf keys in a fixed order; the spec's slurm.config overrides or adds."""
    spec = cluster.spec
    heads = cluster.head_nodes
    ports = service_ports(spec)
    settings: dict[str, str | int | bool] = {
        "ClusterName": spec.name,
        "SlurmUser": "slurm",
        "AuthType": "auth/munge",
        "SlurmctldPort": ports.slurmctld,
        "SlurmdPort": ports.slurmd,
        "SrunPortRange": str(spec.slurm.srun_port_range),
        **SLURM_DIRECTORIES,
        "SlurmctldPidFile": "/run/slurmctld.pid",
        "SlurmdPidFile": "/run/slurmd.pid",
        "ProctrackType": "proctrack/cgroup",
        "TaskPlugin": "task/affinity,task/cgroup",
        "JobAcctGatherType": "jobacct_gather/cgroup",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core_Memory",
        "GresTypes": "gpu",
        "MpiDefault": "none",
        "ReturnToService": 2,
        "SlurmctldTimeout": 120,
        "SlurmdTimeout": 300,
        "InactiveLimit": 0,
        "MinJobAge": 300,
        "KillWait": 30,
        "Waittime": 0,
    }
    if spec.slurm.accounting:
        settings["AccountingStorageType"] = "accounting_storage/slurmdbd"
        settings["AccountingStorageHost"] = heads[0].name
        settings["AccountingStorageTRES"] = "gres/gpu"
    if spec.slurm.accounts:
        settings.update(fair_share(cluster))
    if any(n.elastic for n in cluster.nodes):
        settings.update(power_saving(cluster))
    if spec.health is not None:
        # every node in any state: a drained node is checked too, so it can come back
        settings["HealthCheckProgram"] = HEALTH_PROGRAM
        settings["HealthCheckInterval"] = spec.health.interval
        settings["HealthCheckNodeState"] = "ANY"
        gpu = any(v.profile.gpu is not None for v in cluster.pools_with_role("compute"))
        if spec.health.prolog and gpu:  # the checks before every job (on GPU nodes only)
            settings["Prolog"] = HEALTH_PROLOG
    settings.update(spec.slurm.config)
    pairs = [("SlurmctldHost", h.name) for h in heads]
    return pairs + [(k, _fmt(v)) for k, v in settings.items()]


def fair_share(cluster: Cluster) -> dict[str, str | int | bool]:
    """With accounts: a job needs an association (its user in an account) and keeps to its
    QoS' and account's limits; jobs are ordered by fair share, then QoS, then age."""
    settings: dict[str, str | int | bool] = {
        "AccountingStorageEnforce": "associations,limits,qos,safe",
        "PriorityType": "priority/multifactor",
        "PriorityWeightFairshare": 10000,
        "PriorityWeightQOS": 10000,
        "PriorityWeightAge": 1000,
    }
    if any(q.preempt for q in cluster.spec.slurm.qos):
        settings["PreemptType"] = "preempt/qos"
        settings["PreemptMode"] = "REQUEUE"
    return settings


def wall_minutes(limit: str) -> int:
    """A Slurm time limit (90, 01:30:00, 2-00:00:00) in minutes."""
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        return int(days or 0) * 1440 + parts[0]
    hours, mins, secs = parts
    return int(days or 0) * 1440 + hours * 60 + mins + (1 if secs else 0)


def power_saving(cluster: Cluster) -> dict[str, str | int | bool]:
    """The power-saving block of a cluster with elastic pools: the burst programs, their
    timeouts and rates, and what lets a node join and leave without a restart."""
    spec = cluster.spec
    lasting = [n.name for n in cluster.lasting_nodes if n.role == "compute"]
    settings: dict[str, str | int | bool] = {
        "ResumeProgram": f"{BURST_PROGRAMS}/burst-resume",
        "SuspendProgram": f"{BURST_PROGRAMS}/burst-suspend",
        "ResumeFailProgram": f"{BURST_PROGRAMS}/burst-resume-fail",
        "SuspendTime": spec.slurm.suspend_time,
        "SuspendTimeout": SUSPEND_TIMEOUT_S,
        "ResumeTimeout": spec.slurm.resume_timeout,
        # 0: no limit; the programs start or remove a whole hostlist in one call
        "ResumeRate": 0,
        "SuspendRate": 0,
        # burst nodes run `slurmd --conf-server`: slurm.conf comes from slurmctld, never a copy;
        # a node that is powered down shows idle~, not down~, so jobs keep landing there
        "SlurmctldParameters": "enable_configless,idle_on_node_suspend",
        # sinfo and scontrol show powered-down elastic nodes (idle~) instead of hiding them
        "PrivateData": "cloud",
        # addresses of nodes that come and go are looked up anew, never cached
        "CommunicationParameters": "NoAddrCache",
        "TreeWidth": 65533,
    }
    if any(n.elastic and n.address is None for n in cluster.nodes):
        # a cloud gives a burst node its address: Slurm takes it (and the host name) from the
        # node's registration, and forgets it once the node is powered down (Slurm 20.11+)
        settings["SlurmctldParameters"] = f"{settings['SlurmctldParameters']},cloud_reg_addrs"
    if lasting:
        # lasting nodes are never powered down, only elastic ones
        settings["SuspendExcNodes"] = compress(lasting)
    return settings


def node_line(view: PoolView) -> str:
    prof = view.profile
    cpu = prof.cpu
    cpus = cpu.sockets * cpu.cores_per_socket * cpu.threads_per_core
    parts = [
        f"NodeName={view.hostlist}",
        f"CPUs={cpus}",
        "Boards=1",
        f"SocketsPerBoard={cpu.sockets}",
        f"CoresPerSocket={cpu.cores_per_socket}",
        f"ThreadsPerCore={cpu.threads_per_core}",
        f"RealMemory={int(prof.memory_gib * 1024 * REAL_MEMORY_FRACTION)}",
    ]
    if prof.gpu and view.pool.mig:
        counts = Counter(view.pool.mig)
        gres = ",".join(f"gpu:{m}:{n * prof.gpu.count}" for m, n in sorted(counts.items()))
        parts.append(f"Gres={gres}")
    elif prof.gpu:
        parts.append(f"Gres=gpu:{prof.gpu.slurm_type}:{prof.gpu.count}")
    features = [view.pool.profile.replace(".", "_"), view.pool.provider]
    if view.pool.elastic:
        features.append("elastic")
    parts.append("Feature=" + ",".join(features))
    parts.append(f"Weight={node_weight(view)}")
    parts.append("State=CLOUD" if view.pool.elastic else "State=UNKNOWN")
    return " ".join(parts)


def partition_line(name: str, nodes: str, default: bool) -> str:
    parts = [
        f"PartitionName={name}",
        f"Nodes={nodes}",
        f"Default={'YES' if default else 'NO'}",
        "MaxTime=INFINITE",
        "State=UP",
    ]
    return " ".join(parts)


def default_partition(cluster: Cluster) -> str:
    chosen = cluster.spec.slurm.default_partition
    if chosen:
        return chosen
    return cluster.pools_with_role("compute")[0].name


def slurm_conf_context(cluster: Cluster) -> dict[str, object]:
    compute = cluster.pools_with_role("compute")
    views = {v.name: v for v in compute}
    default = default_partition(cluster)
    return {
        "settings": slurm_settings(cluster),
        "node_lines": [node_line(v) for v in compute],
        "partition_lines": [partition_line(v.name, v.hostlist, v.name == default) for v in compute]
        + [
            partition_line(
                part.name,
                ",".join(views[p].hostlist for p in part.pools),
                part.name == default,
            )
            for part in cluster.spec.slurm.partitions
        ],
    }


def gres_conf_context(cluster: Cluster) -> dict[str, object]:
    lines = []
    for view in cluster.pools_with_role("compute"):
        gpu = view.profile.gpu
        if gpu is None:
            continue
        if view.pool.mig:
            # MIG devices and their /dev/nvidia-caps files exist only once the layout is
            # applied at boot; slurmd finds them through NVML (types are the MIG profiles).
            lines.append(f"NodeName={view.hostlist} AutoDetect=nvml")
            continue
        files = "/dev/nvidia0" if gpu.count == 1 else f"/dev/nvidia[0-{gpu.count - 1}]"
        lines.append(f"NodeName={view.hostlist} Name=gpu Type={gpu.slurm_type} File={files}")
    return {"gres_lines": lines}


# slurm.oci_runtime unset: Slurm without an oci.conf would run a --container step on the node
# itself, outside any container (seen on 22.05); so oci.conf is always there, and refuses it
OCI_REFUSAL = (
    "containers in jobs (--container) are not set up on this cluster: its spec has no "
    "slurm.oci_runtime"
)


def oci_conf_context(runtime: str | None) -> dict[str, object]:
    """oci.conf's commands for runc or crun, rootless: slurmstepd runs the task's as the job's
    user, for the container named after the node, user, job, step and task. %b is the step's
    bundle as slurmstepd writes it (its config.json, with the task's command, in a directory of
    the step's own under SlurmdSpoolDir that slurmstepd makes for the user): the runtime keeps
    its state there, where no other user can reach it, and removes it when the task ends, so
    slurmstepd can remove the directory. slurmstepd then asks (as root) whether the container
    is still there: only where the directory is, or the runtime would make it again. Without a
    runtime, the task's command refuses the step."""
    if runtime is None:
        return {
            "runtime": None,
            "commands": [
                ("RunTimeQuery", "echo {}"),
                ("RunTimeKill", "true"),
                ("RunTimeDelete", "true"),
                ("RunTimeRun", f"echo '{OCI_REFUSAL}' >&2; exit 1"),
            ],
        }
    root = f"{runtime} --rootless=true --root=%b"
    name = "%n.%u.%j.%s.%t"
    run = f"{root} run {name} -b %b" if runtime == "runc" else f"{root} run --bundle %b {name}"
    there = "test -d %b && "
    return {
        "runtime": runtime,
        "commands": [
            ("RunTimeQuery", f"if test -d %b; then {root} state {name}; else echo {{}}; fi"),
            ("RunTimeKill", f"{there}{root} kill -a {name}"),
            # a task killed before its runtime could clean up: the state, then the directory
            ("RunTimeDelete", f"{there}{{ {root} delete --force {name}; rmdir %b; }}"),
            ("RunTimeRun", f"exec {run}"),
        ],
    }

"""Cross-field checks: what no single field can know. Each problem names its key path and says
what to do about it."""

from __future__ import annotations

import difflib
import ipaddress
import posixpath
import re
from collections.abc import Callable

from provision.parsers.dcgm import DIAG_TIMEOUT_S, LONG_DIAG_FROM
from provision.spec.exposure import WIDE, describe_size, public_addresses
from provision.spec.fabric import efa_count, fabric_addresses, fabric_hcas
from provision.spec.models import BURST_PROVIDERS, CLOUD_PROVIDERS, Health, Spec, port_range
from provision.spec.nodes import Loc, Node, expand_nodes_checked, node_network
from provision.spec.ports import (
    HEALTH_KEYS,
    SLURM_DIRECTORIES,
    daemon_directory,
    service_ports,
    system_directory,
)
from provision.spec.profiles import load_profiles
from provision.spec.storage import (
    check_storage_nodes,
    client_for,
    served_by,
    shared_home_mounts,
    split_source,
)
from provision.spec.yamlfile import format_path

Problem = tuple[Loc, str]


def check_spec(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    for check in CHECKS:
        problems.extend(check(spec))
    nodes, node_problems = expand_nodes_checked(spec)
    problems.extend(node_problems)
    if not problems:
        problems.extend(_check_nodes(spec, nodes))
    if not problems:
        problems.extend(check_storage_nodes(spec, nodes))
    if not problems:
        problems.extend(_check_fabric_nodes(spec, nodes))
    return problems


def _check_head(spec: Spec) -> list[Problem]:
    heads = [i for i, p in enumerate(spec.pools) if p.role == "head"]
    if not heads:
        return [(("pools",), "no pool has role 'head': add one (it runs the controller)")]
    return [
        (
            ("pools", i, "role"),
            f"a second head pool ({spec.pools[i].name}); the cluster has one head pool, "
            f"'{spec.pools[heads[0]].name}'",
        )
        for i in heads[1:]
    ]


def _check_compute(spec: Spec) -> list[Problem]:
    if any(p.role == "compute" for p in spec.pools):
        return []
    return [(("pools",), "no pool has role 'compute': add one for the jobs to run on")]


def _check_pools(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    profiles = load_profiles(spec.profiles)
    seen: dict[str, int] = {}
    for i, pool in enumerate(spec.pools):
        at: Loc = ("pools", i)
        if pool.name in seen:
            problems.append(((*at, "name"), f"pool name '{pool.name}' is used twice: rename one"))
        seen.setdefault(pool.name, i)
        if (pool.count is None) == (pool.hosts is None):
            problems.append((at, "give the pool either 'count' or 'hosts', not both or neither"))
        if pool.hosts is not None:
            for key in ("first_address", "first_bmc_address", "hostname_prefix"):
                if key in pool.model_fields_set:
                    problems.append(
                        (
                            (*at, key),
                            f"'{key}' applies to counted pools: remove it "
                            "and give each host its own values",
                        )
                    )
        profile = profiles.get(pool.profile)
        if profile is None:
            close = difflib.get_close_matches(pool.profile, sorted(profiles), n=1)
            hint = f"did you mean '{close[0]}'?" if close else "see `provision profiles`"
            problems.append(((*at, "profile"), f"unknown profile '{pool.profile}': {hint}"))
        else:
            if pool.provider not in profile.providers:
                problems.append(
                    (
                        (*at, "provider"),
                        f"profile '{pool.profile}' exists on {', '.join(profile.providers)}"
                        f", not on '{pool.provider}': change the provider or the profile",
                    )
                )
            if pool.provider == "azure" and profile.gpu and spec.os in ("debian12", "rocky9"):
                problems.append(
                    (
                        ("os",),
                        f"Azure's GPU VMs (pool '{pool.name}', {pool.profile}) support Ubuntu "
                        f"(Microsoft's Ubuntu-HPC images), not {spec.os}: use ubuntu22.04 or "
                        "ubuntu24.04",
                    )
                )
            have = profile.gpu.count if profile.gpu else 0
            if pool.gpus is not None and pool.gpus != have:
                problems.append(
                    (
                        (*at, "gpus"),
                        f"profile '{pool.profile}' has {have} GPUs per node, the pool says "
                        f"{pool.gpus}: fix gpus or pick the right profile",
                    )
                )
        if pool.elastic:
            if pool.provider not in BURST_PROVIDERS:
                problems.append(
                    (
                        (*at, "elastic"),
                        f"provider '{pool.provider}' cannot create nodes on demand: elastic "
                        f"pools need one of {', '.join(BURST_PROVIDERS)}",
                    )
                )
            if pool.role != "compute":
                problems.append(
                    (
                        (*at, "elastic"),
                        f"only compute pools can be elastic, this one is '{pool.role}'",
                    )
                )
            heads = [p for p in spec.pools if p.role == "head"]
            if pool.provider == "lab" and heads and heads[0].provider != "lab":
                problems.append(
                    (
                        (*at, "elastic"),
                        "an elastic lab pool needs a lab head (the head drives this machine's "
                        f"podman), the head pool '{heads[0].name}' is '{heads[0].provider}'",
                    )
                )
        if pool.provider == "static" and not pool.elastic:
            missing = (
                pool.first_address is None
                if pool.hosts is None
                else any(h.address is None for h in pool.hosts)
            )
            if missing:
                problems.append(
                    (
                        at,
                        "static nodes already exist, so the spec must give their "
                        "addresses: set first_address, or an address on every host",
                    )
                )
        if pool.provider in CLOUD_PROVIDERS:
            for key in ("first_address", "first_bmc_address"):
                if key in pool.model_fields_set:
                    problems.append(
                        ((*at, key), f"the cloud assigns {pool.provider} addresses: remove '{key}'")
                    )
            if pool.region is None:
                problems.append((at, f"{pool.provider} pools need 'region'"))
            if pool.provider == "gcp" and pool.zone is None:
                # Compute Engine makes an instance in one zone, and refuses one without it
                problems.append(
                    (at, "gcp pools need 'zone' (their instances live in one: us-central1-a)")
                )
        elif pool.region is not None or pool.zone is not None:
            problems.append(
                (
                    (*at, "region" if pool.region else "zone"),
                    f"region and zone apply to cloud pools, not '{pool.provider}'",
                )
            )
    return problems


# each cloud's form of a reservation's name
_EC2_RESERVATION = re.compile(r"cr-[0-9a-f]{8}(?:[0-9a-f]{9})?")
_GCE_RESERVATION = re.compile(
    r"(?:projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/reservations/)?[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
)
_AZURE_RESERVATION = re.compile(
    r"/subscriptions/[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}/resourceGroups/[-\w.()]{1,90}"
    r"/providers/Microsoft\.Compute/capacityReservationGroups/[-\w.]{1,80}",
    re.IGNORECASE,
)
_RESERVATION_FORM = {
    "aws": (_EC2_RESERVATION, "an EC2 Capacity Reservation ID: cr- and 17 hex digits"),
    "gcp": (
        _GCE_RESERVATION,
        "a Compute Engine reservation: its name, or projects/PROJECT/reservations/NAME",
    ),
    "azure": (
        _AZURE_RESERVATION,
        "a capacity reservation group's resource ID: /subscriptions/SUBSCRIPTION/"
        "resourceGroups/GROUP/providers/Microsoft.Compute/capacityReservationGroups/NAME",
    ),
}


def _check_reservations(spec: Spec) -> list[Problem]:
    """A reservation in each cloud's own form, where that cloud launches into it."""
    problems: list[Problem] = []
    profiles = load_profiles(spec.profiles)
    for i, pool in enumerate(spec.pools):
        reservation = pool.reservation
        if reservation is None:
            continue
        at: Loc = ("pools", i, "reservation")
        if pool.provider not in CLOUD_PROVIDERS:
            problems.append((at, f"reservations apply to cloud pools, not '{pool.provider}'"))
            continue
        form, words = _RESERVATION_FORM[pool.provider]
        if not form.fullmatch(reservation.id):
            problems.append(((*at, "id"), f"'{reservation.id}' is not {words}"))
        if reservation.capacity_block and pool.provider != "aws":
            problems.append(
                (
                    (*at, "capacity_block"),
                    f"Capacity Blocks are AWS's; a {pool.provider} reservation is named by id "
                    "alone: remove capacity_block",
                )
            )
        if pool.provider == "aws" and pool.zone is None:
            # a Capacity Reservation or Block lies in one zone; EC2 launches into it only there
            problems.append(
                (
                    ("pools", i),
                    "an EC2 Capacity Reservation lies in one zone: set 'zone' to its zone "
                    "(instances in another zone cannot use it)",
                )
            )
        profile = profiles.get(pool.profile)
        size = (profile.instance_type or "") if profile else ""
        if pool.provider == "azure" and size.lower().startswith("standard_nd"):
            problems.append(
                (
                    at,
                    f"Azure has no capacity reservations for ND-series sizes ({size}): remove "
                    "the reservation",
                )
            )
    return problems


def _check_efa(spec: Spec) -> list[Problem]:
    """software.efa pins what the efa role installs: on no pool with EFA it would act on none."""
    if spec.software.efa is None:
        return []
    profiles = load_profiles(spec.profiles)
    if any(efa_count(profiles[p.profile]) for p in spec.pools if p.profile in profiles):
        return []
    return [
        (
            ("software", "efa"),
            "no pool has EFA (AWS's p4d and p5 profiles): remove software.efa",
        )
    ]


def _check_networks(spec: Spec) -> list[Problem]:
    nets: list[tuple[Loc, ipaddress.IPv4Network]] = [
        (("network", "management", "cidr"), spec.network.management.cidr)
    ]
    if spec.network.bmc:
        nets.append((("network", "bmc", "cidr"), spec.network.bmc.cidr))
    if spec.network.fabric.subnet:
        nets.append((("network", "fabric", "subnet"), spec.network.fabric.subnet))
    if spec.scheduler == "kubernetes":
        nets.append((("kubernetes", "pod_cidr"), spec.kubernetes.pod_cidr))
        nets.append((("kubernetes", "service_cidr"), spec.kubernetes.service_cidr))
    for i, remote in enumerate(spec.network.remote):
        nets.append((("network", "remote", i, "cidr"), remote.cidr))
    problems: list[Problem] = []
    for a in range(len(nets)):
        for b in range(a):
            if nets[a][1].overlaps(nets[b][1]):
                other = ".".join(str(p) for p in nets[b][0])
                why = (
                    "a remote network needs its own range, or no route can tell the two apart"
                    if nets[a][0][1] == "remote"
                    else "give each network its own range"
                )
                problems.append(
                    (nets[a][0], f"{nets[a][1]} overlaps {other} ({nets[b][1]}): {why}")
                )
    problems += _check_remote(spec)
    if spec.network.fabric.kind != "ethernet" and spec.network.fabric.subnet is None:
        problems.append(
            (
                ("network", "fabric"),
                f"a {spec.network.fabric.kind} fabric needs 'subnet' for its IP addresses",
            )
        )
    return problems


def _check_remote(spec: Spec) -> list[Problem]:
    """Remote networks: each named once and used; pools name one that exists; a cloud's pools
    share one, which no other provider uses; what the tunnel cannot carry yet is refused."""
    problems: list[Problem] = []
    names: dict[str, int] = {}
    for i, remote in enumerate(spec.network.remote):
        if remote.name in names:
            problems.append(
                (("network", "remote", i, "name"), f"'{remote.name}' is used twice: rename one")
            )
        names.setdefault(remote.name, i)
    used_by: dict[str, str] = {}  # remote network -> the cloud on it
    cloud_net: dict[str, str] = {}  # cloud -> its remote network
    for i, pool in enumerate(spec.pools):
        at: Loc = ("pools", i, "network")
        if pool.network is None:
            if pool.provider in CLOUD_PROVIDERS:
                problems.append(
                    (
                        at,
                        f"pools on {pool.provider} need a remote network: the cloud's own "
                        "address range (network.remote), which its nodes reach the head "
                        "from through the tunnel",
                    )
                )
            continue
        if pool.network not in names:
            known = ", ".join(names) or "none"
            problems.append((at, f"no remote network '{pool.network}' (network.remote: {known})"))
            continue
        if pool.role != "compute":
            problems.append(
                (at, f"{pool.role} pools on a remote network: not supported yet (compute only)")
            )
        elif pool.provider == "lab":
            problems.append((at, "lab pools on a remote network: not supported yet"))
        elif pool.provider in CLOUD_PROVIDERS:
            cloud = used_by.setdefault(pool.network, pool.provider)
            mine = cloud_net.setdefault(pool.provider, pool.network)
            if cloud != pool.provider:
                problems.append(
                    (at, f"'{pool.network}' is {cloud}'s network: give {pool.provider} its own")
                )
            elif mine != pool.network:
                problems.append(
                    (
                        at,
                        f"the {pool.provider} pools share one network ('{mine}'): one per "
                        "cloud and cluster",
                    )
                )
    on_remote = {p.network for p in spec.pools if p.network is not None}
    for i, remote in enumerate(spec.network.remote):
        if remote.name not in on_remote:
            problems.append(
                (("network", "remote", i), f"no pool is on '{remote.name}': remove it or use it")
            )
    if on_remote:
        heads = sum(p.size for p in spec.pools if p.role == "head")
        if heads > 1:
            problems.append(
                (
                    ("network", "remote"),
                    "remote networks with more than one head: not supported yet (the tunnel's "
                    "hub is the first head)",
                )
            )
        if spec.scheduler == "kubernetes":
            problems.append(
                (("network", "remote"), "remote networks under Kubernetes: not supported yet")
            )
    elif spec.network.tunnel.model_fields_set:
        problems.append((("network", "tunnel"), "no pool is on a remote network: remove it"))
    return problems


def _check_scheduler(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    other = "kubernetes" if spec.scheduler == "slurm" else "slurm"
    if other in spec.model_fields_set:
        problems.append(
            (
                (other,),
                f"'{other}' settings given but scheduler is '{spec.scheduler}': "
                "remove them or change the scheduler",
            )
        )
    names = {p.name: p for p in spec.pools}
    compute = [p.name for p in spec.pools if p.role == "compute"]
    seen: set[str] = set()
    for i, part in enumerate(spec.slurm.partitions):
        at: Loc = ("slurm", "partitions", i)
        if part.name in names or part.name in seen:
            what = "a pool's" if part.name in names else "another partition's"
            problems.append(((*at, "name"), f"'{part.name}' is {what} name: pick another"))
        seen.add(part.name)
        for j, pool in enumerate(part.pools):
            if pool not in compute:
                problems.append(
                    (
                        (*at, "pools", j),
                        f"'{pool}' is not a compute pool: use one of {', '.join(compute)}",
                    )
                )
            elif pool in part.pools[:j]:
                problems.append(((*at, "pools", j), f"'{pool}' is named twice"))
    dp = spec.slurm.default_partition
    if dp is not None and dp not in compute and dp not in seen:
        problems.append(
            (
                ("slurm", "default_partition"),
                f"'{dp}' is neither a compute pool nor a partition: use one of "
                + ", ".join(compute + [p.name for p in spec.slurm.partitions]),
            )
        )
    if spec.scheduler == "kubernetes":
        problems.extend(_check_kubernetes(spec))
    return problems


def _check_kubernetes(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    kube = spec.kubernetes
    heads = sum(p.size for p in spec.pools if p.role == "head")
    if kube.ha and heads < 3:
        problems.append(
            (
                ("kubernetes", "ha"),
                f"an HA control plane needs at least 3 head nodes (etcd quorum), the "
                f"spec has {heads}: raise the head pool's count or set ha: false",
            )
        )
    mgmt = spec.network.management.cidr
    if kube.ha and kube.api_address is None:
        problems.append(
            (
                ("kubernetes", "ha"),
                f"an HA control plane needs api_address: a free address in {mgmt} that moves "
                "to a healthy head",
            )
        )
    if kube.api_address is not None:
        if not kube.ha:
            problems.append(
                (
                    ("kubernetes", "api_address"),
                    "api_address is the HA control plane's virtual address: set ha: true, or "
                    "remove it (the API is then the first head's own address)",
                )
            )
        elif kube.api_address not in mgmt or kube.api_address in (
            mgmt.network_address,
            mgmt.broadcast_address,
        ):
            problems.append(
                (
                    ("kubernetes", "api_address"),
                    f"{kube.api_address} is not a host address of the management network {mgmt}",
                )
            )
    return problems


# The Slurm series each OS's own archive carries (stable releases keep their series); Rocky 9's
# comes from EPEL, which moves on, so the slurm role checks it on the node instead
SLURM_SERIES = {"debian12": "22.05", "ubuntu22.04": "21.08", "ubuntu24.04": "23.11"}


def _check_slurm_version(spec: Spec) -> list[Problem]:
    version, series = spec.software.slurm, SLURM_SERIES.get(spec.os)
    if version is None or series is None:
        return []
    if version == series or version.startswith(f"{series}."):
        return []
    return [
        (
            ("software", "slurm"),
            f"'{version}': {spec.os}'s Slurm packages are {series}, the only series the slurm "
            f"role installs there; pin {series} (or one of its releases, like {series}.1) or "
            "leave software.slurm out",
        )
    ]


def _check_controllers(spec: Spec) -> list[Problem]:
    """Two or more heads run a primary and backup slurmctld: the controller's state must be on
    storage every head mounts, served by none of them (it would fail with its server)."""
    for i, pool in enumerate(spec.pools):
        if pool.role != "head" or pool.size < 2 or spec.scheduler != "slurm":
            continue
        state = str(spec.slurm.config.get("StateSaveLocation", ""))
        shared = [
            m
            for m in spec.storage.mounts
            if (m.pools is None or pool.name in m.pools)
            and state.startswith(m.path.rstrip("/") + "/")
        ]
        at: Loc = (
            ("slurm", "config", "StateSaveLocation")
            if state
            else ("pools", i, "hosts" if pool.hosts is not None else "count")
        )
        if not shared:
            return [
                (
                    at,
                    f"{pool.size} head nodes run a primary and a backup slurmctld, which share "
                    "their state: set slurm.config StateSaveLocation under a path of "
                    "storage.mounts that every head mounts (like /shared/slurm/state under a "
                    "mount at /shared/slurm)",
                )
            ]
        nodes, _ = expand_nodes_checked(spec)
        heads = {n.name for n in nodes if n.pool == pool.name}
        served = served_by(spec, nodes, shared[0])
        server = served.node.name if served else split_source(shared[0])[0]
        if server in heads:
            return [
                (
                    at,
                    f"StateSaveLocation is on {shared[0].source}, served by head {server}: the "
                    "backup controller could not read it once that head is down; mount it from "
                    "storage outside the head pool",
                )
            ]
        if served is not None and served.export is not None:
            client = client_for(spec, nodes, served.export, pool.name)
            if client is not None and client.squash != "none":
                return [
                    (
                        at,
                        f"StateSaveLocation is on {shared[0].source}, whose export squashes the "
                        f"heads' root ({client.squash}): the slurm role makes the directory as "
                        "root and gives it to slurm; give the head pool's client entry in "
                        f"storage.exports[{served.index}] squash: none",
                    )
                ]
    return []


# Debian and Ubuntu package NVIDIA drivers; Rocky has no distribution NVIDIA packages.
_DISTRO_NVIDIA_OS = ("debian12", "ubuntu22.04", "ubuntu24.04")
# What Debian 12's non-free does not carry: the NVIDIA-only parts.
_NVIDIA_ONLY = ("dcgm", "container_toolkit")


def _mig_slices(profile: str, gpu_memory_gib: int) -> tuple[int, int]:
    """Compute slices (of 7) and memory slices (of 8) a MIG profile takes: 3g.40gb on an
    80 GB GPU takes 3 and 4."""
    compute, memory = profile.split(".")
    return int(compute[:-1]), max(1, round(int(memory[:-2]) * 8 / gpu_memory_gib))


def _check_gpu(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    nvidia = spec.nvidia
    at: Loc = ("nvidia",)
    if nvidia.source == "mirror" and not nvidia.mirror_url:
        problems.append(
            (
                (*at, "source"),
                "source 'mirror' needs 'mirror_url': the mirror's "
                "base URL, with NVIDIA's repository paths below it",
            )
        )
    if nvidia.mirror_url and nvidia.source != "mirror":
        problems.append(
            (
                (*at, "mirror_url"),
                f"'mirror_url' is only used with source 'mirror' "
                f"(source is '{nvidia.source}'): remove it or set source: mirror",
            )
        )
    if (nvidia.dcgm_exporter_url is None) != (nvidia.dcgm_exporter_sha256 is None):
        problems.append(
            (
                (*at, "dcgm_exporter_sha256"),
                "give 'dcgm_exporter_url' and "
                "'dcgm_exporter_sha256' together: nothing is installed unverified",
            )
        )
    profiles = load_profiles(spec.profiles)
    gpu_pools = [
        p for p in spec.pools if (prof := profiles.get(p.profile)) is not None and prof.gpu
    ]
    if nvidia.source == "distro" and gpu_pools:
        if spec.os not in _DISTRO_NVIDIA_OS:
            problems.append(
                (
                    (*at, "source"),
                    f"{spec.os} has no distribution NVIDIA packages: "
                    "use source 'nvidia' or 'mirror'",
                )
            )
        for part in _NVIDIA_ONLY:
            if getattr(nvidia, part):
                problems.append(
                    (
                        (*at, part),
                        f"{part} comes only from NVIDIA's repositories; "
                        f"with source 'distro' set {part}: false, or use source "
                        "'nvidia' or 'mirror'",
                    )
                )
        if spec.os == "debian12" and nvidia.driver_modules != "dkms":
            problems.append(
                (
                    (*at, "driver_modules"),
                    "Debian 12 packages only the proprietary "
                    "DKMS modules at the driver's version: set driver_modules: dkms",
                )
            )
        for pool in gpu_pools:
            gpu = profiles[pool.profile].gpu
            if gpu is not None and gpu.nvswitch:
                problems.append(
                    (
                        (*at, "source"),
                        f"pool '{pool.name}' has NVSwitch, whose "
                        "fabric manager comes only from NVIDIA's repositories: use "
                        "source 'nvidia' or 'mirror'",
                    )
                )
                break
    if nvidia.driver_modules == "precompiled" and spec.os == "debian12":
        problems.append(
            (
                (*at, "driver_modules"),
                "no precompiled NVIDIA modules exist for Debian 12: use 'open' or 'dkms'",
            )
        )
    sw = spec.software
    for part in ("cudnn", "nccl"):
        if getattr(sw, part) and not sw.cuda:
            problems.append(
                (
                    ("software", part),
                    f"{part} is built per CUDA major version: pin software.cuda too",
                )
            )
    if sw.cudnn and sw.cudnn.split(".")[0] not in ("8", "9"):
        problems.append(
            (("software", "cudnn"), f"cuDNN {sw.cudnn}: major versions 8 and 9 are supported")
        )
    for i, pool in enumerate(spec.pools):
        prof = profiles.get(pool.profile)
        if pool.mig is None or prof is None:  # an unknown profile is reported by _check_pools
            continue
        gpu = prof.gpu
        where: Loc = ("pools", i, "mig")
        if gpu is None or not gpu.mig_profiles:
            problems.append(
                (where, f"profile '{pool.profile}' has no MIG-capable GPU: remove 'mig'")
            )
            continue
        unknown = [m for m in pool.mig if m not in gpu.mig_profiles]
        if unknown:
            problems.append(
                (
                    where,
                    f"{', '.join(unknown)} not offered by {gpu.model}: "
                    f"choose from {', '.join(gpu.mig_profiles)}",
                )
            )
            continue
        slices = [_mig_slices(m, gpu.memory_gib) for m in pool.mig]
        compute, memory = sum(c for c, _ in slices), sum(m for _, m in slices)
        if compute > 7 or memory > 8:
            problems.append(
                (
                    where,
                    f"the layout needs {compute} of 7 compute slices and "
                    f"{memory} of 8 memory slices of one {gpu.model}: use fewer "
                    "or smaller instances",
                )
            )
    return problems


# NVIDIA's driver documentation: Grace Hopper and Blackwell run only the open kernel modules;
# Blackwell needs the R570 driver or later
_GRACE_HOPPER = re.compile(r"^GH\d{3}\b", re.IGNORECASE)
_BLACKWELL = re.compile(r"^G?B\d{3}\b|blackwell", re.IGNORECASE)
BLACKWELL_DRIVER = 570


def _proprietary_modules(spec: Spec) -> bool:
    """Whether the nodes get NVIDIA's proprietary kernel modules: the dkms flavour, and the
    precompiled streams of Rocky (Ubuntu's precompiled ones are the open modules)."""
    modules = spec.nvidia.driver_modules
    return modules == "dkms" or (modules == "precompiled" and spec.os.startswith("rocky"))


def _check_gpu_generation(spec: Spec) -> list[Problem]:
    """What a GPU generation needs of the driver, refused where the spec cannot give it."""
    problems: list[Problem] = []
    profiles = load_profiles(spec.profiles)
    driver = spec.software.nvidia_driver
    for i, pool in enumerate(spec.pools):
        prof = profiles.get(pool.profile)
        if prof is None or prof.gpu is None:
            continue
        model = prof.gpu.model
        blackwell = _BLACKWELL.search(model) is not None
        if (blackwell or _GRACE_HOPPER.search(model)) and _proprietary_modules(spec):
            problems.append(
                (
                    ("nvidia", "driver_modules"),
                    f"pool '{pool.name}' has {model} GPUs, which run only NVIDIA's open kernel "
                    f"modules: set driver_modules: open",
                )
            )
        if not blackwell:
            continue
        if driver is not None and int(str(driver).split(".")[0]) < BLACKWELL_DRIVER:
            problems.append(
                (
                    ("software", "nvidia_driver"),
                    f"pool '{pool.name}' has Blackwell GPUs ({model}), which need driver "
                    f"{BLACKWELL_DRIVER} or later, not {driver}",
                )
            )
        if prof.gpu.nvswitch:
            problems.append(
                (
                    ("pools", i, "profile"),
                    f"{model} with NVSwitch is not supported yet: Blackwell's NVLink fabric "
                    "needs NVIDIA's NVLink subnet manager (NVLSM) beside the fabric manager, "
                    "which no role installs yet",
                )
            )
    return problems


def _check_security(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    security = spec.security
    admin = public_addresses(security.admin_cidrs)
    if admin > WIDE and not security.allow_admin_from_anywhere:
        what = ", ".join(str(c) for c in security.admin_cidrs)
        whole = any(c.prefixlen == 0 for c in security.admin_cidrs)
        wide = [i for i, c in enumerate(security.admin_cidrs) if public_addresses([c]) > WIDE]
        problems.append(
            (
                ("security", "admin_cidrs", *wide[:1]),
                f"{'0.0.0.0/0' if whole else what} opens SSH to "
                f"{'the whole internet' if whole else describe_size(admin)}: name your admin "
                "networks, or set security.allow_admin_from_anywhere: true if you mean it",
            )
        )
    # each rule, and all rules together, may admit at most a /8 of the internet unless opted in
    admin_nets = list(security.admin_cidrs)
    so_far: list[ipaddress.IPv4Network] = []
    for i, rule in enumerate(security.firewall_rules):
        nets = [s for s in rule.sources if isinstance(s, ipaddress.IPv4Network)]
        if "admin" in rule.sources and security.allow_admin_from_anywhere:
            nets += admin_nets
        if rule.open_to_internet:
            continue
        so_far += nets
        alone, together = public_addresses(nets), public_addresses(so_far)
        if max(alone, together) > WIDE:
            size = (
                describe_size(alone)
                if alone > WIDE
                else (f"{describe_size(together)} with the rules before it")
            )
            problems.append(
                (
                    ("security", "firewall_rules", i, "sources"),
                    f"rule '{rule.name}' opens port {rule.port} to {size}: narrow its sources, "
                    "or set open_to_internet: true on it if you mean it",
                )
            )
            so_far = []
    if spec.ssh.port != 22 and any(p.provider == "lab" for p in spec.pools):
        problems.append(
            (
                ("ssh", "port"),
                "not supported yet: lab nodes' sshd listens on 22; leave ssh.port out for a lab",
            )
        )
    names = [a.name for a in spec.security.admins]
    for i, name in enumerate(names):
        if name in names[:i]:
            problems.append((("security", "admins", i, "name"), f"admin '{name}' is listed twice"))
    problems += _check_admin_homes(spec)
    pools = {p.name for p in spec.pools}
    for i, rule in enumerate(spec.security.firewall_rules):
        for j, pool in enumerate(rule.pools or []):
            if pool not in pools:
                problems.append(
                    (("security", "firewall_rules", i, "pools", j), f"no pool named '{pool}'")
                )
    return problems


def _check_admin_homes(spec: Spec) -> list[Problem]:
    """An admin whose home is on shared storage needs a uid pinned by the spec: the nodes'
    useradd would each pick their own, and the home's files one owner on one node only."""
    problems: list[Problem] = []
    shared = shared_home_mounts(spec)
    uids: dict[int, str] = {}
    for i, admin in enumerate(spec.security.admins):
        if admin.uid is not None:
            if admin.uid in uids:
                problems.append(
                    (
                        ("security", "admins", i, "uid"),
                        f"uid {admin.uid} is {uids[admin.uid]}'s too: each admin needs their own",
                    )
                )
            uids.setdefault(admin.uid, admin.name)
        elif shared:
            mount = shared[0]
            problems.append(
                (
                    ("security", "admins", i),
                    f"{admin.name}'s home is on shared storage ({mount.source} at {mount.path}): "
                    "set uid (1000-59999), the same on every node, so that its files have one "
                    "owner everywhere",
                )
            )
    return problems


def _check_monitoring(spec: Spec) -> list[Problem]:
    monitoring = spec.monitoring
    if monitoring is None:
        return []
    problems: list[Problem] = []
    pools = {p.name: p for p in spec.pools}
    if monitoring.pool is not None:
        at: Loc = ("monitoring", "pool")
        pool = pools.get(monitoring.pool)
        if pool is None:
            problems.append((at, f"no pool named '{monitoring.pool}'"))
        elif pool.elastic:
            problems.append(
                (at, f"'{pool.name}' is elastic: its nodes come and go; name a lasting pool")
            )
        elif pool.role in ("compute", "login"):
            who = "jobs run" if pool.role == "compute" else "users log in"
            problems.append(
                (
                    at,
                    f"'{pool.name}' is a {pool.role} pool, where {who}: they would reach "
                    "Prometheus and Alertmanager on its loopback (and could silence the "
                    "cluster's alerts); name a head or storage pool, or leave pool unset",
                )
            )
    ports = service_ports(spec)
    taken = {
        ports.ssh: "SSH",
        ports.slurmd: "slurmd",
        ports.slurmdbd: "slurmdbd",
        ports.mariadb: "MariaDB",
        ports.nfs: "NFS",
        str(spec.nvidia.dcgm_exporter_port): "the DCGM exporter",
    }
    low, _, high = ports.slurmctld.partition("-")
    for number in range(int(low), int(high or low) + 1):
        taken[str(number)] = "slurmctld"
    for field in ("prometheus_port", "alertmanager_port", "node_exporter_port"):
        port = str(getattr(monitoring, field))
        if port in taken:
            problems.append((("monitoring", field), f"port {port} is also {taken[port]}'s port"))
        taken[port] = field.removesuffix("_port").replace("_", " ")
    if monitoring.grafana is not None:
        port = str(monitoring.grafana.port)
        if port in taken:
            problems.append(
                (("monitoring", "grafana", "port"), f"port {port} is also {taken[port]}'s port")
            )
    if system_directory(monitoring.storage_path):
        problems.append(
            (
                ("monitoring", "storage_path"),
                f"{monitoring.storage_path} is a system directory Prometheus would own: use one "
                "of its own, like /var/lib/prometheus/metrics2",
            )
        )
    seen: set[str] = set()
    for i, receiver in enumerate(monitoring.receivers):
        at = ("monitoring", "receivers", i)
        if receiver.name in seen:
            problems.append(((*at, "name"), f"a second receiver '{receiver.name}'"))
        seen.add(receiver.name)
        if (receiver.webhook is None) == (receiver.email is None):
            problems.append(
                (at, "give the receiver either 'webhook' or 'email', not both or neither")
            )
        email = receiver.email
        if email is not None and (email.username is None) != (email.password_file is None):
            given = "username" if email.username is not None else "password_file"
            problems.append(
                (
                    (*at, "email", given),
                    "the relay's login needs both 'username' and 'password_file'",
                )
            )
    return problems


def _gpu_pools(spec: Spec) -> list[str]:
    profiles = load_profiles(spec.profiles)
    return [
        p.name
        for p in spec.pools
        if p.profile in profiles and profiles[p.profile].gpu is not None and p.role == "compute"
    ]


def _check_health(spec: Spec) -> list[Problem]:
    health = spec.health
    if health is None:
        return []
    problems: list[Problem] = []
    if spec.scheduler != "slurm":
        problems.append((("health",), "health checks run under Slurm: use scheduler: slurm"))
    for key in HEALTH_KEYS:
        if key in spec.slurm.config:
            problems.append(
                (
                    ("slurm", "config", key),
                    f"{key} is set by health: leave it out, or leave health out to run your own",
                )
            )
    if health.prolog and "Prolog" in spec.slurm.config and _gpu_pools(spec):
        problems.append(
            (
                ("slurm", "config", "Prolog"),
                "Prolog is set by health (its checks before every job on GPU nodes): leave "
                "it out, or set health.prolog: false",
            )
        )
    seen: set[str] = set()
    for i, disk in enumerate(health.disks):
        if disk.path in seen:
            problems.append((("health", "disks", i, "path"), f"{disk.path} is given twice"))
        seen.add(disk.path)
    return problems + _check_dcgm_diag(spec, health)


def _check_dcgm_diag(spec: Spec, health: Health) -> list[Problem]:
    diag = health.dcgm_diag
    if diag is None:
        return []
    at: Loc = ("health", "dcgm_diag")
    if not _gpu_pools(spec):
        return [(at, "no pool has GPUs: DCGM's diagnostics have nothing to test")]
    if not spec.nvidia.dcgm:
        return [(at, "DCGM's diagnostics need DCGM: set nvidia.dcgm: true")]
    problems: list[Problem] = []
    if diag.when == "prolog":
        if diag.level == 3:
            problems.append(
                (
                    (*at, "level"),
                    "level 3 runs for about half an hour: not before every job; run it by hand "
                    "in a maintenance reservation, or use level 2",
                )
            )
        if not health.prolog:
            problems.append(((*at, "when"), "health.prolog is false: no prolog runs it"))
        if diag.every is not None:
            problems.append(((*at, "every"), "'every' is for when: periodic"))
    elif diag.every is not None and diag.every < health.interval:
        problems.append(
            ((*at, "every"), f"{diag.every} s is shorter than health.interval ({health.interval})")
        )
    elif (
        diag.level >= LONG_DIAG_FROM
        and diag.every is not None
        and diag.every < 10 * DIAG_TIMEOUT_S[diag.level]
    ):
        # the node is held while it runs: at most a tenth of its time goes to the diagnostic
        least = 10 * DIAG_TIMEOUT_S[diag.level]
        problems.append(
            (
                (*at, "every"),
                f"{diag.every} s: a level {diag.level} diagnostic holds the node for up to "
                f"{DIAG_TIMEOUT_S[diag.level]} s; run it at most every {least} s",
            )
        )
    return problems


def _check_storage(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    roles = {p.name: p.role for p in spec.pools}
    for i, export in enumerate(spec.storage.exports):
        if export.pool not in roles:
            problems.append((("storage", "exports", i, "pool"), f"no pool named '{export.pool}'"))
        elif roles[export.pool] not in ("storage", "head"):
            problems.append(
                (
                    ("storage", "exports", i, "pool"),
                    f"'{export.pool}' is a {roles[export.pool]} pool: exports are served "
                    "by storage or head pools",
                )
            )
    for i, mount in enumerate(spec.storage.mounts):
        # the source's form per fstype, and what its server exports: storage.check_storage_nodes
        for j, pool in enumerate(mount.pools or []):
            if pool not in roles:
                problems.append((("storage", "mounts", i, "pools", j), f"no pool named '{pool}'"))
    return problems


def _check_nodes(spec: Spec, nodes: list[Node]) -> list[Problem]:
    problems: list[Problem] = []
    known = {n.name for n in nodes}
    for i, mount in enumerate(spec.storage.mounts):
        server = split_source(mount)[0]
        if mount.fstype == "lustre":
            continue  # a site's Lustre, by its MGS NIDs
        # a node's name, an address, or a site's server by its full name (filer.example.org)
        if server and server not in known and not _is_address(server) and "." not in server:
            close = difflib.get_close_matches(server, sorted(known), n=1)
            hint = (
                f": did you mean '{close[0]}'?"
                if close
                else ": use a node name, an address or a site server's full name"
            )
            problems.append(
                (
                    ("storage", "mounts", i, "source"),
                    f"'{server}' is not a node of this cluster{hint}",
                )
            )
    names: dict[str, Loc] = {}
    addresses: dict[ipaddress.IPv4Address, str] = {}
    bmc = spec.network.bmc.cidr if spec.network.bmc else None
    for node in nodes:
        mgmt = node_network(spec, node.pool)
        where = "the management network" if mgmt == spec.network.management.cidr else "its network"
        if node.name in names:
            problems.append(
                (
                    node.loc,
                    f"host name '{node.name}' is used twice (also at "
                    f"{format_path(names[node.name])}): every node needs its own name",
                )
            )
        names.setdefault(node.name, node.loc)
        field = "address" if "hosts" in node.loc else "first_address"
        if node.address is not None:
            if node.address in (mgmt.network_address, mgmt.broadcast_address):
                problems.append(
                    (
                        (*node.loc, field),
                        f"{node.name}'s address {node.address} is the network or broadcast address "
                        f"of {mgmt}: pick a host address",
                    )
                )
            elif node.address not in mgmt:
                problems.append(
                    (
                        (*node.loc, field),
                        f"{node.name}'s address {node.address} is outside {where} {mgmt}",
                    )
                )
            elif node.address in addresses:
                problems.append(
                    (
                        (*node.loc, field),
                        f"{node.name} and {addresses[node.address]} "
                        f"share the address {node.address}",
                    )
                )
            addresses.setdefault(node.address, node.name)
            if spec.scheduler == "kubernetes" and node.address == spec.kubernetes.api_address:
                problems.append(
                    (
                        (*node.loc, field),
                        f"{node.name} has {node.address}, the API's virtual address "
                        "(kubernetes.api_address): give one of them another",
                    )
                )
        if node.bmc_address is not None:
            bfield = "bmc_address" if "hosts" in node.loc else "first_bmc_address"
            if bmc is None:
                problems.append(
                    (
                        (*node.loc, bfield),
                        "BMC addresses need network.bmc.cidr: add the out-of-band network",
                    )
                )
            elif node.bmc_address not in bmc:
                problems.append(
                    (
                        (*node.loc, bfield),
                        f"{node.name}'s BMC address "
                        f"{node.bmc_address} is outside network.bmc.cidr {bmc}",
                    )
                )
    return _first_per_loc(problems)


def _check_fabric(spec: Spec) -> list[Problem]:
    fabric = spec.network.fabric
    loc = ("network", "fabric")
    problems: list[Problem] = []
    if fabric.rdma == "doca" and spec.software.doca is None:
        problems.append(
            ((*loc, "rdma"), "DOCA-OFED needs its release: set software.doca (like 2.9.1)")
        )
    if fabric.rdma == "doca" and fabric.doca_key_fingerprint is None:
        problems.append(
            (
                (*loc, "rdma"),
                "DOCA-OFED needs the full fingerprint of its signing key: set "
                "network.fabric.doca_key_fingerprint (gpg --show-keys --with-colons "
                "GPG-KEY-Mellanox.pub; Mellanox's ends in A024F6F0E6D6A281)",
            )
        )
    if fabric.kind == "ethernet":
        for key in (
            "subnet_managers",
            "bootstrap_interface",
            "rdma",
            "doca_mirror_url",
            "doca_key_fingerprint",
            "roce",
        ):
            if key in fabric.model_fields_set:
                problems.append(
                    ((*loc, key), f"'{key}' needs an infiniband or roce fabric, not ethernet")
                )
    if fabric.kind == "roce" and fabric.subnet_managers:
        problems.append(
            (
                (*loc, "subnet_managers"),
                "RoCE runs over Ethernet switches and needs no subnet manager: remove the list",
            )
        )
    if fabric.kind == "infiniband" and "roce" in fabric.model_fields_set:
        problems.append(((*loc, "roce"), "RoCE settings need a roce fabric, not infiniband"))
    if fabric.kind == "infiniband":
        problems.extend(_check_ipoib(spec))
    if fabric.kind == "roce" and fabric.subnet is not None:
        profiles = load_profiles(spec.profiles)
        for i, pool in enumerate(spec.pools):
            profile = profiles.get(pool.profile)
            if profile is None:
                continue
            if any(not h.netdevs for h in fabric_hcas(profile, "roce")):
                problems.append(
                    (
                        ("pools", i, "profile"),
                        f"profile {pool.profile}'s RoCE adapters name no netdevs, so their "
                        "fabric addresses have nowhere to go: add netdevs to the profile",
                    )
                )
    return problems


# IPoIB's datagram mode carries at most the IB MTU less its 4-byte header
IPOIB_DATAGRAM_MTU = 4092
_CONNECTX = re.compile(r"ConnectX-(\d+)", re.IGNORECASE)


def _enhanced_ipoib(model: str) -> bool:
    """ConnectX-4 and later run Enhanced IPoIB (mlx5), which has no connected mode."""
    found = _CONNECTX.search(model)
    return found is not None and int(found.group(1)) >= 4


def _check_ipoib(spec: Spec) -> list[Problem]:
    fabric = spec.network.fabric
    loc = ("network", "fabric")
    problems: list[Problem] = []
    if fabric.ipoib_mode == "connected":
        profiles = load_profiles(spec.profiles)
        models = sorted(
            {
                h.model
                for pool in spec.pools
                if (profile := profiles.get(pool.profile)) is not None
                for h in fabric_hcas(profile, "infiniband")
                if _enhanced_ipoib(h.model)
            }
        )
        if models:
            problems.append(
                (
                    (*loc, "ipoib_mode"),
                    f"{', '.join(models)} run Enhanced IPoIB, which has datagram mode only "
                    "(ConnectX-4 and later): remove ipoib_mode connected",
                )
            )
    elif fabric.mtu is not None and fabric.mtu > IPOIB_DATAGRAM_MTU:
        problems.append(
            (
                (*loc, "mtu"),
                f"IPoIB in datagram mode carries at most {IPOIB_DATAGRAM_MTU} bytes, not "
                f"{fabric.mtu}: lower mtu or leave it unset",
            )
        )
    return problems


def _check_fabric_nodes(spec: Spec, nodes: list[Node]) -> list[Problem]:
    fabric = spec.network.fabric
    profiles = load_profiles(spec.profiles)
    by_name = {n.name: n for n in nodes}
    pools = {p.name: p for p in spec.pools}
    problems: list[Problem] = []
    for i, name in enumerate(fabric.subnet_managers):
        loc = ("network", "fabric", "subnet_managers", i)
        node = by_name.get(name)
        if node is None:
            close = difflib.get_close_matches(name, sorted(by_name), n=1)
            hint = f": did you mean '{close[0]}'?" if close else ""
            problems.append((loc, f"'{name}' is not a node of this cluster{hint}"))
        elif node.elastic:
            problems.append((loc, f"{name} is an elastic node: a subnet manager must stay up"))
        elif fabric.subnet_managers.index(name) != i:
            problems.append((loc, f"{name} is named twice"))
        elif not fabric_hcas(profiles[pools[node.pool].profile], "infiniband"):
            problems.append(
                (
                    loc,
                    f"{name} has no InfiniBand adapter (profile {pools[node.pool].profile}): "
                    "the subnet manager must run on a node on the fabric",
                )
            )
    if len(fabric.subnet_managers) > 16:
        problems.append(
            (("network", "fabric", "subnet_managers"), "opensm has 16 priorities: name at most 16")
        )
    _, address_problems = fabric_addresses(spec, profiles, nodes, addresses=False)
    return problems + address_problems


def _is_address(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _first_per_loc(problems: list[Problem]) -> list[Problem]:
    seen: set[Loc] = set()
    out = []
    for loc, msg in problems:
        if loc not in seen:
            seen.add(loc)
            out.append((loc, msg))
    return out


# slurm.conf keys the renderer owns: the pools and the cluster write them
_SLURM_RENDERED = {
    key.lower(): why
    for keys, why in (
        (
            ("NodeName", "PartitionName", "NodeSet", "DownNodes", "FrontendName", "Include",
             "SlurmctldHost", "ControlMachine", "ControlAddr", "BackupController", "BackupAddr",
             "ClusterName", "AccountingStorageHost"),
            "is rendered from the spec's name and pools: change those instead",
        ),
        (
            ("AuthType", "CredType", "SlurmUser"),
            "is what the cluster is built on (munge, the slurm user): it cannot be changed",
        ),
        (
            ("AccountingStoragePort", "SrunPortRange"),
            "not supported yet: slurmdbd listens on 6819; srun's ports are slurm.srun_port_range",
        ),
    )
    for key in keys
}  # fmt: skip


def _check_slurm_config(spec: Spec) -> list[Problem]:
    """slurm.config may tune Slurm, not rebuild what the renderer and the roles rely on."""
    problems: list[Problem] = []
    config = spec.slurm.config
    # Slurm reads keys in any case; the ports, the firewall and the role read them as written
    canonical = {k.lower(): k for k in (*SLURM_DIRECTORIES, "SlurmctldPort", "SlurmdPort")}
    for key, value in config.items():
        at: Loc = ("slurm", "config", key)
        if key.lower() in _SLURM_RENDERED:
            problems.append((at, f"{key} {_SLURM_RENDERED[key.lower()]}"))
        elif key.lower() in canonical and key != canonical[key.lower()]:
            problems.append((at, f"write it as {canonical[key.lower()]}"))
        elif key in SLURM_DIRECTORIES:
            text = str(value)
            if not text.startswith("/") or posixpath.normpath(text) != text:
                problems.append((at, f"{text!r} must be an absolute, normalised path"))
                continue
            directory = daemon_directory(key, text)
            if system_directory(directory):
                default = daemon_directory(key, SLURM_DIRECTORIES[key])
                problems.append(
                    (
                        at,
                        f"{directory} is a system directory the slurm role would give to the "
                        f"slurm user: use a directory of its own, like {default}",
                    )
                )
        elif key == "SlurmctldPort":
            problems.extend(_port_problem(at, value, ranges=True))
        elif key == "SlurmdPort":
            problems.extend(_port_problem(at, value, ranges=False))
    ports = service_ports(spec)
    if ports.ssh in (ports.slurmctld_first, ports.slurmd):
        problems.append((("ssh", "port"), f"port {ports.ssh} is also a Slurm daemon's port"))
    return problems


def _port_problem(at: Loc, value: object, ranges: bool) -> list[Problem]:
    try:
        text = port_range(str(value))  # str(True) is "True": not a port
    except ValueError as exc:
        return [(at, str(exc))]
    if not ranges and "-" in text:
        return [(at, f"{text!r} is a range: slurmd listens on one port, like 6818")]
    return []


CHECKS: list[Callable[[Spec], list[Problem]]] = [
    _check_head,
    _check_slurm_config,
    _check_compute,
    _check_pools,
    _check_reservations,
    _check_efa,
    _check_networks,
    _check_scheduler,
    _check_slurm_version,
    _check_controllers,
    _check_security,
    _check_storage,
    _check_monitoring,
    _check_health,
    _check_gpu,
    _check_gpu_generation,
    _check_fabric,
]

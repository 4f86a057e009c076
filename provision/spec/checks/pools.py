"""The pools' checks: head and compute pools, counts, providers, reservations, EFA, the
expanded nodes, and the storage the pools name."""

from __future__ import annotations

import difflib
import ipaddress
import re

from provision.spec.checks.base import Problem, first_per_loc, is_address
from provision.spec.fabric import efa_count
from provision.spec.models import BURST_PROVIDERS, CLOUD_PROVIDERS, Spec
from provision.spec.nodes import LOOPBACK, Loc, Node, metal_lab_pools, node_network
from provision.spec.profiles import load_profiles
from provision.spec.storage import (
    split_source,
)
from provision.spec.yamlfile import format_path


def check_head(spec: Spec) -> list[Problem]:
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


def check_compute(spec: Spec) -> list[Problem]:
    if any(p.role == "compute" for p in spec.pools):
        return []
    return [(("pools",), "no pool has role 'compute': add one for the jobs to run on")]


def check_pools(spec: Spec) -> list[Problem]:
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


def check_capacity(spec: Spec) -> list[Problem]:
    """Spot capacity: a cloud's, for pools whose nodes are made again when jobs wait."""
    problems: list[Problem] = []
    for i, pool in enumerate(spec.pools):
        if pool.capacity != "spot":
            continue
        at: Loc = ("pools", i, "capacity")
        if pool.provider not in CLOUD_PROVIDERS:
            problems.append((at, f"spot is a cloud's way of selling; '{pool.provider}' has none"))
        elif not pool.elastic:
            problems.append(
                (
                    at,
                    "spot on a lasting pool: a reclaimed node would stay gone until the next "
                    "apply; set elastic: true (Slurm makes nodes again when jobs wait)",
                )
            )
        elif pool.reservation is not None:
            problems.append(
                (at, "a reservation holds on-demand capacity: remove capacity or the reservation")
            )
    return problems


def check_reservations(spec: Spec) -> list[Problem]:
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


def check_efa(spec: Spec) -> list[Problem]:
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


def check_storage(spec: Spec) -> list[Problem]:
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
    pools = {p.name: p for p in spec.pools}
    if spec.storage.nfs_server == "kernel":
        served = [e.pool for e in spec.storage.exports if e.pool in pools]
        if not served or all(pools[p].provider == "lab" for p in served):
            problems.append(
                (
                    ("storage", "nfs_server"),
                    "not supported yet on the lab: a lab's exports are podman volumes (its "
                    "containers share this machine's kernel), served by no NFS server"
                    if served
                    else "the kernel's NFS server serves storage.exports: there are none",
                )
            )
    for i, mount in enumerate(spec.storage.mounts):
        # the source's form per fstype, and what its server exports: storage.check_storage_nodes
        for j, pool in enumerate(mount.pools or []):
            if pool not in roles:
                problems.append((("storage", "mounts", i, "pools", j), f"no pool named '{pool}'"))
    return problems


def check_nodes(spec: Spec, nodes: list[Node]) -> list[Problem]:
    problems: list[Problem] = []
    known = {n.name for n in nodes}
    for i, mount in enumerate(spec.storage.mounts):
        server = split_source(mount)[0]
        if mount.fstype == "lustre":
            continue  # a site's Lustre, by its MGS NIDs
        # a node's name, an address, or a site's server by its full name (filer.example.org)
        if server and server not in known and not is_address(server) and "." not in server:
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
    return first_per_loc(problems)


# the operating systems whose node image provision builds (providers/lab/netboot.py: Debian's
# kernel and live-boot on the lab's debootstrap image)
NETWORK_BOOT_OS = ("debian12",)


def check_network_boot(spec: Spec) -> list[Problem]:
    """Pools that boot from the network: static hosts on the management network, each with
    its MAC address, once in the cluster; a MAC only where it boots something."""
    problems: list[Problem] = []
    macs: dict[str, Loc] = {}
    for i, pool in enumerate(spec.pools):
        at: Loc = ("pools", i)
        network = pool.boot == "network"
        if network:
            if pool.role == "head":
                problems.append(
                    (
                        (*at, "boot"),
                        "the head serves the network boot and cannot boot from itself: "
                        "boot: disk for the head pool",
                    )
                )
            elif pool.provider not in ("static", "lab") or pool.elastic or pool.network:
                problems.append(
                    (
                        (*at, "boot"),
                        "a pool that boots from the network is of static hosts (or the metal "
                        "lab's machines: provider lab) on the management network (the head's "
                        "DHCP answers there), not elastic",
                    )
                )
            elif spec.os not in NETWORK_BOOT_OS:
                problems.append(
                    (
                        (*at, "boot"),
                        f"no node image for {spec.os}: provision builds network boot images for "
                        f"{', '.join(NETWORK_BOOT_OS)}",
                    )
                )
            elif pool.provider == "static" and pool.hosts is None:
                problems.append(
                    (
                        (*at, "boot"),
                        "a pool that boots from the network lists its hosts, each with its mac "
                        "(the boot server knows a machine by it)",
                    )
                )
            elif spec.network.bmc is None:
                problems.append(
                    (
                        (*at, "boot"),
                        "apply powers the nodes that boot from the network through their BMCs: "
                        "set network.bmc (its protocol and network) and each host's bmc_address",
                    )
                )
            elif pool.provider == "lab" and pool.first_bmc_address is None:
                problems.append(
                    (
                        (*at, "boot"),
                        "each machine of the metal lab gets a Redfish BMC on this machine's "
                        "loopback: give the pool's first_bmc_address (inside network.bmc.cidr)",
                    )
                )
        for h, host in enumerate(pool.hosts or []):
            where: Loc = (*at, "hosts", h)
            if network and host.mac is None:
                problems.append(
                    (where, f"{host.name} boots from the network: give its mac (its boot card's)")
                )
            if network and spec.network.bmc is not None and host.bmc_address is None:
                problems.append(
                    (
                        where,
                        f"{host.name} boots from the network: give its bmc_address (apply powers "
                        "it on through its BMC)",
                    )
                )
            if host.mac is None:
                continue
            if pool.provider == "lab":
                problems.append(
                    ((*where, "mac"), "the metal lab gives its machines their MAC addresses")
                )
            elif not network:
                problems.append(
                    (
                        (*where, "mac"),
                        "a mac is what the boot server knows a machine by: set the pool's "
                        "boot: network, or remove it",
                    )
                )
            elif host.mac in macs:
                problems.append(
                    (
                        (*where, "mac"),
                        f"MAC address {host.mac} is also {format_path(macs[host.mac])}: every "
                        "machine has its own",
                    )
                )
            macs.setdefault(host.mac, (*where, "mac"))
    problems += _check_metal_lab(spec)
    management = spec.network.management
    if management.gateway is not None:
        where = ("network", "management", "gateway")
        if management.gateway not in management.cidr:
            problems.append(
                (where, f"{management.gateway} is not in the management network {management.cidr}")
            )
        elif not any(p.boot == "network" for p in spec.pools):
            problems.append(
                (
                    where,
                    "the nodes that boot from the network take it from the head's DHCP, and no "
                    "pool boots so (the others keep the route their OS has): remove it",
                )
            )
    return problems


def _check_metal_lab(spec: Spec) -> list[Problem]:
    """The metal lab (lab pools that boot from the network) makes its machines' BMCs: Redfish
    emulators on this machine's loopback, behind a certificate of its own, and routes the
    machines through this machine (the lab network's first address)."""
    if not metal_lab_pools(spec):
        return []
    problems: list[Problem] = []
    bmc = spec.network.bmc
    if bmc is not None:
        if bmc.protocol != "redfish":
            problems.append(
                (("network", "bmc", "protocol"), "the metal lab's BMCs speak Redfish: redfish")
            )
        if not bmc.cidr.subnet_of(LOOPBACK):
            problems.append(
                (
                    ("network", "bmc", "cidr"),
                    "the metal lab's BMCs listen on this machine's loopback: a network inside "
                    f"{LOOPBACK}",
                )
            )
        if bmc.ca_file is not None:
            problems.append(
                (
                    ("network", "bmc", "ca_file"),
                    "the metal lab signs its BMCs' certificate itself (kept in the cluster's "
                    "state): remove ca_file",
                )
            )
    for i, pool in enumerate(spec.pools):
        if pool.provider != "lab" and (pool.first_bmc_address or any(
            h.bmc_address for h in pool.hosts or []
        )):  # fmt: skip
            problems.append(
                (
                    ("pools", i),
                    "the BMC network is the metal lab's (emulators on this machine): real "
                    "machines' BMCs belong to a cluster of their own",
                )
            )
    management = spec.network.management
    router = management.cidr.network_address + 1
    if management.gateway != router:
        problems.append(
            (
                ("network", "management", "gateway") if management.gateway else
                ("network", "management"),
                f"the metal lab's machines route through this machine, {router} on the lab's "
                f"network: gateway: {router}",
            )
        )  # fmt: skip
    return problems

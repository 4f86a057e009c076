"""What a cluster asks of one cloud, from the spec alone: the network, each pool's instance type,
NICs, placement and nodes, and its ingress rules, translated from the same rule set the nftables
files come from (one source, two enforcement points). Pure; no cloud SDK needed."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

from provision.burst.config import TAG_CLUSTER, TAG_POOL
from provision.burst.join import JoinConfig
from provision.cluster import Cluster
from provision.render.firewall import ADMIN, CLUSTER, COMPUTE, HEADS, MONITOR, pool_rules
from provision.render.gpu import nccl_transport
from provision.render.kubernetes import API_PORT
from provision.render.userdata import join_config
from provision.spec.fabric import cloud_infiniband, efa_count
from provision.spec.nodes import login_user

# Each OS's official image on each cloud: AWS (owner account, name pattern), GCP (family),
# Azure (publisher, offer, SKU)
IMAGES: dict[str, dict[str, tuple[str, ...]]] = {
    "ubuntu22.04": {
        "aws": ("099720109477", "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*"),
        "gcp": ("ubuntu-os-cloud/ubuntu-2204-lts",),
        "azure": ("Canonical", "0001-com-ubuntu-server-jammy", "22_04-lts-gen2"),
    },
    "ubuntu24.04": {
        "aws": ("099720109477", "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"),
        "gcp": ("ubuntu-os-cloud/ubuntu-2404-lts-amd64",),
        "azure": ("Canonical", "ubuntu-24_04-lts", "server"),
    },
    "debian12": {
        "aws": ("136693071363", "debian-12-amd64-*"),
        "gcp": ("debian-cloud/debian-12",),
        "azure": ("Debian", "debian-12", "12-gen2"),
    },
    "rocky9": {
        "aws": ("792107900819", "Rocky-9-EC2-Base-9*x86_64"),
        "gcp": ("rocky-linux-cloud/rocky-linux-9",),
        "azure": ("resf", "rockylinux-x86_64", "9-base"),
    },
}
ROOT_GB = 200
# Azure Marketplace images sold under a purchase plan (the VM names it, and the subscription
# accepts its terms once: `az vm image terms accept --urn publisher:offer:sku:latest`)
AZURE_PLAN_OS = frozenset({"rocky9"})


@dataclass(frozen=True)
class Ingress:
    description: str
    protocol: str  # tcp or udp
    from_port: int
    to_port: int
    cidrs: tuple[str, ...]


@dataclass(frozen=True)
class CloudPool:
    name: str
    instance_type: str
    region: str | None
    zone: str | None
    nodes: tuple[str, ...]  # lasting nodes: instances made now
    elastic: int  # burst nodes: only the template now, instances when jobs wait
    gpus: int
    efa: int  # EFA interfaces (AWS)
    infiniband: int  # the cloud's InfiniBand adapters (Azure ND): one availability set
    extra_nics: int  # NICs beyond the first (GCP's a3: four more gVNICs)
    ingress: tuple[Ingress, ...]
    nccl: str = ""  # what NCCL runs over between the pool's nodes (GPU pools), for plan
    # capacity held for the pool (spec's reservation: its placement replaces the pool's own)
    reservation: str | None = None
    capacity_block: bool = False  # AWS: the reservation is a Capacity Block for ML
    # an elastic pool's: what its instances' user data tells the join program (a controller's
    # address is "" where the head is a node of the same stack, which fills it in)
    join: JoinConfig | None = None
    # an elastic pool's own image (provision image build), once made: its template starts it
    image: str | None = None
    spot: bool = False  # the cloud's spare capacity, taken back when the cloud needs it

    @property
    def private(self) -> bool:
        """AWS: burst nodes of a type with several network cards. EC2 gives such an instance
        no public address and a launch template cannot ask one, so the pool's template puts
        them in its zone's private subnet, whose way out is a NAT gateway (a lasting node of
        such a type gets an Elastic IP in the public subnet instead)."""
        return self.join is not None and self.efa > 1


@dataclass(frozen=True)
class ApiFrontend:
    """An HA Kubernetes control plane on heads in the cloud: the cloud's internal load balancer
    in front of their API servers, at the spec's api_address (kubernetes.api_address), which
    every node and kubectl reach the API at."""

    address: str
    pool: str  # the head pool: its nodes are the targets
    zone: str | None  # the head pool's zone (AWS: the subnet the address is taken in)
    port: int = API_PORT  # the same on the load balancer and on the API servers


@dataclass(frozen=True)
class CloudLayout:
    cluster: str
    provider: str
    cidr: str  # the cloud network: its remote network's range
    admin_user: str
    ssh_public_key: str
    pools: tuple[CloudPool, ...]
    os_name: str  # the spec's os: which image each cloud starts
    home: bool = False  # the heads are in this cloud: its network is the management network
    api: ApiFrontend | None = None  # an HA control plane on heads here: its load balancer

    @property
    def bursts(self) -> bool:
        """Whether a pool is elastic: the stack then holds the munge key's secret."""
        return any(p.join for p in self.pools)

    def tags(self, pool: str | None = None) -> dict[str, str]:
        out = {TAG_CLUSTER: self.cluster}
        if pool:
            out[TAG_POOL] = pool
        return out

    def name(self, *parts: str) -> str:
        """A resource name from the cluster and its place: burst-awsh100-lt."""
        return "-".join((self.cluster, *parts))


@dataclass(frozen=True)
class Subnet:
    """One of an AWS stack's subnets: its resource name, zone (None: EC2 picks) and range."""

    name: str
    zone: str | None
    cidr: str
    private: bool  # behind the zone's NAT gateway, without public addresses


def aws_subnets(shape: CloudLayout) -> list[Subnet]:
    """The subnets of an AWS stack, carved from the cloud's range: one public subnet per zone
    the pools name, in their order, each an equal slice (the whole range where they name one
    zone or none; pools without a zone share the first). A zone holding a private pool splits
    its slice: the public subnet takes the first half, the private one the second. A subnet's
    range never changes on a running stack (refused_recarve)."""
    named: list[str | None] = list(dict.fromkeys(p.zone for p in shape.pools if p.zone))
    zones = named or [None]
    private = {p.zone if p.zone in zones else zones[0] for p in shape.pools if p.private}
    network = ipaddress.IPv4Network(shape.cidr)
    slices = (
        [network]
        if len(zones) == 1
        else list(network.subnets(prefixlen_diff=math.ceil(math.log2(len(zones)))))
    )
    out = []
    for i, (zone, part) in enumerate(zip(zones, slices, strict=False)):
        suffix = () if i == 0 else (str(zone),)
        if zone not in private:
            out.append(Subnet(shape.name("subnet", *suffix), zone, str(part), False))
            continue
        public, behind = part.subnets(prefixlen_diff=1)
        out.append(Subnet(shape.name("subnet", *suffix), zone, str(public), False))
        out.append(Subnet(shape.name("private", *suffix), zone, str(behind), True))
    return out


def refused_recarve(shape: CloudLayout, saved: dict[str, str]) -> list[str]:
    """The subnets of a running AWS stack (saved: name -> range, the stack's last outputs)
    whose range the spec would change: EC2 cannot change a subnet's range, Pulumi would make
    it anew beside the old one (refused: the ranges overlap) and its instances with it."""
    wanted = {s.name: s.cidr for s in aws_subnets(shape)}
    return [
        f"{name} {cidr} -> {wanted[name]}"
        for name, cidr in sorted(saved.items())
        if name in wanted and wanted[name] != cidr
    ]


def _ports(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def layout(
    cluster: Cluster,
    provider: str,
    ssh_public_key: str,
    images: dict[str, str] | None = None,
) -> CloudLayout:
    """images: an elastic pool's own image, by pool (the state's images.json)."""
    spec = cluster.spec
    # the cloud's own range (network.remote, one per cloud): the rest of the cluster reaches it
    # through the tunnel, whose packets the cloud's firewall sees as the nodes' own outbound
    # flows; inside the network, the cluster's sets are the cloud's nodes themselves
    names = {p.network for p in spec.pools if p.provider == provider and p.network}
    cidr = next(
        (str(r.cidr) for r in spec.network.remote if r.name in names),
        str(spec.network.management.cidr),  # no cloud pool (the checks refuse one without)
    )
    admin = tuple(str(c) for c in spec.security.admin_cidrs)
    by_set = {ADMIN: admin, CLUSTER: (cidr,), COMPUTE: (cidr,), HEADS: (cidr,), MONITOR: (cidr,)}
    rules = pool_rules(cluster)
    pools = []
    for view in cluster.pools:
        if view.pool.provider != provider:
            continue
        profile = view.profile
        ingress = []
        for rule in rules[view.name]:
            cidrs: list[str] = []
            for source in rule.sources:
                cidrs += by_set.get(source, (source,))
            low, high = _ports(rule.ports)
            ingress.append(
                Ingress(rule.service, rule.protocol, low, high, tuple(dict.fromkeys(cidrs)))
            )
        efa = efa_count(profile)
        nics = sum(h.count for h in profile.hcas if h.kind == "ethernet" and h.model == "gVNIC")
        pools.append(
            CloudPool(
                name=view.name,
                instance_type=profile.instance_type or view.pool.profile,
                region=view.pool.region,
                zone=view.pool.zone,
                nodes=tuple(n.name for n in view.nodes if not n.elastic),
                elastic=sum(1 for n in view.nodes if n.elastic),
                gpus=profile.gpu.count if profile.gpu else 0,
                efa=efa,
                infiniband=cloud_infiniband(profile),
                extra_nics=max(0, nics - 1),
                ingress=tuple(ingress),
                nccl=nccl_transport(cluster, view) if profile.gpu else "",
                reservation=view.pool.reservation.id if view.pool.reservation else None,
                capacity_block=bool(view.pool.reservation and view.pool.reservation.capacity_block),
                join=join_config(cluster, view) if view.pool.elastic else None,
                image=(images or {}).get(view.name) if view.pool.elastic else None,
                spot=view.pool.capacity == "spot",
            )
        )
    user = login_user(spec, provider)  # AWS: the image's; the key pair goes to it
    heads = cluster.pools_with_role("head")[0].pool
    home = heads.provider == provider
    kube = spec.kubernetes
    api = None
    if home and spec.scheduler == "kubernetes" and kube.ha and kube.api_address is not None:
        api = ApiFrontend(str(kube.api_address), heads.name, heads.zone)
    return CloudLayout(
        spec.name,
        provider,
        cidr,
        user,
        ssh_public_key,
        tuple(pools),
        spec.os,
        home=home,
        api=api,
    )


def api_subnet(shape: CloudLayout) -> str:
    """The range the API's load balancer takes its address in: the heads' subnet (AWS: the
    public subnet of their zone; GCP and Azure: the stack's one subnet)."""
    if shape.provider != "aws" or shape.api is None:
        return shape.cidr
    public = [s for s in aws_subnets(shape) if not s.private]
    return next((s.cidr for s in public if s.zone == shape.api.zone), public[0].cidr)


def reserved_addresses(provider: str, cidr: str) -> list[ipaddress.IPv4Address]:
    """The addresses of a subnet the cloud keeps for itself: EC2 and Azure the first four and
    the last; Compute Engine the first two, the second-to-last and the last."""
    net = ipaddress.IPv4Network(cidr)
    first, last = net.network_address, net.broadcast_address
    if provider == "gcp":
        return [first, first + 1, last - 1, last]
    return [first, first + 1, first + 2, first + 3, last]


def api_address_problem(shape: CloudLayout) -> str | None:
    """Why the load balancer cannot take the spec's API address, or None."""
    if shape.api is None:
        return None
    subnet = api_subnet(shape)
    address = ipaddress.IPv4Address(shape.api.address)
    where = "the heads' subnet" + (f" in {shape.api.zone}" if shape.api.zone else "")
    if address not in ipaddress.IPv4Network(subnet):
        return (
            f"{address} is outside {where} {subnet}, where {shape.provider}'s load balancer "
            "takes the API's address: pick a free address there"
        )
    if address in reserved_addresses(shape.provider, subnet):
        return (
            f"{address} is one of the addresses {shape.provider} keeps for itself in {subnet}: "
            "pick another (a high one: the cloud gives instances the low ones first)"
        )
    return None


NETWORK = {
    "aws": ["VPC", "subnet", "internet gateway", "route table", "key pair"],
    "gcp": ["VPC network", "subnetwork"],
    "azure": ["resource group", "virtual network", "subnet", "NAT gateway"],
}


# what fronts an HA control plane's API servers on heads in each cloud
API_FRONTEND = {
    "aws": "an internal Network Load Balancer (IP targets, client IP preservation off)",
    "gcp": "an internal passthrough Network Load Balancer (its address reserved)",
    "azure": "an internal Standard Load Balancer (a static frontend address)",
}

# where each cloud keeps the munge key, and what a burst node reads it with
SECRET_STORE = {"aws": "Secrets Manager", "gcp": "Secret Manager", "azure": "a Key Vault"}
JOIN_IDENTITY = {
    "aws": "instance profile",
    "gcp": "pool's service account",
    "azure": "pool's managed identity",
}


def describe(shape: CloudLayout) -> list[str]:
    """What the cloud's stack holds, one line for the network and one per pool (for plan)."""
    lines = [f"{shape.provider}: {', '.join(NETWORK[shape.provider])} ({shape.cidr})"]
    if shape.provider == "aws":
        behind = [s for s in aws_subnets(shape) if s.private]
        if behind:
            lines[0] += "; " + ", ".join(
                f"a private subnet {s.cidr}{f' in {s.zone}' if s.zone else ''}" for s in behind
            )
            lines[0] += " going out through a NAT gateway (an Elastic IP; it costs by the hour)"
    if shape.bursts:
        lines[0] += f"; the munge key in {SECRET_STORE[shape.provider]}"
    if shape.home:
        lines.append(
            f"{shape.provider}: the heads are here: its network is the cluster's management "
            "network; Ansible reaches the nodes at their public addresses"
        )
    else:
        lines.append(
            f"{shape.provider}: its nodes dial the heads' WireGuard tunnel once they exist; "
            "Ansible reaches them at their public addresses"
        )
    if shape.api is not None:
        lines.append(
            f"{shape.provider}: {API_FRONTEND[shape.provider]} at {shape.api.address}:"
            f"{shape.api.port} in front of the {shape.api.pool} pool's API servers"
        )
    if shape.bursts and shape.provider == "aws":
        lines.append(
            f"aws: the heads burst as the IAM user {shape.name('burst')} (launch from the "
            "cluster's templates, name and end its own instances, pass the pools' node roles); "
            "its key kept 0600 in the cluster's secrets, root's ~/.aws/credentials on the heads"
        )
    if shape.bursts and shape.provider == "gcp":
        lines.append(
            f"gcp: the heads burst as the service account {shape.name('burst-heads')} (Compute "
            "Engine's instance admin in the project, user of the pools' node accounts); its key "
            "kept 0600 in the cluster's secrets, root's alone on the heads"
        )
    if shape.bursts and shape.provider == "azure":
        lines.append(
            f"azure: the heads burst as the identity {shape.cluster}-burst-heads (a role of the "
            "cluster's own in its resource group: make and delete the pools' VMs), federated "
            "with the cluster's issuer (its key set public in a storage account of the stack); "
            "the issuer's key kept 0600 in the cluster's secrets, root's alone on the heads"
        )
    if shape.provider == "gcp":
        extra = max((p.extra_nics for p in shape.pools), default=0)
        if extra:
            lines[0] += f"; {extra} more networks for the extra NICs"
    if shape.provider == "azure" and shape.os_name in AZURE_PLAN_OS:
        urn = ":".join(IMAGES[shape.os_name]["azure"])
        lines.append(
            f"azure: the image {urn} is sold under a Marketplace plan: accept its terms once "
            f"per subscription (az vm image terms accept --urn {urn}:latest)"
        )
    for pool in shape.pools:
        parts = [f"{len(pool.ingress)} ingress rules"]
        if pool.reservation:
            kind = "Capacity Block" if pool.capacity_block else "reservation"
            parts.append(f"launched into the {kind} {pool.reservation}")
        elif pool.gpus:
            parts.append(
                {"aws": "cluster placement group", "gcp": "compact placement policy"}.get(
                    shape.provider, "proximity placement group"
                )
            )
        template = {"aws": "launch template", "gcp": "instance template"}.get(
            shape.provider, "scale set (capacity 0)" if pool.elastic else ""
        )
        if template:
            nics = f", {pool.efa} EFA" if pool.efa else ""
            nics += f", {1 + pool.extra_nics} gVNIC" if pool.extra_nics else ""
            parts.append(f"{template} {pool.instance_type}{nics}")
        parts.append(f"{len(pool.nodes)} instance(s)")
        if shape.provider == "azure" and pool.infiniband and pool.nodes:
            parts[-1] += " in one availability set (one InfiniBand partition)"
        if shape.provider == "aws" and pool.efa > 1 and pool.nodes:
            parts[-1] += " with an Elastic IP each"  # EC2 gives multi-card ones no address
        if pool.elastic:
            parts.append(f"{pool.elastic} made when jobs wait")
        if pool.private:  # EC2 gives multi-card ones no address
            parts.append("in the private subnet, out through the NAT gateway")
        if pool.spot:
            parts.append("spot (reclaimed nodes are marked down, their jobs requeued)")
        lines.append(f"{shape.provider} pool {pool.name}: " + ", ".join(parts))
        if pool.join:
            lines.append(
                f"{shape.provider} pool {pool.name}: burst nodes join by themselves: user data "
                f"runs the join; the {JOIN_IDENTITY[shape.provider]} reads the munge key from "
                f"{SECRET_STORE[shape.provider]} and nothing else"
            )
        if pool.nccl:
            lines.append(f"{shape.provider} pool {pool.name}: NCCL between nodes over {pool.nccl}")
    return lines

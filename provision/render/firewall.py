"""The firewall rule set: which services run where and who may reach them.

One source, several enforcement points: nftables on the nodes (rendered here) and, later, the
cloud security groups, which are built from the same `pool_rules`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from provision.cluster import Cluster, compress
from provision.render.kubernetes import (
    API_PORT,
    BALANCER_NAMES,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    HA_PORT,
    api_cloud,
    balancer_sources,
)
from provision.render.netboot import HTTP_PORT, boot_server, booted_nodes
from provision.render.tunnel import INTERFACE, far_ranges
from provision.spec.exposure import public_addresses
from provision.spec.fabric import rails
from provision.spec.models import CLOUD_PROVIDERS
from provision.spec.ports import service_ports

# Address sets every rule refers to by name, in their own file. An elastic cloud pool's nodes
# get their addresses from the cloud when they are made, after the render: the sets hold the
# pool's whole network (its `network.remote` range) instead, so a new node is admitted before
# it registers; a lab pool's reserved addresses are known and listed.
ADMIN = "admin"
CLUSTER = "cluster_nodes"
HEADS = "head_nodes"
COMPUTE = "compute_nodes"
MONITOR = "monitoring_nodes"  # only with monitoring: the node Prometheus scrapes from
NETBOOT = "netboot_nodes"  # only with pools that boot from the network: their nodes


@dataclass(frozen=True)
class Rule:
    service: str
    protocol: str  # tcp or udp; vrrp (IP protocol 112, no ports) between HA heads
    ports: str  # "22" or "60001-63000"; "" for vrrp
    sources: tuple[str, ...]  # set names above, or CIDRs
    to: str = ""  # the node's address it is for, where the pool's other nodes must not take it


def address_sets(cluster: Cluster) -> dict[str, list[str]]:
    admin = sorted({str(c) for c in cluster.spec.security.admin_cidrs}, key=_addr_key)

    def addresses(role: str | None) -> list[str]:
        found = {
            str(n.address)
            for n in cluster.nodes
            if n.address is not None and (role is None or n.role == role)
        }
        return sorted(found, key=_addr_key)

    ranges = elastic_ranges(cluster)
    networks = [ipaddress.IPv4Network(r) for r in ranges]

    def outside(found: list[str]) -> list[str]:
        # nftables refuses an interval set's elements that overlap: an address in a range
        # the set already holds goes
        return [a for a in found if not any(ipaddress.IPv4Address(a) in n for n in networks)]

    sets = {
        ADMIN: admin,
        CLUSTER: outside(addresses(None)) + ranges,
        HEADS: addresses("head"),
        COMPUTE: outside(addresses("compute")) + ranges,
    }
    watcher = cluster.monitoring_node
    if watcher is not None:
        sets[MONITOR] = [str(watcher.address)] if watcher.address is not None else []
    if boot_server(cluster) is not None:
        booted = {str(n.address) for n in booted_nodes(cluster) if n.address is not None}
        sets[NETBOOT] = sorted(booted, key=_addr_key)
    return sets


def elastic_ranges(cluster: Cluster) -> list[str]:
    """The networks of the elastic pools whose nodes have no address before they are made
    (cloud pools: the cloud picks it in the pool's range: its remote network's, or the
    management network where the heads are in the same cloud)."""
    remote = {r.name: str(r.cidr) for r in cluster.spec.network.remote}
    found = set()
    for view in cluster.pools:
        if not view.pool.elastic or all(n.address is not None for n in view.nodes):
            continue
        if view.pool.network in remote:
            found.add(remote[view.pool.network])
        elif view.pool.network is None and view.pool.provider in CLOUD_PROVIDERS:
            found.add(str(cluster.spec.network.management.cidr))
    return sorted(found, key=_addr_key)


def _addr_key(text: str) -> tuple[int, ...]:
    addr, _, prefix = text.partition("/")
    return (*(int(x) for x in addr.split(".")), int(prefix or 32))


def pool_rules(cluster: Cluster) -> dict[str, list[Rule]]:
    """Input rules per pool, in a fixed order (SSH first, the spec's own rules last)."""
    spec = cluster.spec
    srun = str(spec.slurm.srun_port_range)
    exporting = {e.pool for e in spec.storage.exports}
    ports = service_ports(spec)
    server = boot_server(cluster)
    out: dict[str, list[Rule]] = {}
    for view in cluster.pools:
        role = view.pool.role
        rules = [Rule("ssh from admin networks", "tcp", ports.ssh, (ADMIN,))]
        users = tuple(str(c) for c in spec.security.user_cidrs)
        if users and view.name in cluster.user_doors:  # where the users log in
            rules.append(Rule("ssh from user networks", "tcp", ports.ssh, users))
        if role == "head":  # the head pool serves time to the other nodes (common role)
            rules.append(Rule("ntp for the cluster", "udp", "123", (CLUSTER,)))
        if spec.scheduler == "slurm":
            if role == "head":
                rules.append(Rule("slurmctld", "tcp", ports.slurmctld, (CLUSTER,)))
                if spec.slurm.accounting:
                    rules.append(Rule("slurmdbd", "tcp", ports.slurmdbd, (CLUSTER,)))
                    rules.append(Rule("mariadb for slurmdbd", "tcp", ports.mariadb, (HEADS,)))
            if role == "compute":
                rules.append(Rule("slurmd", "tcp", ports.slurmd, (CLUSTER,)))
                rules.append(
                    Rule(
                        "job traffic between compute nodes (MPI, NCCL)",
                        "tcp",
                        "1024-65535",
                        (COMPUTE,),
                    )
                )
            if role in ("head", "login", "compute"):
                rules.append(Rule("srun port range", "tcp", srun, (CLUSTER,)))
        else:
            rules += _kubernetes_rules(cluster, role)
        # the exporters answer the monitoring node only, where there is one
        scrapers = (MONITOR,) if spec.monitoring is not None else (ADMIN, CLUSTER)
        if spec.monitoring is not None:
            port = str(spec.monitoring.node_exporter_port)
            rules.append(Rule("node exporter (node metrics)", "tcp", port, scrapers))
            # Prometheus and Alertmanager answer on the monitoring node's loopback only
            # (Alertmanager's API silences alerts): no rule opens them to any network
            if spec.monitoring_pool == view.name and spec.monitoring.grafana is not None:
                port = str(spec.monitoring.grafana.port)
                rules.append(Rule("grafana web", "tcp", port, (ADMIN,)))
        if view.profile.gpu is not None and spec.nvidia.dcgm and spec.nvidia.dcgm_exporter_url:
            port = str(spec.nvidia.dcgm_exporter_port)
            rules.append(Rule("dcgm-exporter (GPU metrics)", "tcp", port, scrapers))
        fabric = spec.network.fabric
        pool_rails = rails(view.profile, fabric.kind)
        if fabric.subnet is not None and pool_rails:
            # RDMA itself bypasses the kernel; IPoIB and RoCE interfaces carry IP like any other
            rules.append(
                Rule("job traffic over the fabric (IP)", "tcp", "1024-65535", (str(fabric.subnet),))
            )
            if any(r.soft for r in pool_rails):  # rdma_rxe is the kernel: its RoCE v2 is UDP
                rules.append(Rule("soft RoCE (RoCE v2)", "udp", "4791", (str(fabric.subnet),)))
        if view.name in exporting:
            # the cluster's nodes, and the networks an export names as clients (the NFS server
            # itself admits each client to its own exports only)
            networks = [
                str(c.network)
                for e in spec.storage.exports
                if e.pool == view.name
                for c in e.clients
                if c.network is not None
            ]
            rules.append(Rule("nfs", "tcp", ports.nfs, (CLUSTER, *dict.fromkeys(networks))))
        if server is not None and server.pool == view.name and server.address is not None:
            # the boot server's pool (the first head's): a booting node asks for its address
            # from 0.0.0.0 (a broadcast), then fetches iPXE (TFTP) and its image (HTTP) from the
            # address it got. Rules are per pool: each is for the server's address alone, so
            # another head of the pool opens nothing for it
            me, booting = str(server.address), (NETBOOT,)
            rules += [
                Rule(
                    "dhcp for the nodes that boot", "udp", "67", ("0.0.0.0/32", NETBOOT),
                    f"{{ {me}, 255.255.255.255 }}",
                ),
                Rule("tftp for the nodes that boot (iPXE)", "udp", "69", booting, me),
                Rule("http for the nodes that boot (images)", "tcp", str(HTTP_PORT), booting, me),
            ]  # fmt: skip
        if role == "head" and spec.network.remote:  # the first head is the tunnel's hub
            sources = tuple(str(c) for c in spec.network.tunnel.sources)
            port = str(spec.network.tunnel.port)
            rules.append(Rule("wireguard tunnel from remote nodes", "udp", port, sources))
        for extra in spec.security.firewall_rules:
            if extra.pools is None or view.name in extra.pools:
                sources = tuple(
                    {"cluster": CLUSTER, "admin": ADMIN}.get(str(s), str(s)) for s in extra.sources
                )
                rules.append(Rule(extra.name, extra.protocol, str(extra.port), sources))
        out[view.name] = rules
    return out


def guard_lines(cluster: Cluster, pool: str) -> list[str]:
    """nftables lines that drop, on a tunnel's end, what claims to come from the networks on the
    tunnel's other side but did not arrive through it: a remote node takes the management
    network and the other remote networks only from the tunnel; the hub the remote networks."""
    if not cluster.spec.network.remote:
        return []
    view = next(v for v in cluster.pools if v.name == pool)
    if view.pool.network is None and view.pool.role != "head":
        return []  # the management network's other nodes: their peers' packets come routed
    far = far_ranges(cluster, view.pool.network)
    return [
        f'iifname != "{INTERFACE}" ip saddr {{ {", ".join(far)} }} drop '
        'comment "those networks come through the tunnel only"'
    ]


def output_lines(cluster: Cluster, pool: str) -> list[str]:
    """nftables lines of a head pool's nat output chain where an HA control plane's heads are
    in a cloud: a head's own connections to the API's address go to its haproxy, which sends
    them to a ready API server. Through the cloud's balancer they could come back to the head
    itself, whose API server may not be up (one joining); GCP's and Azure's internal balancers
    answer a backend's own traffic with itself, and Azure's drops the flow."""
    view = next(v for v in cluster.pools if v.name == pool)
    if view.pool.role != "head" or api_cloud(cluster) is None:
        return []
    address = cluster.spec.kubernetes.api_address
    return [
        f"ip daddr {address} tcp dport {API_PORT} redirect to :{HA_PORT} "
        'comment "the heads reach the API through their haproxy, not the balancer"'
    ]


@dataclass(frozen=True)
class OpenRule:
    """A rule that admits public addresses, and where it is enforced."""

    pool: str
    where: str  # "nftables" on premises and in the lab; the cloud's firewall otherwise
    rule: Rule
    cidrs: tuple[str, ...]
    public: int  # public addresses it admits


_ENFORCED_BY = {"aws": "AWS security group", "gcp": "GCP firewall", "azure": "Azure NSG"}


def internet_rules(cluster: Cluster) -> list[OpenRule]:
    """Every rule, on every pool, whose sources reach beyond private address space."""
    admin = tuple(str(c) for c in cluster.spec.security.admin_cidrs)
    out = []
    for pool, rules in pool_rules(cluster).items():
        provider = next(v.pool.provider for v in cluster.pools if v.name == pool)
        for rule in rules:
            # the cluster's own sets hold node addresses, not networks: only CIDRs reach out
            cidrs = [c for s in rule.sources for c in (admin if s == ADMIN else (s,)) if "/" in c]
            public = public_addresses(ipaddress.IPv4Network(c) for c in cidrs)
            if public:
                where = _ENFORCED_BY.get(provider, "nftables")
                out.append(OpenRule(pool, where, rule, tuple(dict.fromkeys(cidrs)), public))
    return out


def _kubernetes_rules(cluster: Cluster, role: str) -> list[Rule]:
    """The API for admins and nodes; etcd, the kubelet and VRRP between the nodes that use them."""
    kube = cluster.spec.kubernetes
    rules = []
    pods = str(kube.pod_cidr)
    if role == "head":
        # pods on a head reach the API through its service address unmasqueraded: their source
        # is the pod network (Calico masquerades only what leaves the node)
        rules.append(Rule("kube-apiserver", "tcp", str(API_PORT), (ADMIN, CLUSTER, pods)))
        balancer = balancer_sources(cluster)
        if balancer:  # heads in a cloud: its load balancer, and its health checks
            who = BALANCER_NAMES[api_cloud(cluster) or ""]
            rules.append(Rule(f"kube-apiserver ({who})", "tcp", str(API_PORT), balancer))
        elif kube.ha:  # on premises: keepalived's address, haproxy behind it
            rules.append(Rule("kube-apiserver (haproxy)", "tcp", str(HA_PORT), (ADMIN, CLUSTER)))
            rules.append(Rule("keepalived (VRRP)", "vrrp", "", (HEADS,)))
        # stacked or external, etcd serves the API servers and its peers, all on the heads
        etcd = f"{ETCD_CLIENT_PORT}-{ETCD_PEER_PORT}"
        rules.append(Rule("etcd", "tcp", etcd, (HEADS,)))
    # the API server reaches each kubelet (logs, exec, metrics)
    rules.append(Rule("kubelet", "tcp", "10250", (HEADS,)))
    rules.append(Rule("pod network (VXLAN)", "udp", "4789", (CLUSTER,)))
    # calico-node on every node reaches Typha, which runs on some of them
    rules.append(Rule("calico typha", "tcp", "5473", (CLUSTER,)))
    if role == "compute":
        rules.append(Rule("NodePort services", "tcp", "30000-32767", (CLUSTER,)))
    return rules


def rule_lines(rules: list[Rule]) -> list[str]:
    """nftables accept lines of a pool's rules: one per source (a set name, or a network)."""
    lines = []
    for rule in rules:
        for source in rule.sources:
            match = f"ip saddr @{source}" if "/" not in source else f"ip saddr {source}"
            what = (
                f"ip protocol {rule.protocol}"
                if not rule.ports
                else f"{rule.protocol} dport {rule.ports}"
            )
            if rule.to:
                match += f" ip daddr {rule.to}"
            lines.append(f'{match} {what} accept comment "{rule.service}"')
    return lines


@dataclass(frozen=True)
class Reach:
    """Who reaches one of the services that change the cluster or its alerts (plan)."""

    service: str
    where: str  # the nodes it runs on
    port: str
    who: str


def admin_reach(cluster: Cluster) -> list[Reach]:
    """SSH and the monitoring services: where they answer and from where, naming the nodes
    where jobs run that an admin network holds (a job there reaches what that network does)."""
    spec = cluster.spec
    ports = service_ports(spec)
    admin = spec.security.admin_cidrs
    jobs = [
        n.name
        for n in cluster.lasting_nodes
        if n.role in ("compute", "login") and n.address is not None
        and any(n.address in net for net in admin)
    ]  # fmt: skip
    networks = ", ".join(str(c) for c in admin)
    from_admin = f"the admin networks ({networks})" + (
        f"; they hold {compress(jobs)}, where users log in or jobs run" if jobs else ""
    )
    rows = [Reach("ssh", "every node", ports.ssh, from_admin + " (the admins' keys)")]
    if spec.users or spec.identity is not None:
        doors = [n.name for n in cluster.lasting_nodes if n.pool in cluster.user_doors]
        whose = "the users' keys" if spec.users else ""
        if spec.identity is not None:
            groups = ", ".join(spec.identity.allowed_groups)
            directory = f"the directory's keys of its {groups} members"
            whose = f"{whose} and {directory}" if whose else directory
        rows.append(
            Reach(
                "ssh (users)",
                compress(doors),
                ports.ssh,
                whose
                + ", from "
                + (
                    f"the user networks ({', '.join(str(c) for c in spec.security.user_cidrs)}) "
                    "and the admin networks"
                    if spec.security.user_cidrs
                    else "the admin networks (no security.user_cidrs)"
                )
                + "; no other node takes a user's key",
            )
        )
    monitoring = spec.monitoring
    watcher = cluster.monitoring_node
    if monitoring is not None and watcher is not None:
        for name, port in (
            ("prometheus", monitoring.prometheus_port),
            ("alertmanager", monitoring.alertmanager_port),
        ):
            rows.append(
                Reach(
                    name,
                    watcher.name,
                    str(port),
                    f"{watcher.name}'s loopback only: admins through SSH "
                    f"(provision ssh --forward {port} {watcher.name}); there, root, the login "
                    "user, the admins, Prometheus and Grafana alone (the loopback guard)",
                )
            )
        if monitoring.grafana is not None:
            rows.append(
                Reach(
                    "grafana", watcher.name, str(monitoring.grafana.port), from_admin + " (login)"
                )
            )
        rows.append(
            Reach(
                "node exporter",
                "every node",
                str(monitoring.node_exporter_port),
                f"{watcher.name} only (it scrapes them)",
            )
        )
    return rows

"""The burst configuration: what the programs on the head know of the cluster's elastic pools.

The render writes it (files/burst/burst.json, from the spec alone), the burst role installs it
at CONFIG_PATH (root, 0600), and the programs read it. It holds no secret: the munge key is read
from the head's own /etc/munge at resume, and cloud credentials come from the head's instance
identity (the SDK's own chain: instance profile, or a credentials file root reads).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

CONFIG_PATH = Path("/etc/provision/burst.json")
LOG_DIR = Path("/var/log/provision")
# where the head sees the workstation's podman API (lab pools): a folder the lab provider
# mounts into the head container, holding the socket of a `podman system service`
LAB_SOCKET_DIR = Path("/run/provision-podman")
LAB_SOCKET = LAB_SOCKET_DIR / "podman.sock"
MUNGE_KEY = Path("/etc/munge/munge.key")
# the cluster's WireGuard interface on every member (at most 15 characters: a Linux name)
TUNNEL_INTERFACE = "wg-provision"
# this project's wheel on every node (the health, burst and node_exporter roles put it there;
# a burst pool's image carries it): the node programs run from it
NODE_WHEEL = "/opt/provision/gpu-provision.whl"
# The lab's names: every container and network of a cluster carries the label; containers are
# prefix + node name; an elastic pool's nodes start from the pool's image.
LAB_LABEL = "provision.cluster"
# Tags (AWS, Azure) or labels (GCP) on every cloud resource of a cluster; a burst instance
# carries the node's name too
TAG_CLUSTER = "provision-cluster"
TAG_POOL = "provision-pool"
TAG_NODE = "provision-node"
# on an Azure InfiniBand pool's scale set: the availability set its burst VMs are made in (a
# Flexible scale set carries no InfiniBand; one availability set is one InfiniBand partition)
TAG_AVAILABILITY_SET = "provision-availability-set"


# the shortest limit on those names: a Compute Engine name (63), an Azure scale set's (64)
CLOUD_NAME_MAX = 63


def fit_name(name: str, limit: int = CLOUD_NAME_MAX) -> str:
    """`name` where it fits in `limit` characters; else its start and a hash of all of it, so
    two long names stay apart and the same one always gives the same."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def cloud_template(cluster: str, pool: str) -> str:
    """The name of what the cluster's stack makes for a pool to start instances from (AWS
    launch template, GCP instance template, Azure scale set); one every cloud takes."""
    return fit_name(f"{cluster}-{pool}")


def munge_secret(cluster: str) -> str:
    """The name of the cluster's munge key in the cloud's secret store (AWS Secrets Manager, GCP
    Secret Manager, an Azure Key Vault): letters, digits and hyphens, which all three take."""
    return fit_name(f"{cluster}-munge-key")


def tunnel_secret(cluster: str, pool: str) -> str:
    """The name of a remote elastic pool's tunnel keys in the cloud's secret store: each node's
    WireGuard private key and the hub's public key, read by that pool's nodes alone."""
    return fit_name(f"{cluster}-{pool}-tunnel-keys")


def key_vault(cluster: str) -> str:
    """The Azure Key Vault of a cluster's secrets: 3-24 letters, digits and hyphens, starting
    with a letter, unique in all of Azure; the cluster's name and a hash of it."""
    digest = hashlib.sha256(f"provision:{cluster}".encode()).hexdigest()[:8]
    start = "".join(c for c in cluster.lower() if c.isalnum())[:12] or "cluster"
    if not start[0].isalpha():
        start = "c" + start[:11]
    return f"pv{start}{digest}"[:24]


def cloud_group(cluster: str) -> str:
    """The Azure resource group of a cluster."""
    return f"{cluster}-rg"


def lab_container_prefix(cluster: str) -> str:
    return f"provision-{cluster}-"


def lab_network(cluster: str) -> str:
    return f"provision-{cluster}"


def lab_image(cluster: str, pool: str) -> str:
    return f"localhost/provision-{cluster}-{pool}:latest"


@dataclass(frozen=True)
class LabPool:
    image: str  # the pool's image, made by apply with the compute roles applied
    network: str  # the cluster's podman network
    container_prefix: str  # container name = prefix + node name
    label: str  # label=value every container of the cluster carries
    socket: str = str(LAB_SOCKET)


@dataclass(frozen=True)
class CloudPool:
    region: str
    # what the cluster's stack made for the pool to start instances from: the AWS launch
    # template's, the GCP instance template's or the Azure scale set's name
    template: str
    tags: dict[str, str]  # on every instance of the pool: the cluster's and the pool's
    zone: str | None = None  # GCP: where bulkInsert makes the instances
    group: str | None = None  # Azure: the cluster's resource group


@dataclass(frozen=True)
class Pool:
    name: str
    backend: str  # lab, aws, gcp or azure
    nodes: dict[str, str]  # node name -> address (a cloud node's is the cloud's choice)
    lab: LabPool | None = None
    cloud: CloudPool | None = None
    # on a remote network: each node reaches the cluster through the tunnel, whose hub (this
    # head) takes its peer at resume and drops it at suspend (burst/tunnel.py)
    tunnel: bool = False


@dataclass(frozen=True)
class BurstConfig:
    cluster: str
    # host:port of each slurmctld, the primary first, for `slurmd --conf-server`
    conf_server: str
    pools: dict[str, Pool]
    cooldown: int = 600  # seconds a node whose start failed stays down

    @property
    def controllers(self) -> list[str]:
        """The heads' names, the primary first."""
        return [server.rsplit(":", 1)[0] for server in self.conf_server.split(",")]

    @property
    def log_path(self) -> Path:
        return LOG_DIR / f"burst-{self.cluster}.log"

    def pool_of(self, node: str) -> Pool | None:
        return next((p for p in self.pools.values() if node in p.nodes), None)

    def to_json(self) -> str:
        pools = {}
        for name, pool in sorted(self.pools.items()):
            entry: dict[str, object] = {"backend": pool.backend, "nodes": dict(pool.nodes)}
            if pool.lab is not None:
                entry["lab"] = pool.lab.__dict__
            if pool.cloud is not None:
                entry["cloud"] = pool.cloud.__dict__
            if pool.tunnel:
                entry["tunnel"] = True
            pools[name] = entry
        doc = {
            "cluster": self.cluster,
            "conf_server": self.conf_server,
            "cooldown": self.cooldown,
            "pools": pools,
        }
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def parse_config(text: str) -> BurstConfig:
    doc = json.loads(text)
    pools = {}
    for name, entry in doc["pools"].items():
        lab = LabPool(**entry["lab"]) if "lab" in entry else None
        cloud = CloudPool(**entry["cloud"]) if "cloud" in entry else None
        tunnel = bool(entry.get("tunnel", False))
        pools[name] = Pool(name, entry["backend"], dict(entry["nodes"]), lab, cloud, tunnel)
    return BurstConfig(doc["cluster"], doc["conf_server"], pools, int(doc.get("cooldown", 600)))


def load_config(path: Path = CONFIG_PATH) -> BurstConfig:
    return parse_config(path.read_text(encoding="utf-8"))

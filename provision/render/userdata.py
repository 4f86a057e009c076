"""The user data of an elastic cloud pool's instances: a `#cloud-config` that writes what the
node must know of the cluster (burst/join.py's JoinConfig: no secret) and runs the join program
from the wheel the pool's image carries. The same on AWS (the launch template's UserData), GCP
(the instance template's `user-data` metadata, which cloud-init reads on Compute Engine) and
Azure (the scale set's `userData`, which a VM reads from its metadata service).

No key material is ever in it: the munge key is read at boot from the cloud's secret store with
the instance's own identity (see burst/join.py)."""

from __future__ import annotations

import yaml

from provision.burst.config import NODE_WHEEL, key_vault, munge_secret, tunnel_secret
from provision.burst.join import JOIN_CONFIG, JoinConfig
from provision.cluster import Cluster, PoolView
from provision.render.tunnel import far_ranges, tunnel_layout
from provision.spec.ports import service_ports

HEADER = "#cloud-config\n"


def secret_ref(cloud: str, cluster: str, name: str | None = None) -> str:
    """Where a pool's nodes read a secret of the cluster (the munge key's unless name): the
    secret's name (AWS, GCP: in the node's own project), or the Key Vault secret's URL
    (Azure)."""
    name = name or munge_secret(cluster)
    if cloud == "azure":
        return f"https://{key_vault(cluster)}.vault.azure.net/secrets/{name}"
    return name


def join_config(cluster: Cluster, view: PoolView, identity: str = "") -> JoinConfig:
    """The pool's join configuration: every head, the primary first, at its address (a cloud
    head's private address comes from its stack, which fills it in: "" until then)."""
    cloud = view.pool.provider
    spec = cluster.spec
    endpoint, keys = "", ""
    routes: tuple[str, ...] = ()
    backups: tuple[str, ...] = ()
    shape = tunnel_layout(cluster)
    if view.pool.network is not None and shape is not None:
        # a remote pool: its nodes dial the hubs, which take each one's peer at resume
        endpoint, *more = shape.endpoints
        backups = tuple(more)
        routes = tuple(far_ranges(cluster, view.pool.network))
        keys = secret_ref(cloud, spec.name, tunnel_secret(spec.name, view.name))
    return JoinConfig(
        cluster=cluster.spec.name,
        cloud=cloud,
        controllers=tuple(
            (head.name, str(head.address) if head.address else "") for head in cluster.head_nodes
        ),
        port=int(service_ports(cluster.spec).slurmctld_first),
        secret=secret_ref(cloud, cluster.spec.name),
        region=(view.pool.region or "") if cloud == "aws" else "",
        identity=identity,
        tunnel_endpoint=endpoint,
        tunnel_routes=routes,
        tunnel_secret=keys,
        tunnel_backups=backups,
    )


def user_data(config: JoinConfig) -> str:
    """The `#cloud-config` text: the join configuration's file, and the join program."""
    missing = [name for name, address in config.controllers if not address]
    if missing:
        raise ValueError(f"the head {missing[0]} has no address yet")
    doc = {
        "write_files": [
            {
                "path": str(JOIN_CONFIG),
                "owner": "root:root",
                "permissions": "0644",
                "content": config.to_json(),
            }
        ],
        # the program's own lines go to cloud-init's output log and the serial console
        "runcmd": [["env", f"PYTHONPATH={NODE_WHEEL}", "python3", "-m", "provision.burst", "join"]],
    }
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=100)

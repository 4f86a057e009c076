"""The user data of an elastic cloud pool's instances: a `#cloud-config` that writes what the
node must know of the cluster (burst/join.py's JoinConfig: no secret) and runs the join program
from the wheel the pool's image carries. The same on AWS (the launch template's UserData), GCP
(the instance template's `user-data` metadata, which cloud-init reads on Compute Engine) and
Azure (the scale set's `userData`, which a VM reads from its metadata service).

No key material is ever in it: the munge key is read at boot from the cloud's secret store with
the instance's own identity (see burst/join.py)."""

from __future__ import annotations

import yaml

from provision.burst.config import NODE_WHEEL, key_vault, munge_secret
from provision.burst.join import JOIN_CONFIG, JoinConfig
from provision.cluster import Cluster, PoolView
from provision.spec.ports import service_ports

HEADER = "#cloud-config\n"


def secret_ref(cloud: str, cluster: str) -> str:
    """Where a pool's nodes read the munge key: the secret's name (AWS, GCP: in the node's own
    project), or the Key Vault secret's URL (Azure)."""
    if cloud == "azure":
        return f"https://{key_vault(cluster)}.vault.azure.net/secrets/{munge_secret(cluster)}"
    return munge_secret(cluster)


def join_config(
    cluster: Cluster, view: PoolView, controller_address: str | None = None, identity: str = ""
) -> JoinConfig:
    """The pool's join configuration; the controller's address is the first head's (a cloud
    head's private address comes from its stack, which fills it in: "" until then)."""
    head = cluster.head_nodes[0]
    address = controller_address or (str(head.address) if head.address else "")
    cloud = view.pool.provider
    return JoinConfig(
        cluster=cluster.spec.name,
        cloud=cloud,
        controller=head.name,
        controller_address=address,
        port=int(service_ports(cluster.spec).slurmctld_first),
        secret=secret_ref(cloud, cluster.spec.name),
        region=(view.pool.region or "") if cloud == "aws" else "",
        identity=identity,
    )


def user_data(config: JoinConfig) -> str:
    """The `#cloud-config` text: the join configuration's file, and the join program."""
    if not config.controller_address:
        raise ValueError(f"the head {config.controller} has no address yet")
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

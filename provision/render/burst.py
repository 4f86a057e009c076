"""The burst configuration of a cluster with elastic pools (files/burst/burst.json): what the
programs on its heads need to create and remove the pools' nodes. See provision/burst/."""

from __future__ import annotations

from provision.burst.config import (
    LAB_LABEL,
    TAG_CLUSTER,
    TAG_POOL,
    BurstConfig,
    CloudPool,
    LabPool,
    Pool,
    cloud_group,
    cloud_template,
    lab_container_prefix,
    lab_image,
    lab_network,
)
from provision.cluster import Cluster
from provision.spec.ports import service_ports


def burst_config(cluster: Cluster) -> BurstConfig | None:
    """None when no pool is elastic."""
    spec = cluster.spec
    pools = {}
    for view in cluster.pools:
        if not view.pool.elastic:
            continue
        # a cloud node's address is the cloud's choice, set in Slurm when it is made
        nodes = {n.name: str(n.address) if n.address else "" for n in view.nodes}
        lab = cloud = None
        if view.pool.provider == "lab":
            lab = LabPool(
                image=lab_image(spec.name, view.name),
                network=lab_network(spec.name),
                container_prefix=lab_container_prefix(spec.name),
                label=f"{LAB_LABEL}={spec.name}",
            )
        elif view.pool.provider in ("aws", "gcp", "azure"):
            cloud = CloudPool(
                region=view.pool.region or "",
                # what the cluster's stack makes (providers/cloud/aws.py, gcp.py, azure.py)
                template=cloud_template(spec.name, view.name),
                # GCP label values are lower case (providers/cloud/gcp.py)
                tags={TAG_CLUSTER: spec.name.lower(), TAG_POOL: view.name.lower()},
                zone=view.pool.zone,
                group=cloud_group(spec.name) if view.pool.provider == "azure" else None,
            )
        # a remote pool's nodes join through the tunnel: resume gives the hub their peers
        tunnel = view.pool.network is not None
        pools[view.name] = Pool(view.name, view.pool.provider, nodes, lab, cloud, tunnel)
    if not pools:
        return None
    port = service_ports(spec).slurmctld_first
    # every head, the primary first: a lab burst node's slurmd finds whichever is in control
    servers = ",".join(f"{head.name}:{port}" for head in cluster.head_nodes)
    return BurstConfig(spec.name, servers, pools, spec.slurm.burst_cooldown)

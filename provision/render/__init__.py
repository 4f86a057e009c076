"""Render every file a cluster needs from its spec, without touching a host.

`render(cluster)` is pure: the same spec (and node addresses) gives byte-identical files.
`write_render(files, out)` puts them in a build directory (output.py); the inventory and its
variables are inventory.py, the variables' readers contract.py.
"""

from __future__ import annotations

from provision.cluster import Cluster
from provision.render.burst import burst_config
from provision.render.firewall import (
    address_sets,
    guard_lines,
    output_lines,
    pool_rules,
    rule_lines,
)
from provision.render.gpu import nccl_conf
from provision.render.health import health_files
from provision.render.identity import identity_files
from provision.render.inventory import NFT_SETS_PATH, render_group_vars, render_inventory
from provision.render.jinja import template
from provision.render.kubernetes import kubernetes_files
from provision.render.monitoring import monitoring_files
from provision.render.output import MANIFEST, read_render, write_render
from provision.render.slurm import gres_conf_context, oci_conf_context, slurm_conf_context

__all__ = ["MANIFEST", "read_render", "render", "render_inventory", "write_render"]


# where the pyxis role installs the plugin it builds (Pyxis' own `make install` prefix)
PYXIS_PLUGIN = "/usr/local/lib/slurm/spank_pyxis.so"


def render(cluster: Cluster) -> dict[str, str]:
    """Relative path -> file content, for every artifact of the cluster."""
    header = cluster.header
    files: dict[str, str] = {
        "inventory/hosts.yml": render_inventory(cluster),
        "inventory/group_vars/all.yml": render_group_vars(cluster),
        "files/hosts": template(
            "hosts.j2",
            header=header,
            nodes=[n for n in cluster.nodes if n.address is not None],
            domain=cluster.spec.network.management.domain,
        ),
        "files/nftables/address-sets.nft": template(
            "nftables-sets.nft.j2", header=header, sets=address_sets(cluster)
        ),
    }
    for pool, rules in pool_rules(cluster).items():
        lines = rule_lines(rules)
        role = next(p.pool.role for p in cluster.pools if p.name == pool)
        files[f"files/nftables/{pool}.nft"] = template(
            "nftables.nft.j2",
            header=header,
            pool=pool,
            role=role,
            sets_path=NFT_SETS_PATH,
            rule_lines=lines,
            guard_lines=guard_lines(cluster, pool),
            output_lines=output_lines(cluster, pool),
        )
    for view in cluster.pools:
        if view.profile.gpu is not None:
            files[f"files/nccl/{view.name}.conf"] = nccl_conf(cluster, view)
    if cluster.spec.scheduler == "slurm":
        files["files/slurm/slurm.conf"] = template(
            "slurm.conf.j2", header=header, **slurm_conf_context(cluster)
        )
        files["files/slurm/gres.conf"] = template(
            "gres.conf.j2", header=header, **gres_conf_context(cluster)
        )
        files["files/slurm/cgroup.conf"] = template("cgroup.conf.j2", header=header)
        files["files/slurm/oci.conf"] = template(  # Slurm's own containers, or their refusal
            "oci.conf.j2", header=header, **oci_conf_context(cluster.spec.slurm.oci_runtime)
        )
        if cluster.spec.nvidia.enroot:  # containers in jobs: Enroot and Pyxis
            files["files/enroot/enroot.conf"] = template(
                "enroot.conf.j2", header=header, scratch=cluster.spec.nvidia.enroot_scratch
            )
            files["files/slurm/plugstack.conf"] = template(
                "plugstack.conf.j2", header=header, pyxis_plugin=PYXIS_PLUGIN
            )
        burst = burst_config(cluster)
        if burst is not None:
            files["files/burst/burst.json"] = burst.to_json()
    files.update(kubernetes_files(cluster))
    files.update(monitoring_files(cluster))
    files.update(health_files(cluster))
    files.update(identity_files(cluster))
    return dict(sorted(files.items()))

"""The Ansible inventory and group_vars of a cluster: groups per role, pool and provider, and
every variable the roles read, each named in contract.py."""

from __future__ import annotations

import posixpath
from typing import Any

from provision.cluster import Cluster
from provision.render.contract import FABRIC, GRAFANA, MONITORING, NVIDIA, ROCE, SOFTWARE, emitted
from provision.render.jinja import template
from provision.render.kubernetes import api_cloud, api_endpoint, node_labels, vrrp_router_id
from provision.render.monitoring import smtp_logins
from provision.render.netboot import netboot_host_vars
from provision.render.slurm import JOB_USER, wall_minutes
from provision.render.tunnel import tunnel_host_vars
from provision.render.yamldata import Template, yaml_mapping, yaml_value
from provision.spec.fabric import cloud_infiniband, efa_count, fabric_addresses, rails
from provision.spec.nodes import login_user
from provision.spec.storage import (
    HOMES,
    export_clients,
    served_by,
    shared_home_mounts,
    split_source,
)

# Where the roles install the rendered nftables sets file on each node.
NFT_SETS_PATH = "/etc/nftables.d/provision-sets.nft"


def render_inventory(cluster: Cluster) -> str:
    spec = cluster.spec
    lasting = cluster.lasting_nodes
    fabric = spec.network.fabric
    addresses, _ = fabric_addresses(spec, cluster.profiles, lasting)
    groups: list[dict[str, Any]] = []
    kubernetes = spec.scheduler == "kubernetes"
    for role in ("head", "login", "compute", "storage"):
        hosts = [
            _host(
                n.name,
                ansible_host=n.login_address and str(n.login_address),
                # a control-plane member's API server advertises it (None: kubeadm chooses)
                kubernetes_node_address=str(n.address) if kubernetes and n.address else None,
            )
            for n in lasting
            if n.role == role
        ]
        groups.append({"name": role, "vars": [], "hosts": hosts})
    # GPU nodes: the NVIDIA roles run here
    hosts = [
        _host(n.name) for v in cluster.pools if v.profile.gpu for n in v.nodes if not n.elastic
    ]
    groups.append({"name": "gpu", "vars": [], "hosts": hosts})
    # Nodes on the RDMA fabric (the rdma and ipoib roles), and the fabric's subnet managers;
    # a cloud's InfiniBand machines take the rdma role too (their fabric is the cloud's)
    fabric_pools = [
        v for v in cluster.pools if rails(v.profile, fabric.kind) or cloud_infiniband(v.profile)
    ]
    hosts = [_host(n.name) for v in fabric_pools for n in v.nodes if not n.elastic]
    groups.append({"name": "fabric", "vars": [], "hosts": hosts})
    # Nodes with EFA (AWS): the EFA software and aws-ofi-nccl
    hosts = [
        _host(n.name)
        for v in cluster.pools
        if efa_count(v.profile)
        for n in v.nodes
        if not n.elastic
    ]
    groups.append({"name": "efa", "vars": [], "hosts": hosts})
    # opensm: the higher priority is master; the first named gets 15, the next 14, ...
    hosts = [_host(name, opensm_priority=15 - i) for i, name in enumerate(fabric.subnet_managers)]
    groups.append({"name": "subnet_manager", "vars": [], "hosts": hosts})
    # The WireGuard tunnel to the remote networks: its hub, its spokes, the nodes it routes for
    hosts = [_host(name, **values) for name, values in tunnel_host_vars(cluster).items()]
    groups.append({"name": "tunnel", "vars": [], "hosts": hosts})
    # the boot server of the pools that boot from the network (the netboot role)
    hosts = [_host(name, **values) for name, values in netboot_host_vars(cluster).items()]
    groups.append({"name": "boot_server", "vars": [], "hosts": hosts})
    # Prometheus and Alertmanager (the monitoring role)
    watcher = cluster.monitoring_node
    hosts = [_host(watcher.name)] if watcher is not None else []
    groups.append({"name": "monitoring", "vars": [], "hosts": hosts})
    for view in cluster.pools:
        gpu = view.profile.gpu
        gvars: dict[str, object] = {"provision_pool": view.name}
        if gpu:
            gvars["provision_nvswitch"] = gpu.nvswitch
        if view.pool.mig:
            gvars["provision_mig_layout"] = list(view.pool.mig)
        if cluster.spec.scheduler == "kubernetes" and node_labels(view):
            gvars["kubernetes_node_labels"] = node_labels(view)
        pool_rails = rails(view.profile, fabric.kind)
        if pool_rails:
            netdevs = [r.netdev for r in pool_rails if r.netdev]
            devices = [r.device for r in pool_rails if r.device]
            if netdevs:
                gvars["provision_fabric_netdevs"] = netdevs
            if devices:
                gvars["provision_fabric_devices"] = devices
            soft = [r.device for r in pool_rails if r.soft and r.device]
            if soft:  # software RoCE: the rdma role makes these devices over their netdevs
                gvars["provision_fabric_soft_devices"] = soft
        if view.pool.provider != "lab":  # a lab's storage is podman volumes (lab/storage.py)
            gvars.update(_storage_vars(cluster, view.name))
        people = cluster.spec.security.admins or cluster.spec.users
        if people and shared_home_mounts(cluster.spec, view.name):
            # the admins' and users' homes are on shared storage here (a lab's volume too):
            # made there after the mounts, not by useradd
            gvars["common_homes_shared"] = True
        if cluster.spec.users and view.name in cluster.user_doors:
            gvars["common_users_login"] = True  # the users' keys let them in here
        if cluster.spec.identity is not None and view.name in cluster.user_doors:
            gvars["sssd_door"] = True  # and the directory's users', with their keys from it
        hosts = [
            _host(n.name, provision_fabric_addresses=addresses[n.name])
            if n.name in addresses
            else _host(n.name)
            for n in view.nodes
            if not n.elastic
        ]
        groups.append(
            {"name": f"pool_{view.name}", "vars": _pairs(emitted(gvars, "pool")), "hosts": hosts}
        )
    for provider in sorted({p.pool.provider for p in cluster.pools}):
        hosts = [_host(n.name) for n in lasting if n.provider == provider]
        # a cloud's image decides the login user (AWS), or refuses root (Azure, GCP)
        user = login_user(spec, provider)
        login = {} if user == spec.ssh.user else {"ansible_user": user, "ansible_become": True}
        groups.append(
            {
                "name": f"provider_{provider}",
                "vars": _pairs(emitted(login, "connection")),
                "hosts": hosts,
            }
        )
    all_vars = {
        "ansible_user": spec.ssh.user,
        "ansible_port": spec.ssh.port,
        # every supported OS has it; naming it saves Ansible's interpreter discovery on each run
        "ansible_python_interpreter": "/usr/bin/python3",
    }
    if spec.ssh.user != "root":
        all_vars["ansible_become"] = True
    return template(
        "inventory.yml.j2",
        header=cluster.header,
        all_vars=_pairs(emitted(all_vars, "connection")),
        groups=groups,
    )


def _storage_vars(cluster: Cluster, pool: str) -> dict[str, object]:
    """A pool's NFS exports (nfs_server role) and mounts (mounts role), where it has any."""
    spec, nodes = cluster.spec, cluster.nodes
    out: dict[str, object] = {}
    exports = []
    for e in spec.storage.exports:
        if e.pool != pool:
            continue
        entry: dict[str, object] = {
            "path": e.path,
            "clients": [
                {"match": list(c.matches), "access": c.access, "squash": c.squash}
                for c in export_clients(spec, nodes, e)
            ],
        }
        homes_dir = _homes_dir(cluster, e.path)
        if homes_dir is not None:  # the role makes the admins' and the login user's homes there
            entry["homes_dir"] = homes_dir
        exports.append(entry)
    if exports:
        out["nfs_server_exports"] = exports
        if spec.storage.nfs_server != "ganesha":
            out["nfs_server_implementation"] = spec.storage.nfs_server
    mounts = []
    for m in spec.storage.mounts:
        if m.pools is not None and pool not in m.pools:
            continue
        entry = {"src": m.source, "path": m.path, "fstype": m.fstype, "opts": m.options}
        served = served_by(spec, nodes, m)
        if served is not None and split_source(m)[1] == m.path:
            entry["skip_on"] = served.node.name  # the server has the directory itself
        elif served is not None and served.node.pool == pool:
            # the server binds its own directory there: never an NFS mount of itself (a loop
            # through its own page cache, and a name that may resolve to 127.0.1.1, which the
            # export's clients do not hold)
            entry["bind_on"] = served.node.name
            entry["bind_src"] = split_source(m)[1]
        mounts.append(entry)
    if mounts:
        out["mounts_filesystems"] = mounts
    return out


def _homes_dir(cluster: Cluster, path: str) -> str | None:
    """The directory of the export at `path` that the spec mounts as /home, if any: the users'
    homes are made there, on the server, where root squash does not apply."""
    spec, nodes = cluster.spec, cluster.nodes
    for mount in shared_home_mounts(spec):
        served = served_by(spec, nodes, mount)
        if served is None or served.export is None or served.export.path != path:
            continue
        inside = posixpath.join(split_source(mount)[1], posixpath.relpath(HOMES, mount.path))
        return posixpath.normpath(inside)
    return None


def accounts_vars(cluster: Cluster) -> dict[str, object]:
    """slurmdbd's QoS and accounts as the slurm role's slurm_accounts module takes them."""
    slurm = cluster.spec.slurm
    return {
        "slurm_qos": [
            {
                "name": q.name,
                "priority": q.priority,
                "preempt": list(q.preempt),
                "grp_tres": dict(q.grp_tres),
                "max_tres_per_job": dict(q.max_tres_per_job),
                "max_tres_per_user": dict(q.max_tres_per_user),
                "max_wall": wall_minutes(q.max_wall) if q.max_wall is not None else None,
            }
            for q in slurm.qos
        ],
        "slurm_accounts": [
            {
                "name": a.name,
                "parent": a.parent,
                "fairshare": a.fairshare,
                "users": list(a.users),
                "qos": list(a.qos),
                "default_qos": a.default_qos,
            }
            for a in slurm.accounts
        ],
        # verify's test jobs' user and the admins may run jobs in the root account
        "slurm_accounts_root_users": [JOB_USER] + [a.name for a in cluster.spec.security.admins],
    }


def _pairs(values: dict[str, object]) -> list[tuple[str, str]]:
    """Variables as (name, YAML value) pairs; every string is data (see yamldata)."""
    return [(key, yaml_value(value)) for key, value in values.items() if value is not None]


def _host(name: str, **hostvars: object) -> tuple[str, list[tuple[str, str]]]:
    """A host of the inventory: its name and its variables, each as a YAML value."""
    return name, _pairs(emitted(hostvars, "host"))


def group_vars(cluster: Cluster) -> dict[str, Any]:
    """Variables for every host: only what the spec sets; the roles own their defaults."""
    spec = cluster.spec
    out: dict[str, Any] = {
        "provision_cluster": spec.name,
        "provision_scheduler": spec.scheduler,
        "provision_files_dir": Template("{{ inventory_dir }}/../files"),
        "provision_nft_sets_path": NFT_SETS_PATH,
    }
    if spec.network.time_servers:
        out["common_time_servers"] = list(spec.network.time_servers)
    out["common_time_allow"] = [str(spec.network.management.cidr)]
    if spec.security.admins:
        out["common_admin_users"] = [
            {"name": a.name, "sudo": a.sudo, "ssh_keys": list(a.ssh_keys)}
            | ({"uid": a.uid} if a.uid is not None else {})
            for a in spec.security.admins
        ]
    if spec.groups:
        out["common_groups"] = [{"name": g.name, "gid": g.gid} for g in spec.groups]
    if spec.users:
        out["common_users"] = [
            {"name": u.name, "uid": u.uid, "groups": list(u.groups), "ssh_keys": list(u.ssh_keys)}
            for u in spec.users
        ]
    if spec.identity is not None:
        out["provision_directory"] = True
        if spec.identity.bind_password_file is not None:
            out["sssd_bind"] = True  # its password in the secrets directory
    if spec.scheduler == "kubernetes":
        kube = spec.kubernetes
        out["provision_kubernetes_etcd"] = kube.etcd
        out["kubernetes_packages_version"] = kube.version
        out["kubernetes_node_api_endpoint"] = api_endpoint(cluster)
        if cluster.has_gpus:
            out["kubernetes_control_plane_gpu"] = True
            if spec.nvidia.dcgm and spec.nvidia.dcgm_exporter_url:
                out["dcgm_exporter_kubernetes"] = True
        if kube.ha and kube.api_address is not None:
            out["provision_kubernetes_ha"] = True
            out["api_endpoint_address"] = str(kube.api_address)
            out["api_endpoint_prefix"] = spec.network.management.cidr.prefixlen
            out["api_endpoint_router_id"] = vrrp_router_id(spec.name)
            if api_cloud(cluster) is not None:  # the cloud's load balancer holds the address
                out["api_endpoint_vrrp"] = False
    if spec.scheduler == "slurm" and any(p.elastic for p in spec.pools):
        out["provision_burst"] = True
    if spec.scheduler == "slurm" and "accounting" in spec.slurm.model_fields_set:
        out["slurm_accounting"] = spec.slurm.accounting
    if spec.scheduler == "slurm" and spec.slurm.accounts:
        out.update(accounts_vars(cluster))
    if spec.scheduler == "slurm" and spec.slurm.oci_runtime is not None:
        out["slurm_oci_runtime"] = spec.slurm.oci_runtime
    if spec.health is not None and spec.scheduler == "slurm":
        out["provision_health"] = True
    if spec.monitoring is not None:
        out["provision_monitoring"] = True
        for field in sorted(spec.monitoring.model_fields_set & set(MONITORING)):
            out[MONITORING[field]] = getattr(spec.monitoring, field)
        logins = smtp_logins(cluster)
        if logins:
            out["monitoring_smtp_logins"] = logins
        grafana = spec.monitoring.grafana
        if grafana is not None:
            out["provision_grafana"] = True
            for field in sorted(grafana.model_fields_set & set(GRAFANA)):
                out[GRAFANA[field]] = getattr(grafana, field)
    fabric = spec.network.fabric
    if "fabric" in spec.network.model_fields_set:
        out["provision_fabric"] = fabric.kind
    for section, table in (
        (spec.software, SOFTWARE),
        (spec.nvidia, NVIDIA),
        (fabric, FABRIC),
        (fabric.roce, ROCE),
    ):
        for field in sorted(section.model_fields_set & set(table)):
            value = getattr(section, field)
            if value is not None:
                out[table[field]] = value
    return emitted(out, "all")


def render_group_vars(cluster: Cluster) -> str:
    return f"---\n# {cluster.header}\n" + yaml_mapping(group_vars(cluster))

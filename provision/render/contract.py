"""The contract between the renderer and the roles: every variable the renderer hands Ansible,
where it is set, and who reads it.

The renderer emits no variable this table does not name (`emitted` raises), and
tests/test_contract.py fails when a variable here has no reader that uses it, or when a role or
playbook reads a `provision_*` variable that nothing here provides. A spec field reaches a role
only through this table: a field whose feature no role builds is refused instead (spec/unbuilt.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# all: inventory/group_vars/all.yml; pool: the pool_<name> group; host: one host's variables;
# extra: passed by apply as an extra variable (never written to a file); connection: Ansible's own
Scope = Literal["all", "pool", "host", "extra", "connection"]


@dataclass(frozen=True)
class Variable:
    name: str
    scope: Scope
    readers: tuple[str, ...]  # roles/<name>, or playbooks/<name>.yml; () for Ansible's own
    meaning: str


_TABLE = (
    # connection: Ansible itself reads these
    Variable(
        "ansible_user", "connection", (),
        "ssh.user; on a cloud's nodes the image's user (AWS) or a non-root one (Azure, GCP)",
    ),
    Variable("ansible_port", "connection", (), "ssh.port"),
    Variable("ansible_python_interpreter", "connection", (), "/usr/bin/python3 on every OS"),
    Variable("ansible_become", "connection", (), "sudo when the login user is not root"),
    Variable("ansible_host", "host", (), "the node's management address"),
    # the tunnel to the remote networks (render/tunnel.py), on its members' hosts
    Variable("tunnel_role", "host", ("tunnel", "playbooks/site"), "hub, spoke or routed"),
    Variable("tunnel_port", "host", ("tunnel",), "network.tunnel.port: where the hub listens"),
    Variable(
        "tunnel_address", "host", ("tunnel",),
        "the node's own address: the source of what it sends into the tunnel",
    ),
    Variable(
        "tunnel_routes", "host", ("tunnel",),
        "the ranges the node sends through the tunnel (or to the hub, for routed nodes)",
    ),
    Variable("tunnel_peers", "host", ("tunnel",), "the hub's peers: each remote node's address"),
    Variable(
        "tunnel_forward", "host", ("tunnel",),
        "the hub forwards between the management network and the tunnel",
    ),
    Variable(
        "tunnel_burst_peers", "host", ("tunnel",),
        "the hub's burst nodes: their public keys go to the burst programs, which add each peer",
    ),
    Variable(
        "tunnel_hubs", "host", ("tunnel",),
        "a spoke's hubs: each head's key name, host:port and the ranges sent to it",
    ),
    Variable("tunnel_via", "host", ("tunnel",), "the hub's address, a routed node's gateway"),
    # the boot server of the pools that boot from the network (render/netboot.py): the first head
    Variable(
        "netboot_address", "host", ("netboot", "playbooks/site"),
        "the boot server's management address, where DHCP, TFTP and HTTP answer",
    ),
    Variable("netboot_network", "host", ("netboot",), "network.management.cidr"),
    Variable(
        "netboot_router", "host", ("netboot",),
        "network.management.gateway: the booted nodes' default route",
    ),
    Variable(
        "netboot_nodes", "host", ("netboot",),
        "the nodes of the pools with boot: network: name, hosts[].mac, address, pool (its image)",
    ),
    Variable(
        "netboot_images", "extra", ("netboot",),
        "each such pool's image, built by apply: a directory on this machine, by the pool's name",
    ),
    # the cluster
    Variable(
        "provision_cluster", "all", ("common", "slurm"),
        "name, in the marker of managed blocks; the cluster slurmdbd knows",
    ),
    Variable(
        "provision_scheduler", "all", ("playbooks/site", "node_exporter"),
        "which scheduler's plays run (and whether the heads export Slurm's states)",
    ),
    Variable(
        "provision_files_dir", "all",
        ("common", "firewall", "nccl", "slurm", "containerd", "etcd", "api_endpoint"),
        "where the rendered files are, beside the inventory",
    ),
    Variable(
        "provision_nft_sets_path", "all", ("firewall",), "where the address sets go on a node"
    ),
    Variable(
        "provision_secrets_dir", "extra",
        ("munge", "slurm", "monitoring", "grafana", "etcd", "tunnel"),
        "the state directory's secrets (munge key, slurmdbd password, relay passwords, Grafana's "
        "admin password, etcd's certificates, the tunnel's keys): read on the controller",
    ),
    Variable(
        "provision_burst", "all", ("playbooks/site",),
        "an elastic pool exists: the burst programs go on the heads",
    ),
    Variable(
        "slurm_config_change", "extra", ("slurm",),
        "what the Slurm daemons do for the change since the last apply (provision/changes.py)",
    ),
    Variable(
        "provision_drained", "extra", ("nvidia_driver",),
        "nodes no job runs on, which a reboot may take: a rolling change's drained batch, or "
        "the nodes new to the cluster (provision/lifecycle.py)",
    ),
    Variable(
        "provision_new_nodes", "extra", ("playbooks/site",),
        "the nodes new to the cluster, converging for the first time: the later roles' "
        "packages in one transaction (provision/lifecycle.py)",
    ),
    Variable(
        "provision_wheel", "extra", ("burst", "health", "node_exporter"),
        "this project's wheel, made by apply on the workstation: the heads' burst programs and "
        "the compute nodes' health checks and the heads' Slurm metrics run from it",
    ),
    Variable(
        "provision_kubernetes_etcd", "all", ("playbooks/site",),
        "kubernetes.etcd: external puts the etcd role on the heads",
    ),
    Variable(
        "provision_kubernetes_ha", "all", ("playbooks/site",),
        "kubernetes.ha: keepalived and haproxy on the heads (the api_endpoint role)",
    ),
    Variable(
        "kubernetes_packages_version", "all", ("kubernetes_packages",),
        "kubernetes.version: kubeadm, kubelet and kubectl at it",
    ),
    Variable(
        "kubernetes_node_api_endpoint", "all", ("kubernetes_node",),
        "host:port of the API the nodes join through (the virtual address, or the first head)",
    ),
    Variable(
        "kubernetes_node_labels", "pool", ("kubernetes_node", "kubernetes_control_plane"),
        "the labels a pool's kubelets register with (nvidia.com/gpu.present on GPU pools)",
    ),
    Variable(
        "kubernetes_node_address", "host", ("kubernetes_node", "kubernetes_control_plane"),
        "the node's management address, which a control-plane member's API server advertises",
    ),
    Variable(
        "kubernetes_control_plane_gpu", "all", ("kubernetes_control_plane",),
        "a pool has GPUs: NVIDIA's device plugin and the nvidia runtime class go on",
    ),
    Variable("api_endpoint_address", "all", ("api_endpoint",), "kubernetes.api_address"),
    Variable(
        "api_endpoint_prefix", "all", ("api_endpoint",),
        "the management network's prefix length, the virtual address's",
    ),
    Variable(
        "api_endpoint_router_id", "all", ("api_endpoint",),
        "the VRRP router id, from the cluster's name",
    ),
    Variable(
        "api_endpoint_vrrp", "all", ("api_endpoint",),
        "false on heads in a cloud: its internal load balancer holds the address, no keepalived",
    ),
    Variable("common_time_servers", "all", ("common",), "network.time_servers"),
    Variable("common_time_allow", "all", ("common",), "the management network, chrony's clients"),
    Variable("common_admin_users", "all", ("common", "nfs_server"), "security.admins"),
    Variable("common_groups", "all", ("common",), "groups"),
    Variable("common_users", "all", ("common", "nfs_server"), "users"),
    Variable(
        "common_homes_shared", "pool", ("common", "playbooks/site"),
        "the pool mounts /home from shared storage: the admins' and users' homes are made there",
    ),
    Variable(
        "common_users_login", "pool", ("common",),
        "the users log in here: the login pools, or the heads without one",
    ),
    Variable("provision_directory", "all", ("playbooks/site",), "identity: SSSD on every node"),
    Variable(
        "sssd_bind", "all", ("sssd",),
        "identity.bind_dn: the nodes read the directory as it (its password from the secrets)",
    ),
    Variable(
        "sssd_door", "pool", ("sssd",),
        "with identity: the directory's users log in here, with their keys from it",
    ),
    Variable("slurm_accounting", "all", ("slurm",), "slurm.accounting"),
    Variable("slurm_qos", "all", ("slurm",), "slurm.qos"),
    Variable("slurm_accounts", "all", ("slurm",), "slurm.accounts"),
    Variable("slurm_oci_runtime", "all", ("slurm",), "slurm.oci_runtime"),
    Variable(
        "slurm_accounts_root_users", "all", ("slurm",),
        "verify's job user and the admins, kept in the root account",
    ),
    # pools and hosts
    Variable(
        "provision_pool", "pool", ("firewall", "nccl", "containerd"),
        "the pool: names its nftables, NCCL and containerd files",
    ),
    Variable("provision_nvswitch", "pool", ("playbooks/site",), "fabric manager on NVSwitch GPUs"),
    Variable("provision_mig_layout", "pool", ("nvidia_mig",), "pools[].mig"),
    Variable(
        "provision_fabric_netdevs", "pool", ("rdma", "ipoib"), "the profile's fabric interfaces"
    ),
    Variable("provision_fabric_devices", "pool", ("rdma",), "the profile's RDMA devices"),
    Variable(
        "provision_fabric_soft_devices", "pool", ("rdma",),
        "the profile's software RoCE devices (rdma_rxe), which the rdma role makes",
    ),
    Variable(
        "provision_fabric_addresses", "host", ("playbooks/site", "ipoib"),
        "the node's address on each rail",
    ),
    Variable(
        "nfs_server_exports", "pool", ("nfs_server",),
        "storage.exports of the pool, each client as addresses or networks, and homes_dir: "
        "the directory the clients mount as /home, where the homes are made",
    ),
    Variable(
        "nfs_server_implementation", "pool", ("nfs_server",),
        "storage.nfs_server: the kernel's NFS server instead of nfs-ganesha",
    ),
    Variable(
        "mounts_filesystems", "pool", ("mounts",),
        "storage.mounts of the pool (skip_on: the node serving it at that path; bind_on, "
        "bind_src: the node serving it elsewhere, and where)",
    ),
    Variable("opensm_priority", "host", ("opensm",), "network.fabric.subnet_managers' order"),
    # GPU software: network.fabric, nvidia and software
    Variable("provision_fabric", "all", ("rdma", "ipoib"), "network.fabric.kind"),
    Variable("rdma_stack", "all", ("rdma",), "network.fabric.rdma"),
    Variable("rdma_doca_mirror_url", "all", ("rdma",), "network.fabric.doca_mirror_url"),
    Variable(
        "rdma_doca_key_fingerprint", "all", ("rdma",), "network.fabric.doca_key_fingerprint"
    ),
    Variable("ipoib_mode", "all", ("ipoib",), "network.fabric.ipoib_mode"),
    Variable("ipoib_mtu", "all", ("ipoib",), "network.fabric.mtu"),
    Variable("rdma_roce_trust", "all", ("rdma",), "network.fabric.roce.trust"),
    Variable("rdma_roce_traffic_class", "all", ("rdma",), "network.fabric.roce.traffic_class"),
    Variable("rdma_roce_priority", "all", ("rdma",), "network.fabric.roce.priority"),
    Variable("rdma_roce_pfc", "all", ("rdma",), "network.fabric.roce.pfc"),
    Variable(
        "provision_nvidia_source", "all",
        ("nvidia_repos", "nvidia_driver", "cuda", "cudnn", "nccl", "nccl_tests"),
        "nvidia.source",
    ),
    Variable("provision_nvidia_mirror_url", "all", ("nvidia_repos",), "nvidia.mirror_url"),
    Variable("nvidia_driver_modules", "all", ("nvidia_driver",), "nvidia.driver_modules"),
    Variable("nvidia_driver_reboot", "all", ("nvidia_driver",), "nvidia.reboot"),
    Variable("provision_nvidia_dcgm", "all", ("playbooks/site",), "nvidia.dcgm"),
    Variable("dcgm_exporter_port", "all", ("dcgm",), "nvidia.dcgm_exporter_port"),
    Variable("dcgm_exporter_url", "all", ("dcgm",), "nvidia.dcgm_exporter_url"),
    Variable("dcgm_exporter_sha256", "all", ("dcgm",), "nvidia.dcgm_exporter_sha256"),
    Variable(
        "dcgm_exporter_kubernetes", "all", ("dcgm",),
        "scheduler kubernetes: GPU metrics name the pod using the GPU",
    ),
    Variable(
        "provision_nvidia_container_toolkit", "all", ("playbooks/site",),
        "nvidia.container_toolkit",
    ),
    Variable("provision_nvidia_nccl_tests", "all", ("playbooks/site",), "nvidia.nccl_tests"),
    Variable("nccl_tests_sha256", "all", ("nccl_tests",), "nvidia.nccl_tests_sha256"),
    Variable("provision_enroot", "all", ("playbooks/site",), "nvidia.enroot"),
    Variable("enroot_version", "all", ("enroot",), "nvidia.enroot_version"),
    Variable("enroot_sha256", "all", ("enroot",), "nvidia.enroot_sha256"),
    Variable("enroot_caps_sha256", "all", ("enroot",), "nvidia.enroot_caps_sha256"),
    Variable("pyxis_version", "all", ("pyxis",), "nvidia.pyxis_version"),
    Variable("pyxis_sha256", "all", ("pyxis",), "nvidia.pyxis_sha256"),
    Variable("enroot_scratch", "all", ("enroot",), "nvidia.enroot_scratch"),
    Variable(
        "nvidia_driver_version", "all", ("nvidia_driver", "nvidia_fabricmanager"),
        "software.nvidia_driver",
    ),
    Variable("slurm_version", "all", ("slurm",), "software.slurm"),
    Variable("cuda_version", "all", ("cuda",), "software.cuda"),
    Variable("cudnn_version", "all", ("cudnn",), "software.cudnn"),
    Variable("nccl_version", "all", ("nccl",), "software.nccl"),
    Variable("dcgm_version", "all", ("dcgm",), "software.dcgm"),
    Variable(
        "nvidia_container_toolkit_version", "all", ("nvidia_container_toolkit",),
        "software.container_toolkit",
    ),
    Variable("nccl_tests_version", "all", ("nccl_tests",), "software.nccl_tests"),
    Variable("rdma_doca_version", "all", ("rdma",), "software.doca"),
    Variable("efa_installer_version", "all", ("efa",), "software.efa"),
    Variable(
        "provision_health", "all", ("playbooks/site",),
        "health is set: the health checks go on the compute nodes",
    ),
    # monitoring
    Variable(
        "provision_monitoring", "all", ("playbooks/site",),
        "monitoring is set: node exporters on every node, Prometheus on the monitoring node",
    ),
    Variable("node_exporter_port", "all", ("node_exporter",), "monitoring.node_exporter_port"),
    Variable("monitoring_prometheus_port", "all", ("monitoring",), "monitoring.prometheus_port"),
    Variable(
        "monitoring_alertmanager_port", "all", ("monitoring",), "monitoring.alertmanager_port"
    ),
    Variable("monitoring_retention", "all", ("monitoring",), "monitoring.retention"),
    Variable("monitoring_storage_path", "all", ("monitoring",), "monitoring.storage_path"),
    Variable(
        "monitoring_smtp_logins", "all", ("monitoring",),
        "mail receivers whose relay wants a login: their passwords are copied from the secrets",
    ),
    Variable(
        "provision_grafana", "all", ("playbooks/site",),
        "monitoring.grafana is set: Grafana and the dashboards on the monitoring node",
    ),
    Variable("grafana_port", "all", ("grafana",), "monitoring.grafana.port"),
)  # fmt: skip

VARIABLES: dict[str, Variable] = {v.name: v for v in _TABLE}

# spec section -> field -> variable: the fields group_vars copies as they are
SOFTWARE = {
    "nvidia_driver": "nvidia_driver_version",
    "slurm": "slurm_version",
    "cuda": "cuda_version",
    "cudnn": "cudnn_version",
    "nccl": "nccl_version",
    "dcgm": "dcgm_version",
    "container_toolkit": "nvidia_container_toolkit_version",
    "nccl_tests": "nccl_tests_version",
    "doca": "rdma_doca_version",
    "efa": "efa_installer_version",
}
NVIDIA = {
    "source": "provision_nvidia_source",
    "mirror_url": "provision_nvidia_mirror_url",
    "driver_modules": "nvidia_driver_modules",
    "reboot": "nvidia_driver_reboot",
    "dcgm": "provision_nvidia_dcgm",
    "dcgm_exporter_port": "dcgm_exporter_port",
    "dcgm_exporter_url": "dcgm_exporter_url",
    "dcgm_exporter_sha256": "dcgm_exporter_sha256",
    "container_toolkit": "provision_nvidia_container_toolkit",
    "nccl_tests": "provision_nvidia_nccl_tests",
    "nccl_tests_sha256": "nccl_tests_sha256",
    "enroot": "provision_enroot",
    "enroot_version": "enroot_version",
    "enroot_sha256": "enroot_sha256",
    "enroot_caps_sha256": "enroot_caps_sha256",
    "pyxis_version": "pyxis_version",
    "pyxis_sha256": "pyxis_sha256",
    "enroot_scratch": "enroot_scratch",
}
FABRIC = {
    "rdma": "rdma_stack",
    "doca_mirror_url": "rdma_doca_mirror_url",
    "doca_key_fingerprint": "rdma_doca_key_fingerprint",
    "ipoib_mode": "ipoib_mode",
    "mtu": "ipoib_mtu",
}
MONITORING = {
    "node_exporter_port": "node_exporter_port",
    "prometheus_port": "monitoring_prometheus_port",
    "alertmanager_port": "monitoring_alertmanager_port",
    "retention": "monitoring_retention",
    "storage_path": "monitoring_storage_path",
}
GRAFANA = {"port": "grafana_port"}
ROCE = {
    "trust": "rdma_roce_trust",
    "traffic_class": "rdma_roce_traffic_class",
    "priority": "rdma_roce_priority",
    "pfc": "rdma_roce_pfc",
}


def emitted(values: dict[str, object], scope: Scope) -> dict[str, object]:
    """`values` as they are, once every name is checked against the contract at that scope."""
    for name in values:
        variable = VARIABLES.get(name)
        if variable is None or variable.scope != scope:
            raise AssertionError(
                f"the renderer emits {name} ({scope}), which render/contract.py does not name "
                "at that scope: add it there with the role that reads it"
            )
    return values

"""The files of a Kubernetes cluster that the spec decides: kubeadm's cluster-wide configuration
(with the kubelet's and kube-proxy's), containerd's configuration per pool, haproxy's in front of
the API servers of an HA control plane, each external etcd member's settings, Calico's
Installation (the pod network) and, where a pool has GPUs, NVIDIA's device plugin, GPU feature
discovery and the `nvidia` runtime class.

Every value here is the spec's, validated (addresses, networks, names, the pinned release) or
this module's own; the YAML is written by a YAML library and the other files from fixed text,
so no spec value is ever read as a template or becomes a second line. Per-node and secret parts
(kubeadm's InitConfiguration and JoinConfiguration with their tokens, keepalived's interface)
are made on the nodes by the roles.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import yaml

from provision.cluster import Cluster, PoolView
from provision.spec.models import CLOUD_PROVIDERS
from provision.spec.nodes import Node

API_PORT = 6443  # each API server
HA_PORT = 8443  # haproxy on every head, reached at the virtual address
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
CONTAINERD_SOCKET = "unix:///run/containerd/containerd.sock"
# On the nodes: where the etcd role puts the certificates, and where kubeadm reads its own
ETCD_PKI = "/etc/etcd/pki"
KUBE_PKI = "/etc/kubernetes/pki"
# The pause image kubeadm pulls for each minor release (kubeadm config images list)
PAUSE_IMAGE = {"1.31": "3.10", "1.32": "3.10", "1.33": "3.10"}
NVIDIA_RUNTIME = "/usr/bin/nvidia-container-runtime"
DEVICE_PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"
# The label the kubelet of a GPU pool's node registers with: the device plugin, GPU feature
# discovery and the runtime class select it
GPU_LABEL = "nvidia.com/gpu.present"
# Where GPU feature discovery writes its labels on the host, and Node Feature Discovery's worker
# (the role applies its pinned release) reads them from to label the node
NFD_FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"


def kubernetes_files(cluster: Cluster) -> dict[str, str]:
    if cluster.spec.scheduler != "kubernetes":
        return {}
    kube = cluster.spec.kubernetes
    files = {"files/kubernetes/kubeadm.yaml": kubeadm_config(cluster)}
    for view in cluster.pools:
        files[f"files/kubernetes/containerd/{view.name}.toml"] = containerd_config(cluster, view)
    if kube.ha:
        files["files/kubernetes/haproxy.cfg"] = haproxy_config(cluster)
    if kube.etcd == "external":
        for node in cluster.head_nodes:
            files[f"files/kubernetes/etcd/{node.name}.env"] = etcd_env(cluster, node)
    files["files/kubernetes/calico.yaml"] = calico_installation(cluster)
    if cluster.has_gpus:
        files["files/kubernetes/nvidia-device-plugin.yaml"] = gpu_manifests(cluster)
    return files


def node_labels(view: PoolView) -> list[str]:
    """The labels each node of the pool registers with (kubelet's --node-labels)."""
    return [f"{GPU_LABEL}=true"] if view.profile.gpu is not None else []


# Where a cloud's internal load balancer sends a head's API traffic from, which the heads'
# firewall admits to the API servers: AWS's Network Load Balancer from its own address (client
# IP preservation off), Compute Engine's health checkers from Google's documented ranges, and
# Azure's probes from the platform's one address (the clients' own traffic keeps their
# addresses behind GCP's and Azure's balancers, which the cluster's sets already admit)
BALANCER_SOURCES = {
    "gcp": ("35.191.0.0/16", "130.211.0.0/22"),
    "azure": ("168.63.129.16/32",),
}
# who that rule admits, in each cloud (its name in the rule sets and in plan)
BALANCER_NAMES = {
    "aws": "the load balancer",
    "gcp": "Google's health checkers",
    "azure": "the load balancer's probes",
}


def api_cloud(cluster: Cluster) -> str | None:
    """The cloud whose internal load balancer fronts an HA control plane (its heads are
    there), or None: no HA control plane, or keepalived's virtual address on premises."""
    kube = cluster.spec.kubernetes
    if cluster.spec.scheduler != "kubernetes" or not kube.ha or kube.api_address is None:
        return None
    provider = cluster.pools_with_role("head")[0].pool.provider
    return provider if provider in CLOUD_PROVIDERS else None


def balancer_sources(cluster: Cluster) -> tuple[str, ...]:
    """What the heads admit to their API servers from the cloud's load balancer."""
    cloud = api_cloud(cluster)
    if cloud == "aws":
        return (f"{cluster.spec.kubernetes.api_address}/32",)
    return BALANCER_SOURCES.get(cloud or "", ())


def api_endpoint(cluster: Cluster) -> str:
    """host:port every node and kubectl reach the API at: keepalived's virtual address on
    haproxy's port, the cloud's load balancer on the API's own, or the first head."""
    kube = cluster.spec.kubernetes
    if kube.ha and kube.api_address is not None:
        port = API_PORT if api_cloud(cluster) else HA_PORT
        return f"{kube.api_address}:{port}"
    return f"{cluster.head_nodes[0].reach}:{API_PORT}"


def vrrp_router_id(name: str) -> int:
    """The VRRP router id of the API address (1-255), from the cluster's name: two clusters on
    one network get different ids unless their names collide, which plan shows."""
    return int(hashlib.sha256(name.encode()).hexdigest(), 16) % 255 + 1


def kubeadm_config(cluster: Cluster) -> str:
    spec, kube = cluster.spec, cluster.spec.kubernetes
    heads = cluster.head_nodes
    sans = [str(kube.api_address)] if kube.api_address is not None else []
    for node in heads:
        sans += [node.name] + ([str(node.address)] if node.address is not None else [])
    etcd: dict[str, object]
    if kube.etcd == "external":
        etcd = {
            "external": {
                "endpoints": [f"https://{n.reach}:{ETCD_CLIENT_PORT}" for n in heads],
                "caFile": f"{ETCD_PKI}/ca.crt",
                "certFile": f"{ETCD_PKI}/apiserver-etcd-client.crt",
                "keyFile": f"{ETCD_PKI}/apiserver-etcd-client.key",
            }
        }
    else:
        etcd = {"local": {"dataDir": "/var/lib/etcd"}}
    documents: list[dict[str, object]] = [
        {
            "apiVersion": "kubeadm.k8s.io/v1beta4",
            "kind": "ClusterConfiguration",
            "clusterName": spec.name,
            "kubernetesVersion": f"v{kube.version}",
            "controlPlaneEndpoint": api_endpoint(cluster),
            "certificatesDir": KUBE_PKI,
            "networking": {
                "podSubnet": str(kube.pod_cidr),
                "serviceSubnet": str(kube.service_cidr),
                "dnsDomain": "cluster.local",
            },
            "apiServer": {"certSANs": list(dict.fromkeys(sans))},
            "etcd": etcd,
        },
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "systemd",
            "containerRuntimeEndpoint": CONTAINERD_SOCKET,
            "clusterDomain": "cluster.local",
            # the GPU stack's own services keep their CPU and memory
            "systemReserved": {"cpu": "500m", "memory": "1Gi"},
            "kubeReserved": {"cpu": "500m", "memory": "1Gi"},
            "evictionHard": {"memory.available": "500Mi", "nodefs.available": "10%"},
        },
        {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clusterCIDR": str(kube.pod_cidr),
        },
    ]
    return _yaml(cluster, documents)


def containerd_config(cluster: Cluster, view: PoolView) -> str:
    """containerd 1.6/1.7 (configuration version 2): the CRI with systemd's cgroups, the
    pinned pause image, registries from /etc/containerd/certs.d; on GPU pools the NVIDIA
    runtime is the default (the device plugin's pods see the GPUs) and a runtime class."""
    minor = ".".join(cluster.spec.kubernetes.version.split(".")[:2])
    # overlayfs cannot mount inside a lab node, itself a container on overlayfs
    snapshotter = "native" if view.pool.provider == "lab" else "overlayfs"
    gpu = view.profile.gpu is not None
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    lines = [
        f"# {cluster.header}",
        f"# pool {view.name}: {view.profile.description}",
        "version = 2",
        "",
        f"[{cri}]",
        f'  sandbox_image = "registry.k8s.io/pause:{PAUSE_IMAGE[minor]}"',
        f"[{cri}.containerd]",
        f'  snapshotter = "{snapshotter}"',
        f'  default_runtime_name = "{"nvidia" if gpu else "runc"}"',
    ]
    runtimes = [("runc", None)] + ([("nvidia", NVIDIA_RUNTIME)] if gpu else [])
    for name, binary in runtimes:
        lines += [
            f"[{cri}.containerd.runtimes.{name}]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{cri}.containerd.runtimes.{name}.options]",
            "  SystemdCgroup = true",
        ]
        if binary is not None:
            lines.append(f'  BinaryName = "{binary}"')
    lines += [f"[{cri}.registry]", '  config_path = "/etc/containerd/certs.d"']
    return "\n".join(lines) + "\n"


def haproxy_config(cluster: Cluster) -> str:
    """haproxy on each head: the virtual address's port 8443 to every ready API server."""
    lines = [
        f"# {cluster.header}",
        "global",
        # to the journal through systemd (haproxy -Ws): no /dev/log inside the chroot
        "  log stdout format short local0",
        "  chroot /var/lib/haproxy",
        "  user haproxy",
        "  group haproxy",
        "",
        "defaults",
        "  mode tcp",
        "  log global",
        "  option tcplog",
        "  timeout connect 5s",
        # watches (kubectl get -w, controllers) hold connections for long
        "  timeout client 1h",
        "  timeout server 1h",
        "",
        "frontend kube_api",
        f"  bind *:{HA_PORT}",
        "  default_backend kube_apiservers",
        "",
        "backend kube_apiservers",
        "  balance roundrobin",
        "  option httpchk GET /readyz",
        "  http-check expect status 200",
        "  default-server check check-ssl verify none inter 2s fall 3 rise 2",
    ]
    lines += [f"  server {n.name} {n.reach}:{API_PORT}" for n in cluster.head_nodes]
    return "\n".join(lines) + "\n"


def etcd_env(cluster: Cluster, node: Node) -> str:
    """One external etcd member's settings (Debian's etcd reads /etc/default/etcd): TLS for
    clients and peers, each checked against the cluster's etcd CA."""
    me = node.reach
    initial = ",".join(f"{n.name}=https://{n.reach}:{ETCD_PEER_PORT}" for n in cluster.head_nodes)
    values = [
        ("ETCD_NAME", node.name),
        ("ETCD_DATA_DIR", f"/var/lib/etcd/{cluster.spec.name}"),
        ("ETCD_LISTEN_PEER_URLS", f"https://0.0.0.0:{ETCD_PEER_PORT}"),
        ("ETCD_LISTEN_CLIENT_URLS", f"https://0.0.0.0:{ETCD_CLIENT_PORT}"),
        ("ETCD_ADVERTISE_CLIENT_URLS", f"https://{me}:{ETCD_CLIENT_PORT}"),
        ("ETCD_INITIAL_ADVERTISE_PEER_URLS", f"https://{me}:{ETCD_PEER_PORT}"),
        ("ETCD_INITIAL_CLUSTER", initial),
        ("ETCD_INITIAL_CLUSTER_STATE", "new"),
        ("ETCD_INITIAL_CLUSTER_TOKEN", f"{cluster.spec.name}-etcd"),
        ("ETCD_CERT_FILE", f"{ETCD_PKI}/member.crt"),
        ("ETCD_KEY_FILE", f"{ETCD_PKI}/member.key"),
        ("ETCD_TRUSTED_CA_FILE", f"{ETCD_PKI}/ca.crt"),
        ("ETCD_CLIENT_CERT_AUTH", "true"),
        ("ETCD_PEER_CERT_FILE", f"{ETCD_PKI}/member.crt"),
        ("ETCD_PEER_KEY_FILE", f"{ETCD_PKI}/member.key"),
        ("ETCD_PEER_TRUSTED_CA_FILE", f"{ETCD_PKI}/ca.crt"),
        ("ETCD_PEER_CLIENT_CERT_AUTH", "true"),
    ]
    body = "\n".join(f"{key}={value}" for key, value in values)
    return f"# {cluster.header}\n# etcd member {node.name}\n{body}\n"


def _yaml(cluster: Cluster, documents: Sequence[Mapping[str, object]]) -> str:
    body = yaml.safe_dump_all(documents, explicit_start=True, sort_keys=False)
    return f"# {cluster.header}\n{body}"


def calico_installation(cluster: Cluster) -> str:
    """Calico's Installation: one IPv4 pool over the spec's pod network, VXLAN between the nodes
    (no BGP peering to set up; the firewall opens 4789/udp between nodes), each node's address
    found on the management network."""
    spec = cluster.spec
    installation = {
        "apiVersion": "operator.tigera.io/v1",
        "kind": "Installation",
        "metadata": {"name": "default"},
        "spec": {
            "calicoNetwork": {
                "bgp": "Disabled",
                "ipPools": [
                    {
                        "name": "default-ipv4-ippool",
                        "cidr": str(spec.kubernetes.pod_cidr),
                        "blockSize": 26,
                        "encapsulation": "VXLAN",
                        "natOutgoing": "Enabled",
                        "nodeSelector": "all()",
                    }
                ],
                "nodeAddressAutodetectionV4": {"cidrs": [str(spec.network.management.cidr)]},
            },
        },
    }
    return _yaml(cluster, [installation])


def gpu_manifests(cluster: Cluster) -> str:
    """The `nvidia` runtime class, NVIDIA's device plugin and GPU feature discovery on the GPU
    pools' nodes. The plugin advertises nvidia.com/gpu (and each MIG profile, where a pool has
    MIG) to the kubelet; feature discovery labels each node with what its GPUs are
    (nvidia.com/gpu.product, .count, .memory, the driver's and CUDA's versions, MIG's state).
    The host's driver and container toolkit, installed by the GPU roles, are used as they are."""
    strategy = "mixed" if any(view.pool.mig for view in cluster.pools) else "none"
    runtime_class = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"},
        "handler": "nvidia",
        "scheduling": {"nodeSelector": {GPU_LABEL: "true"}},
    }
    plugins = "/var/lib/kubelet/device-plugins"
    plugin = {
        "env": [
            {"name": "FAIL_ON_INIT_ERROR", "value": "true"},
            {"name": "MIG_STRATEGY", "value": strategy},
        ],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "device-plugins", "mountPath": plugins}],
    }
    # feature discovery (the plugin's image, its second program): every minute it writes the
    # node's GPU labels to a file that Node Feature Discovery's worker turns into the node's
    # labels. Privileged, as NVIDIA ships it: it reads MIG's capability devices and the
    # machine's type from /sys.
    discovery = {
        "command": ["/usr/bin/gpu-feature-discovery"],
        "env": [
            {"name": "GFD_FAIL_ON_INIT_ERROR", "value": "true"},
            {"name": "GFD_SLEEP_INTERVAL", "value": "60s"},
            {"name": "MIG_STRATEGY", "value": strategy},
        ],
        "securityContext": {"privileged": True},
        "volumeMounts": [
            {"name": "output-dir", "mountPath": NFD_FEATURES_DIR},
            {"name": "host-sys", "mountPath": "/sys", "readOnly": True},
        ],
    }
    documents: list[Mapping[str, object]] = [
        runtime_class,
        _gpu_daemonset(
            "nvidia-device-plugin",
            plugin,
            [{"name": "device-plugins", "hostPath": {"path": plugins}}],
        ),
        _gpu_daemonset(
            "gpu-feature-discovery",
            discovery,
            [
                {
                    "name": "output-dir",
                    "hostPath": {"path": NFD_FEATURES_DIR, "type": "DirectoryOrCreate"},
                },
                {"name": "host-sys", "hostPath": {"path": "/sys", "type": "Directory"}},
            ],
        ),
    ]
    return _yaml(cluster, documents)


def _gpu_daemonset(
    name: str, container: Mapping[str, object], volumes: Sequence[Mapping[str, object]]
) -> dict[str, object]:
    """A DaemonSet of NVIDIA's image on every node with the GPU label, through the `nvidia`
    runtime, critical to the node, past the GPU taint."""
    labels = {"app.kubernetes.io/name": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": "kube-system", "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {GPU_LABEL: "true"},
                    "priorityClassName": "system-node-critical",
                    "runtimeClassName": "nvidia",
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "CriticalAddonsOnly", "operator": "Exists"},
                    ],
                    "containers": [{"name": name, "image": DEVICE_PLUGIN_IMAGE, **container}],
                    "volumes": volumes,
                },
            },
        },
    }

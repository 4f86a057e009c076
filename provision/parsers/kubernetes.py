"""Parsers and findings of what a Kubernetes cluster says (`kubectl get ... -o json`): pure
functions on the standard library, for scripts/k8s-check.py on a real cluster and, later,
verify. No API server runs here: tests/data/kubernetes/ holds outputs written in kubectl's JSON
form, healthy and not."""

from __future__ import annotations

import json
from dataclasses import dataclass

GPU_RESOURCE = "nvidia.com/gpu"
# the labels GPU feature discovery gives a GPU node (through Node Feature Discovery)
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
ROLE_LABEL = "node-role.kubernetes.io/"
# the static pods kubeadm runs on each control-plane node (etcd only when stacked)
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")


@dataclass(frozen=True)
class KubeNode:
    name: str
    ready: bool
    roles: frozenset[str]
    unschedulable: bool
    gpus_capacity: int
    gpus_allocatable: int
    kubelet_version: str
    gpu_product: str = ""  # GPU feature discovery's labels; empty where it has not labelled
    gpu_count: int = 0


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    node: str
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    ready: bool
    restarts: int


def _items(text: str) -> list[dict[str, object]]:
    doc = json.loads(text)
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise ValueError("not a kubectl list (no 'items')")
    return [i for i in items if isinstance(i, dict)]


def _get(obj: object, *keys: str) -> object:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _count(value: object) -> int:
    try:
        return int(str(value)) if value is not None else 0
    except ValueError:
        return 0


def parse_nodes(text: str) -> list[KubeNode]:
    """`kubectl get nodes -o json` -> the nodes, by name."""
    nodes = []
    for item in _items(text):
        labels = _get(item, "metadata", "labels") or {}
        assert isinstance(labels, dict)
        conditions = _get(item, "status", "conditions")
        ready = isinstance(conditions, list) and any(
            isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
            for c in conditions
        )
        nodes.append(
            KubeNode(
                name=str(_get(item, "metadata", "name")),
                ready=ready,
                roles=frozenset(k[len(ROLE_LABEL) :] for k in labels if k.startswith(ROLE_LABEL)),
                unschedulable=bool(_get(item, "spec", "unschedulable")),
                gpus_capacity=_count(_get(item, "status", "capacity", GPU_RESOURCE)),
                gpus_allocatable=_count(_get(item, "status", "allocatable", GPU_RESOURCE)),
                kubelet_version=str(_get(item, "status", "nodeInfo", "kubeletVersion") or ""),
                gpu_product=str(labels.get(GPU_PRODUCT_LABEL) or ""),
                gpu_count=_count(labels.get(GPU_COUNT_LABEL)),
            )
        )
    return sorted(nodes, key=lambda n: n.name)


def parse_pods(text: str) -> list[Pod]:
    """`kubectl get pods -A -o json` -> the pods."""
    pods = []
    for item in _items(text):
        statuses = _get(item, "status", "containerStatuses") or []
        assert isinstance(statuses, list)
        pods.append(
            Pod(
                namespace=str(_get(item, "metadata", "namespace") or "default"),
                name=str(_get(item, "metadata", "name")),
                node=str(_get(item, "spec", "nodeName") or ""),
                phase=str(_get(item, "status", "phase") or "Unknown"),
                ready=bool(statuses) and all(s.get("ready") is True for s in statuses),
                restarts=sum(_count(s.get("restartCount")) for s in statuses),
            )
        )
    return pods


def node_findings(
    nodes: list[KubeNode], expected: dict[str, tuple[str, int]], version: str | None = None
) -> list[str]:
    """What is wrong with the nodes against {name: (role, GPUs)}: role 'control-plane' or
    'worker'. Empty when every expected node is there, Ready, schedulable where it should take
    work, with the right role, its GPUs allocatable and labelled by GPU feature discovery
    (product and count), and at the release."""
    found = {n.name: n for n in nodes}
    problems = [f"{name}: not in the cluster" for name in sorted(set(expected) - set(found))]
    problems += [
        f"{name}: in the cluster but not in the spec" for name in sorted(set(found) - set(expected))
    ]
    for name, (role, gpus) in sorted(expected.items()):
        node = found.get(name)
        if node is None:
            continue
        if not node.ready:
            problems.append(f"{name}: not Ready")
        if role == "control-plane" and "control-plane" not in node.roles:
            problems.append(f"{name}: has no control-plane role (roles: {sorted(node.roles)})")
        if role == "worker":
            if "control-plane" in node.roles:
                problems.append(f"{name}: a worker with the control-plane role")
            if node.unschedulable:
                problems.append(f"{name}: cordoned (unschedulable)")
        if node.gpus_allocatable != gpus:
            capacity = f" ({node.gpus_capacity} in capacity)" if node.gpus_capacity != gpus else ""
            problems.append(
                f"{name}: {node.gpus_allocatable} {GPU_RESOURCE} allocatable, "
                f"the profile has {gpus}{capacity}"
            )
        if gpus and not node.gpu_product:
            problems.append(
                f"{name}: no {GPU_PRODUCT_LABEL} label (GPU feature discovery has not labelled it)"
            )
        elif gpus and node.gpu_count != gpus:
            problems.append(
                f"{name}: GPU feature discovery counts {node.gpu_count} GPUs "
                f"({GPU_COUNT_LABEL}), the profile has {gpus}"
            )
        if version is not None and node.kubelet_version != f"v{version}":
            problems.append(
                f"{name}: kubelet {node.kubelet_version or '?'}, the spec pins v{version}"
            )
    return problems


def control_plane_findings(pods: list[Pod], heads: list[str], stacked_etcd: bool) -> list[str]:
    """Each head runs kubeadm's static pods (name-<node>) in kube-system, Running and ready."""
    wanted = CONTROL_PLANE + (("etcd",) if stacked_etcd else ())
    by_name = {(p.namespace, p.name): p for p in pods}
    problems = []
    for head in heads:
        for component in wanted:
            pod = by_name.get(("kube-system", f"{component}-{head}"))
            if pod is None:
                problems.append(f"{head}: no {component} pod")
            elif pod.phase != "Running" or not pod.ready:
                problems.append(
                    f"{head}: {component} is {pod.phase}{'' if pod.ready else ', not ready'}"
                )
    return problems


def unhealthy_pods(pods: list[Pod], namespaces: tuple[str, ...] = ("kube-system",)) -> list[str]:
    """Pods of these namespaces that are neither Running and ready nor Succeeded."""
    out = []
    for pod in pods:
        if pod.namespace not in namespaces or pod.phase == "Succeeded":
            continue
        if pod.phase != "Running" or not pod.ready:
            out.append(f"{pod.namespace}/{pod.name} on {pod.node or '?'}: {pod.phase}")
    return out


def gpu_pod_findings(phase: str, log: str, gpus: int) -> list[str]:
    """The GPU test pod (nvidia-smi -L, one GPU requested) ended Succeeded and listed exactly
    the GPUs it was given."""
    listed = [line for line in log.splitlines() if line.startswith("GPU ")]
    problems = []
    if phase != "Succeeded":
        problems.append(f"the GPU pod ended {phase}")
    if len(listed) != gpus:
        problems.append(f"the GPU pod saw {len(listed)} GPU(s), it asked for {gpus}")
    return problems

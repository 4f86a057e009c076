"""Verify of a Kubernetes cluster, through kubectl on the first head that answers: every node
Ready with its role and release and its GPUs allocatable and labelled by GPU feature discovery,
kubeadm's control-plane pods on every head, every kube-system pod healthy, a pod asking for one
GPU running nvidia-smi to completion; and from this machine, the API open and the kubelet and
etcd closed (the firewall)."""

from __future__ import annotations

import json
import shlex
import time

from provision.cluster import Cluster
from provision.parsers import kubernetes as kp
from provision.render.kubernetes import API_PORT, ETCD_CLIENT_PORT, HA_PORT
from provision.verify.base import CheckResult, VerifyContext, closed_ports, probe_ports
from provision.verify.remote import Remote

KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
GPU_POD = "provision-verify-gpu"
GPU_IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
KUBELET_PORT = 10250


def expected_nodes(cluster: Cluster) -> dict[str, tuple[str, int]]:
    """{node: (role, nvidia.com/gpu allocatable)}: the heads are the control plane, with no GPU
    advertised (the device plugin keeps off their taint); a MIG pool advertises its profiles
    instead of whole GPUs."""
    out: dict[str, tuple[str, int]] = {}
    for view in cluster.pools:
        gpu = view.profile.gpu
        head = view.pool.role == "head"
        gpus = gpu.count if gpu is not None and not head and not view.pool.mig else 0
        for node in view.nodes:
            if not node.elastic:
                out[node.name] = ("control-plane" if head else "worker", gpus)
    return out


def gpu_pod_manifest(workers: list[str], image: str = GPU_IMAGE) -> dict[str, object]:
    """A pod asking for one GPU on one of `workers`, listing what it was given."""
    term = {
        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": workers}]
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": GPU_POD, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            },
            "containers": [
                {
                    "name": "nvidia-smi",
                    "image": image,
                    "command": ["nvidia-smi", "-L"],
                    "resources": {"limits": {kp.GPU_RESOURCE: 1}},
                }
            ],
        },
    }


def _head(ctx: VerifyContext, remotes: dict[str, Remote]) -> tuple[str, Remote] | None:
    for node in ctx.cluster.head_nodes:
        if node.name in remotes:
            return node.name, remotes[node.name]
    return None


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "no output")


def check_kubernetes(
    ctx: VerifyContext, remotes: dict[str, Remote], gpu_wait_s: float = 300.0
) -> list[CheckResult]:
    found = _head(ctx, remotes)
    if found is None:
        return [CheckResult("kubernetes API", "cluster", False, "no head answers over SSH")]
    name, head = found
    cluster = ctx.cluster
    kube = cluster.spec.kubernetes
    nodes_out = head.run(f"{KUBECTL} get nodes -o json", sudo=True)
    if nodes_out.rc != 0:
        why = _first_line(nodes_out.stderr or nodes_out.stdout)
        return [CheckResult("kubernetes API", name, False, f"kubectl get nodes: {why}")]
    pods_out = head.run(f"{KUBECTL} get pods -A -o json", sudo=True)
    expected = expected_nodes(cluster)
    results = [CheckResult("kubernetes API", name, True, f"answers through {name}'s kubectl")]
    problems = kp.node_findings(kp.parse_nodes(nodes_out.stdout), expected, kube.version)
    results.append(_result("kubernetes nodes", problems, f"all {len(expected)} Ready"))
    pods = kp.parse_pods(pods_out.stdout) if pods_out.rc == 0 else []
    heads = [n.name for n in cluster.head_nodes]
    problems = kp.control_plane_findings(pods, heads, kube.etcd == "stacked")
    if pods_out.rc != 0:
        problems = [f"kubectl get pods: {_first_line(pods_out.stderr)}"]
    results.append(_result("kubernetes control plane", problems, f"{len(heads)} head(s) healthy"))
    problems = kp.unhealthy_pods(pods) if pods_out.rc == 0 else problems
    results.append(_result("kube-system pods", problems, "all Running and ready"))
    workers = [n for n, (role, gpus) in expected.items() if role == "worker" and gpus]
    if workers:
        results.append(_gpu_pod(head, workers, gpu_wait_s))
    return results


def _gpu_pod(head: Remote, workers: list[str], wait_s: float) -> CheckResult:
    manifest = shlex.quote(json.dumps(gpu_pod_manifest(workers)))
    head.run(f"{KUBECTL} delete pod {GPU_POD} --ignore-not-found --wait=true", sudo=True)
    made = head.run(f"echo {manifest} | {KUBECTL} apply -f -", sudo=True)
    if made.rc != 0:
        return CheckResult("a pod with one GPU", "cluster", False, _first_line(made.stderr))
    phase, deadline = "Pending", time.monotonic() + wait_s
    status = f"{KUBECTL} get pod {GPU_POD} -o jsonpath={{.status.phase}}"
    while phase in ("Pending", "Running", "Unknown", "") and time.monotonic() < deadline:
        time.sleep(2)
        phase = head.run(status, sudo=True).stdout.strip()
    log = head.run(f"{KUBECTL} logs {GPU_POD}", sudo=True).stdout if phase != "Pending" else ""
    head.run(f"{KUBECTL} delete pod {GPU_POD} --wait=false", sudo=True)
    problems = kp.gpu_pod_findings(phase, log, 1)
    return _result("a pod with one GPU", problems, f"nvidia-smi saw 1 GPU ({phase})")


def _result(check: str, problems: list[str], passed: str) -> CheckResult:
    evidence = passed if not problems else "; ".join(problems[:5])
    if len(problems) > 5:
        evidence += f"; and {len(problems) - 5} more"
    return CheckResult(check, "cluster", not problems, evidence)


def check_kubernetes_ports(ctx: VerifyContext) -> list[CheckResult]:
    """From this machine (an admin address): each head's API port open; the kubelet's and
    etcd's ports closed on every node (nftables lets only the heads reach them)."""
    cluster = ctx.cluster
    nodes = [n for n in cluster.lasting_nodes if n.address is not None]
    api = [API_PORT] + ([HA_PORT] if cluster.spec.kubernetes.ha else [])
    probes = [(n, p) for n in nodes for p in (api if n.role == "head" else [])]
    probes += [(n, p) for n in nodes for p in [KUBELET_PORT, ETCD_CLIENT_PORT]]
    states = probe_ports(probes)
    results = []
    for node in nodes:
        if node.role == "head":
            opened = {p: states[(node, p)] for p in api}
            # the API is reachable (open), or nothing listens yet (refused); not filtered
            ok = all(state in ("open", "refused") for state in opened.values())
            evidence = ", ".join(f"{p} {state}" for p, state in opened.items())
            results.append(CheckResult("kubernetes API from workstation", node.name, ok, evidence))
        closed = [KUBELET_PORT, ETCD_CLIENT_PORT]
        results.append(closed_ports("kubelet and etcd from workstation", node, states, closed))
    return results

#!/usr/bin/env python3
"""Check a Kubernetes GPU cluster the way verify will, with nothing but python3 and kubectl
(its current context is the cluster).

    scripts/k8s-check.py --heads cp001,cp002,cp003 --workers gpu001,gpu002 --gpus 8 \\
        --version 1.33.5 [--stacked-etcd] [--gpu-image IMAGE] [--record DIR]

Checks: every node there and Ready, with its role, at the release, workers schedulable with the
profile's GPUs allocatable (nvidia.com/gpu) and labelled by GPU feature discovery
(nvidia.com/gpu.product, nvidia.com/gpu.count); kubeadm's static pods Running on every head (etcd
too when stacked); every kube-system pod Running and ready; a pod asking for one GPU runs
`nvidia-smi -L` to completion on a worker and sees exactly one GPU. --record DIR keeps every
command's raw output, so a run on a real cluster can become test data (tests/data/kubernetes/).
Exit 0 when every check passes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parsers_by_path import load

kp = load("kubernetes")
POD = "provision-gpu-check"


def kubectl(args: list[str], record: Path | None, name: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=120, check=False
    )
    if record is not None:
        (record / name).write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        sys.exit(f"kubectl {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def gpu_pod(image: str, workers: list[str], record: Path | None, wait: float) -> list[str]:
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": workers,
                                    }
                                ]
                            }
                        ]
                    }
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
    kubectl(["delete", "pod", POD, "--ignore-not-found", "--wait=true"], None, "")
    kubectl(["apply", "-f", "-"], record, "gpu-pod-apply.txt", json.dumps(manifest))
    phase, deadline = "Pending", time.monotonic() + wait
    while phase in ("Pending", "Running", "Unknown", "") and time.monotonic() < deadline:
        time.sleep(2)
        phase = kubectl(["get", "pod", POD, "-o", "jsonpath={.status.phase}"], None, "")
    log = kubectl(["logs", POD], record, "gpu-pod-log.txt") if phase != "Pending" else ""
    kubectl(["delete", "pod", POD, "--wait=false"], None, "")
    return kp.gpu_pod_findings(phase, log, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", required=True, help="control-plane node names, comma-separated")
    parser.add_argument("--workers", required=True, help="GPU worker node names, comma-separated")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs per worker (the profile's)")
    parser.add_argument("--version", help="the release every kubelet must run (1.33.5)")
    parser.add_argument("--stacked-etcd", action="store_true", help="kubeadm runs etcd")
    parser.add_argument("--gpu-image", default="nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04")
    parser.add_argument("--wait", type=float, default=300, help="seconds for the GPU pod")
    parser.add_argument("--record", type=Path, help="keep the raw outputs in this directory")
    args = parser.parse_args()
    if args.record:
        args.record.mkdir(parents=True, exist_ok=True)
    heads = [h for h in args.heads.split(",") if h]
    workers = [w for w in args.workers.split(",") if w]
    expected = {h: ("control-plane", 0) for h in heads} | {
        w: ("worker", args.gpus) for w in workers
    }

    nodes = kp.parse_nodes(kubectl(["get", "nodes", "-o", "json"], args.record, "nodes.json"))
    pods = kp.parse_pods(kubectl(["get", "pods", "-A", "-o", "json"], args.record, "pods.json"))
    checks = {
        "nodes": kp.node_findings(nodes, expected, args.version),
        "control plane": kp.control_plane_findings(pods, heads, args.stacked_etcd),
        "kube-system pods": kp.unhealthy_pods(pods),
    }
    checks["a pod with one GPU"] = gpu_pod(args.gpu_image, workers, args.record, args.wait)
    failed = 0
    for name, problems in checks.items():
        print(f"{'FAIL' if problems else 'PASS'} {name}")
        for problem in problems:
            print(f"     {problem}")
        failed += bool(problems)
    print(f"k8s-check: {len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Render a generated 10,000-node spec (10 pools) and print how long it takes.

Targets (issue: the spec, the renderer and the CLI): under 1 second, slurm.conf under 200 lines.
`--kubernetes`: a 1,000-node Kubernetes spec instead (three heads with the API's virtual
address and an external etcd, four GPU pools), its files and time.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from provision import converged
from provision.cluster import Cluster
from provision.render import render, write_render
from provision.spec import load_spec

NODES = 10_000
POOLS = 10


def generate(path: Path) -> None:
    per_pool = (NODES - 2) // (POOLS - 1)
    lines = [
        "name: bench",
        "os: ubuntu22.04",
        "slurm: {accounting: true}",
        "network:",
        "  management: {cidr: 10.64.0.0/14}",
        # eight rails, each as large as the management network: every node keeps its offset
        "  fabric: {kind: infiniband, subnet: 10.128.0.0/11}",
        "pools:",
        "  - {name: head, role: head, profile: cpu-node, count: 1, first_address: 10.64.0.11}",
    ]
    remaining = NODES - 2
    for i in range(POOLS - 1):
        count = per_pool if i < POOLS - 2 else remaining
        remaining -= count
        lines.append(
            f"  - {{name: gpu{i}, role: compute, profile: dgx-h100, count: {count}, "
            f"index_width: 5, first_address: 10.{65 + i // 4}.{(i % 4) * 64}.1}}"
        )
    lines += ["security: {admin_cidrs: [10.0.0.0/24]}"]
    path.write_text("\n".join(lines) + "\n")


K8S_NODES = 1_000


def generate_kubernetes(path: Path) -> None:
    lines = [
        "name: benchk8s",
        "os: ubuntu24.04",
        "scheduler: kubernetes",
        "kubernetes: {ha: true, api_address: 10.64.0.5, etcd: external}",
        "network:",
        "  management: {cidr: 10.64.0.0/16}",
        "pools:",
        "  - {name: cp, role: head, profile: cpu-node, count: 3, first_address: 10.64.0.11}",
    ]
    per_pool = (K8S_NODES - 3) // 4
    for i in range(4):
        count = per_pool if i < 3 else K8S_NODES - 3 - 3 * per_pool
        lines.append(
            f"  - {{name: gpu{i}, role: compute, profile: dgx-h100, count: {count}, "
            f"index_width: 4, first_address: 10.64.{1 + i}.1}}"
        )
    lines += ["security: {admin_cidrs: [10.0.0.0/24]}"]
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    kubernetes = "--kubernetes" in sys.argv[1:]
    work = Path(tempfile.mkdtemp(prefix="provision-bench-"))
    try:
        spec_path = work / "bench.yaml"
        (generate_kubernetes if kubernetes else generate)(spec_path)
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            cluster = Cluster(load_spec(spec_path))
            loaded = time.perf_counter()
            files = render(cluster)
            rendered = time.perf_counter()
            shutil.rmtree(work / "out", ignore_errors=True)
            write_render(files, work / "out")
            written = time.perf_counter()
            runs.append(
                (loaded - started, rendered - loaded, written - rendered, written - started)
            )
        nodes = len(cluster.nodes)
        total_bytes = sum(len(c) for c in files.values())
        med = [statistics.median(r[i] for r in runs) for i in range(4)]
        if kubernetes:
            kube = [f for f in files if f.startswith("files/kubernetes/")]
            print(f"nodes: {nodes} in {len(cluster.pools)} pools (kubernetes)")
            print(f"load+validate+expand: {med[0]:.3f} s")
            print(f"render:               {med[1]:.3f} s")
            print(f"write:                {med[2]:.3f} s")
            print(f"total (median of 5):  {med[3]:.3f} s")
            print(f"files: {len(files)} ({len(kube)} of Kubernetes), {total_bytes / 1e6:.2f} MB")
            return 0
        slurm_lines = len(files["files/slurm/slurm.conf"].splitlines())
        started = time.perf_counter()
        converged.prints(files, work / "secrets")  # what plan and apply add to the render
        fingerprints = time.perf_counter() - started
        print(f"nodes: {nodes} in {len(cluster.pools)} pools")
        print(f"load+validate+expand: {med[0]:.3f} s")
        print(f"render:               {med[1]:.3f} s")
        print(f"write:                {med[2]:.3f} s")
        print(f"total (median of 5):  {med[3]:.3f} s   target < 1 s")
        print(f"slurm.conf lines:     {slurm_lines}   target < 200")
        print(f"fingerprints per node (plan, apply): {fingerprints:.3f} s")
        print(f"files: {len(files)}, {total_bytes / 1e6:.2f} MB in all")
        return 0 if med[3] < 1.0 and slurm_lines < 200 else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""What the health checks on each compute pool's nodes expect (files/health/<pool>.json): free
space, the spec's mounts, and the GPUs and fabric ports the pool's profile promises. The
program that reads it is provision/health/; verify checks the GPUs against the same promise."""

from __future__ import annotations

import dataclasses
import json

from provision.cluster import Cluster, PoolView
from provision.health import DIAG_STATE, DRAIN_RECORD
from provision.parsers.dcgm import DIAG_TIMEOUT_S
from provision.parsers.gpu import GpuExpect
from provision.spec.fabric import rails
from provision.spec.nodes import lab_container

# where the node exporter's textfile collector reads (the node_exporter role's default)
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"


def gpu_expect(view: PoolView, driver: str | None) -> GpuExpect | None:
    gpu = view.profile.gpu
    if gpu is None:
        return None
    return GpuExpect(
        count=gpu.count,
        family=gpu.slurm_type,
        memory_gib=gpu.memory_gib,
        driver=driver,
        nvlink_links=gpu.nvlink_links,
        pcie_gen=gpu.pcie_gen,
        pcie_width=gpu.pcie_width,
        nvswitch=gpu.nvswitch,
        busbw_gbs=gpu.nccl_busbw_gbs,
        mig=bool(view.pool.mig),
    )


DIAG_EVERY_S = 86400  # a periodic DCGM diagnostic passes once a day unless the spec says
# when the periodic DCGM diagnostic last passed on the node (its modification time)
DIAG_LAST_PASS = "/var/lib/provision/health/dcgm-diag.passed"


def health_files(cluster: Cluster) -> dict[str, str]:
    spec = cluster.spec
    if spec.health is None or spec.scheduler != "slurm":
        return {}
    out = {}
    for view in cluster.pools_with_role("compute"):
        out[f"files/health/{view.name}.json"] = (
            json.dumps(health_config(cluster, view), indent=2, sort_keys=True) + "\n"
        )
    return out


def health_config(cluster: Cluster, view: PoolView) -> dict[str, object]:
    spec = cluster.spec
    assert spec.health is not None
    mounts = [m.path for m in spec.storage.mounts if m.pools is None or view.name in m.pools]
    config: dict[str, object] = {
        "disks": [d.model_dump() for d in spec.health.disks],
        "mounts": mounts,
        "textfile_dir": TEXTFILE_DIR if spec.monitoring is not None else None,
        "drain_record": DRAIN_RECORD,
        "interval": spec.health.interval,  # slurmd's; a long diagnostic's timer checks as often
    }
    want = gpu_expect(view, spec.software.nvidia_driver)
    if want is not None and view.pool.provider != "lab":
        config["gpu"] = dataclasses.asdict(want)
    diag = spec.health.dcgm_diag
    if want is not None and diag is not None and view.pool.provider != "lab":
        config["dcgm_diag"] = {
            "level": diag.level,
            "when": diag.when,
            "every": diag.every or DIAG_EVERY_S,
            "last_pass_file": DIAG_LAST_PASS,
            "state_file": DIAG_STATE,
            # the longest a run may take: the diagnostic's own limit (its timer's unit has it)
            "timeout_s": DIAG_TIMEOUT_S[diag.level],
        }
    # the prolog runs on every node of the cluster: it checks the GPU pools' nodes only
    config["prolog"] = spec.health.prolog and view.profile.gpu is not None
    pool_rails = rails(view.profile, spec.network.fabric.kind)
    if pool_rails and not lab_container(view.pool):  # a lab container has no adapter
        config["fabric"] = {
            "devices": [r.device for r in pool_rails if r.device],
            "count": len(pool_rails),
            "rate_gbps": pool_rails[0].rate_gbps,
            "link_layer": "InfiniBand" if spec.network.fabric.kind == "infiniband" else "Ethernet",
        }
    return config

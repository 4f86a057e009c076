#!/usr/bin/env python3
"""Run provision's GPU checks on this host, with nothing but python3 and the NVIDIA tools.

    scripts/gpu-check.py --profile dgx-h100 [--driver 550.90.07] [--record DIR]

Checks: GPU count, model and memory against the profile; driver pin; persistence mode; ECC,
retired pages and row remapping; PCIe generation and width; NVLink links up; the fabric
manager where the profile has NVSwitch; an NCCL all_reduce_perf bus bandwidth at the profile's
threshold (when nccl-tests is built). --record DIR keeps every command's raw output, so a run on
real hardware can become test data (tests/data/nvidia/). Exit 0 when every check passes.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "gpu_parsers", ROOT / "provision" / "verify" / "gpu_parsers.py"
)
assert _spec and _spec.loader
gp = importlib.util.module_from_spec(_spec)
sys.modules["gpu_parsers"] = gp  # dataclasses look their module up while the file loads
_spec.loader.exec_module(gp)


def profile_gpu(name: str) -> dict[str, object]:
    """The gpu: block of a built-in profile, read without a YAML library."""
    path = ROOT / "provision" / "profiles" / f"{name}.yaml"
    if not path.exists():
        sys.exit(f"no profile {name}: see {path.parent}")
    block: dict[str, object] = {}
    inside = False
    for line in path.read_text().splitlines():
        if line.startswith("gpu:"):
            inside = True
            continue
        if inside and not line.startswith("  "):
            break
        if inside:
            key, _, value = line.strip().partition(":")
            value = value.split("#")[0].strip()
            if re.fullmatch(r"[0-9]+", value):
                block[key] = int(value)
            elif re.fullmatch(r"[0-9]+\.[0-9]+", value):
                block[key] = float(value)
            elif value in ("true", "false"):
                block[key] = value == "true"
            else:
                block[key] = value
    if not block:
        sys.exit(f"profile {name} has no GPUs")
    return block


def run(
    command: list[str], record: Path | None, name: str, timeout: float = 900
) -> tuple[int, str]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        rc, out = done.returncode, done.stdout + done.stderr
    except FileNotFoundError:
        rc, out = 127, f"{command[0]}: not found\n"
    except subprocess.TimeoutExpired:
        rc, out = 124, f"{' '.join(command)}: timed out after {timeout:.0f}s\n"
    if record is not None:
        (record / name).write_text(out)
    return rc, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="hardware profile, e.g. dgx-h100")
    parser.add_argument("--driver", help="pinned driver branch or version, e.g. 550.90.07")
    parser.add_argument("--all-reduce", default="/opt/nccl-tests/build/all_reduce_perf")
    parser.add_argument("--record", type=Path, help="keep the raw outputs in this directory")
    args = parser.parse_args()
    g = profile_gpu(args.profile)
    want = gp.GpuExpect(
        count=int(g["count"]),
        family=str(g["slurm_type"]),
        memory_gib=int(g["memory_gib"]),
        driver=args.driver,
        nvlink_links=int(g.get("nvlink_links", 0)),
        pcie_gen=g.get("pcie_gen"),
        pcie_width=g.get("pcie_width"),
        nvswitch=bool(g.get("nvswitch")),
        busbw_gbs=g.get("nccl_busbw_gbs"),
    )
    if args.record:
        args.record.mkdir(parents=True, exist_ok=True)
    smi = ["nvidia-smi"]
    rc, query = run(
        [*smi, f"--query-gpu={gp.GPU_QUERY}", "--format=csv,noheader,nounits"],
        args.record,
        "query-gpu.csv",
    )
    if rc != 0:
        print(f"FAIL gpu.count: nvidia-smi failed: {query.strip()[:200]}")
        return 1
    _, remapped = run(
        [*smi, f"--query-remapped-rows={gp.REMAPPED_QUERY}", "--format=csv,noheader"],
        args.record,
        "remapped-rows.csv",
    )
    _, nvlink = run([*smi, "nvlink", "--status"], args.record, "nvlink-status.txt")
    run([*smi, "-q"], args.record, "nvidia-smi-q.txt")
    run([*smi, "topo", "-m"], args.record, "topo-m.txt")
    findings = gp.gpu_findings(
        want,
        gp.parse_gpu_query(query),
        gp.parse_remapped_rows(remapped),
        gp.parse_nvlink_status(nvlink),
    )
    if want.nvswitch:
        _, fm = run(
            ["systemctl", "is-active", "nvidia-fabricmanager"], args.record, "fabricmanager.txt"
        )
        findings.append(("gpu.fabricmanager", fm.strip() == "active", fm.strip()))
    if Path(args.all_reduce).exists():
        _, out = run(
            [args.all_reduce, "-b", "1G", "-e", "8G", "-f", "2", "-g", str(want.count)],
            args.record,
            "all-reduce.txt",
        )
        findings.append(gp.all_reduce_finding(want, gp.parse_all_reduce(out)))
    else:
        print(f"skip nccl.all_reduce: no {args.all_reduce} (build nccl-tests)")
    for check, passed, evidence in findings:
        print(f"{'ok  ' if passed else 'FAIL'} {check}: {evidence}")
    return 0 if all(passed for _, passed, _ in findings) else 1


if __name__ == "__main__":
    sys.exit(main())

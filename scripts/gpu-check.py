#!/usr/bin/env python3
"""Run provision's GPU checks on this host, with nothing but python3 and the NVIDIA tools.

    scripts/gpu-check.py --profile dgx-h100 [--driver 550.90.07] [--record DIR]

Checks: GPU count, model and memory against the profile; driver pin; persistence mode; ECC,
retired pages and row remapping; PCIe generation and width; NVLink links up; the fabric
manager where the profile has NVSwitch; an NCCL all_reduce_perf bus bandwidth at the profile's
threshold (when nccl-tests is built); DCGM's level-1 diagnostics (when dcgmi is installed).
--record DIR keeps every command's raw output, so a run on real hardware can become test data
(tests/data/nvidia/, tests/data/dcgm/). Exit 0 when every check passes.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parsers_by_path import ROOT, load

gp = load("gpu")
dcgm = load("dcgm")


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


def run(command: str, record: Path | None, name: str, timeout: float = 900) -> tuple[int, str]:
    try:
        done = subprocess.run(
            command, shell=True, capture_output=True, text=True, timeout=timeout, check=False
        )
        rc, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        rc, out = 124, f"{command}: timed out after {timeout:.0f}s\n"
    if record is not None:
        (record / name).write_text(out)
    return rc, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="hardware profile, e.g. dgx-h100")
    parser.add_argument("--driver", help="pinned driver branch or version, e.g. 550.90.07")
    parser.add_argument("--all-reduce", default=gp.ALL_REDUCE)
    parser.add_argument(
        "--mig", action="store_true", help="the GPUs are split into MIG instances (the pool's mig)"
    )
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
        mig=args.mig,
    )
    if args.record:
        args.record.mkdir(parents=True, exist_ok=True)
    all_reduce = args.all_reduce if Path(args.all_reduce).exists() else None
    if all_reduce is None:
        print(f"skip nccl.all_reduce: no {args.all_reduce} (build nccl-tests)")
    outputs = {
        name: run(command, args.record, name)
        for name, command in gp.gpu_commands(want, all_reduce).items()
    }
    if outputs[gp.QUERY_GPU][0] != 0:  # why nvidia-smi cannot reach the GPUs
        outputs[gp.DRIVER_STATE] = run(gp.DRIVER_STATE_COMMAND, args.record, gp.DRIVER_STATE)
    if args.record:  # for reference beside the test data
        run("nvidia-smi -q", args.record, "nvidia-smi-q.txt")
        run("nvidia-smi topo -m", args.record, "topo-m.txt")
    findings = gp.findings_from(want, outputs)
    if shutil.which("dcgmi"):  # DCGM's quick diagnostics, as the health checks run them
        code, out = run(dcgm.diag_command(1), args.record, "dcgm-diag-r1.txt")
        report = dcgm.parse_diag(out)
        if report is None:
            findings.append(("dcgm.diag", False, f"rc {code}: {out.strip()[:160]}"))
        else:
            passed = f"{report.tests} results passed (DCGM {report.version})"
            findings.append(
                ("dcgm.diag", not report.failures, "; ".join(report.failures) or passed)
            )
    else:
        print("skip dcgm.diag: no dcgmi (DCGM is not installed)")
    for check, passed, evidence in findings:
        print(f"{'ok  ' if passed else 'FAIL'} {check}: {evidence}")
    return 0 if all(passed for _, passed, _ in findings) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Run provision's fabric checks on this host, with nothing but python3 and the RDMA tools.

    scripts/fabric-check.py --count 8 --rate 400 [--devices mlx5_0,mlx5_3,...] [--roce]
                            [--peer HOST] [--record DIR]

Checks: the adapters are present and their ports Active/LinkUp at the rate; the subnet manager
answers as master (InfiniBand); link-down counters per adapter; with --peer, ib_write_bw from
here to HOST (where `ib_write_bw -d DEV --report_gbits -F -D 5` must already be listening) on
the first adapter. --record DIR keeps every command's raw output, so a run on a real fabric
can become test data (tests/data/fabric/). Exit 0 when every check passes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parsers_by_path import load

fp = load("fabric")


def run(argv: list[str], record: Path | None, name: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        text = done.stdout if done.returncode == 0 else done.stdout + done.stderr
    except FileNotFoundError:
        text = f"{argv[0]}: not installed\n"
    except subprocess.TimeoutExpired:
        text = f"{argv[0]}: timed out\n"
    if record is not None:
        record.mkdir(parents=True, exist_ok=True)
        (record / f"{name}.txt").write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, required=True, help="fabric adapters expected")
    parser.add_argument("--rate", type=int, required=True, help="port rate in Gb/s (400: NDR)")
    parser.add_argument("--devices", default="", help="their RDMA device names, comma-separated")
    parser.add_argument("--roce", action="store_true", help="RoCE (Ethernet link layer)")
    parser.add_argument("--link-downed-limit", type=int, default=5)
    parser.add_argument("--peer", help="host whose ib_write_bw server to measure against")
    parser.add_argument("--record", type=Path, help="keep every raw output in this directory")
    args = parser.parse_args()
    devices = [d for d in args.devices.split(",") if d]
    layer = "Ethernet" if args.roce else "InfiniBand"

    found = []
    cas = fp.parse_ibstat(run(["ibstat"], args.record, "ibstat"))
    found += fp.hca_findings(cas, devices, args.count, args.rate, layer)
    names = fp.fabric_devices(cas, devices, layer)
    run(["ibv_devinfo", "-v"], args.record, "ibv_devinfo")
    if not args.roce:
        raw = run(["sminfo"], args.record, "sminfo")
        found.append(fp.sm_finding(fp.parse_sminfo(raw), raw))
        for device in names:
            raw = run(["perfquery", "-C", device, "-P", "1"], args.record, f"perfquery-{device}")
            found.append(
                fp.link_flap_finding(device, fp.parse_perfquery(raw), args.link_downed_limit)
            )
    if args.peer and names:
        raw = run(
            ["ib_write_bw", "-d", names[0], "--report_gbits", "-F", "-D", "5", args.peer],
            args.record,
            "ib_write_bw",
        )
        threshold = fp.write_bw_threshold(args.rate, None)
        found.append(
            fp.write_bw_finding(
                f"->{args.peer}", names[0], fp.parse_ib_write_bw(raw), raw, threshold
            )
        )
    failed = 0
    for check, ok, evidence in found:
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {check}: {evidence}")
    print(f"fabric-check: {len(found) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Resume and suspend of 64 AWS burst nodes in one call each, against moto in server mode on
127.0.0.1 (tests/fakeec2.py): seconds and EC2 API calls by action, median of --runs. What it
measures is this project's batching and its own cost (boto3, threads, the programs), not EC2's
time to boot an instance, which moto does not model.

Needs the dev extras (boto3, moto); no root, no cloud. About 30 seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from provision.burst import programs, slurm  # noqa: E402
from provision.burst.config import (  # noqa: E402
    TAG_CLUSTER,
    TAG_POOL,
    BurstConfig,
    CloudPool,
    Pool,
)
from tests.fakeec2 import FakeEC2  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    slurm.SCONTROL = "true"  # no Slurm here: the node addresses go nowhere
    nodes = [f"aws-h100-{i:03d}" for i in range(1, args.nodes + 1)]
    pool = Pool(
        "awsh100",
        "aws",
        dict.fromkeys(nodes, ""),
        cloud=CloudPool("us-east-1", "bench-awsh100", {TAG_CLUSTER: "bench", TAG_POOL: "awsh100"}),
    )
    config = BurstConfig("bench", "head01:6817", {"awsh100": pool})
    log: list[str] = []
    verbs = {"resume": programs.resume, "suspend": programs.suspend}
    measured: dict[str, list[tuple[float, dict[str, int]]]] = {verb: [] for verb in verbs}
    with FakeEC2() as ec2:
        ec2.launch_template("bench-awsh100", "p5.48xlarge")
        os.environ.update(ec2.env())
        for _ in range(args.runs):
            for verb, run in verbs.items():
                ec2.calls.clear()
                started = time.monotonic()
                if run(config, nodes, log.append):
                    print(f"{verb} failed:", log[-1], file=sys.stderr)
                    return 1
                measured[verb].append((time.monotonic() - started, dict(ec2.calls)))
    for name, runs in measured.items():
        seconds = [s for s, _ in runs]
        calls = runs[-1][1]
        print(
            f"{name} of {args.nodes} nodes: {statistics.median(seconds):.2f} s median of "
            f"{len(seconds)} ({min(seconds):.2f}-{max(seconds):.2f}); EC2 calls: "
            + ", ".join(f"{action} {n}" for action, n in sorted(calls.items()))
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

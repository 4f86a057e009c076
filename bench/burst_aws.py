"""Resume and suspend of 64 AWS burst nodes in one call each, against moto in server mode on
127.0.0.1 (tests/fakeec2.py): seconds and EC2 API calls by action, median of --runs. The launch
template carries the pool's user data (render/userdata.py) and an instance profile (moto's
IAM), as the cluster's stack makes it. Then the nodes' side: every instance's user data taken
back from moto and its join run (16 at a time, each against a folder standing for its node,
systemctl and nft recorded) with its name from a fake instance metadata service and the munge
key from moto's Secrets Manager. What it measures is this project's batching and its own cost
(boto3, threads, the programs), not EC2's time to boot an instance, which moto does not model.

Needs the dev extras (boto3, moto); no root, no cloud. About 40 seconds.
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from provision.burst import join as joining  # noqa: E402
from provision.burst import programs, slurm  # noqa: E402
from provision.burst.config import (  # noqa: E402
    TAG_CLUSTER,
    TAG_NODE,
    TAG_POOL,
    BurstConfig,
    CloudPool,
    Pool,
)
from provision.burst.join import JoinConfig, Metadata, parse_join_config  # noqa: E402
from provision.render.userdata import user_data  # noqa: E402
from tests.fakeec2 import FakeEC2  # noqa: E402


class FakeIMDS(ThreadingHTTPServer):
    """EC2's instance metadata service for many instances at once: each instance's session token
    is its ID (a stand-in for the link-local address each instance has of its own)."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names  # instance ID -> node name (its tag)
        super().__init__(("127.0.0.1", 0), _IMDS)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _IMDS(BaseHTTPRequestHandler):
    def _answer(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        assert isinstance(self.server, FakeIMDS)
        instance = self.headers.get("X-aws-ec2-metadata-token", "")
        name = self.server.names.get(instance)
        if self.path == f"/latest/meta-data/tags/instance/{TAG_NODE}" and name:
            self._answer(200, name)
        else:
            self._answer(404, "")

    def log_message(self, *args: object) -> None:
        pass


class _NodeMetadata(Metadata):
    """One instance's view of the shared fake metadata service: its token is its ID."""

    def __init__(self, base: str, instance: str) -> None:
        super().__init__("aws", base)
        self.instance = instance

    def _aws(self, path: str) -> tuple[int, str]:
        self._aws_token = self.instance
        return super()._aws(path)


def joins(ec2: FakeEC2, key: bytes) -> tuple[float, int]:
    """Every running instance's join from the user data moto gives back: seconds, and how many
    joined."""
    client = ec2.client()
    instances = [
        i
        for r in client.describe_instances()["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] == "running"
    ]
    names = {
        i["InstanceId"]: {t["Key"]: t["Value"] for t in i.get("Tags", [])}[TAG_NODE]
        for i in instances
    }
    imds = FakeIMDS(names)
    base = f"http://127.0.0.1:{imds.server_address[1]}"

    def one(instance: str, root: Path) -> str:
        given = client.describe_instance_attribute(InstanceId=instance, Attribute="userData")
        data = yaml.safe_load(base64.b64decode(given["UserData"]["Value"]))
        config = parse_join_config(data["write_files"][0]["content"])
        (root / "etc").mkdir(parents=True)
        return joining.join(
            config,
            _NodeMetadata(base, instance),
            lambda line: None,
            root=root,
            run=lambda *a: None,
            nft=lambda script: None,
            key_owner="root",
        )

    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(16) as pool:
        done = list(pool.map(lambda i: one(i, Path(tmp) / i), names))
        for i in names:
            assert (Path(tmp) / i / "etc" / "munge" / "munge.key").read_bytes() == key
    imds.shutdown()
    return time.monotonic() - started, len(done)


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
    key = secrets.token_bytes(1024)
    join = JoinConfig("bench", "aws", "head01", "10.20.0.10", 6817, "bench-munge-key", "us-east-1")
    joined: list[tuple[float, int]] = []
    with FakeEC2() as ec2:
        ec2.launch_template("bench-awsh100", "p5.48xlarge")
        os.environ.update(ec2.env())
        import boto3

        iam = boto3.client("iam", endpoint_url=ec2.url)
        iam.create_role(RoleName="bench-awsh100-node", AssumeRolePolicyDocument="{}")
        profile = iam.create_instance_profile(InstanceProfileName="bench-awsh100-node")
        iam.add_role_to_instance_profile(
            InstanceProfileName="bench-awsh100-node", RoleName="bench-awsh100-node"
        )
        boto3.client("secretsmanager", endpoint_url=ec2.url).create_secret(
            Name="bench-munge-key", SecretBinary=key
        )
        ec2.client().create_launch_template_version(
            LaunchTemplateName="bench-awsh100",
            SourceVersion="1",
            LaunchTemplateData={
                "UserData": base64.b64encode(user_data(join).encode()).decode(),
                "IamInstanceProfile": {"Arn": profile["InstanceProfile"]["Arn"]},
                "MetadataOptions": {"HttpTokens": "required", "InstanceMetadataTags": "enabled"},
            },
        )
        for _ in range(args.runs):
            for verb, run in verbs.items():
                ec2.calls.clear()
                started = time.monotonic()
                if run(config, nodes, log.append):
                    print(f"{verb} failed:", log[-1], file=sys.stderr)
                    return 1
                measured[verb].append((time.monotonic() - started, dict(ec2.calls)))
                if verb == "resume":
                    joined.append(joins(ec2, key))
    for name, runs in measured.items():
        seconds = [s for s, _ in runs]
        calls = runs[-1][1]
        print(
            f"{name} of {args.nodes} nodes: {statistics.median(seconds):.2f} s median of "
            f"{len(seconds)} ({min(seconds):.2f}-{max(seconds):.2f}); EC2 calls: "
            + ", ".join(f"{action} {n}" for action, n in sorted(calls.items()))
        )
    seconds = [s for s, _ in joined]
    print(
        f"join of {joined[-1][1]} nodes (user data from moto, name from the metadata service, "
        f"the munge key from Secrets Manager; 16 at a time): {statistics.median(seconds):.2f} s "
        f"median of {len(seconds)} ({min(seconds):.2f}-{max(seconds):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Burst nodes as EC2 instances made from the pool's launch template (the cluster's Pulumi stack
made it: image, type, EFA interfaces, placement group, security group, encrypted disk).

boto3 is imported only here, only when an AWS pool is resumed: the head has it from the OS's
packages (python3-boto3, installed by the burst role). Credentials come from boto3's own chain:
the head's instance profile in the cloud, AWS_* variables or root's credentials file elsewhere.
AWS_ENDPOINT_URL points it at another endpoint (the tests' moto server).

One resume is one RunInstances call for all of a pool's nodes, all or nothing (MinCount =
MaxCount: a part of a multi-node job's nodes would hold GPUs that no job can use, and the pool's
failure sends the job to the next pool whole), then one CreateTags per instance to give it its
node's name; resume gives Slurm (and the tunnel) the new nodes' addresses in one call.
"""

from __future__ import annotations

import contextlib
from typing import Any

from provision.burst.backend import CAPACITY, Backend, BurstError, each, one_line
from provision.burst.config import TAG_NODE, Pool

# Error codes that mean "not here, not now": the pool is taken out for the cooldown
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacityOnHost",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "Unsupported",
    }
)
# Instances that count as made (terminated ones linger in the API for an hour)
LIVE = ["pending", "running", "stopping", "stopped"]
# An instance of the pool with no node's name that is older than this was left by a resume
# that stopped between launching and naming: the reconciler terminates it
UNNAMED_GRACE_S = 300
# what a node's reason says when EC2 took its spot instance back
SPOT_RECLAIMED = "spot instance reclaimed by EC2"


def client(region: str) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise BurstError(
            "boto3 is not installed on this head (the burst role installs python3-boto3)"
        ) from None
    config = Config(
        retries={"mode": "standard", "max_attempts": 3}, connect_timeout=10, read_timeout=60
    )
    return boto3.client("ec2", region_name=region, config=config)


def _error(exc: Exception) -> str:
    """One line; a capacity or quota code gets the CAPACITY prefix."""
    response = getattr(exc, "response", None) or {}
    code = response.get("Error", {}).get("Code", "")
    text = one_line(exc)
    return f"{CAPACITY}{text}" if code in CAPACITY_CODES else text


class AwsBackend(Backend):
    def __init__(self, pool: Pool, ec2: Any = None) -> None:
        super().__init__()
        assert pool.cloud is not None
        self.pool, self.cloud = pool, pool.cloud
        self.ec2 = ec2 if ec2 is not None else client(self.cloud.region)

    def _call(self, method: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.ec2, method)(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise BurstError(_error(exc)) from None

    def _tag_filters(self) -> list[dict[str, Any]]:
        return [{"Name": f"tag:{k}", "Values": [v]} for k, v in sorted(self.cloud.tags.items())]

    def _instances(self, nodes: list[str] | None = None) -> list[dict[str, Any]]:
        filters = [*self._tag_filters(), {"Name": "instance-state-name", "Values": LIVE}]
        if nodes is not None:
            filters.append({"Name": f"tag:{TAG_NODE}", "Values": nodes})
        found: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = self._call(
                "describe_instances", Filters=filters, **({"NextToken": token} if token else {})
            )
            for reservation in page.get("Reservations", []):
                found += reservation.get("Instances", [])
            token = page.get("NextToken")
            if not token:
                return found

    @staticmethod
    def _node(instance: dict[str, Any]) -> str | None:
        tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
        return tags.get(TAG_NODE)

    def start(self, nodes: list[str]) -> dict[str, str]:
        tags = [{"Key": k, "Value": v} for k, v in sorted(self.cloud.tags.items())]
        try:
            made = self._call(
                "run_instances",
                LaunchTemplate={"LaunchTemplateName": self.cloud.template, "Version": "$Latest"},
                MinCount=len(nodes),
                MaxCount=len(nodes),
                TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
            )["Instances"]
        except BurstError as exc:
            return {node: str(exc) for node in nodes}
        pairs = dict(zip(nodes, made, strict=True))

        def name(node: str) -> None:
            self._call(
                "create_tags",
                Resources=[pairs[node]["InstanceId"]],
                Tags=[{"Key": "Name", "Value": node}, {"Key": TAG_NODE, "Value": node}],
            )

        errors = each(list(pairs), name)
        unnamed = [pairs[node]["InstanceId"] for node in errors]
        if unnamed:  # nothing half-made stays: an instance without its name goes
            # if that fails too, the reconciler terminates it after UNNAMED_GRACE_S
            with contextlib.suppress(BurstError):
                self._call("terminate_instances", InstanceIds=unnamed)
        self.addresses.update(
            {
                node: instance["PrivateIpAddress"]
                for node, instance in pairs.items()
                if node not in errors and instance.get("PrivateIpAddress")
            }
        )
        return errors

    def stop(self, nodes: list[str]) -> tuple[set[str], dict[str, str]]:
        try:
            found = self._instances(nodes)
            by_node = {self._node(i): i["InstanceId"] for i in found}
            ids = [by_node[n] for n in nodes if n in by_node]
            if ids:
                self._call("terminate_instances", InstanceIds=ids)
        except BurstError as exc:
            return set(), {node: str(exc) for node in nodes}
        return {n for n in nodes if n in by_node}, {}

    def states(self) -> dict[str, str]:
        out = {}
        for instance in self._instances():
            node = self._node(instance)
            if node in self.pool.nodes:
                out[node] = instance["State"]["Name"]
        return out

    def ended(self, nodes: list[str]) -> dict[str, str]:
        """A spot instance EC2 took back says so in its state reason while it lingers."""
        filters = [
            *self._tag_filters(),
            {"Name": f"tag:{TAG_NODE}", "Values": nodes},
            {"Name": "instance-state-name", "Values": ["shutting-down", "terminated"]},
        ]
        found = self._call("describe_instances", Filters=filters)
        return {
            node: SPOT_RECLAIMED
            for reservation in found.get("Reservations", [])
            for instance in reservation.get("Instances", [])
            if (node := self._node(instance)) is not None
            and instance.get("StateReason", {}).get("Code") == "Server.SpotInstanceTermination"
        }

    def sweep(self, now: float) -> list[str]:
        stray = [
            i["InstanceId"]
            for i in self._instances()
            if self._node(i) is None and now - i["LaunchTime"].timestamp() > UNNAMED_GRACE_S
        ]
        if stray:
            self._call("terminate_instances", InstanceIds=stray)
        return stray

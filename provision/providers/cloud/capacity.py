"""What a cloud can give the spec's pools, asked before anything is created (read-only calls):
on AWS, that each pool's instance type is offered in its zone (or region), and that the account's
On-Demand vCPU quota for the type's family holds the pool's lasting nodes. A pool that names a
reservation is not counted: its capacity was granted already. Bursting to every elastic node is
said when it would pass the quota, as burst nodes beyond it fail for want of quota.

A quota that cannot be read (no servicequotas:GetServiceQuota permission) is said and not held
against the apply. GCP and Azure are not asked yet (their quota APIs need SDKs this toolkit does
not depend on)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from provision.cluster import Cluster

# EC2's On-Demand vCPU quotas per instance family (Service Quotas, service code ec2)
_P = ("L-417A185B", "Running On-Demand P instances")
_G = ("L-DB2E81BA", "Running On-Demand G and VT instances")
_STANDARD = ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances")
_FAMILIES = {"p": _P, "g": _G, "vt": _G} | {letter: _STANDARD for letter in "acdhimrtz"}


def quota_of(instance_type: str) -> tuple[str, str] | None:
    """The On-Demand quota (code, name) an instance type counts against, where known here."""
    letters = re.match(r"[a-z]+", instance_type)  # p5.48xlarge: p; vt1.3xlarge: vt
    return _FAMILIES.get(letters.group(0)) if letters else None


@dataclass(frozen=True)
class Findings:
    problems: list[str]  # stop the apply: the cloud would refuse these pools
    notes: list[str]  # said, not held against it


def aws_capacity(cluster: Cluster, client: Callable[[str], Any]) -> Findings:
    """`client(name)`: a boto3 client of the pools' region ('ec2', 'service-quotas')."""
    from botocore.exceptions import BotoCoreError, ClientError

    pools = [v for v in cluster.pools if v.pool.provider == "aws"]
    problems: list[str] = []
    notes: list[str] = []
    if not pools:
        return Findings(problems, notes)
    ec2 = client("ec2")
    region = next((v.pool.region for v in pools if v.pool.region), "")
    for view in pools:
        kind = view.profile.instance_type or view.pool.profile
        where, location = (
            ("availability-zone", view.pool.zone) if view.pool.zone else ("region", region)
        )
        offered = ec2.describe_instance_type_offerings(
            LocationType=where,
            Filters=[
                {"Name": "instance-type", "Values": [kind]},
                {"Name": "location", "Values": [location]},
            ],
        )["InstanceTypeOfferings"]
        if not offered:
            problems.append(
                f"pool {view.name}: EC2 does not offer {kind} in {location}: pick another "
                f"{'zone' if view.pool.zone else 'region'}"
            )
    if problems:
        return Findings(problems, notes)
    kinds = sorted({v.profile.instance_type or v.pool.profile for v in pools})
    described = ec2.describe_instance_types(InstanceTypes=kinds)["InstanceTypes"]
    vcpus = {t["InstanceType"]: int(t["VCpuInfo"]["DefaultVCpus"]) for t in described}
    needed: dict[tuple[str, str], list[int]] = {}  # quota: [lasting vCPUs, with every elastic]
    for view in pools:
        kind = view.profile.instance_type or view.pool.profile
        quota = quota_of(kind)
        if quota is None:
            notes.append(f"pool {view.name}: the On-Demand quota of {kind} is not checked here")
            continue
        if view.pool.reservation is not None:
            continue  # launched into capacity already granted
        lasting = sum(1 for n in view.nodes if not n.elastic)
        sums = needed.setdefault(quota, [0, 0])
        sums[0] += lasting * vcpus[kind]
        sums[1] += len(view.nodes) * vcpus[kind]
    quotas = client("service-quotas")
    for (code, name), (lasting, every) in sorted(needed.items()):
        try:
            value = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
        except (ClientError, BotoCoreError) as exc:
            notes.append(
                f"the quota '{name}' ({code}) in {region} could not be read, so it is not "
                f"checked: {' '.join(str(exc).split())[:160]}"
            )
            continue
        have = int(value)
        if lasting > have:
            problems.append(
                f"the lasting nodes need {lasting} vCPUs of '{name}' in {region}, the account's "
                f"quota is {have}: ask AWS for more (Service Quotas, ec2 {code}) or name a "
                "reservation"
            )
        elif every > have:
            notes.append(
                f"bursting to every elastic node needs {every} vCPUs of '{name}' in {region}, "
                f"the quota is {have}: burst nodes beyond it will fail for want of quota"
            )
    return Findings(problems, notes)

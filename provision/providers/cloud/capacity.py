"""What a cloud can give the spec's pools, asked before anything is created (read-only calls):
that each pool's machine type is offered where the pool lives (AWS: its zone or region; GCP: its
zone; Azure: its region, and enabled for the subscription), that the quota holds the lasting
nodes (AWS: the account's On-Demand vCPUs of the type's family; GCP: the region's GPUs of the
model; Azure: the size family's vCPUs), and on Azure that the subscription accepted the terms of
an image sold under a plan. A pool that names a reservation is not counted: its capacity was
granted already. Bursting to every elastic node is said when it would pass the quota, as burst
nodes beyond it fail for want of quota.

Pure over the clouds' answers: the callers hand in boto3 clients (AWS) or a GET of the REST API
(GCP, Azure); a quota that cannot be read is said and not held against the apply."""

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


# --- GCP: the zone's machine types and the region's GPU quota (Compute Engine's REST API) ------

# the region quota (Compute Engine's metric) each GPU model counts against
GCP_GPU_METRICS = {
    "H100-SXM5-80GB": "NVIDIA_H100_GPUS",
    "H200-SXM5-141GB": "NVIDIA_H200_GPUS",
    "A100-SXM4-40GB": "NVIDIA_A100_GPUS",
    "A100-SXM4-80GB": "NVIDIA_A100_80GB_GPUS",
}


def gcp_capacity(cluster: Cluster, project: str, get: Callable[[str], Any]) -> Findings:
    """`get(path)`: Compute Engine's JSON answer for a path below compute/v1, None for 404."""
    pools = [v for v in cluster.pools if v.pool.provider == "gcp"]
    problems: list[str] = []
    notes: list[str] = []
    if not pools:
        return Findings(problems, notes)
    region = next((v.pool.region for v in pools if v.pool.region), "")
    for view in pools:
        kind = view.profile.instance_type or view.pool.profile
        zone = view.pool.zone
        if get(f"projects/{project}/zones/{zone}/machineTypes/{kind}") is None:
            problems.append(
                f"pool {view.name}: Compute Engine does not offer {kind} in {zone}: pick "
                "another zone"
            )
    if problems:
        return Findings(problems, notes)
    quotas = {
        q["metric"]: q
        for q in (get(f"projects/{project}/regions/{region}") or {}).get("quotas", [])
    }
    needed: dict[str, list[int]] = {}  # metric: [lasting GPUs, with every elastic node]
    for view in pools:
        gpu = view.profile.gpu
        if gpu is None or view.pool.reservation is not None:
            continue
        metric = GCP_GPU_METRICS.get(gpu.model)
        if metric is None:
            notes.append(f"pool {view.name}: the GPU quota of {gpu.model} is not checked here")
            continue
        sums = needed.setdefault(metric, [0, 0])
        sums[0] += sum(1 for n in view.nodes if not n.elastic) * gpu.count
        sums[1] += len(view.nodes) * gpu.count
    for metric, (lasting, every) in sorted(needed.items()):
        quota = quotas.get(metric)
        if quota is None:
            notes.append(f"the region {region} lists no quota {metric}: not checked")
            continue
        free = int(quota.get("limit", 0) - quota.get("usage", 0))
        if lasting > free:
            problems.append(
                f"the lasting nodes need {lasting} GPUs of {metric} in {region}, the project "
                f"has {free} free (quota {int(quota.get('limit', 0))}): ask Google for more "
                "(IAM & Admin, Quotas) or name a reservation"
            )
        elif every > free:
            notes.append(
                f"bursting to every elastic node needs {every} GPUs of {metric} in {region}, "
                f"{free} are free: burst nodes beyond them will fail for want of quota"
            )
    return Findings(problems, notes)


# --- Azure: the region's VM sizes, the family's vCPU quota, Marketplace terms (Resource Manager)


def azure_capacity(
    cluster: Cluster, subscription: str, get: Callable[[str], Any], plan_urn: str | None
) -> Findings:
    """`get(path)`: Resource Manager's JSON answer for a path below the subscription, None for
    404. `plan_urn`: publisher:offer:plan of an image sold under a plan, whose terms the
    subscription must have accepted."""
    pools = [v for v in cluster.pools if v.pool.provider == "azure"]
    problems: list[str] = []
    notes: list[str] = []
    if not pools:
        return Findings(problems, notes)
    location = next((v.pool.region for v in pools if v.pool.region), "")
    base = f"subscriptions/{subscription}/providers"
    if plan_urn:
        publisher, offer, plan = plan_urn.split(":")
        agreement = get(
            f"{base}/Microsoft.MarketplaceOrdering/offerTypes/virtualmachine/publishers/"
            f"{publisher}/offers/{offer}/plans/{plan}/agreements/current"
            "?api-version=2021-01-01"
        )
        if not (agreement or {}).get("properties", {}).get("accepted"):
            problems.append(
                f"the subscription has not accepted the terms of the image {plan_urn}: "
                f"az vm image terms accept --urn {plan_urn}:latest"
            )
    skus = (
        get(
            f"{base}/Microsoft.Compute/skus?api-version=2021-07-01"
            f"&$filter=location%20eq%20%27{location}%27"
        )
        or {}
    ).get("value", [])
    sizes = {s["name"]: s for s in skus if s.get("resourceType") == "virtualMachines"}
    for view in pools:
        kind = view.profile.instance_type or view.pool.profile
        sku = sizes.get(kind)
        if sku is None:
            problems.append(f"pool {view.name}: Azure does not offer {kind} in {location}")
        elif any(
            r.get("reasonCode") == "NotAvailableForSubscription"
            for r in sku.get("restrictions", [])
            if r.get("type") == "Location"
        ):
            problems.append(
                f"pool {view.name}: {kind} is not available to this subscription in "
                f"{location} (ask Azure to enable the size)"
            )
    if problems:
        return Findings(problems, notes)
    usages = {
        u["name"]["value"]: u
        for u in (
            get(f"{base}/Microsoft.Compute/locations/{location}/usages?api-version=2023-09-01")
            or {}
        ).get("value", [])
    }
    needed: dict[str, list[int]] = {}  # family: [lasting vCPUs, with every elastic node]
    for view in pools:
        if view.pool.reservation is not None:
            continue
        sku = sizes[view.profile.instance_type or view.pool.profile]
        vcpus = int(next(c["value"] for c in sku["capabilities"] if c["name"] == "vCPUs"))
        sums = needed.setdefault(sku["family"], [0, 0])
        sums[0] += sum(1 for n in view.nodes if not n.elastic) * vcpus
        sums[1] += len(view.nodes) * vcpus
    for family, (lasting, every) in sorted(needed.items()):
        usage = usages.get(family)
        if usage is None:
            notes.append(f"{location} lists no quota for {family}: not checked")
            continue
        free = int(usage["limit"]) - int(usage["currentValue"])
        if lasting > free:
            problems.append(
                f"the lasting nodes need {lasting} vCPUs of {family} in {location}, the "
                f"subscription has {free} free (quota {int(usage['limit'])}): ask Azure for "
                "more (Quotas) or name a capacity reservation"
            )
        elif every > free:
            notes.append(
                f"bursting to every elastic node needs {every} vCPUs of {family} in "
                f"{location}, {free} are free: burst nodes beyond them will fail for want of "
                "quota"
            )
    return Findings(problems, notes)

"""The cloud programs under Pulumi's mocks (no Pulumi CLI and no cloud can be reached here), with
the clouds' own rules for what they accept enforced on every resource (tests/cloud_rules.py: a
program the cloud would refuse fails here) and policy-style assertions on what they would
create; the checks that stop apply before anything is created; and the toolkit without the cloud
SDKs installed."""

from __future__ import annotations

import base64
import ipaddress
import json
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from provision.burst.config import TAG_POOL
from provision.cluster import Cluster
from provision.errors import OperationError
from provision.providers.cloud.layout import IMAGES
from provision.render import render, render_inventory
from provision.render.tunnel import tunnel_host_vars
from provision.spec.fabric import cloud_infiniband

from . import cloud_rules
from .conftest import ROOT, load_any, load_rendered, rsa_key
from .conftest import run_provision as provision
from .fakehttp import JsonFake

pulumi = pytest.importorskip("pulumi")  # a dev install has it: the check is for a bare install

SPECS = [
    ROOT / "tests" / "data" / "cloud" / "cluster.yaml",
    ROOT / "examples" / "hybrid-cloud.yaml",
    ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml",
    ROOT / "tests" / "data" / "cloud" / "reserved.yaml",
]
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFxsWi/kWC/jwkJ3ZrWg1zvAFVA3skOEzrF8xvZk54Zh test"
TAG = "provision-cluster"


@dataclass
class Made:
    typ: str
    name: str
    inputs: dict[str, Any]


class Recorder(pulumi.runtime.Mocks):  # type: ignore[misc]
    """Records every resource; answers with its inputs plus the addresses a cloud would give."""

    def __init__(self) -> None:
        self.made: list[Made] = []
        self.refused: list[str] = []  # what the cloud would refuse at `pulumi up`
        self.count = 0
        self._templates: dict[str, int] = {}  # launch template id: its network interfaces

    def new_resource(self, args: Any) -> tuple[str, dict[str, Any]]:
        self.made.append(Made(args.typ, args.name, dict(args.inputs)))
        self.refused += cloud_rules.refusals(args.typ, args.name, dict(args.inputs))
        self.count += 1
        out = dict(args.inputs)
        private, public = f"10.40.9.{self.count}", f"198.51.100.{self.count}"
        if args.typ == "aws:ec2/instance:Instance":
            out |= {"privateIp": private, "primaryNetworkInterfaceId": f"eni-{self.count}"}
            # EC2 gives a public address only to an instance with one interface
            nics = self._templates.get(str(args.inputs["launchTemplate"]["id"]), 1)
            out["publicIp"] = public if nics == 1 else ""
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            self._templates[f"{args.name}-id"] = len(args.inputs["networkInterfaces"])
        elif args.typ == "aws:ec2/eip:Eip":
            out["publicIp"] = public
        elif args.typ == "gcp:compute/instanceFromTemplate:InstanceFromTemplate":
            out["networkInterfaces"] = [
                {"networkIp": private, "accessConfigs": [{"natIp": public}]}
            ]
        elif args.typ == "azure-native:network:NetworkInterface":
            out["ipConfigurations"] = [{"name": "primary", "privateIPAddress": private}]
        elif args.typ == "azure-native:compute:VirtualMachineScaleSet" and "identity" in out:
            # asked for as a list of IDs, answered as a map of them (with their principals)
            ids = out["identity"]["userAssignedIdentities"]
            out["identity"] = {**out["identity"], "userAssignedIdentities": dict.fromkeys(ids)}
        elif args.typ == "gcp:serviceaccount/key:Key":  # the key file's JSON, base64
            doc = {"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\n"}
            out["privateKey"] = base64.b64encode(json.dumps(doc).encode()).decode()
        elif args.typ == "gcp:serviceaccount/account:Account":
            out["email"] = f"{args.inputs['accountId']}@lab-project.iam.gserviceaccount.com"
            out["name"] = f"projects/lab-project/serviceAccounts/{out['email']}"
        elif args.typ == "azure-native:managedidentity:UserAssignedIdentity":
            out |= {"principalId": f"principal-{self.count}", "clientId": f"client-{self.count}"}
            out.setdefault("name", args.inputs.get("resourceName", args.name))
        elif args.typ == "azure-native:storage:StorageAccount":
            out["name"] = args.inputs["accountName"]
        elif args.typ == "azure-native:storage:BlobContainer":
            out["name"] = args.inputs["containerName"]
        elif args.typ == "azure-native:network:PublicIPAddress":
            out["ipAddress"] = public
        if args.typ == "aws:iam/role:Role":  # IAM names a role when none is asked for
            out.setdefault("name", args.name)
        if args.typ.startswith("aws:"):  # every AWS resource has an ARN
            out.setdefault("arn", f"arn:aws:{args.typ.split(':')[1]}:{args.name}")
        if args.typ.startswith("gcp:"):  # every GCP resource has a self link
            out.setdefault("selfLink", f"https://compute/{args.name}")
        return f"{args.name}-id", out

    def call(self, args: Any) -> dict[str, Any]:
        if args.token.endswith("getAmi"):  # Debian's AMIs boot from /dev/xvda, the others sda1
            owner = args.args["owners"][0]
            root = "/dev/xvda" if owner == "136693071363" else "/dev/sda1"
            return {"id": "ami-0123456789abcdef0", "rootDeviceName": root}
        if args.token.startswith("gcp:") and args.token.endswith("getClientConfig"):
            return {"project": "lab-project"}  # the project the stack runs in
        if args.token.endswith("getClientConfig"):  # who runs the stack, in Azure
            return {"tenantId": "tenant-1", "subscriptionId": "sub-1", "clientId": "c"}
        return {}

    def of(self, suffix: str, none: bool = False) -> list[Made]:
        """The resources whose type token ends with `suffix`. None found fails the test (a
        renamed type would otherwise leave a loop over them checking nothing), unless `none`:
        the test says that none is what it expects."""
        found = [m for m in self.made if m.typ.lower().endswith(suffix.lower())]
        assert found or none, f"no resource of a type ending {suffix!r} was made"
        return found


def build(
    spec_path: Path,
    refusals: bool = False,
    munge_key: bytes | None = None,
    tunnel_keys: dict[str, bytes] | None = None,
    issuer_key: dict[str, str] | None = None,
) -> tuple[Recorder, Cluster, dict[str, Any]]:
    """Run the three clouds' components for a spec under mocks; their outputs, resolved. A
    resource the cloud would refuse fails it, unless `refusals` (the recorder keeps them)."""
    from provision.providers.cloud import component

    recorder = Recorder()
    pulumi.runtime.set_mocks(recorder, preview=False)
    cluster = Cluster(load_any(spec_path))
    kinds = sorted({p.pool.provider for p in cluster.pools} - {"static", "lab"})
    outputs: dict[str, Any] = {}

    @pulumi.runtime.test  # type: ignore[misc]
    def program() -> Any:
        built = {
            k: component(k, cluster, KEY, munge_key, tunnel_keys, issuer_key=issuer_key)
            for k in kinds
        }
        nodes = {k: pulumi.Output.from_input(b.nodes) for k, b in built.items()}
        heads = {
            f"{k}-burst-credentials": b.burst_credentials
            for k, b in built.items()
            # the heads' credentials where a test asks for Azure's (it hands the issuer's key)
            if issuer_key is not None and getattr(b, "burst_credentials", None) is not None
        }
        return pulumi.Output.all(**nodes, **heads).apply(outputs.update)

    program()
    assert refusals or recorder.refused == [], "\n".join(recorder.refused)
    return recorder, cluster, outputs


@pytest.fixture(scope="module", params=SPECS, ids=lambda p: p.parent.name + "/" + p.stem)
def made(request: pytest.FixtureRequest) -> Iterator[tuple[Recorder, Cluster, dict[str, Any]]]:
    yield build(request.param)


def _pools(cluster: Cluster, provider: str) -> list[Any]:
    return [v for v in cluster.pools if v.pool.provider == provider]


def test_instance_types_and_counts_match_the_profiles(made: Any) -> None:
    rec, cluster, _ = made
    name = cluster.spec.name
    aws_types = {m.inputs["name"]: m.inputs["instanceType"] for m in rec.of("LaunchTemplate")}
    assert aws_types == {
        f"{name}-{v.name}": v.profile.instance_type for v in _pools(cluster, "aws")
    }
    gcp_types = {
        m.inputs["name"]: m.inputs["machineType"]
        for m in rec.of("instanceTemplate:InstanceTemplate")
    }
    assert gcp_types == {
        f"{name}-{v.name}": v.profile.instance_type for v in _pools(cluster, "gcp")
    }
    lasting = {
        p: sum(1 for v in _pools(cluster, p) for n in v.nodes if not n.elastic)
        for p in ("aws", "gcp", "azure")
    }
    assert len(rec.of("ec2/instance:Instance", none=not lasting["aws"])) == lasting["aws"]
    assert len(rec.of("InstanceFromTemplate", none=not lasting["gcp"])) == lasting["gcp"]
    vms = rec.of("compute:VirtualMachine", none=not lasting["azure"])
    assert len(vms) == lasting["azure"]
    azure = {v.name: v.profile.instance_type for v in _pools(cluster, "azure")}
    for vm in vms:
        assert vm.inputs["hardwareProfile"]["vmSize"] in azure.values()
    elastic = sum(1 for v in _pools(cluster, "azure") if v.pool.elastic)
    scale_sets = rec.of("VirtualMachineScaleSet", none=not elastic)
    assert len(scale_sets) == elastic
    for vmss in scale_sets:
        assert vmss.inputs["sku"]["capacity"] == 0
        # what the Azure burst backend needs: named VMs made from the profile, in a group it
        # can name (provision/burst/azure.py)
        assert vmss.inputs["orchestrationMode"] == "Flexible"
        assert vmss.inputs["vmScaleSetName"].startswith(f"{name}-")
        network = vmss.inputs["virtualMachineProfile"]["networkProfile"]
        assert network["networkApiVersion"] == "2020-11-01"
    groups = rec.of("resources:ResourceGroup")
    assert len(groups) == (1 if lasting["azure"] or scale_sets else 0)
    for group in groups:
        assert group.inputs["resourceGroupName"] == f"{name}-rg"


def test_efa_and_nic_layout_per_type(made: Any) -> None:
    rec, cluster, outputs = made
    assert len(rec.of("LaunchTemplate")) == len(_pools(cluster, "aws"))
    for template in rec.of("LaunchTemplate"):
        nics = template.inputs["networkInterfaces"]
        kind = template.inputs["instanceType"]
        want = {"p5.48xlarge": 32, "p4d.24xlarge": 4}[kind]
        assert len(nics) == want
        # P5: the primary EFA with its address, the other 31 cards EFA only (AWS's P5 guide)
        others = "efa-only" if kind.startswith("p5") else "efa"
        assert [n["interfaceType"] for n in nics] == ["efa"] + [others] * (want - 1)
        assert [n["networkCardIndex"] for n in nics] == list(range(want))
        assert [n["deviceIndex"] for n in nics] == [0] + [1] * (want - 1)
        assert not any("associatePublicIpAddress" in n for n in nics)
    # each lasting node of those types is reached at an Elastic IP on its primary interface
    lasting = [n for v in _pools(cluster, "aws") for n in v.nodes if not n.elastic]
    # (the NAT gateways' own Elastic IPs, of private pools, aside: the test below)
    eips = [e for e in rec.of("ec2/eip:Eip", none=True) if "networkInterface" in e.inputs]
    assert sorted(e.name for e in eips) == sorted(
        f"{cluster.spec.name}-{n.name}-eip" for n in lasting
    )
    for eip in eips:
        assert eip.inputs["domain"] == "vpc" and eip.inputs["networkInterface"].startswith("eni-")
    for node in lasting:
        assert outputs["aws"][node.name]["public"].startswith("198.51.100."), node.name
    for template in rec.of("instanceTemplate:InstanceTemplate"):
        nics = template.inputs["networkInterfaces"]
        assert len(nics) == 5 and {n["nicType"] for n in nics} == {"GVNIC"}  # a3-highgpu-8g
        assert template.inputs["scheduling"]["onHostMaintenance"] == "TERMINATE"
        # no image of the pool's own made: the OS's public family
        (family,) = IMAGES[cluster.spec.os]["gcp"]
        assert template.inputs["disks"][0]["sourceImage"] == family


def test_every_resource_names_its_cluster(made: Any) -> None:
    rec, cluster, _ = made
    untaggable = (
        "RouteTableAssociation",
        "network:Subnet",
        "compute/network:",
        "Subnetwork",
        "Firewall",
        "ResourcePolicy",
        "pulumi:providers",
        "provision:",
        "iam/rolePolicy:RolePolicy",  # an inline policy of a tagged role
        "iam/userPolicy:UserPolicy",  # an inline policy of a tagged user
        "iam/accessKey:AccessKey",  # a key of a tagged user (IAM takes no tags on it)
        "secretVersion:SecretVersion",  # a version of a tagged secret
        "serviceaccount/account:Account",  # GCP service accounts take no labels
        "serviceaccount/key:Key",  # nor their keys
        "serviceaccount/iAMMember:IAMMember",  # a binding on an account
        "projects/iAMMember:IAMMember",  # a binding in the project
        "secretIamMember:SecretIamMember",  # a binding on a labelled secret
        "authorization:RoleAssignment",  # Azure role assignments take no tags
    )
    tagged = [m for m in rec.made if not any(u in m.typ for u in untaggable)]
    assert tagged, "no resource to check"
    for m in rec.made:
        if any(u in m.typ for u in untaggable):
            continue
        tags = m.inputs.get("tags") if not m.typ.startswith("gcp:") else m.inputs.get("labels")
        assert isinstance(tags, dict) and tags.get(TAG) == cluster.spec.name, (m.typ, m.name)
        assert m.name.startswith(f"{cluster.spec.name}-") or m.typ.startswith("provision:")
    # providers get their settings as JSON text
    for provider in rec.of("pulumi:providers:aws"):
        assert json.loads(provider.inputs["defaultTags"])["tags"][TAG] == cluster.spec.name
    for provider in rec.of("pulumi:providers:gcp"):
        assert json.loads(provider.inputs["defaultLabels"])[TAG] == cluster.spec.name


def test_root_disks_are_encrypted(made: Any) -> None:
    rec, cluster, _ = made
    for template in rec.of("LaunchTemplate"):
        (root,) = template.inputs["blockDeviceMappings"]
        assert root["ebs"]["encrypted"] == "true"
        assert root["deviceName"] == "/dev/sda1"  # the Ubuntu image's own (the mock's getAmi)
    # Azure encrypts managed disks at rest with platform keys; encryption at host is not asked
    # for (refused where the subscription has not registered it: cloud_rules)
    azure = rec.of("compute:VirtualMachine", none=True) + rec.of(
        "VirtualMachineScaleSet", none=True
    )
    assert bool(azure) == bool(_pools(cluster, "azure"))
    for vm in azure:
        profile = vm.inputs.get("virtualMachineProfile", vm.inputs)
        assert "securityProfile" not in profile
        assert profile["storageProfile"]["osDisk"]["managedDisk"]["storageAccountType"] == (
            "Premium_LRS"
        )
    # GCP encrypts every disk at rest with Google's keys; no template turns that off
    for template in rec.of("instanceTemplate:InstanceTemplate"):
        assert "diskEncryptionKey" not in template.inputs["disks"][0]


def _variant(tmp_path: Path, name: str, *edits: tuple[str, str]) -> Path:
    text = SPECS[0].read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def test_efa_traffic_is_allowed_both_ways_and_containers_reach_the_metadata(made: Any) -> None:
    rec, _, _ = made
    for sg in rec.of("ec2/securityGroup:SecurityGroup"):
        own = [r for r in sg.inputs["ingress"] if r.get("self")]
        out = [r for r in sg.inputs["egress"] if r.get("self")]
        assert own and out and own[0]["protocol"] == out[0]["protocol"] == "-1"
        assert "'" not in sg.inputs["description"]
    for template in rec.of("LaunchTemplate"):
        metadata = template.inputs["metadataOptions"]
        tags = {"instanceMetadataTags": "enabled"} if "userData" in template.inputs else {}
        assert metadata == {"httpTokens": "required", "httpPutResponseHopLimit": 2, **tags}


def test_debian_nodes_keep_the_images_root_device(tmp_path: Path) -> None:
    spec = _variant(
        tmp_path,
        "debian",
        ("os: ubuntu22.04", "os: debian12"),
        # Azure's GPU VMs take Ubuntu only (the spec refuses Debian there)
        (
            "  - {name: aza100, role: compute, profile: azure-nd-a100-v4, provider: azure, "
            "region: eastus,\n     count: 2, network: azure}\n",
            "",
        ),
        ("    - {name: azure, cidr: 10.43.0.0/16}\n", ""),
    )
    rec, _, _ = build(spec)
    for template in rec.of("LaunchTemplate"):
        assert template.inputs["blockDeviceMappings"][0]["deviceName"] == "/dev/xvda"


def test_long_names_fit_compute_engine_and_stay_apart(tmp_path: Path) -> None:
    cluster = "c" * 40 + "-research-cluster"  # 57 characters, a valid host name
    spec = _variant(
        tmp_path,
        "long",
        ("name: cloudy", f"name: {cluster}"),
        ("name: gcph100", "name: gcph100trainingpoolwithlongname"),
    )
    rec, built, _ = build(spec)  # the rules (cloud_rules) hold for every name
    names = [m.inputs.get("name") or m.name for m in rec.made if m.typ.startswith("gcp:compute")]
    assert len(names) == len(set(names))
    template = rec.of("instanceTemplate:InstanceTemplate")[0].inputs["name"]
    full = f"{cluster}-gcph100trainingpoolwithlongname"
    assert len(template) == 63 and template[:54] == full[:54] and template[54] == "-"
    # bursting finds the template by the same name (provision/burst/gcp.py)
    from provision.burst.config import cloud_template

    assert cloud_template(built.spec.name, "gcph100trainingpoolwithlongname") == template


def test_an_image_sold_under_a_plan_is_named_with_it(tmp_path: Path) -> None:
    profile = (
        "profiles:\n  azure-d32:\n    description: Azure D32s v5, CPU only\n"
        "    providers: [azure]\n    instance_type: Standard_D32s_v5\n"
        "    cpu: {model: Xeon 8370C, sockets: 1, cores_per_socket: 16, threads_per_core: 2}\n"
        "    memory_gib: 128\n    max_power_w: 600\n"
    )
    spec = _variant(
        tmp_path,
        "rocky",
        ("os: ubuntu22.04", "os: rocky9"),
        ("profile: azure-nd-a100-v4", "profile: azure-d32"),
        ("security:", profile + "security:"),
    )
    rec, cluster, _ = build(spec)
    (vm, *_) = rec.of("compute:VirtualMachine")
    assert vm.inputs["plan"] == {
        "name": "9-base",
        "product": "rockylinux-x86_64",
        "publisher": "resf",
    }
    from provision.providers.cloud.layout import describe, layout

    lines = describe(layout(cluster, "azure", KEY))
    assert any(
        "az vm image terms accept --urn resf:rockylinux-x86_64:9-base:latest" in x for x in lines
    )


def test_each_cloud_logs_in_as_its_images_user_or_a_non_root_one(tmp_path: Path) -> None:
    """ssh.user root: AWS's images let in their own user (Ubuntu's ubuntu, Debian's admin),
    Azure refuses root as a VM's administrator, Google's images refuse root over SSH."""
    from provision.head import ssh_argv
    from provision.spec.nodes import login_user

    spec = _variant(tmp_path, "root", ("  user: ubuntu", "  user: root"))
    rec, cluster, _ = build(spec)
    inventory = load_rendered(render_inventory(cluster))["all"]  # type: ignore[index]
    assert inventory["vars"]["ansible_user"] == "root" and "ansible_become" not in inventory["vars"]
    groups = inventory["children"]
    login = {
        p: {k: v for k, v in (groups[f"provider_{p}"].get("vars") or {}).items()}
        for p in ("static", "aws", "gcp", "azure")
    }
    assert login == {
        "static": {},
        "aws": {"ansible_user": "ubuntu", "ansible_become": True},
        "gcp": {"ansible_user": "provision", "ansible_become": True},
        "azure": {"ansible_user": "azureuser", "ansible_become": True},
    }
    # the key goes to that user: GCP's metadata, Azure's administrator (AWS: the key pair)
    (template,) = rec.of("instanceTemplate:InstanceTemplate")
    assert template.inputs["metadata"]["ssh-keys"] == f"provision:{KEY}"
    for vm in rec.of("compute:VirtualMachine"):
        assert vm.inputs["osProfile"]["adminUsername"] == "azureuser"
        (key,) = vm.inputs["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"]
        assert key["path"] == "/home/azureuser/.ssh/authorized_keys"
    # `provision ssh` logs in the same way
    node = next(n for n in cluster.nodes if n.provider == "aws")
    saved = tmp_path / "state" / cluster.spec.name / "cloud-aws.json"
    saved.parent.mkdir(parents=True)
    saved.write_text(json.dumps({"nodes": {node.name: {"public": "198.51.100.7"}}}))
    argv = ssh_argv(spec, tmp_path / "state", node.name, ["true"])
    assert argv[argv.index("-l") + 1] == "ubuntu" and "198.51.100.7" in argv
    debian = cluster.spec.model_copy(update={"os": "debian12"})
    assert login_user(debian, "aws") == "admin" and login_user(debian, "static") == "root"


def test_azure_machines_go_out_through_a_nat_gateway(made: Any) -> None:
    rec, cluster, _ = made
    if not _pools(cluster, "azure"):
        return
    (subnet,) = rec.of("network:Subnet")
    (nat,) = rec.of("network:NatGateway")
    assert subnet.inputs["natGateway"]["id"] == f"{nat.name}-id"
    assert subnet.inputs["defaultOutboundAccess"] is False
    (address,) = [a for a in rec.of("PublicIPAddress") if a.name.endswith("-nat-ip")]
    assert nat.inputs["publicIpAddresses"] == [{"id": f"{address.name}-id"}]
    assert nat.inputs["sku"] == {"name": "Standard"}


def test_plan_says_what_nccl_runs_over_in_each_cloud() -> None:
    from provision.providers.cloud.layout import describe, layout

    cluster = Cluster(load_any(SPECS[0]))
    lines = [x for k in ("aws", "gcp", "azure") for x in describe(layout(cluster, k, KEY))]
    nccl = [x for x in lines if "NCCL" in x]
    assert nccl == [
        "aws pool awsa100: NCCL between nodes over EFA (4 interfaces) through aws-ofi-nccl "
        "and libfabric, from AWS's installer",
        "aws pool awsh100: NCCL between nodes over EFA (32 interfaces) through aws-ofi-nccl "
        "and libfabric, from AWS's installer",
        "gcp pool gcph100: NCCL between nodes over TCP sockets on the gVNICs: GPUDirect-TCPX "
        "is not installed",
        "azure pool aza100: NCCL between nodes over InfiniBand (the cloud's InfiniBand, 8 "
        "adapters: the pool's machines (lasting and burst) share one availability set, so one "
        "partition)",
    ]
    assert "azure: resource group, virtual network, subnet, NAT gateway (10.43.0.0/16)" in lines


def test_the_rules_refuse_what_the_clouds_refuse() -> None:
    """The mocks' rules themselves, on resources as an unfixed program made them."""
    sg = {"description": "the cluster's rule set", "ingress": [{"description": "ssh"}]}
    assert cloud_rules.refusals("aws:ec2/securityGroup:SecurityGroup", "x", sg)
    sg["description"] = "x" * 256
    assert cloud_rules.refusals("aws:ec2/securityGroup:SecurityGroup", "x", sg)
    big = {"name": "t", "userData": base64.b64encode(b"x" * (16 * 1024 + 1)).decode()}
    assert cloud_rules.refusals("aws:ec2/launchTemplate:LaunchTemplate", "t", big)
    trust = json.dumps({"Statement": [{"Principal": {"Service": "lambda.amazonaws.com"}}]})
    assert cloud_rules.refusals("aws:iam/role:Role", "r", {"assumeRolePolicy": trust})
    for bad in ("a b", "burst-abcdef", "x" * 513):  # a space; a partial ARN's look; too long
        assert cloud_rules.refusals("aws:secretsmanager/secret:Secret", "s", {"name": bad})
    assert not cloud_rules.refusals(
        "aws:secretsmanager/secret:Secret", "s", {"name": "burst-munge-key"}
    )
    account = "gcp:serviceaccount/account:Account"
    for bad in ("short", "9starts-with-digit", "a" * 31, "ends-with-"):
        assert cloud_rules.refusals(account, "a", {"accountId": bad}), bad
    assert not cloud_rules.refusals(account, "a", {"accountId": "burst-gcph100"})
    vault = "azure-native:keyvault:Vault"
    for bad in ("kv", "two--hyphens", "1vault", "v" * 25):
        assert cloud_rules.refusals(vault, "v", {"vaultName": bad, "properties": {"tenantId": "t"}})
    assert cloud_rules.refusals(vault, "v", {"vaultName": "pvburst0123", "properties": {}})
    assert not cloud_rules.refusals(
        vault, "v", {"vaultName": "pvburst0123", "properties": {"tenantId": "t"}}
    )
    nics = [{"associatePublicIpAddress": "true"}, {}]
    lt = {"name": "c-p5", "networkInterfaces": nics}
    assert cloud_rules.refusals("aws:ec2/launchTemplate:LaunchTemplate", "c-p5", lt)
    assert not cloud_rules.refusals(
        "aws:ec2/launchTemplate:LaunchTemplate", "c", {"networkInterfaces": nics[:1]}
    )
    nat = "aws:ec2/natGateway:NatGateway"
    assert cloud_rules.refusals(nat, "n", {"subnetId": "subnet-1"})  # public: needs an address
    assert cloud_rules.refusals(nat, "n", {"allocationId": "eipalloc-1"})  # no subnet
    assert not cloud_rules.refusals(nat, "n", {"subnetId": "s", "allocationId": "eipalloc-1"})
    assert cloud_rules.refusals("aws:ec2/eip:Eip", "e", {})  # EC2-Classic's: gone
    two = {"routes": [{"cidrBlock": "0.0.0.0/0", "gatewayId": "igw", "natGatewayId": "nat"}]}
    assert cloud_rules.refusals("aws:ec2/routeTable:RouteTable", "r", two)
    assert cloud_rules.refusals("aws:ec2/routeTable:RouteTable", "r", {"routes": [{}]})
    gcp = "gcp:compute/instanceFromTemplate:InstanceFromTemplate"
    assert cloud_rules.refusals(gcp, "n", {"name": "node1"})  # no zone
    assert not cloud_rules.refusals(gcp, "n", {"name": "node1", "zone": "us-central1-a"})
    assert cloud_rules.refusals("gcp:compute/network:Network", "a" * 56, {})  # 56 + 8 > 63
    assert cloud_rules.refusals("gcp:compute/network:Network", "Net", {})
    vm = {
        "storageProfile": {"imageReference": {"publisher": "resf", "offer": "rockylinux-x86_64"}},
        "securityProfile": {"encryptionAtHost": True},
    }
    assert len(cloud_rules.refusals("azure-native:compute:VirtualMachine", "v", vm)) == 2
    # reservations: a Capacity Block's market without its ID; a specific GCE reservation named
    # under another key; an Azure reservation beside a placement group, for a scale set with a
    # single placement group, for an ND size
    block = {"name": "b", "instanceMarketOptions": {"marketType": "capacity-block"}}
    assert cloud_rules.refusals("aws:ec2/launchTemplate:LaunchTemplate", "b", block)
    block["capacityReservationSpecification"] = {
        "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}
    }
    assert not cloud_rules.refusals("aws:ec2/launchTemplate:LaunchTemplate", "b", block)
    affinity = {"type": "SPECIFIC_RESERVATION", "specificReservation": {"key": "name"}}
    template = {"name": "t", "reservationAffinity": affinity}
    assert cloud_rules.refusals("gcp:compute/instanceTemplate:InstanceTemplate", "t", template)
    reserved = {"capacityReservationGroup": {"id": "/subscriptions/x"}}
    vm = {
        "hardwareProfile": {"vmSize": "Standard_NC96ads_A100_v4"},
        "capacityReservation": reserved,
    }
    assert not cloud_rules.refusals("azure-native:compute:VirtualMachine", "v", vm)
    vm["proximityPlacementGroup"] = {"id": "ppg"}
    vm["availabilitySet"] = {"id": "avset"}
    vm["hardwareProfile"] = {"vmSize": "Standard_ND96isr_H100_v5"}
    assert len(cloud_rules.refusals("azure-native:compute:VirtualMachine", "v", vm)) == 3
    vmss = {
        "sku": {"name": "Standard_NC96ads_A100_v4"},
        "singlePlacementGroup": True,
        "virtualMachineProfile": {"capacityReservation": reserved},
    }
    assert cloud_rules.refusals("azure-native:compute:VirtualMachineScaleSet", "s", vmss)


def _world_open(rec: Recorder) -> list[str]:
    found = []
    for sg in rec.of("ec2/securityGroup:SecurityGroup"):
        found += [
            r["description"] for r in sg.inputs["ingress"] if "0.0.0.0/0" in r.get("cidrBlocks", [])
        ]
    for fw in rec.of("Firewall"):
        if "0.0.0.0/0" in fw.inputs["sourceRanges"]:
            found.append(fw.inputs.get("description", fw.name))
    for nsg in rec.of("NetworkSecurityGroup"):
        found += [
            r["description"]
            for r in nsg.inputs["securityRules"]
            if "0.0.0.0/0" in r["sourceAddressPrefixes"]
        ]
    return found


def test_no_ingress_from_the_world_and_ssh_only_from_admin(made: Any) -> None:
    rec, cluster, _ = made
    assert _world_open(rec) == []
    admin = [str(c) for c in cluster.spec.security.admin_cidrs]
    for sg in rec.of("ec2/securityGroup:SecurityGroup"):
        ssh = [r for r in sg.inputs["ingress"] if r.get("fromPort") == 22]
        assert [r["cidrBlocks"] for r in ssh] == [admin]


def test_world_ingress_only_where_the_spec_opted_in(tmp_path: Path) -> None:
    text = (
        (SPECS[0])
        .read_text()
        .replace(
            "admin_cidrs: [203.0.113.0/24]",
            "admin_cidrs: [0.0.0.0/0]\n  allow_admin_from_anywhere: true",
        )
    )
    spec = tmp_path / "open.yaml"
    spec.write_text(text)
    rec, _, _ = build(spec)
    opened = _world_open(rec)
    assert opened and set(opened) == {"ssh from admin networks"}


def _lasting(cluster: Cluster, provider: str) -> list[str]:
    """The lasting (not elastic) nodes of a cloud's pools."""
    return [n.name for v in _pools(cluster, provider) for n in v.nodes if not n.elastic]


def _reserved(cluster: Cluster) -> set[str]:
    return {v.name for v in cluster.pools if v.pool.reservation}


def test_gpu_pools_use_placement_unless_a_reservation_holds_it(made: Any) -> None:
    rec, cluster, _ = made
    reserved = _reserved(cluster)
    name = cluster.spec.name
    for template in rec.of("LaunchTemplate"):
        if template.inputs["name"].removeprefix(f"{name}-") in reserved:
            assert "placement" not in template.inputs
        else:
            assert template.inputs["placement"]["groupName"]
    free = [v for v in _pools(cluster, "aws") if v.name not in reserved]
    assert len(rec.of("ec2/placementGroup:PlacementGroup")) == len(free)
    for pg in rec.of("ec2/placementGroup:PlacementGroup"):
        assert pg.inputs["strategy"] == "cluster"
    for template in rec.of("instanceTemplate:InstanceTemplate"):
        pool = template.inputs["name"].removeprefix(f"{name}-")
        assert bool(template.inputs.get("resourcePolicies")) == (pool not in reserved)
    for vm in rec.of("compute:VirtualMachine", none=not _lasting(cluster, "azure")):
        pool = vm.inputs["tags"][TAG_POOL]
        assert bool(vm.inputs.get("proximityPlacementGroup")) == (pool not in reserved)


def test_infiniband_vms_share_their_pools_availability_set(made: Any) -> None:
    """Azure links over InfiniBand only the VMs of one availability set, or of a Uniform scale
    set with a single placement group (one partition key); a Flexible scale set carries none,
    and a standalone ND VM reaches no other. Every lasting VM of an ND pool is in the pool's
    availability set, which is in the pool's proximity placement group; no other VM is; an
    elastic ND pool has one too, for its burst VMs (tests/test_burst_azure.py)."""
    rec, cluster, _ = made
    ib = {v.name for v in _pools(cluster, "azure") if cloud_infiniband(v.profile)}
    lasting = {v.name for v in _pools(cluster, "azure") if any(not n.elastic for n in v.nodes)}
    elastic = {v.name for v in _pools(cluster, "azure") if v.pool.elastic}
    sets = {
        m.inputs["tags"][TAG_POOL]: m
        for m in rec.of("compute:AvailabilitySet", none=not ib & (lasting | elastic))
    }
    assert set(sets) == ib & (lasting | elastic)
    for pool, avset in sets.items():
        assert avset.inputs["sku"] == {"name": "Aligned"}  # managed disks
        ppg = next(
            m for m in rec.of("ProximityPlacementGroup") if m.inputs["tags"][TAG_POOL] == pool
        )
        assert avset.inputs["proximityPlacementGroup"] == {"id": f"{ppg.name}-id"}
    for vm in rec.of("compute:VirtualMachine", none=not lasting):
        pool = vm.inputs["tags"][TAG_POOL]
        joined = vm.inputs.get("availabilitySet", {}).get("id")
        assert joined == (f"{sets[pool].name}-id" if pool in ib else None)
        assert "virtualMachineScaleSet" not in vm.inputs


def test_reserved_pools_launch_into_their_reservation() -> None:
    """Each cloud's way to name a reservation, on the template bursting also launches from (and
    on Azure's VMs): the mocks' rules refuse a capacity-block market without its ID, a specific
    GCE reservation under another key, and an Azure reservation beside placement or for ND."""
    rec, cluster, _ = build(SPECS[3])
    by_pool = {v.name: v.pool.reservation for v in cluster.pools if v.pool.reservation}
    templates = {m.inputs["name"]: m.inputs for m in rec.of("LaunchTemplate")}
    block = templates["reserved-awsblock"]
    assert block["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert block["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}
    }
    odcr = templates["reserved-awsodcr"]
    assert "instanceMarketOptions" not in odcr  # an On-Demand Capacity Reservation
    assert odcr["capacityReservationSpecification"]["capacityReservationTarget"] == {
        "capacityReservationId": "cr-0fedcba987654321f"
    }
    assert "capacityReservationSpecification" not in templates["reserved-awsfree"]
    # each reserved AWS pool's subnet lies in the reservation's zone
    subnets = {m.inputs.get("availabilityZone") for m in rec.of("ec2/subnet:Subnet")}
    assert subnets == {"us-east-1a", "us-east-1b"}
    (gcp,) = rec.of("instanceTemplate:InstanceTemplate")
    assert gcp.inputs["reservationAffinity"] == {
        "type": "SPECIFIC_RESERVATION",
        "specificReservation": {
            "key": "compute.googleapis.com/reservation-name",
            "values": ["projects/capacity-host/reservations/a3-block"],
        },
    }
    vms = rec.of("compute:VirtualMachine")
    assert len(vms) == 2 and not rec.of("ProximityPlacementGroup", none=True)
    for vm in vms:
        group = vm.inputs["capacityReservation"]["capacityReservationGroup"]["id"]
        assert group == by_pool["aza100"].id  # type: ignore[union-attr]


def test_outputs_become_node_addresses_and_reach_the_inventory() -> None:
    from provision.providers.cloud import addresses_from

    _, cluster, outputs = build(SPECS[0])
    addresses, logins = {}, {}
    for kind_nodes in outputs.values():
        addresses |= addresses_from({"nodes": kind_nodes})
        logins |= addresses_from({"nodes": kind_nodes}, "public")
    lasting = [n.name for n in cluster.nodes if n.provider != "static" and not n.elastic]
    assert sorted(addresses) == sorted(logins) == sorted(lasting)
    # the private address is the cluster's (the tunnel's, Slurm's); Ansible logs in at the public
    assert all(str(a).startswith("10.40.9.") for a in addresses.values())
    assert all(str(a).startswith("198.51.100.") for a in logins.values())
    made = Cluster(cluster.spec, addresses, logins)
    inventory = render_inventory(made)
    for name, address in logins.items():
        assert f'        {name}:\n          ansible_host: !unsafe "{address}"\n' in inventory
    hub = tunnel_host_vars(made)["head01"]
    assert sorted(p["name"] for p in hub["tunnel_peers"]) == sorted(lasting)
    assert {p["address"] for p in hub["tunnel_peers"]} == {str(a) for a in addresses.values()}
    assert f"{addresses[lasting[0]]} {lasting[0]}\n" in render(made)["files/hosts"]


# --- before anything is created --------------------------------------------------------------


def _fake_pulumi(bin_dir: Path, plugins: list[dict[str, str]]) -> None:
    """A stand-in Pulumi CLI that answers `pulumi plugin ls --json` with these plugins."""
    bin_dir.mkdir(exist_ok=True)
    cli = bin_dir / "pulumi"
    cli.write_text(f"#!/bin/sh\necho '{json.dumps(plugins)}'\n")
    cli.chmod(0o755)


def test_missing_cli_plugin_sdk_or_credentials_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.metadata

    from provision.providers import cloud

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(OperationError, match="need the Pulumi CLI, which is not on PATH"):
        cloud.check_ready("aws")

    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("HOME", str(tmp_path))
    _fake_pulumi(tmp_path / "bin", [])
    version = importlib.metadata.version("pulumi_aws")
    with pytest.raises(OperationError, match=f"pulumi plugin install resource aws {version}"):
        cloud.check_ready("aws", env={})

    plugins = [
        {"kind": "resource", "name": name, "version": importlib.metadata.version(sdk)}
        for name, sdk in (
            ("aws", "pulumi_aws"),
            ("gcp", "pulumi_gcp"),
            ("azure-native", "pulumi_azure_native"),
        )
    ]
    _fake_pulumi(tmp_path / "bin", plugins)
    with pytest.raises(OperationError, match="no AWS credentials: set AWS_PROFILE"):
        cloud.check_ready("aws", env={})
    with pytest.raises(OperationError, match="gcloud auth application-default login"):
        cloud.check_ready("gcp", env={})
    with pytest.raises(OperationError, match="no GCP project: set GOOGLE_PROJECT"):
        cloud.check_ready("gcp", env={"GOOGLE_APPLICATION_CREDENTIALS": "/k.json"})
    with pytest.raises(OperationError, match="run `az login`"):
        cloud.check_ready("azure", env={})
    cloud.check_ready("aws", env={"AWS_PROFILE": "lab"})  # ready: no error

    real = cloud.importlib.import_module

    def without_gcp(name: str) -> Any:
        if name == "pulumi_gcp":
            raise ImportError(name)
        return real(name)

    monkeypatch.setattr(cloud.importlib, "import_module", without_gcp)
    with pytest.raises(OperationError, match=r"pip install 'gpu-provision\[gcp\]'"):
        cloud.check_ready("gcp", env={})


def test_apply_stops_before_creating_anything(tmp_path: Path) -> None:
    """Here there is no Pulumi CLI: apply says so, exit 1, and leaves no stack behind."""
    r = provision("apply", str(SPECS[0]), "--state-dir", str(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "need the Pulumi CLI, which is not on PATH" in r.stderr
    assert "nothing was created" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "cloudy" / "pulumi").exists()


def test_the_toolkit_runs_without_the_cloud_sdks() -> None:
    """Validate, render and plan a cloud spec with every pulumi module unimportable."""
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0].startswith('pulumi'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "sys.argv = ['provision', 'plan', sys.argv[1], '--state-dir', sys.argv[2]]\n"
        "from provision.cli import main\n"
        "main()\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", blocker, str(ROOT / "examples" / "hybrid-cloud.yaml"), "/tmp/none"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert "cloud: aws pool awsh100:" in r.stdout and "32 EFA" in r.stdout
    assert "aws: from the spec only, no preview: the aws pools need Pulumi's Python SDK" in r.stdout
    assert "pip install 'gpu-provision[aws]'" in r.stdout


def test_every_os_has_an_image_on_every_cloud() -> None:
    import typing

    from provision.providers.cloud.layout import IMAGES
    from provision.spec.models import OsName

    assert set(IMAGES) == set(typing.get_args(OsName))
    for os_name, clouds in IMAGES.items():
        assert set(clouds) == {"aws", "gcp", "azure"}, os_name
        assert len(clouds["aws"]) == 2 and len(clouds["gcp"]) == 1 and len(clouds["azure"]) == 3


def test_each_zone_the_pools_name_gets_its_own_slice_of_the_range(tmp_path: Path) -> None:
    spec = _variant(
        tmp_path,
        "zones",
        ("provider: aws, region: us-east-1,\n     count: 4", "provider: aws, region: us-east-1,\n"
         "     zone: us-east-1b, count: 4"),
    )  # fmt: skip
    rec, _, _ = build(spec)
    vpc_range = ipaddress.IPv4Network(rec.of("ec2/vpc:Vpc")[0].inputs["cidrBlock"])
    subnets = {s.inputs["availabilityZone"]: s for s in rec.of("ec2/subnet:Subnet")}
    assert set(subnets) == {"us-east-1a", "us-east-1b"}
    ranges = [ipaddress.IPv4Network(s.inputs["cidrBlock"]) for s in subnets.values()]
    assert all(r.subnet_of(vpc_range) for r in ranges) and not ranges[0].overlaps(ranges[1])
    assert len(rec.of("ec2/routeTableAssociation:RouteTableAssociation")) == 2
    # each pool's instances start in its zone's subnet
    for template in rec.of("LaunchTemplate"):
        zone = "us-east-1a" if "awsa100" in template.name else "us-east-1b"
        for nic in template.inputs["networkInterfaces"]:
            assert nic["subnetId"] == f"{subnets[zone].name}-id", template.name


def test_one_subnet_over_the_range_where_the_pools_name_one_zone_or_none(made: Any) -> None:
    rec, cluster, _ = made
    zones = {v.pool.zone for v in _pools(cluster, "aws") if v.pool.zone}
    subnets = rec.of("ec2/subnet:Subnet")
    (vpc,) = rec.of("ec2/vpc:Vpc")
    if len(zones) > 1:  # a slice each (the test above)
        assert len(subnets) == len(zones)
        return
    from provision.providers.cloud.layout import layout

    if any(p.private for p in layout(cluster, "aws", "").pools):
        return  # a private pool's zone is split in two (the test below)
    (subnet,) = subnets
    assert subnet.inputs["cidrBlock"] == vpc.inputs["cidrBlock"]


def test_multi_card_burst_nodes_go_out_through_a_nat_gateway() -> None:
    """EC2 gives an instance of several network cards no public address, and its template
    cannot ask one: an elastic pool of such a type (p5.48xlarge) starts in its zone's private
    subnet, the second half of the zone's slice, whose one route out is a NAT gateway with an
    Elastic IP in the zone's public subnet (the first half, routed to the internet gateway). A
    pool of one card stays in the public subnet; the stack names the public subnet where the
    private pool's image builder starts, and the subnets' ranges, which a running stack keeps."""
    from provision.providers.cloud import component

    spec = ROOT / "examples" / "hybrid-burst.yaml"
    rec = Recorder()
    pulumi.runtime.set_mocks(rec, preview=False)
    cluster = Cluster(load_any(spec))
    seen: dict[str, Any] = {}

    @pulumi.runtime.test  # type: ignore[misc]
    def program() -> Any:
        built = component("aws", cluster, KEY)
        return pulumi.Output.all(
            pulumi.Output.from_input(built.subnets), pulumi.Output.from_input(built.builder_subnets)
        ).apply(lambda pair: seen.update(subnets=pair[0], builders=pair[1]))

    program()
    assert rec.refused == [], rec.refused
    subnets = {s.name: s for s in rec.of("ec2/subnet:Subnet")}
    public, private = subnets["hybridburst-subnet"], subnets["hybridburst-private"]
    assert (public.inputs["cidrBlock"], private.inputs["cidrBlock"]) == (
        "10.31.0.0/17",
        "10.31.128.0/17",
    )
    assert public.inputs["availabilityZone"] == private.inputs["availabilityZone"] == "us-east-1a"
    assert public.inputs["mapPublicIpOnLaunch"] and not private.inputs["mapPublicIpOnLaunch"]
    (nat,) = rec.of("ec2/natGateway:NatGateway")
    (eip,) = rec.of("ec2/eip:Eip")
    assert nat.inputs["subnetId"] == f"{public.name}-id"
    assert nat.inputs["allocationId"] == f"{eip.name}-id"
    tables = {t.name: t for t in rec.of("ec2/routeTable:RouteTable")}
    links = {
        a.inputs["subnetId"]: a.inputs["routeTableId"]
        for a in rec.of("ec2/routeTableAssociation:RouteTableAssociation")
    }

    def way_out(subnet: Any) -> dict[str, Any]:
        (table,) = [t for t in tables.values() if f"{t.name}-id" == links[f"{subnet.name}-id"]]
        (route,) = table.inputs["routes"]
        assert route["cidrBlock"] == "0.0.0.0/0"
        return dict(route)

    assert way_out(private) == {"cidrBlock": "0.0.0.0/0", "natGatewayId": f"{nat.name}-id"}
    (igw,) = rec.of("ec2/internetGateway:InternetGateway")
    assert way_out(public) == {"cidrBlock": "0.0.0.0/0", "gatewayId": f"{igw.name}-id"}
    templates = {t.name: t for t in rec.of("LaunchTemplate")}
    h100 = templates["hybridburst-awsh100-lt"].inputs["networkInterfaces"]
    assert len(h100) == 32 and {n["subnetId"] for n in h100} == {f"{private.name}-id"}
    assert not any("associatePublicIpAddress" in n for n in h100)
    (l40s,) = templates["hybridburst-awsl40s-lt"].inputs["networkInterfaces"]
    assert l40s["subnetId"] == f"{public.name}-id" and l40s["associatePublicIpAddress"] == "true"
    assert seen["subnets"] == {
        "hybridburst-subnet": "10.31.0.0/17",
        "hybridburst-private": "10.31.128.0/17",
    }
    assert seen["builders"] == {"awsh100": f"{public.name}-id"}
    # the pool's template from the spec alone, for plan
    from provision.providers.cloud.layout import describe, layout

    text = "\n".join(describe(layout(cluster, "aws", "")))
    assert "a private subnet 10.31.128.0/17 in us-east-1a going out through a NAT gateway" in text
    assert "awsh100: 4 ingress rules" in text and "out through the NAT gateway" in text


# --- what EC2 can give the pools, asked before anything is made ---------------------------------


def _quotas(values: dict[str, float | None]) -> Any:
    """A real Service Quotas client whose answers are stubbed and checked against the API's
    model (moto has no Service Quotas for EC2): each code's value, or None: AccessDenied."""
    import boto3
    from botocore.stub import Stubber

    client = boto3.client("service-quotas", region_name="us-east-1")
    stub = Stubber(client)
    for code, value in sorted(values.items()):
        params = {"ServiceCode": "ec2", "QuotaCode": code}
        if value is None:
            stub.add_client_error(
                "get_service_quota",
                service_error_code="AccessDeniedException",
                service_message="not authorized to perform servicequotas:GetServiceQuota",
                expected_params=params,
            )
        else:
            stub.add_response(
                "get_service_quota",
                {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "Value": value}},
                params,
            )
    stub.activate()
    return client


def _capacity(spec: Path, quotas: dict[str, float | None]) -> Any:
    """aws_capacity against EC2 as moto answers it (instance types and their offerings)."""
    import boto3
    from moto import mock_aws

    from provision.providers.cloud.capacity import aws_capacity

    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        answers = {"ec2": ec2, "service-quotas": _quotas(quotas)}
        return aws_capacity(Cluster(load_any(spec)), answers.__getitem__)


def test_the_lasting_nodes_must_fit_the_accounts_gpu_quota(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    # cluster.yaml: 2 x p4d.24xlarge (96 vCPUs) and 4 x p5.48xlarge (192): 960 vCPUs of P
    found = _capacity(SPECS[0], {"L-417A185B": 960})
    assert found.problems == [] and found.notes == []
    found = _capacity(SPECS[0], {"L-417A185B": 0})
    assert found.problems == [
        "the lasting nodes need 960 vCPUs of 'Running On-Demand P instances' in us-east-1, "
        "the account's quota is 0: ask AWS for more (Service Quotas, ec2 L-417A185B) or name "
        "a reservation"
    ]
    # a quota that cannot be read is said, not held against the apply
    found = _capacity(SPECS[0], {"L-417A185B": None})
    assert found.problems == [] and "AccessDeniedException" in found.notes[0]
    # the elastic pools: nothing is launched now, bursting past the quota is said
    found = _capacity(SPECS[2], {"L-417A185B": 192})
    assert found.problems == []
    assert found.notes == [
        "bursting to every elastic node needs 3072 vCPUs of 'Running On-Demand P instances' "
        "in us-east-1, the quota is 192: burst nodes beyond it will fail for want of quota"
    ]
    # reserved pools are not counted: the reservation's capacity was granted already
    found = _capacity(SPECS[3], {"L-417A185B": 96})  # only awsfree's one p4d counts
    assert found.problems == [] and found.notes == []


def test_an_instance_type_ec2_does_not_offer_there_stops_the_apply(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from provision.providers.cloud.capacity import quota_of

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    text = SPECS[0].read_text().replace("zone: us-east-1a", "zone: us-east-1z")
    spec = tmp_path / "elsewhere.yaml"
    spec.write_text(text)
    found = _capacity(spec, {})
    assert found.problems == [
        "pool awsa100: EC2 does not offer p4d.24xlarge in us-east-1z: pick another zone"
    ]
    assert (
        quota_of("p5.48xlarge")
        == quota_of("p4d.24xlarge")
        == ("L-417A185B", "Running On-Demand P instances")
    )
    assert quota_of("vt1.3xlarge") == quota_of("g6e.48xlarge")
    assert quota_of("c7i.large") is not None and quota_of("trn1.32xlarge") is None


def test_apply_asks_about_capacity_before_it_makes_any_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from provision import lifecycle
    from provision.providers import cloud
    from provision.providers.cloud import capacity
    from provision.state import State

    asked: list[str] = []
    monkeypatch.setattr(cloud, "check_ready", asked.append)
    refused = capacity.Findings(["pool awsa100: EC2 does not offer p4d.24xlarge there"], ["n"])
    monkeypatch.setattr(capacity, "aws_capacity", lambda _c, _client: refused)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    cluster = Cluster(load_any(SPECS[0]))
    said: list[object] = []
    with pytest.raises(OperationError) as err:
        lifecycle.create_nodes(cluster, State(tmp_path, "cloudy"), said.append)
    assert str(err.value) == (
        "aws: pool awsa100: EC2 does not offer p4d.24xlarge there; nothing was created"
    )
    assert asked == ["aws"]  # the first cloud refused: the others are not asked, nothing made
    assert said == ["aws: n"]


class _CloudAPIs(JsonFake):
    """Compute Engine and Resource Manager at the HTTP layer, for what apply asks them before
    anything is made: a zone's machine types and a region's quotas (GCP); a region's VM sizes,
    the families' vCPU usage and a Marketplace agreement (Azure); and Azure's OAuth token."""

    def __init__(self, gpus_free: float, vcpus_free: int, accepted: bool) -> None:
        super().__init__()
        self.gpus_free, self.vcpus_free, self.accepted = gpus_free, vcpus_free, accepted

    def respond(self, method: str, path: str, headers: dict[str, str], body: Any) -> Any:
        if method == "POST" and path.endswith("/oauth2/v2.0/token"):
            ok = "client_secret=s3cret" in body and "grant_type=client_credentials" in body
            return (200, {"access_token": "arm-token"}) if ok else (401, {"error": "denied"})
        if headers.get("Authorization") not in ("Bearer gce-token", "Bearer arm-token"):
            return 401, {"error": {"code": "Unauthenticated", "message": "no token"}}
        route = urllib.parse.urlparse(path).path
        if route == "/projects/burst-project/zones/us-central1-a/machineTypes/a3-highgpu-8g":
            return 200, {"name": "a3-highgpu-8g", "guestCpus": 208}
        if route == "/projects/burst-project/regions/us-central1":
            quota = {"metric": "NVIDIA_H100_GPUS", "limit": 64.0, "usage": 64 - self.gpus_free}
            return 200, {"name": "us-central1", "quotas": [quota]}
        sub = "/subscriptions/00000000-1111-2222-3333-444444444444/providers"
        if route == f"{sub}/Microsoft.Compute/skus":
            assert "location eq 'eastus'" in urllib.parse.unquote(path)
            size = {
                "resourceType": "virtualMachines",
                "name": "Standard_ND96isr_H100_v5",
                "family": "standardNDSH100v5Family",
                "capabilities": [{"name": "vCPUs", "value": "96"}],
                "restrictions": [],
            }
            return 200, {"value": [size]}
        if route == f"{sub}/Microsoft.Compute/locations/eastus/usages":
            family = {"value": "standardNDSH100v5Family", "localizedValue": "ND H100 v5"}
            used = 1000 - self.vcpus_free
            return 200, {"value": [{"name": family, "currentValue": used, "limit": 1000}]}
        if "/agreements/current" in route:
            return 200, {"properties": {"accepted": self.accepted}}
        return 404, {"error": {"code": "NotFound", "message": f"{route} not found"}}


def _cli(bin_dir: Path, name: str, output: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    (bin_dir / name).chmod(0o755)


def test_gcp_and_azure_capacity_before_anything_is_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from provision.providers import cloud

    azure = json.dumps(
        {"accessToken": "arm-token", "subscription": "00000000-1111-2222-3333-444444444444"}
    )
    _cli(tmp_path / "bin", "gcloud", "gce-token")
    _cli(tmp_path / "bin", "az", azure)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    # the hybrid example: 2 lasting a3-highgpu-8g (16 H100s), 2 lasting ND H100 v5 (192 vCPUs)
    cluster = Cluster(load_any(SPECS[1]))
    said: list[str] = []
    with _CloudAPIs(gpus_free=16, vcpus_free=192, accepted=True) as api:
        env = {
            "GOOGLE_PROJECT": "burst-project",
            "PROVISION_GCP_ENDPOINT": api.url,
            "PROVISION_AZURE_ENDPOINT": api.url,
        }
        cloud.check_capacity("gcp", cluster, said.append, env)
        cloud.check_capacity("azure", cluster, said.append, env)
        assert said == []
        api.gpus_free, api.vcpus_free = 8, 96
        with pytest.raises(OperationError) as gcp:
            cloud.check_capacity("gcp", cluster, said.append, env)
        with pytest.raises(OperationError) as az:
            cloud.check_capacity("azure", cluster, said.append, env)
        # a service principal's token, from the form grant
        principal = {
            **env,
            "ARM_CLIENT_ID": "app",
            "ARM_CLIENT_SECRET": "s3cret",
            "ARM_TENANT_ID": "tenant",
            "ARM_SUBSCRIPTION_ID": "00000000-1111-2222-3333-444444444444",
        }
        api.vcpus_free = 192
        cloud.check_capacity("azure", cluster, said.append, principal)
        denied = {**principal, "ARM_CLIENT_SECRET": "wrong"}
        cloud.check_capacity("azure", cluster, said.append, denied)
    assert str(gcp.value) == (
        "gcp: the lasting nodes need 16 GPUs of NVIDIA_H100_GPUS in us-central1, the project "
        "has 8 free (quota 64): ask Google for more (IAM & Admin, Quotas) or name a reservation"
    )
    assert str(az.value) == (
        "azure: the lasting nodes need 192 vCPUs of standardNDSH100v5Family in eastus, the "
        "subscription has 96 free (quota 1000): ask Azure for more (Quotas) or name a capacity "
        "reservation"
    )
    assert said == ["azure: its quotas were not checked: HTTP 401: denied"]
    tokens = [b for m, p, b in api.requests if m == "POST"]
    assert len(tokens) == 2 and "s3cret" not in " ".join(said)


def test_azure_capacity_names_unaccepted_terms_and_missing_sizes(tmp_path: Path) -> None:
    from provision.providers.cloud.capacity import azure_capacity, gcp_capacity

    cluster = Cluster(load_any(SPECS[1]))  # its Azure pool: 2 x ND H100 v5 in eastus
    answers = {"skus": {"value": []}}

    def get(path: str) -> Any:
        if "agreements/current" in path:
            return {"properties": {"accepted": False}}
        return answers["skus"] if "/skus" in path else None

    found = azure_capacity(cluster, "sub", get, "resf:rockylinux-x86_64:9-base")
    assert found.problems == [
        "the subscription has not accepted the terms of the image resf:rockylinux-x86_64:9-base: "
        "az vm image terms accept --urn resf:rockylinux-x86_64:9-base:latest",
        "pool azh100: Azure does not offer Standard_ND96isr_H100_v5 in eastus",
    ]
    restricted = {
        "resourceType": "virtualMachines",
        "name": "Standard_ND96isr_H100_v5",
        "restrictions": [{"type": "Location", "reasonCode": "NotAvailableForSubscription"}],
    }
    answers["skus"] = {"value": [restricted]}
    found = azure_capacity(cluster, "sub", get, None)
    assert found.problems == [
        "pool azh100: Standard_ND96isr_H100_v5 is not available to this subscription in eastus "
        "(ask Azure to enable the size)"
    ]
    # a zone without the machine type (Compute Engine answers 404)
    found = gcp_capacity(cluster, "p", lambda _path: None)
    assert found.problems == [
        "pool gcph100: Compute Engine does not offer a3-highgpu-8g in us-central1-a: pick "
        "another zone"
    ]


def test_an_elastic_aws_pool_joins_by_its_instance_profile_and_user_data() -> None:
    """The cluster's munge key goes into Secrets Manager (a Pulumi secret); each elastic pool's
    launch template carries an instance profile whose role may read that one secret and
    nothing else, tags in the metadata (the node's name), and the user data that runs the join,
    which holds no key material."""
    import base64
    import secrets

    import yaml

    from provision.burst.join import parse_join_config

    munge = secrets.token_bytes(1024)
    keys = {"awsh100": b'{"hub": "aws-hub", "keys": {}}'}
    rec, _, _ = build(
        ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml", munge_key=munge, tunnel_keys=keys
    )
    secret, tunnel = sorted(
        rec.of("secretsmanager/secret:Secret"), key=lambda r: "tunnel" in r.name
    )
    assert secret.inputs["name"] == "burst-munge-key"
    # the pool is remote: its nodes' tunnel keys in a secret of its own
    assert tunnel.inputs["name"] == "burst-awsh100-tunnel-keys"
    version, tunnel_version = sorted(
        rec.of("secretsmanager/secretVersion:SecretVersion"), key=lambda r: "tunnel" in r.name
    )
    # a Pulumi secret: the mocks see it wrapped as the engine does, encrypted in the state
    for made, value in ((version, munge), (tunnel_version, keys["awsh100"])):
        wrapped = made.inputs["secretBinary"]
        assert wrapped["4dabf18193072939515e22adb298388d"] == "1b47061264138c4ac30d75fd1eb44270"
        assert base64.b64decode(wrapped["value"]) == value
    (template,) = [t for t in rec.of("LaunchTemplate") if t.name == "burst-awsh100-lt"]
    data = base64.b64decode(template.inputs["userData"])
    for form in (munge, base64.b64encode(munge), munge.hex().encode(), b"aws-hub"):
        assert form not in data
    join = parse_join_config(yaml.safe_load(data)["write_files"][0]["content"])
    assert (join.cloud, join.secret, join.controllers) == (
        "aws",
        "burst-munge-key",
        (("head01", "10.20.0.10"),),
    )
    assert (join.tunnel_secret, join.tunnel_endpoint) == (
        "burst-awsh100-tunnel-keys",
        "vpn.example.org:51820",
    )
    (profile,) = rec.of("iam/instanceProfile:InstanceProfile")
    assert template.inputs["iamInstanceProfile"] == {
        "arn": f"arn:aws:iam/instanceProfile:{profile.name}"
    }
    (role,) = rec.of("iam/role:Role")
    assert profile.inputs["role"] == role.name
    assert (
        profile.inputs["role"] == role.inputs.get("name", f"{role.name}-id")
        or profile.inputs["role"]
    )
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert trust == [
        {
            "Effect": "Allow",
            "Principal": {"Service": "ec2.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ]
    (policy,) = rec.of("iam/rolePolicy:RolePolicy")
    assert json.loads(policy.inputs["policy"])["Statement"] == [
        {
            "Effect": "Allow",
            "Action": "secretsmanager:GetSecretValue",
            "Resource": [
                "arn:aws:secretsmanager/secret:burst-munge-key",
                "arn:aws:secretsmanager/secret:burst-awsh100-tunnel-keys",
            ],
        }
    ]
    # without elastic pools the stack holds no secret and no node role
    lasting, _, _ = build(ROOT / "examples" / "hybrid-cloud.yaml")
    assert lasting.of("secretsmanager/secret:Secret", none=True) == []
    assert lasting.of("iam/role:Role", none=True) == []


def test_elastic_gcp_and_azure_pools_join_by_their_identity_and_user_data() -> None:
    """GCP: Secret Manager holds the key (its own bytes, a Pulumi secret); the pool's service
    account may access that secret alone, and the instance template carries it and the
    `user-data` cloud-init reads. Azure: a Key Vault with role-based access holds it; the
    pool's user-assigned identity is Key Vault Secrets User on that one secret, and the scale
    set carries the identity and the userData (naming that identity's client ID)."""
    import base64
    import secrets

    import yaml

    from provision.burst.join import parse_join_config

    munge = secrets.token_bytes(1024)
    keys = {"gcph100": b"gcp-tunnel-keys", "azh100": b"azure-tunnel-keys"}
    rec, _, _ = build(
        ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml", munge_key=munge, tunnel_keys=keys
    )

    def joined(text: str) -> Any:
        forms = (
            munge,
            base64.b64encode(munge),
            *keys.values(),
            *map(base64.b64encode, keys.values()),
        )
        assert all(form not in text.encode() for form in forms)
        return parse_join_config(yaml.safe_load(text)["write_files"][0]["content"])

    secret, tunnel = sorted(
        rec.of("gcp:secretmanager/secret:Secret"), key=lambda r: "tunnel" in r.name
    )
    assert (secret.inputs["secretId"], tunnel.inputs["secretId"]) == (
        "burst-munge-key",
        "burst-gcph100-tunnel-keys",
    )
    versions = sorted(
        rec.of("gcp:secretmanager/secretVersion:SecretVersion"), key=lambda r: "tunnel" in r.name
    )
    assert all(v.inputs["isSecretDataBase64"] is True for v in versions)
    assert [base64.b64decode(v.inputs["secretData"]["value"]) for v in versions] == [
        munge,
        keys["gcph100"],
    ]
    account, heads = sorted(
        rec.of("serviceaccount/account:Account"), key=lambda r: "heads" in r.name
    )
    members = sorted(rec.of("secretIamMember:SecretIamMember"), key=lambda r: "tunnel" in r.name)
    email = f"{account.inputs['accountId']}@lab-project.iam.gserviceaccount.com"
    # the pool's service account reads these two secrets, each by its own binding, and no more
    assert [m.inputs["secretId"] for m in members] == [f"{secret.name}-id", f"{tunnel.name}-id"]
    for member in members:
        assert member.inputs["role"] == "roles/secretmanager.secretAccessor"
        assert member.inputs["member"] == f"serviceAccount:{email}"
    assert account.inputs["accountId"] == "burst-gcph100"
    (template,) = [t for t in rec.of("compute/instanceTemplate:InstanceTemplate")
                   if t.name.startswith("burst-gcph100")]  # fmt: skip
    assert template.inputs["serviceAccount"] == {"email": email, "scopes": ["cloud-platform"]}
    gcp_join = joined(template.inputs["metadata"]["user-data"])
    assert (gcp_join.cloud, gcp_join.secret) == ("gcp", "burst-munge-key")
    # the heads (outside GCP) burst as an account of their own: Compute Engine's instance admin
    # in the project, user of the pool's node account (to attach it), no secret of the cluster;
    # its key a Pulumi secret, the key file's JSON
    assert heads.inputs["accountId"] == "burst-burst-heads"
    heads_member = f"serviceAccount:{heads.inputs['accountId']}@lab-project.iam.gserviceaccount.com"
    (project_grant,) = rec.of("projects/iAMMember:IAMMember")
    assert project_grant.inputs == {
        "project": "lab-project",
        "role": "roles/compute.instanceAdmin.v1",
        "member": heads_member,
    }
    (uses,) = rec.of("serviceaccount/iAMMember:IAMMember")
    assert uses.inputs == {
        "serviceAccountId": f"projects/lab-project/serviceAccounts/{email}",
        "role": "roles/iam.serviceAccountUser",
        "member": heads_member,
    }
    assert all(m.inputs["member"] != heads_member for m in members)
    (heads_key,) = rec.of("serviceaccount/key:Key")
    assert heads_key.inputs["serviceAccountId"] == heads_member.replace(
        "serviceAccount:", "projects/lab-project/serviceAccounts/"
    )

    (vault,) = rec.of("keyvault:Vault")
    assert vault.inputs["properties"]["enableRbacAuthorization"] is True
    kv_secret, kv_tunnel = sorted(rec.of("keyvault:Secret"), key=lambda r: "tunnel" in r.name)
    assert base64.b64decode(kv_secret.inputs["properties"]["value"]["value"]) == munge
    assert base64.b64decode(kv_tunnel.inputs["properties"]["value"]["value"]) == keys["azh100"]
    assert kv_tunnel.inputs["secretName"] == "burst-azh100-tunnel-keys"
    (identity,) = rec.of("managedidentity:UserAssignedIdentity")
    grants = sorted(rec.of("authorization:RoleAssignment"), key=lambda r: "tunnel" in r.name)
    # Key Vault Secrets User on each of the two secrets, nothing wider, for the one identity
    assert [g.inputs["scope"] for g in grants] == [f"{kv_secret.name}-id", f"{kv_tunnel.name}-id"]
    assert len({g.inputs["principalId"] for g in grants}) == 1
    for grant in grants:
        assert grant.inputs["principalId"].startswith("principal-")
        assert grant.inputs["roleDefinitionId"].endswith(
            "/roleDefinitions/4633458b-17de-408a-b874-0445c86b69e6"
        )
    (scale_set,) = rec.of("compute:VirtualMachineScaleSet")
    assert scale_set.inputs["identity"] == {
        "type": "UserAssigned",
        "userAssignedIdentities": [f"{identity.name}-id"],
    }
    profile = scale_set.inputs["virtualMachineProfile"]
    azure_join = joined(base64.b64decode(profile["userData"]).decode())
    assert azure_join.cloud == "azure" and azure_join.identity.startswith("client-")
    assert azure_join.secret == (
        f"https://{vault.inputs['vaultName']}.vault.azure.net/secrets/burst-munge-key"
    )


def test_plan_says_how_each_clouds_burst_nodes_join() -> None:
    from provision.providers.cloud.layout import describe, layout

    cluster = Cluster(load_any(ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml"))
    said = {k: describe(layout(cluster, k, KEY)) for k in ("aws", "gcp", "azure")}
    assert said["aws"][0].endswith("; the munge key in Secrets Manager")
    assert (
        "aws pool awsh100: burst nodes join by themselves: user data runs the join; the "
        "instance profile reads the munge key from Secrets Manager and nothing else"
    ) in said["aws"]
    assert any("pool's service account reads the munge key from Secret Manager" in x
               for x in said["gcp"])  # fmt: skip
    assert any("pool's managed identity reads the munge key from a Key Vault" in x
               for x in said["azure"])  # fmt: skip
    lasting = describe(
        layout(Cluster(load_any(ROOT / "examples" / "hybrid-cloud.yaml")), "aws", KEY)
    )
    assert not any("munge" in line for line in lasting)


def test_the_heads_burst_in_aws_with_the_burst_policy_alone(tmp_path: Path) -> None:
    """The heads' burst programs act in EC2 with a policy of what they do and no more: launch,
    tag at launch, name and end only the cluster's own instances, look, and pass the elastic
    pools' node roles to EC2. The heads are on premises: the policy is an IAM user's, whose
    key is a Pulumi secret (apply keeps it 0600 for the burst role)."""
    from provision.providers.cloud.aws import burst_policy

    rec, _, _ = build(ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml")
    (user,) = rec.of("iam/user:User")
    (policy,) = rec.of("iam/userPolicy:UserPolicy")
    (key,) = rec.of("iam/accessKey:AccessKey")
    assert policy.inputs["user"] == key.inputs["user"] == user.inputs["name"] == "burst-burst"
    (node_role,) = rec.of("iam/role:Role")  # the elastic pool's: no role for a head
    statements = {s["Sid"]: s for s in json.loads(policy.inputs["policy"])["Statement"]}
    assert statements["PassNodeRoles"]["Resource"] == [f"arn:aws:iam/role:{node_role.name}"]
    own = {"StringEquals": {f"aws:ResourceTag/{TAG}": "burst"}}
    assert statements["EndOwn"]["Condition"] == statements["NameOwn"]["Condition"] == own
    assert statements["EndOwn"]["Action"] == "ec2:TerminateInstances"
    assert statements["TagAtLaunch"]["Condition"] == {
        "StringEquals": {"ec2:CreateAction": "RunInstances"}
    }
    actions = set()
    for statement in statements.values():
        found = statement["Action"]
        actions |= {found} if isinstance(found, str) else set(found)
    assert actions == {
        "ec2:RunInstances",
        "ec2:CreateTags",
        "ec2:DescribeInstances",
        "ec2:DescribeLaunchTemplates",
        "ec2:DescribeLaunchTemplateVersions",
        "ec2:TerminateInstances",
        "iam:PassRole",
    }
    assert json.loads(policy.inputs["policy"]) == json.loads(
        burst_policy("burst", [f"arn:aws:iam/role:{node_role.name}"])
    )


def test_the_heads_credentials_are_kept_apart_from_the_outputs(tmp_path: Path) -> None:
    import stat

    from provision.providers.cloud import BURST_CREDENTIALS, keep_credentials
    from provision.state import State

    state = State(tmp_path, "c")
    state.ensure()
    text = "[default]\naws_access_key_id = AKIAX\naws_secret_access_key = s3cr3t\n"
    outputs = {"nodes": {}, "templates": {"p": "lt-1"}, BURST_CREDENTIALS: text}
    kept = keep_credentials(dict(outputs), state, "aws")
    assert kept == {"nodes": {}, "templates": {"p": "lt-1"}}
    path = state.secrets / "aws-burst-credentials"
    assert path.read_text() == text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # a stack without the user any more (a head moved into AWS): the file goes
    keep_credentials({"nodes": {}}, state, "aws")
    assert not path.exists()
    # Azure's: the heads' identity and issuer from the stack, the issuer's key from the secrets
    from provision.providers.cloud import AZURE_ISSUER_KEY, _issuer_key

    pem = _issuer_key(state).read_text()
    assert stat.S_IMODE((state.secrets / AZURE_ISSUER_KEY).stat().st_mode) == 0o600
    identity = {"tenant": "t", "client_id": "c", "issuer": "https://i/oidc/", "kid": "k"}
    kept = keep_credentials({"nodes": {}, BURST_CREDENTIALS: json.dumps(identity)}, state, "azure")
    assert kept == {"nodes": {}}
    azure = state.secrets / "azure-burst-credentials"
    assert json.loads(azure.read_text()) == {**identity, "private_key": pem}
    assert stat.S_IMODE(azure.stat().st_mode) == 0o600
    assert _issuer_key(state).read_text() == pem  # made once


def test_a_running_stacks_subnets_keep_their_ranges(tmp_path: Path) -> None:
    """A spec that would change the range of a subnet the running AWS stack has (here the first
    elastic pool of several network cards, whose zone then splits in two) is refused by plan at
    the pool, before anything changes: EC2 cannot change a subnet's range, and Pulumi would fail
    midway (the new subnet overlaps the old one). The ranges the stack has pass."""
    from provision.providers.cloud import outputs_file, refuse_recarve
    from provision.state import State

    spec = ROOT / "examples" / "hybrid-burst.yaml"
    cluster = Cluster(load_any(spec))
    state = State(tmp_path, cluster.spec.name)
    state.ensure()
    saved = outputs_file(state, "aws")
    saved.write_text(json.dumps({"nodes": {}, "subnets": {"hybridburst-subnet": "10.31.0.0/16"}}))
    done = provision("plan", str(spec), "--state-dir", str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    at = spec.read_text().splitlines().index("  - name: awsh100") + 1
    assert line.startswith(f"{spec}:{at}: pools[3]: the running AWS stack's subnets would change")
    assert "hybridburst-subnet 10.31.0.0/16 -> 10.31.0.0/17" in line
    assert "Traceback" not in done.stderr
    saved.write_text(
        json.dumps(
            {
                "nodes": {},
                "subnets": {
                    "hybridburst-subnet": "10.31.0.0/17",
                    "hybridburst-private": "10.31.128.0/17",
                },
            }
        )
    )
    refuse_recarve(spec, state, cluster)  # as made: nothing to refuse


def test_azure_heads_burst_as_an_identity_federated_with_the_clusters_issuer() -> None:
    """A head outside Azure has no managed identity: the stack makes the heads' user-assigned
    identity, a federated credential on it that trusts the cluster's own OpenID Connect issuer
    (the discovery document and the key set, public blobs of a storage account, as Microsoft's
    guide for self-managed issuers publishes them), and a role of the cluster's own that makes
    and deletes the pools' VMs in its resource group and reads no secret. The credentials it
    hands apply name the identity, the issuer and the subject; the issuer's private key is the
    workstation's alone (never in the stack)."""

    from provision.providers.cloud import issuer_jwk
    from provision.providers.cloud.azure import HEADS_ACTIONS

    _key, pem = rsa_key()
    jwk = issuer_jwk(pem)
    rec, _, outputs = build(
        ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml", issuer_key=jwk
    )
    (account,) = rec.of("storage:StorageAccount")
    name = account.inputs["accountName"]
    assert account.inputs["allowBlobPublicAccess"] is True
    assert account.inputs["minimumTlsVersion"] == "TLS1_2"
    (container,) = rec.of("storage:BlobContainer")
    assert container.inputs["publicAccess"] == "Blob"
    issuer = f"https://{name}.blob.core.windows.net/{container.inputs['containerName']}/"
    blobs = {b.inputs["blobName"]: b for b in rec.of("storage:Blob")}
    assert sorted(blobs) == [".well-known/openid-configuration", "openid/v1/jwks"]

    def text(blob: Any) -> Any:
        source = blob.inputs["source"]
        return json.loads(getattr(source, "text", None) or source["text"])

    discovery = text(blobs[".well-known/openid-configuration"])
    assert discovery["issuer"] == issuer
    assert discovery["jwks_uri"] == f"{issuer}openid/v1/jwks"
    assert discovery["id_token_signing_alg_values_supported"] == ["RS256"]
    assert text(blobs["openid/v1/jwks"]) == {"keys": [jwk]}
    assert "d" not in jwk and "PRIVATE" not in outputs["azure-burst-credentials"]
    heads, _node = sorted(
        rec.of("managedidentity:UserAssignedIdentity"), key=lambda r: "heads" not in r.name
    )
    assert heads.inputs["resourceName"] == "burst-burst-heads"
    (federated,) = rec.of("managedidentity:FederatedIdentityCredential")
    assert federated.inputs["issuer"] == issuer
    assert federated.inputs["subject"] == "provision:burst:burst-heads"
    assert federated.inputs["audiences"] == ["api://AzureADTokenExchange"]
    assert federated.inputs["resourceName"] == "burst-burst-heads"
    from . import cloud_rules

    typ = "azure-native:managedidentity:FederatedIdentityCredential"
    assert cloud_rules.refusals(typ, "f", federated.inputs) == []
    two = {**federated.inputs, "audiences": ["api://AzureADTokenExchange", "other"]}
    assert cloud_rules.refusals(typ, "f", two)
    (role,) = rec.of("authorization:RoleDefinition")
    typ = "azure-native:authorization:RoleDefinition"
    assert cloud_rules.refusals(typ, "r", {**role.inputs, "roleDefinitionId": "heads"})
    (group,) = rec.of("resources:ResourceGroup")
    assert role.inputs["assignableScopes"] == [f"{group.name}-id"]
    (permissions,) = role.inputs["permissions"]
    assert permissions["actions"] == list(HEADS_ACTIONS)
    assert not permissions.get("dataActions")  # it reads no secret
    assert not [a for a in HEADS_ACTIONS if "keyvault" in a.lower() or "roleAssignments" in a]
    (assignment,) = [
        g
        for g in rec.of("authorization:RoleAssignment")
        if g.inputs["roleDefinitionId"] == f"{role.name}-id"
    ]
    assert assignment.inputs["scope"] == f"{group.name}-id"
    assert assignment.inputs["principalId"] == f"principal-{rec.made.index(heads) + 1}"
    # the ND pool's burst VMs go in its availability set (a Flexible scale set carries no
    # InfiniBand): the scale set names it
    from provision.burst.config import TAG_AVAILABILITY_SET

    (avset,) = rec.of("compute:AvailabilitySet")
    (scale_set,) = rec.of("compute:VirtualMachineScaleSet")
    assert scale_set.inputs["tags"][TAG_AVAILABILITY_SET] == f"{avset.name}-id"
    doc = json.loads(outputs["azure-burst-credentials"])
    assert doc == {
        "tenant": "tenant-1",
        "client_id": f"client-{rec.made.index(heads) + 1}",
        "subscription": "sub-1",
        "issuer": issuer,
        "subject": "provision:burst:burst-heads",
        "kid": jwk["kid"],
    }

r"""The clouds' own rules for what they accept, as the Pulumi mocks in tests/test_cloud.py enforce
them: each rule is one the cloud's API refuses a resource for at `pulumi up` (the mocks alone
accept anything). Each function takes a resource's type and inputs, as Pulumi's mocks see them,
and returns why the cloud would refuse it, if it would.

Sources, each rule: EC2's CreateSecurityGroup and IpPermission (GroupDescription and rule
descriptions: a-zA-Z0-9, spaces and ._-:/()#,@[]+=&;{}!$*, at most 255 characters); EC2's
launch templates (a public address cannot be asked for on a template with several network
interfaces: InvalidParameterCombination); EC2's way out (an Elastic IP in a VPC, a public NAT
gateway with a subnet and an Elastic IP's allocation ID, each route with exactly one target);
Compute Engine's Spot VMs (automaticRestart false, onHostMaintenance TERMINATE, preemptible);
Compute Engine's resource names (RFC 1035: a
lower-case letter, then lower-case letters, digits and '-', not ending with '-', at most 63;
Pulumi's auto-naming adds '-' and 7 characters) and zonal instances (a zone is required); Azure's
Marketplace images that carry a purchase plan (the VM must name the plan) and encryption at host
(refused unless the subscription registered Microsoft.Compute/EncryptionAtHost, which a stack
cannot know). Reservations: EC2's capacity-block market only with the block's reservation ID
(launch templates' InstanceMarketOptions); Compute Engine's specific reservation affinity by the
key compute.googleapis.com/reservation-name; Azure's on-demand capacity reservation limits (no
proximity placement group or availability set, no scale set with a single placement group, no
ND-series size). Joining burst nodes: EC2's user data (at most 16 KB before base64,
RunInstances' and the launch template's UserData), the instance metadata tags option (enabled or
disabled), IAM's role and instance profile names ([\w+=,.@-], at most 64 and 128 characters)
and a role's trust policy (the principal ec2.amazonaws.com for an instance profile's role),
Secrets Manager's secret names (ASCII letters, digits and /_+=.@-, at most 512; its guide asks
that a name not end in a hyphen and six characters, which reads as a partial ARN) and its secret
values (at most 65,536 bytes). GCP: a service account's ID (6-30 characters, a lower-case
letter, then lower-case letters, digits and hyphens, not ending in a hyphen), Secret Manager's
secret IDs (letters, digits, _ and -, at most 255). Azure: Key Vault names (3-24 letters, digits
and hyphens, starting with a letter, ending with a letter or digit, no two hyphens in a row),
a vault's tenant, its secrets' names (letters, digits and hyphens, at most 127), and a VM's
userData (at most 64 KB, base64). Azure's heads' identity: a storage account's name (3-24
lower-case letters and digits), a public container only in an account that allows public blob
access, a federated identity credential (its name 3-120 letters, digits, - and _, starting with a
letter or digit; an HTTPS issuer; exactly one audience), a custom role (its name a GUID, at least
one assignable scope, its own scope among them). Azure Spot: a Spot VM names its eviction policy;
an eviction policy and a billing profile only on Spot.

The API's load balancers on heads in a cloud. Elastic Load Balancing (CreateLoadBalancer,
CreateTargetGroup, CreateListener): a load balancer's and a target group's name at most 32
letters, digits and hyphens, no hyphen at either end, not starting "internal-"; a subnet
mapping's private IPv4 address only on an internal Network Load Balancer; a Network Load
Balancer's target groups and listeners TCP, TLS, UDP or TCP_UDP; health check thresholds 2-10,
its interval 5-300 seconds, a path only for HTTP and HTTPS checks; client IP preservation
"true" or "false"; a forward action names its target group. Compute Engine's internal
passthrough Network Load Balancer: an internal address names its subnetwork; an INTERNAL
backend service is TCP, UDP or UNSPECIFIED, with exactly one health check and its backends
balanced by CONNECTION; an INTERNAL forwarding rule names a backend service and a subnetwork
and at most five ports (or all). Azure Load Balancer: the Basic SKU is retired (30 September
2025); a static frontend names its private address; an HTTPS or HTTP probe names its path,
probes at least every 5 seconds; a rule's idle timeout is 4-100 minutes.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

AWS_TEXT = re.compile(r"[a-zA-Z0-9. _\-:/()#,@\[\]+=&;{}!$*]{0,255}")
GCP_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
GCP_AUTONAME_SUFFIX = 8  # "-" and 7 random characters
# Azure Marketplace images that need a purchase plan on the VM: (publisher, offer)
AZURE_PLAN_IMAGES = {("resf", "rockylinux-x86_64")}
GCP_RESERVATION_KEY = "compute.googleapis.com/reservation-name"
IAM_NAME = re.compile(r"[\w+=,.@-]+")
SECRET_NAME = re.compile(r"[A-Za-z0-9/_+=.@-]{1,512}")
USER_DATA_MAX = 16 * 1024
SECRET_MAX = 65536
GCP_ACCOUNT_ID = re.compile(r"[a-z]([-a-z0-9]{4,28}[a-z0-9])")
GCP_SECRET_ID = re.compile(r"[A-Za-z0-9_-]{1,255}")
KEY_VAULT_NAME = re.compile(r"[A-Za-z](?!.*--)[A-Za-z0-9-]{1,22}[A-Za-z0-9]")
KEY_VAULT_SECRET = re.compile(r"[A-Za-z0-9-]{1,127}")
AZURE_USER_DATA_MAX = 64 * 1024
STORAGE_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
FEDERATED_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_-]{2,119}")
GUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def refusals(typ: str, name: str, inputs: dict[str, Any]) -> list[str]:
    """Why the cloud would refuse this resource; empty when it would make it."""
    if typ == "aws:ec2/securityGroup:SecurityGroup":
        return _aws_security_group(inputs)
    if typ == "aws:ec2/launchTemplate:LaunchTemplate":
        return _aws_launch_template(inputs)
    if typ in ("aws:ec2/natGateway:NatGateway", "aws:ec2/routeTable:RouteTable", "aws:ec2/eip:Eip"):
        return _aws_way_out(typ, name, inputs)
    if typ.startswith("aws:iam/") or typ.startswith("aws:secretsmanager/"):
        return _aws_identity(typ, inputs)
    if typ == "gcp:serviceaccount/account:Account":
        account = inputs.get("accountId", "")
        return [] if GCP_ACCOUNT_ID.fullmatch(account) else [f"IAM refuses account ID {account!r}"]
    if typ == "gcp:secretmanager/secret:Secret":
        secret = inputs.get("secretId", "")
        return [] if GCP_SECRET_ID.fullmatch(secret) else [f"refused secret ID {secret!r}"]
    if typ.startswith("azure-native:keyvault:"):
        return _azure_vault(typ, inputs)
    if typ.startswith(("azure-native:storage:", "azure-native:managedidentity:")) or (
        typ == "azure-native:authorization:RoleDefinition"
    ):
        return _azure_heads(typ, inputs)
    if typ.startswith("aws:lb/"):
        return _aws_balancer(typ, inputs)
    if typ == "azure-native:network:LoadBalancer":
        return _azure_balancer(inputs)
    if typ.startswith("gcp:") and not typ.startswith("gcp:index"):
        return _gcp(typ, name, inputs) + _gcp_balancer(typ, inputs)
    if typ in (
        "azure-native:compute:VirtualMachine",
        "azure-native:compute:VirtualMachineScaleSet",
    ):
        return _azure_machine(inputs)
    return []


def _aws_security_group(inputs: dict[str, Any]) -> list[str]:
    texts = [inputs.get("description", "")]
    texts += [r.get("description", "") for r in inputs.get("ingress", [])]
    texts += [r.get("description", "") for r in inputs.get("egress", [])]
    return [
        f"EC2 refuses the description {text!r} (InvalidParameterValue: characters or length)"
        for text in texts
        if not AWS_TEXT.fullmatch(text)
    ]


def _aws_launch_template(inputs: dict[str, Any]) -> list[str]:
    problems = []
    nics = inputs.get("networkInterfaces", [])
    if len(nics) > 1 and any("associatePublicIpAddress" in n for n in nics):
        problems.append(
            f"EC2 refuses a public address on {inputs.get('name')}, a template with "
            f"{len(nics)} network interfaces (InvalidParameterCombination)"
        )
    data = inputs.get("userData")
    if data is not None and len(base64.b64decode(data)) > USER_DATA_MAX:
        problems.append(f"EC2 refuses user data over 16 KB on {inputs.get('name')}")
    tags = inputs.get("metadataOptions", {}).get("instanceMetadataTags")
    if tags not in (None, "enabled", "disabled"):
        problems.append(f"EC2 takes instanceMetadataTags enabled or disabled, not {tags!r}")
    market = inputs.get("instanceMarketOptions", {}).get("marketType")
    target = inputs.get("capacityReservationSpecification", {}).get("capacityReservationTarget", {})
    spot = inputs.get("instanceMarketOptions", {}).get("spotOptions", {})
    stops = spot.get("instanceInterruptionBehavior") in ("stop", "hibernate")
    if market == "spot" and stops and spot.get("spotInstanceType") != "persistent":
        problems.append(
            f"EC2 stops or hibernates a spot instance of {inputs.get('name')} only from a "
            "persistent request (InvalidParameterCombination)"
        )
    if market == "capacity-block" and not target.get("capacityReservationId"):
        problems.append(
            f"EC2 refuses the capacity-block market on {inputs.get('name')} without the "
            "Capacity Block's reservation ID (InvalidParameterCombination)"
        )
    return problems


ROUTE_TARGETS = (
    "gatewayId",
    "natGatewayId",
    "networkInterfaceId",
    "transitGatewayId",
    "vpcPeeringConnectionId",
    "egressOnlyGatewayId",
    "vpcEndpointId",
    "carrierGatewayId",
    "localGatewayId",
    "coreNetworkArn",
)


def _aws_way_out(typ: str, name: str, inputs: dict[str, Any]) -> list[str]:
    if typ == "aws:ec2/eip:Eip":
        domain = inputs.get("domain")
        return [] if domain == "vpc" else [f"EC2 makes Elastic IPs in a VPC only, not {domain!r}"]
    if typ == "aws:ec2/natGateway:NatGateway":
        problems = []
        if not inputs.get("subnetId"):
            problems.append(f"EC2 refuses NAT gateway {name} without a subnet (MissingParameter)")
        public = inputs.get("connectivityType", "public") == "public"
        if public and not inputs.get("allocationId"):
            problems.append(
                f"EC2 refuses public NAT gateway {name} without an Elastic IP's allocation ID"
            )
        return problems
    return [
        f"EC2 refuses route {route.get('cidrBlock')} of {name}: a route names exactly one "
        f"target, not {sorted(k for k in ROUTE_TARGETS if route.get(k))}"
        for route in inputs.get("routes", [])
        if sum(1 for k in ROUTE_TARGETS if route.get(k)) != 1
    ]


def _aws_identity(typ: str, inputs: dict[str, Any]) -> list[str]:
    problems = []
    name = inputs.get("name")
    if typ == "aws:iam/role:Role":
        if name is not None and (not IAM_NAME.fullmatch(name) or len(name) > 64):
            problems.append(f"IAM refuses the role name {name!r}")
        trust = json.loads(inputs["assumeRolePolicy"])
        services = [st.get("Principal", {}).get("Service") for st in trust["Statement"]]
        if "ec2.amazonaws.com" not in services:
            problems.append("an instance profile's role must trust ec2.amazonaws.com")
    elif typ == "aws:iam/instanceProfile:InstanceProfile":
        if name is not None and (not IAM_NAME.fullmatch(name) or len(name) > 128):
            problems.append(f"IAM refuses the instance profile name {name!r}")
    elif typ == "aws:secretsmanager/secret:Secret":
        if name is None or not SECRET_NAME.fullmatch(name):
            problems.append(f"Secrets Manager refuses the secret name {name!r}")
        elif re.search(r"-[A-Za-z0-9]{6}$", name):
            problems.append(f"{name!r} reads as a partial ARN (a hyphen and six characters)")
    elif typ == "aws:secretsmanager/secretVersion:SecretVersion":
        value = inputs.get("secretBinary")
        value = value.get("value") if isinstance(value, dict) else value
        if value is not None and len(base64.b64decode(value)) > SECRET_MAX:
            problems.append("Secrets Manager refuses a secret value over 64 KB")
    return problems


def _azure_vault(typ: str, inputs: dict[str, Any]) -> list[str]:
    if typ == "azure-native:keyvault:Vault":
        vault = inputs.get("vaultName", "")
        problems = [] if KEY_VAULT_NAME.fullmatch(vault) else [f"refused vault name {vault!r}"]
        if not inputs.get("properties", {}).get("tenantId"):
            problems.append(f"a vault names its tenant: {vault!r} has none")
        return problems
    if typ == "azure-native:keyvault:Secret":
        secret = inputs.get("secretName", "")
        return [] if KEY_VAULT_SECRET.fullmatch(secret) else [f"refused secret {secret!r}"]
    return []


_PUBLIC_ACCOUNTS: set[str] = set()  # accounts made allowing public blob access, by name


def _azure_heads(typ: str, inputs: dict[str, Any]) -> list[str]:
    if typ == "azure-native:storage:StorageAccount":
        name = inputs.get("accountName", "")
        if inputs.get("allowBlobPublicAccess"):
            _PUBLIC_ACCOUNTS.add(name)
        return [] if STORAGE_ACCOUNT.fullmatch(name) else [f"refused account name {name!r}"]
    if (
        typ == "azure-native:storage:BlobContainer"
        and inputs.get("publicAccess")
        not in (
            None,
            "None",
        )
        and inputs.get("accountName") not in _PUBLIC_ACCOUNTS
    ):
        return ["Azure refuses a public container in an account without public blob access"]
    if typ == "azure-native:managedidentity:FederatedIdentityCredential":
        problems = []
        name = inputs.get("federatedIdentityCredentialResourceName", "")
        if not FEDERATED_NAME.fullmatch(name):
            problems.append(f"refused federated credential name {name!r}")
        if not str(inputs.get("issuer", "")).startswith("https://"):
            problems.append("a federated credential's issuer is an HTTPS URL")
        if len(inputs.get("audiences") or []) != 1:
            problems.append("a federated credential takes exactly one audience")
        return problems
    if typ == "azure-native:authorization:RoleDefinition":
        problems = []
        if not GUID.fullmatch(str(inputs.get("roleDefinitionId", ""))):
            problems.append("a custom role's name is a GUID")
        scopes = inputs.get("assignableScopes") or []
        if not scopes or inputs.get("scope") not in scopes:
            problems.append("a custom role is made at one of its assignable scopes")
        return problems
    return []


def _gcp(typ: str, name: str, inputs: dict[str, Any]) -> list[str]:
    problems = []
    given = inputs.get("name")
    physical = given if given else name
    limit = 63 if given else 63 - GCP_AUTONAME_SUFFIX
    if not GCP_NAME.fullmatch(physical) or len(physical) > limit:
        problems.append(
            f"Compute Engine refuses the name {physical!r} ({len(physical)} characters"
            f"{'' if given else ' before Pulumi adds 8'}; at most 63, RFC 1035)"
        )
    if typ == "gcp:compute/instanceFromTemplate:InstanceFromTemplate" and not inputs.get("zone"):
        problems.append(f"Compute Engine refuses the instance {physical!r} without a zone")
    scheduling = inputs.get("scheduling", {})
    if scheduling.get("provisioningModel") == "SPOT" and (
        scheduling.get("automaticRestart") is not False
        or scheduling.get("onHostMaintenance") != "TERMINATE"
        or scheduling.get("preemptible") is not True
    ):
        problems.append(
            f"Compute Engine refuses the Spot VM scheduling of {physical!r}: no automatic "
            "restart, terminated on host maintenance, preemptible"
        )
    affinity = inputs.get("reservationAffinity", {})
    if affinity.get("type") == "SPECIFIC_RESERVATION":
        specific = affinity.get("specificReservation", {})
        if specific.get("key") != GCP_RESERVATION_KEY or not specific.get("values"):
            problems.append(
                f"Compute Engine refuses {physical!r}: a specific reservation is named by the "
                f"key {GCP_RESERVATION_KEY} and its name"
            )
    return problems


def _azure_machine(inputs: dict[str, Any]) -> list[str]:
    profile = inputs.get("virtualMachineProfile", inputs)
    image = profile.get("storageProfile", {}).get("imageReference", {})
    problems = []
    data = profile.get("userData")
    if data is not None and len(data) > AZURE_USER_DATA_MAX:
        problems.append("Azure refuses userData over 64 KB")
    if (image.get("publisher"), image.get("offer")) in AZURE_PLAN_IMAGES and not inputs.get("plan"):
        problems.append(
            f"Azure refuses the Marketplace image {image.get('publisher')}:"
            f"{image.get('offer')} without its purchase plan (VMMarketplaceInvalidInput)"
        )
    if profile.get("capacityReservation"):
        size = inputs.get("hardwareProfile", {}).get("vmSize") or inputs.get("sku", {}).get(
            "name", ""
        )
        if inputs.get("proximityPlacementGroup"):
            problems.append(
                "Azure refuses a capacity reservation beside a proximity placement group"
            )
        if inputs.get("availabilitySet"):
            problems.append("Azure refuses a capacity reservation for a VM in an availability set")
        if inputs.get("singlePlacementGroup"):
            problems.append(
                "Azure refuses a capacity reservation for a scale set with a single placement group"
            )
        if str(size).lower().startswith("standard_nd"):
            problems.append(f"Azure has no capacity reservations for ND-series sizes ({size})")
    if profile.get("priority") == "Spot" and profile.get("evictionPolicy") not in (
        "Delete",
        "Deallocate",
    ):
        problems.append("Azure refuses a Spot VM without its eviction policy")
    if profile.get("priority") != "Spot" and (
        "evictionPolicy" in profile or "billingProfile" in profile
    ):
        problems.append("Azure takes an eviction policy and a billing profile for Spot VMs alone")
    if profile.get("securityProfile", {}).get("encryptionAtHost"):
        problems.append(
            "Azure refuses encryption at host unless the subscription registered "
            "Microsoft.Compute/EncryptionAtHost (InvalidParameter)"
        )
    return problems


ELB_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,30}[A-Za-z0-9])?")
NLB_PROTOCOLS = {"TCP", "TLS", "UDP", "TCP_UDP"}


def _aws_balancer(typ: str, inputs: dict[str, Any]) -> list[str]:
    problems = []
    name = inputs.get("name")
    if name is not None and (not ELB_NAME.fullmatch(name) or name.startswith("internal-")):
        problems.append(f"Elastic Load Balancing refuses the name {name!r}")
    if typ == "aws:lb/loadBalancer:LoadBalancer":
        private = [m for m in inputs.get("subnetMappings", []) if m.get("privateIpv4Address")]
        if private and (
            inputs.get("internal") is not True or inputs.get("loadBalancerType") != "network"
        ):
            problems.append("a private IPv4 address is for an internal Network Load Balancer")
    if typ == "aws:lb/targetGroup:TargetGroup":
        if inputs.get("protocol") not in NLB_PROTOCOLS:
            problems.append(
                f"a Network Load Balancer's target group is not {inputs.get('protocol')}"
            )
        if inputs.get("preserveClientIp") not in (None, "true", "false"):
            problems.append("client IP preservation is 'true' or 'false'")
        check = inputs.get("healthCheck", {})
        for key in ("healthyThreshold", "unhealthyThreshold"):
            if key in check and not 2 <= check[key] <= 10:
                problems.append(f"a health check's {key} is 2-10")
        if "interval" in check and not 5 <= check["interval"] <= 300:
            problems.append("a health check's interval is 5-300 seconds")
        if check.get("path") and check.get("protocol") not in ("HTTP", "HTTPS"):
            problems.append("a health check's path is for HTTP and HTTPS checks")
    if typ == "aws:lb/listener:Listener":
        if inputs.get("protocol") not in NLB_PROTOCOLS:
            problems.append(f"a Network Load Balancer listens on TCP, not {inputs.get('protocol')}")
        for action in inputs.get("defaultActions", []):
            if action.get("type") == "forward" and not action.get("targetGroupArn"):
                problems.append("a forward action names its target group")
    return problems


def _gcp_balancer(typ: str, inputs: dict[str, Any]) -> list[str]:
    problems = []
    internal_address = inputs.get("addressType") == "INTERNAL"
    if typ == "gcp:compute/address:Address" and internal_address and not inputs.get("subnetwork"):
        problems.append("Compute Engine refuses an internal address without its subnetwork")
    internal = inputs.get("loadBalancingScheme") == "INTERNAL"
    if typ == "gcp:compute/regionBackendService:RegionBackendService" and internal:
        if inputs.get("protocol") not in ("TCP", "UDP", "UNSPECIFIED"):
            problems.append("an internal backend service is TCP, UDP or UNSPECIFIED")
        checks = inputs.get("healthChecks")
        if not checks or (isinstance(checks, list) and len(checks) != 1):
            problems.append("an internal backend service has exactly one health check")
        if any(b.get("balancingMode") != "CONNECTION" for b in inputs.get("backends", [])):
            problems.append("an internal backend service balances its backends by CONNECTION")
    if typ == "gcp:compute/forwardingRule:ForwardingRule" and internal:
        if not inputs.get("backendService") or not inputs.get("subnetwork"):
            problems.append("an internal forwarding rule names its backend service and subnetwork")
        if len(inputs.get("ports", [])) > 5 or (inputs.get("ports") and inputs.get("allPorts")):
            problems.append("an internal forwarding rule has at most five ports, or all")
    return problems


def _azure_balancer(inputs: dict[str, Any]) -> list[str]:
    problems = []
    if inputs.get("sku", {}).get("name") != "Standard":
        problems.append("Azure retired the Basic Load Balancer (30 September 2025): Standard")
    for frontend in inputs.get("frontendIPConfigurations", []):
        if frontend.get("privateIPAllocationMethod") == "Static" and not frontend.get(
            "privateIPAddress"
        ):
            problems.append("a static frontend names its private address")
    for probe in inputs.get("probes", []):
        if probe.get("protocol") in ("Http", "Https") and not probe.get("requestPath"):
            problems.append("an HTTP or HTTPS probe names its path")
        if probe.get("intervalInSeconds", 5) < 5:
            problems.append("a probe runs at most every 5 seconds")
    for rule in inputs.get("loadBalancingRules", []):
        if not 4 <= rule.get("idleTimeoutInMinutes", 4) <= 100:
            problems.append("a rule's idle timeout is 4-100 minutes")
    return problems

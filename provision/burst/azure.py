"""Burst nodes as Azure VMs made in the pool's Flexible scale set from its VM profile (the
cluster's Pulumi stack made the scale set with capacity 0: size, image, disk, accelerated
networking, security group, proximity placement group or capacity reservation group, and the
image's Marketplace plan where it has one).

The standard library only: the token and the subscription come from the credentials file of
the stack's heads' identity where apply installed one (a head outside Azure: CREDENTIALS; a JWT
the head signs with its key, which Microsoft Entra takes for the identity's token through the
identity's federated credential, as its workload identity federation has it), else from the
head's own managed identity through the instance metadata service; Resource Manager is plain
JSON over HTTPS.

A resume reads the scale set once, asks for one VM per node (named as the node, 16 calls at a
time, its NIC and disk deleted with it; an InfiniBand pool's in the availability set its scale
set names, as a Flexible scale set carries no InfiniBand), then waits for them all to be
provisioned (allocation failures show there; at most 4 minutes), and gives Slurm their
addresses in one call. All or nothing: when one VM fails for want of capacity, the others are
deleted too. A suspend deletes each VM and does not wait. PROVISION_AZURE_ENDPOINT points the
metadata service, Microsoft Entra's token endpoint and Resource Manager at another place (the
tests' fake).
"""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.parse
from typing import Any

from provision.burst import jwt, rest
from provision.burst.backend import CAPACITY, Backend, BurstError, each, one_line
from provision.burst.config import TAG_AVAILABILITY_SET, TAG_NODE, Pool

ARM = "https://management.azure.com"
IMDS = "http://169.254.169.254"
LOGIN = "https://login.microsoftonline.com"
# the stack's heads' identity: its tenant, client and subscription, the issuer and subject its
# federated credential trusts, and the issuer's key (installed by the burst role, root's alone)
CREDENTIALS = "/etc/provision/azure-burst-credentials.json"
# the audience Microsoft Entra asks of a federated credential's token
EXCHANGE_AUDIENCE = "api://AzureADTokenExchange"
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
# an assertion lives 10 minutes; Entra's access token an hour: made again after 50 minutes
ASSERTION_S = 600
TOKEN_S = 3000
COMPUTE_API = "2024-07-01"
NETWORK_API = "2024-05-01"
CAPACITY_CODES = frozenset(
    {
        "SkuNotAvailable",
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
        "QuotaExceeded",
    }
)
PROVISION_WAIT_S = 240
# a VM of a spot pool gone without a suspend: Azure evicted it (the scale set's eviction policy
# deletes it, and leaves no trace on the VM to ask)
SPOT_EVICTED = "spot VM evicted by Azure"
POLL_S = 5.0


def _capacity(codes: list[str], message: str) -> bool:
    # Azure names a quota error OperationNotAllowed and says "quota" in the message
    return bool(CAPACITY_CODES & set(codes)) or (
        "OperationNotAllowed" in codes and "quota" in message.lower()
    )


def vm_failure(vm: dict[str, Any]) -> tuple[str, str]:
    """A Failed VM's cause from its instance view: (code, "code: message", one line)."""
    statuses = vm.get("properties", {}).get("instanceView", {}).get("statuses", [])
    failed: dict[str, Any] = next((s for s in statuses if "/failed" in s.get("code", "")), {})
    code = str(failed.get("code", "")).rpartition("/")[2]
    return code, f"{code}: {' '.join(str(failed.get('message', '')).split())}"[:200]


def vm_body(node: str, scale_set: dict[str, Any], tags: dict[str, str]) -> dict[str, Any]:
    """The scale set's VM profile as one named VM of it (a spot pool's: Spot priority, deleted
    on eviction)."""
    profile = scale_set["properties"]["virtualMachineProfile"]
    os_profile = {k: v for k, v in profile["osProfile"].items() if k != "computerNamePrefix"}
    storage = dict(profile["storageProfile"])
    storage["osDisk"] = {**storage["osDisk"], "deleteOption": "Delete"}
    network = profile["networkProfile"]
    nics = [
        {
            "name": f"{node}-{nic['name']}",
            "properties": {**nic["properties"], "deleteOption": "Delete"},
        }
        for nic in network["networkInterfaceConfigurations"]
    ]
    # an InfiniBand pool's VMs go in its availability set (one InfiniBand partition), the
    # others in the scale set
    avset = (scale_set.get("tags") or {}).get(TAG_AVAILABILITY_SET)
    owner = (
        {"availabilitySet": {"id": avset}}
        if avset
        else {"virtualMachineScaleSet": {"id": scale_set["id"]}}
    )
    properties: dict[str, Any] = {
        **owner,
        "hardwareProfile": {"vmSize": scale_set["sku"]["name"]},
        "storageProfile": storage,
        "osProfile": {**os_profile, "computerName": node},
        "networkProfile": {
            "networkApiVersion": network["networkApiVersion"],
            "networkInterfaceConfigurations": nics,
        },
    }
    for key in (
        "securityProfile",
        "capacityReservation",
        "userData",
        "priority",
        "evictionPolicy",
        "billingProfile",
    ):
        if key in profile:
            properties[key] = profile[key]
    if "proximityPlacementGroup" in scale_set["properties"]:
        properties["proximityPlacementGroup"] = scale_set["properties"]["proximityPlacementGroup"]
    body = {
        "location": scale_set["location"],
        "tags": tags,
        "properties": properties,
    }
    if "plan" in scale_set:  # a Marketplace image sold under a plan: each VM names it
        body["plan"] = scale_set["plan"]
    if "identity" in scale_set:  # the user-assigned identity that reads the munge key
        identity = scale_set["identity"]
        body["identity"] = {
            "type": identity["type"],
            "userAssignedIdentities": {key: {} for key in identity["userAssignedIdentities"]},
        }
    return body


class AzureBackend(Backend):
    def __init__(self, pool: Pool) -> None:
        super().__init__()
        assert pool.cloud is not None and pool.cloud.group
        self.pool, self.cloud = pool, pool.cloud
        base = os.environ.get("PROVISION_AZURE_ENDPOINT")
        self.arm = base or ARM
        self.imds = base or IMDS
        self._group_url: str | None = None
        self._subscription: str | None = None
        key = os.environ.get("PROVISION_AZURE_CREDENTIALS", CREDENTIALS)
        self.token: Any
        if os.path.exists(key):
            self.token = FederatedToken(key, base or LOGIN)
            self._subscription = self.token.subscription
        else:
            resource = urllib.parse.quote(f"{ARM}/", safe="")
            self.token = rest.Token(
                f"{self.imds}/metadata/identity/oauth2/token?api-version=2018-02-01"
                f"&resource={resource}",
                {"Metadata": "true"},
            )
        self.poll_s = POLL_S

    def _group(self) -> str:
        if self._group_url is None:
            subscription = self._subscription or self._own_subscription()
            self._group_url = (
                f"{self.arm}/subscriptions/{subscription}/resourceGroups/{self.cloud.group}"
            )
        return self._group_url

    def _own_subscription(self) -> str:
        instance = rest.call(
            "GET",
            f"{self.imds}/metadata/instance?api-version=2021-02-01",
            headers={"Metadata": "true"},
            timeout=10,
        )
        try:
            return str(instance["compute"]["subscriptionId"])
        except (KeyError, TypeError):
            raise BurstError("the metadata service names no subscription") from None

    def _call(self, method: str, url: str, body: object = None) -> Any:
        return self._request(method, url, body)[1]

    def _request(self, method: str, url: str, body: object = None) -> tuple[int, Any]:
        try:
            return rest.request(
                method, url, body, headers={"Authorization": f"Bearer {self.token()}"}
            )
        except rest.HTTPError as exc:
            if _capacity(exc.reasons, str(exc)):
                raise BurstError(f"{CAPACITY}{exc}") from None
            raise

    def _vm_url(self, node: str, query: str = "") -> str:
        return (
            f"{self._group()}/providers/Microsoft.Compute/virtualMachines/{node}"
            f"?api-version={COMPUTE_API}{query}"
        )

    def _vm_body(self, node: str, scale_set: dict[str, Any]) -> dict[str, Any]:
        return vm_body(node, scale_set, {**self.cloud.tags, TAG_NODE: node})

    def _provisioned(self, node: str) -> dict[str, Any]:
        """Wait until the VM is provisioned or failed; the VM with its instance view."""
        deadline = time.monotonic() + PROVISION_WAIT_S
        while True:
            vm = self._call("GET", self._vm_url(node, "&$expand=instanceView"))
            state = vm.get("properties", {}).get("provisioningState")
            if state in ("Succeeded", "Failed") or time.monotonic() >= deadline:
                return dict(vm)
            time.sleep(self.poll_s)

    def _address(self, vm: dict[str, Any]) -> str | None:
        nics = vm.get("properties", {}).get("networkProfile", {}).get("networkInterfaces", [])
        if not nics:
            return None
        nic = self._call("GET", f"{self.arm}{nics[0]['id']}?api-version={NETWORK_API}")
        configs = nic.get("properties", {}).get("ipConfigurations", [])
        return configs[0]["properties"].get("privateIPAddress") if configs else None

    def _scale_set(self) -> dict[str, Any]:
        return dict(
            self._call(
                "GET",
                f"{self._group()}/providers/Microsoft.Compute/virtualMachineScaleSets/"
                # the VM profile's userData comes only when asked for (Resource Manager's
                # `$expand=userData`): without it a burst VM would boot with no join
                f"{self.cloud.template}?api-version={COMPUTE_API}&$expand=userData",
            )
        )

    def ended(self, nodes: list[str]) -> dict[str, str]:
        """The vanished VMs of a spot pool were evicted (its scale set's VMs are Spot, deleted
        on eviction); a pool of regular VMs says nothing more."""
        profile = self._scale_set().get("properties", {}).get("virtualMachineProfile", {})
        if str(profile.get("priority", "")).lower() != "spot":
            return {}
        return dict.fromkeys(nodes, SPOT_EVICTED)

    def start(self, nodes: list[str]) -> dict[str, str]:
        try:
            scale_set = self._scale_set()
            bodies = {node: self._vm_body(node, scale_set) for node in nodes}
        except (BurstError, KeyError, TypeError) as exc:
            return {node: one_line(exc) for node in nodes}
        addresses: dict[str, str] = {}

        def create(node: str) -> None:
            self._call("PUT", self._vm_url(node), bodies[node])

        def wait(node: str) -> None:
            vm = self._provisioned(node)
            state = vm.get("properties", {}).get("provisioningState")
            if state == "Failed":
                code, text = vm_failure(vm)
                raise BurstError(f"{CAPACITY}{text}" if _capacity([code], text) else text)
            if state == "Succeeded":
                address = self._address(vm)
                if address:
                    addresses[node] = address

        # every VM is asked for first, then waited for: they are made side by side
        errors = each(nodes, create)
        errors.update(each([n for n in nodes if n not in errors], wait))
        capacity = next((e for e in errors.values() if e.startswith(CAPACITY)), None)
        if capacity:  # all or nothing: the VMs that were made go too
            self.stop(nodes)
            return dict.fromkeys(nodes, capacity)
        if errors:  # nothing half-made stays: a VM that failed goes
            self.stop(list(errors))
        self.addresses.update({n: a for n, a in addresses.items() if n not in errors})
        return errors

    def suspend(self, node: str) -> bool:
        # 202: being deleted; 204: there was no such VM
        return self._request("DELETE", self._vm_url(node))[0] != 204

    def stop(self, nodes: list[str]) -> tuple[set[str], dict[str, str]]:
        try:
            self._group()  # the subscription once, not in 16 threads
        except BurstError as exc:
            return set(), {node: one_line(exc) for node in nodes}
        return super().stop(nodes)

    def states(self) -> dict[str, str]:
        out: dict[str, str] = {}
        url: str | None = (
            f"{self._group()}/providers/Microsoft.Compute/virtualMachines?api-version={COMPUTE_API}"
        )
        while url:
            page = self._call("GET", url)
            for vm in page.get("value", []):
                tags = vm.get("tags") or {}
                if all(tags.get(k) == v for k, v in self.cloud.tags.items()):
                    name = tags.get(TAG_NODE, vm.get("name"))
                    if name in self.pool.nodes:
                        state = vm.get("properties", {}).get("provisioningState")
                        out[name] = "running" if state == "Succeeded" else str(state)
            url = page.get("nextLink")
        return out


class FederatedToken:
    """Resource Manager's token for the heads' user-assigned identity, from a head outside
    Azure: a JWT (RS256, 10 minutes) with the issuer and subject the identity's federated
    credential trusts and Entra's exchange audience, signed with the issuer's key by openssl,
    sent as the client assertion of a client credentials grant at the tenant's token endpoint
    (Microsoft identity platform's client credentials flow with a federated credential); made
    again before it expires. The key never leaves the process but for openssl's pipe."""

    def __init__(self, path: str, login: str = LOGIN) -> None:
        try:
            with open(path) as f:
                doc = json.load(f)
            self.tenant = str(doc["tenant"])
            self.client = str(doc["client_id"])
            self.subscription = str(doc["subscription"])
            self.issuer = str(doc["issuer"])
            self.subject = str(doc["subject"])
            self.kid = str(doc["kid"])
            self._key = str(doc["private_key"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BurstError(f"{path}: not the heads' Azure credentials ({exc})") from None
        self.uri = f"{login}/{self.tenant}/oauth2/v2.0/token"
        self._value, self._until = "", 0.0

    def __call__(self) -> str:
        if time.monotonic() >= self._until:
            now = int(time.time())
            claims = {
                "iss": self.issuer,
                "sub": self.subject,
                "aud": EXCHANGE_AUDIENCE,
                "iat": now,
                "nbf": now,
                "exp": now + ASSERTION_S,
                "jti": secrets.token_hex(16),
            }
            form = urllib.parse.urlencode(
                {
                    "client_id": self.client,
                    "scope": f"{ARM}/.default",
                    "grant_type": "client_credentials",
                    "client_assertion_type": ASSERTION_TYPE,
                    "client_assertion": jwt.signed(claims, self._key, self.kid),
                }
            )
            self._value = rest.form_token(self.uri, form)
            self._until = time.monotonic() + TOKEN_S
        return self._value

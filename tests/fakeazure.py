"""Azure Resource Manager at the HTTP layer for the Azure bursting tests: the instance metadata
service's token and subscription, a pool's Flexible scale set as the cluster's stack makes it,
VMs (create with the body checked against the API's shape, get with the instance view, delete,
list over pages) and their NICs. Every request is recorded.

Microsoft Entra's token endpoint for a federated credential (a head outside Azure): the client
assertion, a JWT, is checked against the key set of its issuer (`issuers`: issuer URL -> kid ->
public key) and the federated credentials of the client (`federated`: client ID -> issuer and
subject), with the exchange audience and at most an hour's life, as Entra checks them.

What a pool image's build asks (AzureBuilder): a builder VM with a public address (its NIC's
address as a resource of its own), deallocate, generalize (only once deallocated), a managed
image from the generalized VM (PUT, GET, list over pages, DELETE). `refuse` answers the next VM
creation with that error at once (SkuNotAvailable, a quota); `fail` lets the creation be
accepted and the VM end Failed with that code (AllocationFailed), as Azure reports them.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import re
import urllib.parse
from typing import Any

from .fakehttp import JsonFake

TOKEN = "eyJ0eXAi.fake-token"
SUBSCRIPTION = "00000000-1111-2222-3333-444444444444"
ARM_RESOURCE = "https://management.azure.com/"
VM_KEYS = {"location", "tags", "properties", "plan", "identity"}
VM_PROPERTIES = {
    "virtualMachineScaleSet",
    "availabilitySet",
    "hardwareProfile",
    "storageProfile",
    "osProfile",
    "networkProfile",
    "securityProfile",
    "capacityReservation",
    "proximityPlacementGroup",
    "userData",
    "priority",
    "evictionPolicy",
    "billingProfile",
}


# the scale set's userData (base64), as the stack would set it
USER_DATA = base64.b64encode(b"#cloud-config\nruncmd: [[true]]\n").decode()


def scale_set(group: str, name: str, subnet: str, nsg: str, ppg: str) -> dict[str, Any]:
    """The scale set a burst pool's stack makes (providers/cloud/azure.py), as ARM returns it."""
    base = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/providers"
    return {
        "id": f"{base}/Microsoft.Compute/virtualMachineScaleSets/{name}",
        "name": name,
        "location": "eastus",
        "sku": {"name": "Standard_ND96isr_H100_v5", "tier": "Standard", "capacity": 0},
        # the user-assigned identity that reads the munge key, as ARM answers it
        "identity": {
            "type": "UserAssigned",
            "userAssignedIdentities": {
                f"{base}/Microsoft.ManagedIdentity/userAssignedIdentities/{name}-node": {
                    "principalId": "00000000-0000-0000-0000-00000000000a",
                    "clientId": "00000000-0000-0000-0000-00000000000b",
                }
            },
        },
        "properties": {
            "orchestrationMode": "Flexible",
            "platformFaultDomainCount": 1,
            "proximityPlacementGroup": {
                "id": f"{base}/Microsoft.Compute/proximityPlacementGroups/{ppg}"
            },
            "virtualMachineProfile": {
                "userData": USER_DATA,
                "osProfile": {
                    "computerNamePrefix": name,
                    "adminUsername": "ubuntu",
                    "linuxConfiguration": {
                        "disablePasswordAuthentication": True,
                        "ssh": {
                            "publicKeys": [
                                {
                                    "path": "/home/ubuntu/.ssh/authorized_keys",
                                    "keyData": "ssh-ed25519 AAAA",
                                }
                            ]
                        },
                    },
                },
                "storageProfile": {
                    "imageReference": {
                        "publisher": "Canonical",
                        "offer": "0001-com-ubuntu-server-jammy",
                        "sku": "22_04-lts-gen2",
                        "version": "latest",
                    },
                    "osDisk": {
                        "createOption": "FromImage",
                        "diskSizeGB": 200,
                        "managedDisk": {"storageAccountType": "Premium_LRS"},
                    },
                },
                "networkProfile": {
                    "networkApiVersion": "2020-11-01",
                    "networkInterfaceConfigurations": [
                        {
                            "name": "primary",
                            "properties": {
                                "primary": True,
                                "enableAcceleratedNetworking": True,
                                "networkSecurityGroup": {
                                    "id": f"{base}/Microsoft.Network/networkSecurityGroups/{nsg}"
                                },
                                "ipConfigurations": [
                                    {"name": "primary", "properties": {"subnet": {"id": subnet}}}
                                ],
                            },
                        }
                    ],
                },
            },
        },
    }


class FakeARM(JsonFake):
    def __init__(
        self, group: str, scale_sets: dict[str, dict[str, Any]], page_size: int = 3
    ) -> None:
        super().__init__()
        self.group = group
        self.scale_sets = scale_sets
        self.page_size = page_size
        self.vms: dict[str, dict[str, Any]] = {}
        self.nics: dict[str, dict[str, Any]] = {}
        self.images: dict[str, dict[str, Any]] = {}
        self.addresses: dict[str, dict[str, Any]] = {}
        self.issuers: dict[str, dict[str, Any]] = {}
        self.federated: dict[str, tuple[str, str]] = {}
        self.assertions: list[dict[str, Any]] = []
        self.refuse: tuple[int, str, str] | None = None
        self.fail: tuple[str, str] | None = None
        self._ids = itertools.count(1)

    @staticmethod
    def _error(status: int, code: str, message: str) -> tuple[int, Any]:
        return status, {"error": {"code": code, "message": message}}

    def respond(
        self, method: str, path: str, headers: dict[str, str], body: Any
    ) -> tuple[int, Any]:
        url = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(url.query)
        if url.path.endswith("/oauth2/v2.0/token") and method == "POST":
            return self._token(str(body or ""))
        if url.path.startswith("/metadata/"):
            if headers.get("Metadata") != "true":
                return 400, {"error": "Bad request. Required metadata header not specified"}
            if url.path == "/metadata/identity/oauth2/token":
                if query.get("resource") != [ARM_RESOURCE]:
                    return 400, {"error": "invalid_resource"}
                return 200, {
                    "access_token": TOKEN,
                    "expires_in": "86399",
                    "token_type": "Bearer",
                }
            if url.path == "/metadata/instance":
                return 200, {"compute": {"subscriptionId": SUBSCRIPTION, "location": "eastus"}}
            return 404, {"error": "not found"}
        if headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._error(401, "AuthenticationFailed", "no token")
        if "api-version" not in query:
            return self._error(400, "MissingApiVersionParameter", "api-version is required")
        prefix = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{self.group}/providers/"
        if not url.path.startswith(prefix):
            return self._error(404, "ResourceGroupNotFound", url.path)
        rest = url.path[len(prefix) :]
        m = re.fullmatch(r"Microsoft\.Compute/virtualMachineScaleSets/([^/]+)", rest)
        if m and method == "GET":
            found = self.scale_sets.get(m.group(1))
            if not found:
                return self._error(404, "ResourceNotFound", m.group(1))
            if query.get("$expand") != ["userData"]:  # ARM gives userData only when asked
                found = copy.deepcopy(found)
                found["properties"]["virtualMachineProfile"].pop("userData", None)
            return 200, found
        if rest == "Microsoft.Compute/virtualMachines" and method == "GET":
            return self._list(int(query.get("skip", ["0"])[0]))
        m = re.fullmatch(
            r"Microsoft\.Compute/virtualMachines/([^/]+)/(deallocate|generalize)", rest
        )
        if m and method == "POST":
            return self._power(m.group(1), m.group(2))
        m = re.fullmatch(r"Microsoft\.Compute/virtualMachines/([^/]+)", rest)
        if m:
            return self._vm(method, m.group(1), body, prefix)
        if rest == "Microsoft.Compute/images" and method == "GET":
            names = sorted(self.images)
            skip = int(query.get("skip", ["0"])[0])
            page: dict[str, Any] = {
                "value": [self.images[n] for n in names[skip : skip + self.page_size]]
            }
            if skip + self.page_size < len(names):
                page["nextLink"] = (
                    f"{self.url}{prefix}Microsoft.Compute/images?api-version=2024-07-01"
                    f"&skip={skip + self.page_size}"
                )
            return 200, page
        m = re.fullmatch(r"Microsoft\.Compute/images/([^/]+)", rest)
        if m:
            return self._image(method, m.group(1), body, prefix)
        m = re.fullmatch(r"Microsoft\.Network/publicIPAddresses/([^/]+)", rest)
        if m and method == "GET":
            found = self.addresses.get(m.group(1))
            return (200, found) if found else self._error(404, "NotFound", m.group(1))
        m = re.fullmatch(r"Microsoft\.Network/networkInterfaces/([^/]+)", rest)
        if m and method == "GET":
            nic = self.nics.get(m.group(1))
            return (200, nic) if nic else self._error(404, "NotFound", m.group(1))
        return self._error(400, "BadRequest", f"{method} {rest}")

    def _list(self, skip: int) -> tuple[int, Any]:
        names = sorted(self.vms)
        page: dict[str, Any] = {"value": [self.vms[n] for n in names[skip : skip + self.page_size]]}
        if skip + self.page_size < len(names):
            skip += self.page_size
            page["nextLink"] = (
                f"{self.url}/subscriptions/{SUBSCRIPTION}/resourceGroups/{self.group}/providers/"
                f"Microsoft.Compute/virtualMachines?api-version=2024-07-01&skip={skip}"
            )
        return 200, page

    def _vm(self, method: str, name: str, body: Any, prefix: str) -> tuple[int, Any]:
        if method == "DELETE":
            vm = self.vms.pop(name, None)
            if vm is None:
                return 204, None
            for nic in vm["properties"]["networkProfile"].get("networkInterfaces", []):
                gone = self.nics.pop(nic["id"].rpartition("/")[2], None) or {}
                for config in gone.get("properties", {}).get("ipConfigurations", []):
                    public = config["properties"].get("publicIPAddress", {}).get("id", "")
                    name = public.rpartition("/")[2]
                    if self.addresses.get(name, {}).get("_delete"):  # its deleteOption
                        self.addresses.pop(name)
            return 202, None
        if method == "GET":
            vm = self.vms.get(name)
            if vm is None:
                return self._error(404, "ResourceNotFound", f"virtualMachines/{name} was not found")
            if vm["properties"]["provisioningState"] == "Creating":
                vm["properties"]["provisioningState"] = vm.pop("_next")
            return 200, vm
        problem = self._check(name, body)
        if problem:
            return self._error(400, "InvalidParameter", problem)
        if self.refuse:
            status, code, message = self.refuse
            return self._error(status, code, message)
        vm = json.loads(json.dumps(body))
        vm["name"], vm["id"] = name, f"{prefix}Microsoft.Compute/virtualMachines/{name}"
        vm["properties"]["provisioningState"] = "Creating"
        vm["_next"] = "Succeeded"
        configs = vm["properties"]["networkProfile"].pop("networkInterfaceConfigurations")
        nic_name = configs[0]["name"]
        vm["properties"]["networkProfile"]["networkInterfaces"] = [
            {"id": f"{prefix}Microsoft.Network/networkInterfaces/{nic_name}"}
        ]
        if self.fail:
            code, message = self.fail
            vm["_next"] = "Failed"
            vm["properties"]["instanceView"] = {
                "statuses": [{"code": f"ProvisioningState/failed/{code}", "message": message}]
            }
        else:
            config: dict[str, Any] = {"privateIPAddress": f"10.20.210.{next(self._ids) % 250 + 1}"}
            asked = configs[0]["properties"]["ipConfigurations"][0]["properties"]
            public = asked.get("publicIPAddressConfiguration")
            if public:  # made with the VM, a resource of its own
                self.addresses[public["name"]] = {
                    "name": public["name"],
                    "properties": {"ipAddress": f"203.0.113.{next(self._ids) % 250 + 1}"},
                    "_delete": public.get("properties", {}).get("deleteOption") == "Delete",
                }
                config["publicIPAddress"] = {
                    "id": f"{prefix}Microsoft.Network/publicIPAddresses/{public['name']}"
                }
            self.nics[nic_name] = {"properties": {"ipConfigurations": [{"properties": config}]}}
        self.vms[name] = vm
        return 201, {k: v for k, v in vm.items() if k != "_next"}

    def _check(self, name: str, body: Any) -> str | None:
        """What the API would refuse in a VM of a Flexible scale set, or None."""
        if not isinstance(body, dict) or set(body) - VM_KEYS or "location" not in body:
            return "a VM is {location, tags, properties}"
        props = body.get("properties", {})
        if set(props) - VM_PROPERTIES:
            return f"unknown properties {sorted(set(props) - VM_PROPERTIES)}"
        owner = props.get("virtualMachineScaleSet", {}).get("id", "").rpartition("/")[2]
        if "availabilitySet" in props:
            if "virtualMachineScaleSet" in props:
                return "a VM is in an availability set or a scale set, not both"
            if not props["availabilitySet"].get("id", "").count("/availabilitySets/"):
                return "availabilitySet.id names no availability set"
        elif owner not in self.scale_sets:
            return "virtualMachineScaleSet.id names no scale set"
        if not props.get("hardwareProfile", {}).get("vmSize"):
            return "hardwareProfile.vmSize is required"
        os_profile = props.get("osProfile", {})
        if os_profile.get("computerName") != name or "computerNamePrefix" in os_profile:
            return "osProfile.computerName must be the VM's name (no computerNamePrefix)"
        if "imageReference" not in props.get("storageProfile", {}):
            return "storageProfile.imageReference is required"
        if props.get("priority") == "Spot" and props.get("evictionPolicy") not in (
            "Delete",
            "Deallocate",
        ):
            return "a Spot VM names its eviction policy (Delete or Deallocate)"
        if props.get("priority") != "Spot" and (
            "evictionPolicy" in props or "billingProfile" in props
        ):
            return "an eviction policy and a billing profile are for Spot VMs alone"
        network = props.get("networkProfile", {})
        if not network.get("networkApiVersion") or not network.get(
            "networkInterfaceConfigurations"
        ):
            return "networkProfile needs networkApiVersion and networkInterfaceConfigurations"
        return None

    def _token(self, form: str) -> tuple[int, Any]:
        fields = dict(urllib.parse.parse_qsl(form))
        if (
            fields.get("grant_type") != "client_credentials"
            or fields.get("client_assertion_type")
            != "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
        ):
            return 400, {"error": "invalid_request", "error_description": "AADSTS900144: grant"}
        if fields.get("scope") != "https://management.azure.com/.default":
            return 400, {"error": "invalid_scope", "error_description": "AADSTS70011: scope"}
        claims = _verify(fields.get("client_assertion", ""), self.issuers)
        if isinstance(claims, str):
            return 401, {"error": "invalid_client", "error_description": claims}
        trusted = self.federated.get(fields.get("client_id", ""))
        if trusted != (claims.get("iss"), claims.get("sub")):
            return 400, {
                "error": "invalid_request",
                "error_description": "AADSTS70021: No matching federated identity record found "
                "for presented assertion.",
            }
        self.assertions.append(claims)
        return 200, {"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"}

    def _power(self, name: str, action: str) -> tuple[int, Any]:
        vm = self.vms.get(name)
        if vm is None:
            return self._error(404, "ResourceNotFound", name)
        statuses = vm["properties"].setdefault("instanceView", {}).setdefault("statuses", [])
        if action == "deallocate":
            statuses[:] = [s for s in statuses if not s["code"].startswith("PowerState/")]
            statuses.append({"code": "PowerState/deallocated"})
            return 202, None
        if not any(s["code"] == "PowerState/deallocated" for s in statuses):
            return self._error(
                409, "OperationNotAllowed", "the VM must be deallocated to be generalized"
            )
        statuses.append({"code": "OSState/generalized"})
        return 200, None

    def _image(self, method: str, name: str, body: Any, prefix: str) -> tuple[int, Any]:
        if method == "DELETE":
            return (202, None) if self.images.pop(name, None) else (204, None)
        if method == "GET":
            found = self.images.get(name)
            return (200, found) if found else self._error(404, "NotFound", name)
        source = (body or {}).get("properties", {}).get("sourceVirtualMachine", {}).get("id", "")
        vm = self.vms.get(source.rpartition("/")[2])
        statuses = (vm or {}).get("properties", {}).get("instanceView", {}).get("statuses", [])
        if not any(s["code"] == "OSState/generalized" for s in statuses):
            return self._error(
                400, "InvalidParameter", "the source VM must be generalized to make an image"
            )
        if "location" not in body:
            return self._error(400, "LocationRequired", "an image names its location")
        image = {
            "id": f"{prefix}Microsoft.Compute/images/{name}",
            "name": name,
            "location": body["location"],
            "tags": body.get("tags", {}),
            "properties": {**body["properties"], "provisioningState": "Succeeded"},
        }
        self.images[name] = image
        return 201, image


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _verify(assertion: str, issuers: dict[str, dict[str, Any]]) -> dict[str, Any] | str:
    """Entra's checks of a federated credential's assertion: the claims, or why not."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    parts = assertion.split(".")
    if len(parts) != 3:
        return "AADSTS50027: JWT token is invalid or malformed."
    header, claims = json.loads(_unb64(parts[0])), json.loads(_unb64(parts[1]))
    keys = issuers.get(claims.get("iss", ""))
    if keys is None:
        return "AADSTS700211: No matching federated identity record found for presented issuer."
    key = keys.get(header.get("kid", ""))
    if header.get("alg") != "RS256" or key is None:
        return "AADSTS700027: the key that signed the assertion is not in the issuer's key set"
    try:
        key.verify(
            _unb64(parts[2]), f"{parts[0]}.{parts[1]}".encode(), padding.PKCS1v15(), hashes.SHA256()
        )
    except InvalidSignature:
        return "AADSTS700027: Client assertion failed signature validation."
    if claims.get("aud") != "api://AzureADTokenExchange":
        return "AADSTS700212: No matching federated identity record found for presented audience."
    if not 0 < claims["exp"] - claims["iat"] <= 3600:
        return "AADSTS700024: Client assertion is not within its valid time range."
    return dict(claims)

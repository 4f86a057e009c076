"""Azure Resource Manager at the HTTP layer for the Azure bursting tests: the instance metadata
service's token and subscription, a pool's Flexible scale set as the cluster's stack makes it,
VMs (create with the body checked against the API's shape, get with the instance view, delete,
list over pages) and their NICs. Every request is recorded. `refuse` answers the next VM
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
    "hardwareProfile",
    "storageProfile",
    "osProfile",
    "networkProfile",
    "securityProfile",
    "capacityReservation",
    "proximityPlacementGroup",
    "userData",
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
        m = re.fullmatch(r"Microsoft\.Compute/virtualMachines/([^/]+)", rest)
        if m:
            return self._vm(method, m.group(1), body, prefix)
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
                self.nics.pop(nic["id"].rpartition("/")[2], None)
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
            self.nics[nic_name] = {
                "properties": {
                    "ipConfigurations": [
                        {
                            "properties": {
                                "privateIPAddress": f"10.20.210.{next(self._ids) % 250 + 1}"
                            }
                        }
                    ]
                }
            }
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
        if owner not in self.scale_sets:
            return "virtualMachineScaleSet.id names no scale set"
        if not props.get("hardwareProfile", {}).get("vmSize"):
            return "hardwareProfile.vmSize is required"
        os_profile = props.get("osProfile", {})
        if os_profile.get("computerName") != name or "computerNamePrefix" in os_profile:
            return "osProfile.computerName must be the VM's name (no computerNamePrefix)"
        if "imageReference" not in props.get("storageProfile", {}):
            return "storageProfile.imageReference is required"
        network = props.get("networkProfile", {})
        if not network.get("networkApiVersion") or not network.get(
            "networkInterfaceConfigurations"
        ):
            return "networkProfile needs networkApiVersion and networkInterfaceConfigurations"
        return None

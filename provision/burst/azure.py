"""Burst nodes as Azure VMs made in the pool's Flexible scale set from its VM profile (the
cluster's Pulumi stack made the scale set with capacity 0: size, image, disk, accelerated
networking, security group, proximity placement group or capacity reservation group, and the
image's Marketplace plan where it has one).

The standard library only: the token and the subscription come from the head's managed
identity through the instance metadata service, and Resource Manager is plain JSON over HTTPS.
A resume reads the scale set once, asks for one VM per node (named as the node, 16 calls at a
time, its NIC and disk deleted with it), then waits for them all to be provisioned (allocation
failures show there; at most 4 minutes), and gives Slurm their addresses in one call. All or
nothing: when one VM fails for want of capacity, the others are deleted too. A suspend deletes
each VM and does not wait. PROVISION_AZURE_ENDPOINT points both the metadata service and
Resource Manager at another place (the tests' fake).
"""

from __future__ import annotations

import os
import time
import urllib.parse
from typing import Any

from provision.burst import rest
from provision.burst.backend import CAPACITY, Backend, BurstError, each, one_line
from provision.burst.config import TAG_NODE, Pool

ARM = "https://management.azure.com"
IMDS = "http://169.254.169.254"
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
POLL_S = 5.0


def _capacity(codes: list[str], message: str) -> bool:
    # Azure names a quota error OperationNotAllowed and says "quota" in the message
    return bool(CAPACITY_CODES & set(codes)) or (
        "OperationNotAllowed" in codes and "quota" in message.lower()
    )


class AzureBackend(Backend):
    def __init__(self, pool: Pool) -> None:
        super().__init__()
        assert pool.cloud is not None and pool.cloud.group
        self.pool, self.cloud = pool, pool.cloud
        base = os.environ.get("PROVISION_AZURE_ENDPOINT")
        self.arm = base or ARM
        self.imds = base or IMDS
        resource = urllib.parse.quote(f"{ARM}/", safe="")
        self.token = rest.Token(
            f"{self.imds}/metadata/identity/oauth2/token?api-version=2018-02-01"
            f"&resource={resource}",
            {"Metadata": "true"},
        )
        self._group_url: str | None = None
        self.poll_s = POLL_S

    def _group(self) -> str:
        if self._group_url is None:
            instance = rest.call(
                "GET",
                f"{self.imds}/metadata/instance?api-version=2021-02-01",
                headers={"Metadata": "true"},
                timeout=10,
            )
            try:
                subscription = instance["compute"]["subscriptionId"]
            except (KeyError, TypeError):
                raise BurstError("the metadata service names no subscription") from None
            self._group_url = (
                f"{self.arm}/subscriptions/{subscription}/resourceGroups/{self.cloud.group}"
            )
        return self._group_url

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
        """The scale set's VM profile as one named VM of it."""
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
        properties: dict[str, Any] = {
            "virtualMachineScaleSet": {"id": scale_set["id"]},
            "hardwareProfile": {"vmSize": scale_set["sku"]["name"]},
            "storageProfile": storage,
            "osProfile": {**os_profile, "computerName": node},
            "networkProfile": {
                "networkApiVersion": network["networkApiVersion"],
                "networkInterfaceConfigurations": nics,
            },
        }
        for key in ("securityProfile", "capacityReservation", "userData"):
            if key in profile:
                properties[key] = profile[key]
        if "proximityPlacementGroup" in scale_set["properties"]:
            properties["proximityPlacementGroup"] = scale_set["properties"][
                "proximityPlacementGroup"
            ]
        body = {
            "location": scale_set["location"],
            "tags": {**self.cloud.tags, TAG_NODE: node},
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

    def start(self, nodes: list[str]) -> dict[str, str]:
        try:
            scale_set = self._call(
                "GET",
                f"{self._group()}/providers/Microsoft.Compute/virtualMachineScaleSets/"
                # the VM profile's userData comes only when asked for (Resource Manager's
                # `$expand=userData`): without it a burst VM would boot with no join
                f"{self.cloud.template}?api-version={COMPUTE_API}&$expand=userData",
            )
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
                statuses = vm["properties"].get("instanceView", {}).get("statuses", [])
                failed: dict[str, Any] = next(
                    (s for s in statuses if "/failed" in s.get("code", "")), {}
                )
                code = str(failed.get("code", "")).rpartition("/")[2]
                text = f"{code}: {' '.join(str(failed.get('message', '')).split())}"[:200]
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

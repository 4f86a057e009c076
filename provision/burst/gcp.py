"""Burst nodes as Compute Engine instances made from the pool's instance template (the
cluster's Pulumi stack made it: machine type, image, gVNICs, placement policy, labels).

The standard library only: the token and the project come from the head's service account
through the metadata server, and the Compute API is plain JSON over HTTPS. A resume is one
bulkInsert for all the pool's requested nodes, each instance named as its node, all or nothing
(minCount = count), then waits for the operation (bulkInsert reports a zone out of resources in
its operation, not in its answer), then one list call for the addresses and one `scontrol
update`. A suspend deletes each instance (one call each, 16 at a time) and does not wait.
PROVISION_GCP_ENDPOINT points both the metadata server and the API at another place (the tests'
fake).
"""

from __future__ import annotations

import os
import time
import urllib.parse
from typing import Any

from provision.burst import rest
from provision.burst.backend import CAPACITY, Backend, BurstError, each, one_line
from provision.burst.config import Pool

COMPUTE = "https://compute.googleapis.com/compute/v1"
METADATA = "http://metadata.google.internal/computeMetadata/v1"
CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "QUOTA_EXCEEDED",
        "quotaExceeded",
        "rateLimitExceeded",
        "RESOURCE_POOL_EXHAUSTED",
    }
)
# how long a resume waits for bulkInsert's operation before it leaves the rest to Slurm's
# ResumeTimeout (the programs return within minutes, never hang)
OPERATION_WAIT_S = 240


class GcpBackend(Backend):
    def __init__(self, pool: Pool) -> None:
        super().__init__()
        assert pool.cloud is not None
        self.pool, self.cloud = pool, pool.cloud
        base = os.environ.get("PROVISION_GCP_ENDPOINT")
        self.compute = f"{base}/compute/v1" if base else COMPUTE
        self.metadata = f"{base}/computeMetadata/v1" if base else METADATA
        self.token = rest.Token(
            f"{self.metadata}/instance/service-accounts/default/token",
            {"Metadata-Flavor": "Google"},
        )
        self._project: str | None = None

    def _zone_url(self) -> str:
        if not self.cloud.zone:
            raise BurstError(f"pool {self.pool.name} has no zone: set pools[].zone")
        if self._project is None:
            self._project = str(
                rest.call(
                    "GET",
                    f"{self.metadata}/project/project-id?alt=json",
                    headers={"Metadata-Flavor": "Google"},
                    timeout=10,
                )
            )
        return f"{self.compute}/projects/{self._project}/zones/{self.cloud.zone}"

    def _call(self, method: str, path: str, body: object = None) -> Any:
        url = path if path.startswith("http") else f"{self._zone_url()}/{path}"
        try:
            return rest.call(method, url, body, headers={"Authorization": f"Bearer {self.token()}"})
        except rest.HTTPError as exc:
            if CAPACITY_CODES & set(exc.reasons):
                raise BurstError(f"{CAPACITY}{exc}") from None
            raise

    def _wait(self, operation: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + OPERATION_WAIT_S
        while operation.get("status") != "DONE" and time.monotonic() < deadline:
            # operations/wait returns when the operation is done or after about 2 minutes
            operation = self._call("POST", f"operations/{operation['name']}/wait")
        return operation

    def start(self, nodes: list[str]) -> dict[str, str]:
        body = {
            "count": len(nodes),
            "minCount": len(nodes),
            "perInstanceProperties": {node: {} for node in nodes},
            "sourceInstanceTemplate": f"global/instanceTemplates/{self.cloud.template}",
        }
        try:
            operation = self._wait(self._call("POST", "instances/bulkInsert", body))
        except BurstError as exc:
            return {node: one_line(exc) for node in nodes}
        failure = _operation_error(operation)
        if failure:
            return dict.fromkeys(nodes, failure)
        if operation.get("status") != "DONE":
            return {}  # still making them: Slurm's ResumeTimeout decides
        try:
            found = self._list()
        except BurstError as exc:
            return {node: f"made, but not listed: {one_line(exc)}" for node in nodes}
        self.addresses.update(
            {
                node: found[node]["networkInterfaces"][0]["networkIP"]
                for node in nodes
                if node in found and found[node].get("networkInterfaces")
            }
        )
        return {node: "made, but not listed" for node in nodes if node not in found}

    def _list(self) -> dict[str, dict[str, Any]]:
        """This pool's instances by name (the node's)."""
        labels = " AND ".join(f'labels.{k}="{v}"' for k, v in sorted(self.cloud.tags.items()))
        out: dict[str, dict[str, Any]] = {}
        token = ""
        while True:
            query = {"filter": labels, "maxResults": "500"}
            if token:
                query["pageToken"] = token
            page = self._call("GET", "instances?" + urllib.parse.urlencode(query))
            for item in page.get("items", []):
                out[item["name"]] = item
            token = page.get("nextPageToken", "")
            if not token:
                return out

    def suspend(self, node: str) -> bool:
        try:
            self._call("DELETE", f"instances/{node}")
        except rest.HTTPError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def stop(self, nodes: list[str]) -> tuple[set[str], dict[str, str]]:
        try:
            self._zone_url()  # the project once, not in 16 threads
        except BurstError as exc:
            return set(), {node: one_line(exc) for node in nodes}
        gone: set[str] = set()

        def remove(node: str) -> None:
            if self.suspend(node):
                gone.add(node)

        return gone, each(nodes, remove)

    def states(self) -> dict[str, str]:
        return {
            name: "running" if item.get("status") == "RUNNING" else str(item.get("status"))
            for name, item in self._list().items()
            if name in self.pool.nodes
        }


def _operation_error(operation: dict[str, Any]) -> str | None:
    errors = (operation.get("error") or {}).get("errors") or []
    if not errors:
        return None
    codes = {str(e.get("code", "")) for e in errors}
    text = "; ".join(f"{e.get('code')}: {e.get('message', '')}" for e in errors[:2])
    text = " ".join(text.split())[:200]
    return f"{CAPACITY}{text}" if codes & CAPACITY_CODES else text

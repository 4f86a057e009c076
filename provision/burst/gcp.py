"""Burst nodes as Compute Engine instances made from the pool's instance template (the
cluster's Pulumi stack made it: machine type, image, gVNICs, placement policy, labels).

The standard library only: the token and the project come from the key file of the stack's
burst account where apply installed one (a head outside GCP: CREDENTIALS; the token from a JWT
signed with the key by openssl, as Google's OAuth 2.0 for server-to-server applications has it),
else from the head's own service account through the metadata server; the Compute API is plain
JSON over HTTPS. A resume is one
bulkInsert for all the pool's requested nodes, each instance named as its node, all or nothing
(minCount = count), then waits for the operation (bulkInsert reports a zone out of resources in
its operation, not in its answer), then one list call for the addresses and one `scontrol
update`. A suspend deletes each instance (one call each, 16 at a time) and does not wait.
PROVISION_GCP_ENDPOINT points both the metadata server and the API at another place (the tests'
fake).
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from typing import Any

from provision.burst import jwt, rest
from provision.burst.backend import CAPACITY, Backend, BurstError, each, one_line
from provision.burst.config import Pool

COMPUTE = "https://compute.googleapis.com/compute/v1"
# the stack's burst account's key, where the burst role installs it (root's alone)
CREDENTIALS = "/etc/provision/gcp-burst-credentials.json"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
# a Spot VM that Compute Engine took back (its termination action deletes it)
SPOT_PREEMPTED = "spot VM preempted by Compute Engine"
# Google's access tokens last an hour: a key's is made again after 50 minutes
KEY_TOKEN_S = 3000
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
        self._project: str | None = None
        key = os.environ.get("PROVISION_GCP_CREDENTIALS", CREDENTIALS)
        self.token: Any
        if os.path.exists(key):
            self.token = KeyToken(key)
            self._project = self.token.project
        else:
            self.token = rest.Token(
                f"{self.metadata}/instance/service-accounts/default/token",
                {"Metadata-Flavor": "Google"},
            )

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

    def ended(self, nodes: list[str]) -> dict[str, str]:
        """A Spot VM Compute Engine took back leaves a `compute.instances.preempted` operation
        in its zone (its Spot VM guide finds them so), also once the VM is deleted."""
        wanted = set(nodes)
        out: dict[str, str] = {}
        token = ""
        while True:
            query = {"filter": 'operationType="compute.instances.preempted"', "maxResults": "500"}
            if token:
                query["pageToken"] = token
            page = self._call("GET", "operations?" + urllib.parse.urlencode(query))
            for op in page.get("items", []):
                node = str(op.get("targetLink", "")).rpartition("/")[2]
                if node in wanted:
                    out[node] = SPOT_PREEMPTED
            token = page.get("nextPageToken", "")
            if not token:
                return out

    def states(self) -> dict[str, str]:
        return {
            name: "running" if item.get("status") == "RUNNING" else str(item.get("status"))
            for name, item in self._list().items()
            if name in self.pool.nodes
        }


class KeyToken:
    """A bearer token from a service account's key file: a JWT (RS256) with the account as its
    issuer, the cloud-platform scope and the key's token URI as its audience, signed with the
    key by openssl (the standard library has no RSA), exchanged at that URI; made again before
    it expires. The key never leaves the process but for openssl's pipe."""

    def __init__(self, path: str) -> None:
        try:
            with open(path) as f:
                doc = json.load(f)
            self.email = str(doc["client_email"])
            self.project = str(doc["project_id"])
            self._key = str(doc["private_key"])
            self.uri = str(doc.get("token_uri") or "https://oauth2.googleapis.com/token")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BurstError(f"{path}: not a service account key file ({exc})") from None
        self._value, self._until = "", 0.0

    def __call__(self) -> str:
        if time.monotonic() >= self._until:
            now = int(time.time())
            claims = {"iss": self.email, "scope": SCOPE, "aud": self.uri, "iat": now}
            claims["exp"] = now + 3600
            assertion = jwt.signed(claims, self._key)
            form = urllib.parse.urlencode({"grant_type": JWT_BEARER, "assertion": assertion})
            self._value = rest.form_token(self.uri, form)
            self._until = time.monotonic() + KEY_TOKEN_S
        return self._value


def _operation_error(operation: dict[str, Any]) -> str | None:
    errors = (operation.get("error") or {}).get("errors") or []
    if not errors:
        return None
    codes = {str(e.get("code", "")) for e in errors}
    text = "; ".join(f"{e.get('code')}: {e.get('message', '')}" for e in errors[:2])
    text = " ".join(text.split())[:200]
    return f"{CAPACITY}{text}" if codes & CAPACITY_CODES else text

"""Compute Engine at the HTTP layer for the GCP bursting tests: the metadata server's token and
project, and the instance calls the burst programs make (bulkInsert, zone operations and their
wait, list with a label filter and pages, delete). Each request is recorded with its body, and
bulkInsert's body is checked against the API's shape (BulkInsertInstanceResource) before
anything is made. `fail` makes the next bulkInsert's operation end with that error, as GCE
reports a zone out of resources; `refuse` answers bulkInsert with that HTTP error instead.

And what a pool image's build asks (GcpBuilder): an OS family's newest image, a template's
properties, `instances.insert` from a template (an instance's disk type must be zonal), get,
stop, `images.insert` from a stopped instance's boot disk (a running one's only with
forceCreate; one image per name), images listed by label and deleted, global operations;
labels must keep Compute Engine's characters.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import urllib.parse
from typing import Any

from .fakehttp import JsonFake

TOKEN = "ya29.fake-token"
PROJECT = "burst-project"
BULK_KEYS = {
    "count",
    "minCount",
    "namePattern",
    "perInstanceProperties",
    "sourceInstanceTemplate",
    "instanceProperties",
    "locationPolicy",
}
NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


class FakeGCE(JsonFake):
    def __init__(self, templates: dict[str, dict[str, str]], page_size: int = 3) -> None:
        super().__init__()
        self.templates = templates  # template name -> the labels its instances get
        self.page_size = page_size
        self.instances: dict[str, dict[str, Any]] = {}  # zone/name -> instance
        self.template_properties: dict[str, dict[str, Any]] = {}  # what a GET of one answers
        self.images: dict[str, dict[str, Any]] = {}  # the project's own images
        self.inserted: list[dict[str, Any]] = []  # instances.insert bodies
        self.preempted: list[str] = []  # Spot VMs Compute Engine took back (by name)
        self.keys: dict[str, Any] = {}  # a service account's email -> its key's public half
        self.assertions: list[dict[str, Any]] = []  # the claims of each JWT taken
        self.fail: tuple[str, str] | None = None
        self.refuse: tuple[int, str, str] | None = None
        self._ids = itertools.count(1)
        self._ops: dict[str, dict[str, Any]] = {}

    @staticmethod
    def _error(status: int, code: str, message: str) -> tuple[int, dict[str, Any]]:
        return status, {
            "error": {
                "code": status,
                "message": message,
                "errors": [{"reason": code, "message": message, "domain": "global"}],
            }
        }

    def _operation(self, zone: str, kind: str, error: tuple[str, str] | None) -> dict[str, Any]:
        op: dict[str, Any] = {
            "kind": "compute#operation",
            "name": f"operation-{next(self._ids)}",
            "operationType": kind,
            "zone": zone,
            "status": "RUNNING",
        }
        self._ops[op["name"]] = {**op, "status": "DONE"}
        if error:
            self._ops[op["name"]]["error"] = {"errors": [{"code": error[0], "message": error[1]}]}
        return op

    def respond(
        self, method: str, path: str, headers: dict[str, str], body: Any
    ) -> tuple[int, Any]:
        url = urllib.parse.urlsplit(path)
        if method == "POST" and url.path == "/token":
            return self._token(body)
        if url.path.startswith("/computeMetadata/v1/"):
            if headers.get("Metadata-Flavor") != "Google":
                return 403, {"error": "Missing Metadata-Flavor:Google header"}
            if url.path.endswith("/service-accounts/default/token"):
                return 200, {"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"}
            if url.path.endswith("/project/project-id"):
                return 200, PROJECT
            return 404, {"error": "not found"}
        if headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._error(401, "authError", "Request had invalid authentication")
        g = re.fullmatch(r"/compute/v1/projects/([^/]+)/global/(.+)", url.path)
        if g:
            return self._global(method, g.group(1), g.group(2), url.query, body)
        m = re.fullmatch(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/(.+)", url.path)
        if not m or m.group(1) != PROJECT:
            return self._error(404, "notFound", f"no such resource {url.path}")
        zone, rest = m.group(2), m.group(3)
        if method == "POST" and rest == "instances/bulkInsert":
            return self._bulk_insert(zone, body)
        op = re.fullmatch(r"operations/([^/]+)/wait", rest)
        if method == "POST" and op:
            return (200, self._ops[op.group(1)]) if op.group(1) in self._ops else (404, {})
        if method == "GET" and rest == "instances":
            return self._list(zone, urllib.parse.parse_qs(url.query))
        if method == "GET" and rest == "operations":  # the zone's, by a filter on their type
            text = urllib.parse.parse_qs(url.query).get("filter", [""])[0]
            kind = re.fullmatch(r'operationType="([^"]+)"', text)
            if not kind:
                return self._error(400, "invalid", f"filter {text!r}")
            items = [
                {
                    "name": f"systemevent-{i}",
                    "operationType": kind.group(1),
                    "targetLink": f"{self.url}/compute/v1/projects/{PROJECT}/zones/{zone}"
                    f"/instances/{n}",
                    "status": "DONE",
                }
                for i, n in enumerate(self.preempted)
                if kind.group(1) == "compute.instances.preempted"
            ]
            return 200, {"items": items} if items else {}
        if method == "POST" and rest == "instances":
            return self._insert(zone, urllib.parse.parse_qs(url.query), body)
        one = re.fullmatch(r"instances/([^/]+)", rest)
        if method == "GET" and one:
            found = self.instances.get(f"{zone}/{one.group(1)}")
            return (200, found) if found else self._error(404, "notFound", "no such instance")
        stop = re.fullmatch(r"instances/([^/]+)/stop", rest)
        if method == "POST" and stop:
            found = self.instances.get(f"{zone}/{stop.group(1)}")
            if not found:
                return self._error(404, "notFound", "no such instance")
            found["status"] = "TERMINATED"
            return 200, self._operation(zone, "stop", None)
        gone = re.fullmatch(r"instances/([^/]+)", rest)
        if method == "DELETE" and gone:
            if self.instances.pop(f"{zone}/{gone.group(1)}", None) is None:
                return self._error(404, "notFound", f"instance {gone.group(1)} not found")
            return 200, self._operation(zone, "delete", None)
        return self._error(400, "badRequest", f"{method} {rest}")

    def _bulk_insert(self, zone: str, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or set(body) - BULK_KEYS:
            return self._error(
                400, "invalid", f"unknown fields {sorted(set(body or {}) - BULK_KEYS)}"
            )
        names = list(body.get("perInstanceProperties", {}))
        if body.get("count") != len(names) or not all(NAME.fullmatch(n) for n in names):
            return self._error(400, "invalid", "count and perInstanceProperties disagree")
        if not 1 <= body.get("minCount", 1) <= body["count"]:
            return self._error(400, "invalid", "minCount out of range")
        template = str(body.get("sourceInstanceTemplate", "")).rpartition("/")[2]
        if template not in self.templates:
            return self._error(404, "notFound", f"instance template {template} not found")
        if self.refuse:
            status, code, message = self.refuse
            return self._error(status, code, message)
        if self.fail:
            error, self.fail = self.fail, None
            return 200, self._operation(zone, "bulkInsert", error)
        for name in names:
            if f"{zone}/{name}" in self.instances:
                return self._error(409, "alreadyExists", f"instance {name} already exists")
        for name in names:
            n = next(self._ids)
            self.instances[f"{zone}/{name}"] = {
                "name": name,
                "status": "RUNNING",
                "labels": dict(self.templates[template]),
                "networkInterfaces": [{"networkIP": f"10.20.200.{n % 250 + 1}"}],
            }
        return 200, self._operation(zone, "bulkInsert", None)

    def _list(self, zone: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        wanted = dict(re.findall(r'labels\.([a-z0-9_-]+)="([^"]*)"', query.get("filter", [""])[0]))
        items = [
            i
            for key, i in sorted(self.instances.items())
            if key.startswith(f"{zone}/")
            and all(i["labels"].get(k) == v for k, v in wanted.items())
        ]
        start = int(query.get("pageToken", ["0"])[0])
        page: dict[str, Any] = {"items": items[start : start + self.page_size]}
        if start + self.page_size < len(items):
            page["nextPageToken"] = str(start + self.page_size)
        return 200, page

    # --- what an image build asks (provision/providers/cloud/builders.py: GcpBuilder) ----------

    def _token(self, form: Any) -> tuple[int, Any]:
        claims = verify_assertion(str(form or ""), self.keys, f"{self.url}/token")
        if isinstance(claims, str):
            return 400, {"error": claims.partition(":")[0], "error_description": claims}
        self.assertions.append(claims)
        return 200, {"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"}

    def _insert(self, zone: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        """instances.insert from a template (sourceInstanceTemplate): the body's fields in the
        template's place; the boot disk named as the instance, an external address."""
        template = query.get("sourceInstanceTemplate", [""])[0].rpartition("/")[2]
        if template not in self.templates:
            return self._error(404, "notFound", f"instance template {template} not found")
        name = str((body or {}).get("name", ""))
        bad = _label_problems(body.get("labels", {}))
        if not NAME.fullmatch(name) or bad:
            return self._error(400, "invalid", f"name {name!r} or labels {bad}")
        if f"{zone}/{name}" in self.instances:
            return self._error(409, "alreadyExists", f"instance {name} already exists")
        disks = body.get("disks") or self.template_properties.get(template, {}).get("disks", [])
        for disk in disks:
            kind = disk.get("initializeParams", {}).get("diskType", "")
            if kind and not re.fullmatch(
                r"(projects/[^/]+/)?zones/[^/]+/diskTypes/[-a-z0-9]+", kind
            ):
                return self._error(400, "invalid", f"an instance's disk type is zonal: {kind}")
        n = next(self._ids)
        self.instances[f"{zone}/{name}"] = {
            "name": name,
            "status": "RUNNING",
            "labels": dict(body.get("labels", {})),
            "metadata": body.get("metadata", {}),
            "disks": [
                {**d, "source": f"projects/{PROJECT}/zones/{zone}/disks/{name}"} for d in disks
            ],
            "networkInterfaces": [
                {
                    "networkIP": f"10.20.200.{n % 250 + 1}",
                    "accessConfigs": [{"natIP": f"198.51.100.{n % 250 + 1}"}],
                }
            ],
        }
        self.inserted.append(body)
        return 200, self._operation(zone, "insert", None)

    def _global(
        self, method: str, project: str, rest: str, query: str, body: Any
    ) -> tuple[int, Any]:
        family = re.fullmatch(r"images/family/([^/]+)", rest)
        if method == "GET" and family:  # an OS's public family: its newest image
            return 200, {"name": f"{family.group(1)}-v20261201", "family": family.group(1)}
        if project != PROJECT:
            return self._error(404, "notFound", f"no such project {project}")
        template = re.fullmatch(r"instanceTemplates/([^/]+)", rest)
        if method == "GET" and template:
            if template.group(1) not in self.templates:
                return self._error(404, "notFound", "no such template")
            props = self.template_properties.get(template.group(1), {})
            return 200, {"name": template.group(1), "properties": props}
        op = re.fullmatch(r"operations/([^/]+)/wait", rest)
        if method == "POST" and op:
            return (200, self._ops[op.group(1)]) if op.group(1) in self._ops else (404, {})
        if method == "POST" and rest == "images":
            return self._image(body)
        if method == "GET" and rest == "images":
            text = urllib.parse.parse_qs(query).get("filter", [""])[0]
            wanted = dict(re.findall(r'labels\.([a-z0-9_-]+)="([^"]*)"', text))
            items = [
                i
                for i in self.images.values()
                if all(i["labels"].get(k) == v for k, v in wanted.items())
            ]
            return 200, {"items": items} if items else {}
        image = re.fullmatch(r"images/([^/]+)", rest)
        if method == "DELETE" and image:
            if self.images.pop(image.group(1), None) is None:
                return self._error(404, "notFound", f"image {image.group(1)} not found")
            return 200, self._operation("", "delete", None)
        return self._error(400, "badRequest", f"{method} global/{rest}")

    def _image(self, body: Any) -> tuple[int, Any]:
        """images.insert from a disk: the disk's instance must be stopped (Compute Engine takes
        a running one only with forceCreate)."""
        name = str(body.get("name", ""))
        bad = _label_problems(body.get("labels", {}))
        if not NAME.fullmatch(name) or bad:
            return self._error(400, "invalid", f"name {name!r} or labels {bad}")
        disk = str(body.get("sourceDisk", ""))
        owner = next(
            (i for i in self.instances.values() for d in i["disks"] if d["source"] == disk), None
        )
        if owner is None:
            return self._error(404, "notFound", f"disk {disk} not found")
        if owner["status"] == "RUNNING" and not body.get("forceCreate"):
            return self._error(400, "resourceInUseByAnotherResource", f"{disk} is in use")
        if name in self.images:
            return self._error(409, "alreadyExists", f"image {name} already exists")
        self.images[name] = {"name": name, "labels": dict(body["labels"]), "sourceDisk": disk}
        return 200, self._operation("", "insert", None)


LABEL = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")


def _label_problems(labels: dict[str, str]) -> list[str]:
    """Compute Engine's label rules: keys start with a lower-case letter; keys and values take
    lower-case letters, digits, _ and -, at most 63 characters."""
    return [
        f"{k}={v}"
        for k, v in labels.items()
        if not LABEL.fullmatch(k) or not LABEL_VALUE.fullmatch(v)
    ]


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify_assertion(form: str, keys: dict[str, Any], audience: str) -> dict[str, Any] | str:
    """Google's token endpoint for a JWT bearer grant: the claims when the assertion is an
    RS256 JWT signed by the key of its issuer, for this audience, asking a scope, at most an
    hour long; else why not."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    fields = dict(urllib.parse.parse_qsl(form))
    if fields.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
        return "unsupported_grant_type"
    parts = fields.get("assertion", "").split(".")
    if len(parts) != 3:
        return "invalid_grant: not a JWT"
    header, claims = json.loads(_unb64(parts[0])), json.loads(_unb64(parts[1]))
    if header.get("alg") != "RS256":
        return "invalid_grant: not RS256"
    key = keys.get(claims.get("iss"))
    if key is None:
        return "invalid_grant: no such account"
    try:
        key.verify(
            _unb64(parts[2]),
            f"{parts[0]}.{parts[1]}".encode(),
            padding.PKCS1v15(),
            hashes.SHA256(),
        )
    except InvalidSignature:
        return "invalid_grant: Invalid JWT Signature."
    if claims.get("aud") != audience or not claims.get("scope"):
        return "invalid_grant: audience or scope"
    if not 0 < claims["exp"] - claims["iat"] <= 3600:
        return "invalid_grant: lifetime"
    return dict(claims)

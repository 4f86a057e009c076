"""Compute Engine at the HTTP layer for the GCP bursting tests: the metadata server's token and
project, and the instance calls the burst programs make (bulkInsert, zone operations and their
wait, list with a label filter and pages, delete). Each request is recorded with its body, and
bulkInsert's body is checked against the API's shape (BulkInsertInstanceResource) before
anything is made. `fail` makes the next bulkInsert's operation end with that error, as GCE
reports a zone out of resources; `refuse` answers bulkInsert with that HTTP error instead.
"""

from __future__ import annotations

import itertools
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

"""The GCP burst backend against Compute Engine faked at the HTTP layer (tests/fakegcp.py): the
real programs and their standard-library client; request bodies checked against the API's
shapes; a zone out of resources and a quota error as GCE reports them."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from provision.burst import programs
from provision.burst.config import BurstConfig, parse_config
from provision.cluster import Cluster
from provision.render import render
from provision.spec import load_spec

from .conftest import ROOT
from .fakegcp import PROJECT, FakeGCE

SPEC = ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml"
POOL = "gcph100"
ZONE = "us-central1-a"
EXHAUSTED = (
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "The zone 'projects/burst-project/zones/us-central1-a' does not have enough resources "
    "available to fulfill the request. Try a different zone, or try again later.",
)


@pytest.fixture
def gce(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGCE]:
    labels = {"provision-cluster": "burst", "provision-pool": POOL}
    with FakeGCE({"burst-gcph100": labels}) as fake:
        monkeypatch.setenv("PROVISION_GCP_ENDPOINT", fake.url)
        # a head inside GCP: no key file installed, the metadata server's token
        monkeypatch.setenv("PROVISION_GCP_CREDENTIALS", "/nonexistent/gcp-burst-credentials.json")
        yield fake


@pytest.fixture
def config(hub: object) -> BurstConfig:
    """The cloud-burst spec's burst configuration (its pools are remote: the hub is faked)."""
    full = parse_config(render(Cluster(load_spec(SPEC, unbuilt=True)))["files/burst/burst.json"])
    return replace(full, pools={POOL: full.pools[POOL]})


def _calls(gce: FakeGCE, method: str, suffix: str) -> list[object]:
    return [
        body
        for m, path, body in gce.requests
        if m == method and path.split("?")[0].endswith(suffix)
    ]


def test_the_burst_configuration_of_a_gcp_pool(config: BurstConfig) -> None:
    pool = config.pools[POOL]
    assert pool.backend == "gcp" and pool.cloud is not None
    assert pool.cloud.template == "burst-gcph100"  # the name the stack gives the template
    assert (pool.cloud.region, pool.cloud.zone) == ("us-central1", ZONE)
    assert pool.cloud.tags == {"provision-cluster": "burst", "provision-pool": POOL}


def test_resume_is_one_bulk_insert_of_named_instances(
    config: BurstConfig, gce: FakeGCE, scontrol: Path
) -> None:
    log: list[str] = []
    nodes = ["gcp-h100-001", "gcp-h100-002"]
    assert programs.resume(config, nodes, log.append) == 0
    inserts = _calls(gce, "POST", f"/projects/{PROJECT}/zones/{ZONE}/instances/bulkInsert")
    assert inserts == [
        {
            "count": 2,
            "minCount": 2,
            "perInstanceProperties": {"gcp-h100-001": {}, "gcp-h100-002": {}},
            "sourceInstanceTemplate": "global/instanceTemplates/burst-gcph100",
        }
    ]
    assert len(_calls(gce, "POST", "/wait")) == 1
    assert sorted(gce.instances) == [f"{ZONE}/{n}" for n in nodes]
    # the token once, from the metadata server with its header (the fake refuses without)
    assert len(_calls(gce, "GET", "/service-accounts/default/token")) == 1
    ips = [gce.instances[f"{ZONE}/{n}"]["networkInterfaces"][0]["networkIP"] for n in nodes]
    assert f"update NodeName=gcp-h100-001,gcp-h100-002 NodeAddr={','.join(ips)}" in (
        scontrol.read_text().splitlines()
    )
    assert [line.split(" (")[0] for line in log] == [f"{n} resume ok" for n in nodes]


def test_suspend_deletes_each_instance_and_says_what_was_not_there(
    config: BurstConfig, gce: FakeGCE, scontrol: Path
) -> None:
    log: list[str] = []
    programs.resume(config, ["gcp-h100-003", "gcp-h100-004"], log.append)
    log.clear()
    assert programs.suspend(config, ["gcp-h100-003", "gcp-h100-005"], log.append) == 0
    assert sorted(gce.instances) == [f"{ZONE}/gcp-h100-004"]
    assert sorted(log) == [
        "gcp-h100-003 suspend ok (gcph100)",
        "gcp-h100-005 suspend ok (gcph100, was not there)",
    ]


@pytest.mark.parametrize("how", ["operation", "quota"])
def test_no_resources_takes_the_pool_out_for_the_cooldown(
    config: BurstConfig, gce: FakeGCE, scontrol: Path, tmp_path: Path, how: str
) -> None:
    if how == "operation":  # bulkInsert accepted, its operation ends with the zone exhausted
        gce.fail = EXHAUSTED
        expected = "capacity: ZONE_RESOURCE_POOL_EXHAUSTED: The zone"
    else:  # refused at once: over the project's GPU quota
        gce.refuse = (403, "quotaExceeded", "Quota 'NVIDIA_H100_GPUS' exceeded. Limit: 8.0")
        expected = "capacity: HTTP 403: Quota 'NVIDIA_H100_GPUS' exceeded"
    log: list[str] = []
    assert programs.resume(config, ["gcp-h100-006", "gcp-h100-007"], log.append) == 1
    assert gce.instances == {}
    down = scontrol.read_text().splitlines()[-1]
    assert down.startswith(
        f"update NodeName=gcp-h100-[006-007] State=DOWN Reason=burst resume failed: {expected}"
    )
    assert log[-1] == f"{POOL} out for {config.cooldown}s: no capacity"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    reason = down.split("Reason=", 1)[1]
    (tmp_path / "states").write_text(
        f"NodeName=gcp-h100-006 State=DOWN+CLOUD Reason={reason} [root@{stamp}]\n"
    )
    gce.refuse = None
    asked = len(gce.requests)
    assert programs.resume(config, ["gcp-h100-008"], log.append) == 1
    assert len(gce.requests) == asked  # not even asked
    assert "Reason=burst pool out: pool gcph100 out for " in scontrol.read_text().splitlines()[-1]


def test_a_missing_template_marks_down_without_taking_the_pool_out(
    config: BurstConfig, gce: FakeGCE, scontrol: Path
) -> None:
    gce.templates.clear()
    log: list[str] = []
    assert programs.resume(config, ["gcp-h100-008"], log.append) == 1
    assert "Reason=burst resume failed: HTTP 404: instance template burst-gcph100 not found" in (
        scontrol.read_text()
    )
    assert not any("out for" in line for line in log)


def test_reconcile_deletes_orphans_and_marks_vanished_nodes_down(
    config: BurstConfig, gce: FakeGCE, scontrol: Path, tmp_path: Path
) -> None:
    log: list[str] = []
    nodes = [f"gcp-h100-00{i}" for i in range(1, 6)]  # five: two pages of three
    programs.resume(config, nodes, log.append)
    del gce.instances[f"{ZONE}/gcp-h100-002"]  # deleted by hand
    del gce.instances[f"{ZONE}/gcp-h100-003"]  # a Spot VM Compute Engine took back
    gce.preempted.append("gcp-h100-003")
    (tmp_path / "states").write_text(
        "NodeName=gcp-h100-001 State=IDLE+CLOUD+POWERED_DOWN\n"
        "NodeName=gcp-h100-002 State=ALLOCATED+CLOUD\n"
        "NodeName=gcp-h100-003 State=ALLOCATED+CLOUD\n"
        "NodeName=gcp-h100-004 State=IDLE+CLOUD\n"
        "NodeName=gcp-h100-005 State=IDLE+CLOUD+POWERED_DOWN\n"
    )
    log.clear()
    assert programs.reconcile(config, log.append) == 0
    assert log == [
        "gcp-h100-001 reconcile: orphan removed (Slurm has it powered down)",
        "gcp-h100-002 reconcile: instance or container gone while Slurm has it up",
        "gcp-h100-003 reconcile: spot VM preempted by Compute Engine while Slurm has it up",
        "gcp-h100-005 reconcile: orphan removed (Slurm has it powered down)",
        # the pool is remote: the hub drops the peers of the nodes with no instance now
        "gcp-h100-001 reconcile: tunnel peer removed (no instance)",
        "gcp-h100-002 reconcile: tunnel peer removed (no instance)",
        "gcp-h100-003 reconcile: tunnel peer removed (no instance)",
        "gcp-h100-005 reconcile: tunnel peer removed (no instance)",
    ]
    assert sorted(gce.instances) == [f"{ZONE}/gcp-h100-004"]
    # the zone's preempted operations, asked once for the vanished nodes
    (asked,) = [p for m, p, _ in gce.requests if m == "GET" and "/operations?" in p]
    assert "compute.instances.preempted" in urllib.parse.unquote_plus(asked)
    assert len([p for m, p, _ in gce.requests if m == "GET" and "pageToken=" in p]) >= 1
    said = scontrol.read_text()
    assert "update NodeName=gcp-h100-002 State=DOWN" in said
    assert "burst: node vanished (spot VM preempted by Compute Engine)" in said


def test_a_head_outside_gcp_bursts_with_the_stacks_key(
    config: BurstConfig,
    gce: FakeGCE,
    scontrol: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the burst account's key file installed (the burst role's, root's alone), the
    backend signs a JWT with the key (openssl), takes a token for it at the key's token URI
    and the project from the key; it never asks a metadata server (there is none outside
    GCP), and no log line holds the key or the token. A key the endpoint refuses fails the
    resume with the endpoint's reason."""
    import json
    import secrets

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    email = f"burst-burst-heads@{PROJECT}.iam.gserviceaccount.com"
    path = tmp_path / "gcp-burst-credentials.json"
    doc = {
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": secrets.token_hex(20),
        "private_key": pem,
        "client_email": email,
        "token_uri": f"{gce.url}/token",
    }
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    monkeypatch.setenv("PROVISION_GCP_CREDENTIALS", str(path))
    gce.keys[email] = key.public_key()
    log: list[str] = []
    assert programs.resume(config, ["gcp-h100-001"], log.append) == 0, log
    assert sorted(gce.instances) == [f"{ZONE}/gcp-h100-001"]
    (claims,) = gce.assertions
    assert claims["iss"] == email
    assert claims["scope"] == "https://www.googleapis.com/auth/cloud-platform"
    assert claims["exp"] - claims["iat"] == 3600
    assert not [p for _, p, _ in gce.requests if p.startswith("/computeMetadata/")]
    text = "\n".join(log)
    assert "PRIVATE KEY" not in text and "ya29" not in text
    # another account's key (the stack's was replaced): the endpoint says no, the resume fails
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    gce.keys[email] = other.public_key()
    failed: list[str] = []
    assert programs.resume(config, ["gcp-h100-002"], failed.append) != 0
    assert "Invalid JWT Signature" in "\n".join(failed), failed
    assert f"{ZONE}/gcp-h100-002" not in gce.instances

"""The Azure burst backend against Resource Manager faked at the HTTP layer
(tests/fakeazure.py): the real programs and their standard-library client; each VM's body
checked against the API's shape for a VM of a Flexible scale set; SkuNotAvailable, a quota and
AllocationFailed as Azure reports them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from provision.burst import azure, programs
from provision.burst.config import BurstConfig, parse_config
from provision.cluster import Cluster
from provision.render import render
from provision.spec import load_spec

from .conftest import ROOT, rsa_key
from .fakeazure import SUBSCRIPTION, USER_DATA, FakeARM, scale_set

SPEC = ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml"
POOL = "azh100"
GROUP = "burst-rg"


@pytest.fixture
def arm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeARM]:
    subnet = (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/"
        "Microsoft.Network/virtualNetworks/burst-vnet/subnets/burst-subnet"
    )
    sets = {"burst-azh100": scale_set(GROUP, "burst-azh100", subnet, "burst-azh100-nsg", "ppg")}
    with FakeARM(GROUP, sets) as fake:
        monkeypatch.setenv("PROVISION_AZURE_ENDPOINT", fake.url)
        # a head in Azure (its managed identity), unless a test installs the heads' credentials
        monkeypatch.setenv("PROVISION_AZURE_CREDENTIALS", "/nonexistent/azure-burst-credentials")
        monkeypatch.setattr(azure, "POLL_S", 0.01)
        yield fake


@pytest.fixture
def config(hub: object) -> BurstConfig:
    """The cloud-burst spec's burst configuration (its pools are remote: the hub is faked)."""
    full = parse_config(render(Cluster(load_spec(SPEC, unbuilt=True)))["files/burst/burst.json"])
    return replace(full, pools={POOL: full.pools[POOL]})


def _puts(arm: FakeARM) -> dict[str, object]:
    return {p.split("?")[0].rpartition("/")[2]: b for m, p, b in arm.requests if m == "PUT"}


def test_the_burst_configuration_of_an_azure_pool(config: BurstConfig) -> None:
    pool = config.pools[POOL]
    assert pool.backend == "azure" and pool.cloud is not None
    assert pool.cloud.template == "burst-azh100"  # the scale set the stack makes
    assert pool.cloud.group == GROUP
    assert pool.cloud.tags == {"provision-cluster": "burst", "provision-pool": POOL}


def test_resume_makes_a_named_vm_per_node_in_the_scale_set(
    config: BurstConfig, arm: FakeARM, scontrol: Path
) -> None:
    log: list[str] = []
    nodes = ["az-h100-001", "az-h100-002"]
    assert programs.resume(config, nodes, log.append) == 0
    assert sorted(arm.vms) == nodes
    body = _puts(arm)["az-h100-001"]
    profile = arm.scale_sets["burst-azh100"]["properties"]["virtualMachineProfile"]
    props = body["properties"]  # type: ignore[index]
    assert body["tags"] == {  # type: ignore[index]
        "provision-cluster": "burst",
        "provision-pool": POOL,
        "provision-node": "az-h100-001",
    }
    assert props["virtualMachineScaleSet"]["id"].endswith("/virtualMachineScaleSets/burst-azh100")
    assert props["hardwareProfile"] == {"vmSize": "Standard_ND96isr_H100_v5"}
    assert props["osProfile"]["computerName"] == "az-h100-001"
    assert props["osProfile"]["linuxConfiguration"] == profile["osProfile"]["linuxConfiguration"]
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    nic = props["networkProfile"]["networkInterfaceConfigurations"][0]
    assert nic["name"] == "az-h100-001-primary" and nic["properties"]["deleteOption"] == "Delete"
    assert "securityProfile" not in props and "plan" not in body  # an Ubuntu image: no plan
    # the join's user data and identity: read with $expand=userData, passed to each VM
    assert props["userData"] == profile["userData"] == USER_DATA
    (identity,) = arm.scale_sets["burst-azh100"]["identity"]["userAssignedIdentities"]
    assert body["identity"] == {  # type: ignore[index]
        "type": "UserAssigned",
        "userAssignedIdentities": {identity: {}},
    }
    assert props["proximityPlacementGroup"]["id"].endswith("/ppg")
    ips = [
        arm.nics[f"{n}-primary"]["properties"]["ipConfigurations"][0]["properties"][
            "privateIPAddress"
        ]
        for n in nodes
    ]
    assert f"update NodeName=az-h100-001,az-h100-002 NodeAddr={','.join(ips)}" in (
        scontrol.read_text().splitlines()
    )
    # the token and the subscription once each, from the metadata service with its header
    metadata = [p for m, p, _ in arm.requests if p.startswith("/metadata/")]
    assert len(metadata) == 2
    assert [line.split(" (")[0] for line in log] == [f"{n} resume ok" for n in nodes]


def test_a_vm_from_an_image_sold_under_a_plan_names_the_plan(
    config: BurstConfig, arm: FakeARM, scontrol: Path
) -> None:
    plan = {"name": "9-base", "product": "rockylinux-x86_64", "publisher": "resf"}
    arm.scale_sets["burst-azh100"]["plan"] = plan
    assert programs.resume(config, ["az-h100-001"], lambda _m: None) == 0
    assert _puts(arm)["az-h100-001"]["plan"] == plan  # type: ignore[index]


def test_a_vm_of_a_reserved_pool_launches_into_its_reservation_group(
    config: BurstConfig, arm: FakeARM, scontrol: Path
) -> None:
    """The stack gives such a scale set no proximity placement group (Azure takes none beside a
    reservation) and its profile the reservation group: each burst VM names the group."""
    group = (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/capacity/providers/"
        "Microsoft.Compute/capacityReservationGroups/nc-a100"
    )
    made = arm.scale_sets["burst-azh100"]
    del made["properties"]["proximityPlacementGroup"]
    made["properties"]["virtualMachineProfile"]["capacityReservation"] = {
        "capacityReservationGroup": {"id": group}
    }
    assert programs.resume(config, ["az-h100-001"], lambda _m: None) == 0
    props = _puts(arm)["az-h100-001"]["properties"]  # type: ignore[index]
    assert props["capacityReservation"] == {"capacityReservationGroup": {"id": group}}
    assert "proximityPlacementGroup" not in props


def test_suspend_deletes_the_nodes_vms(config: BurstConfig, arm: FakeARM, scontrol: Path) -> None:
    log: list[str] = []
    programs.resume(config, ["az-h100-003", "az-h100-004"], log.append)
    log.clear()
    assert programs.suspend(config, ["az-h100-003", "az-h100-005"], log.append) == 0
    assert sorted(arm.vms) == ["az-h100-004"]
    assert sorted(log) == [
        "az-h100-003 suspend ok (azh100)",
        "az-h100-005 suspend ok (azh100, was not there)",
    ]


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("SkuNotAvailable", "capacity: HTTP 409: The requested size for resource"),
        ("quota", "capacity: HTTP 409: Operation could not be completed as it results in"),
        ("AllocationFailed", "capacity: AllocationFailed: Allocation failed."),
    ],
)
def test_no_capacity_takes_the_pool_out_and_leaves_no_vm(
    config: BurstConfig, arm: FakeARM, scontrol: Path, tmp_path: Path, how: str, expected: str
) -> None:
    if how == "SkuNotAvailable":
        arm.refuse = (
            409,
            "SkuNotAvailable",
            "The requested size for resource '...' is currently not available in location "
            "'eastus'. Please try another size or deploy to a different location.",
        )
    elif how == "quota":
        arm.refuse = (
            409,
            "OperationNotAllowed",
            "Operation could not be completed as it results in exceeding approved "
            "standardNDSH100v5Family Cores quota.",
        )
    else:
        arm.fail = ("AllocationFailed", "Allocation failed. We do not have sufficient capacity.")
    log: list[str] = []
    assert programs.resume(config, ["az-h100-006", "az-h100-007"], log.append) == 1
    assert arm.vms == {}  # all or nothing: a VM that was made is deleted again
    down = scontrol.read_text().splitlines()[-1]
    assert down.startswith(
        f"update NodeName=az-h100-[006-007] State=DOWN Reason=burst resume failed: {expected}"
    )
    assert log[-1] == f"{POOL} out for {config.cooldown}s: no capacity"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    (tmp_path / "states").write_text(
        f"NodeName=az-h100-006 State=DOWN+CLOUD Reason={down.split('Reason=', 1)[1]} "
        f"[root@{stamp}]\n"
    )
    arm.refuse = arm.fail = None
    asked = len(arm.requests)
    assert programs.resume(config, ["az-h100-008"], log.append) == 1
    assert len(arm.requests) == asked  # not even asked


def test_a_missing_scale_set_marks_down_without_taking_the_pool_out(
    config: BurstConfig, arm: FakeARM, scontrol: Path
) -> None:
    arm.scale_sets.clear()
    log: list[str] = []
    assert programs.resume(config, ["az-h100-008"], log.append) == 1
    assert "Reason=burst resume failed: HTTP 404: burst-azh100" in scontrol.read_text()
    assert not any("out for" in line for line in log)


def test_reconcile_deletes_orphans_and_marks_vanished_nodes_down(
    config: BurstConfig, arm: FakeARM, scontrol: Path, tmp_path: Path
) -> None:
    log: list[str] = []
    nodes = [f"az-h100-00{i}" for i in range(1, 6)]  # five: two pages of three
    assert programs.resume(config, nodes, log.append) == 0
    del arm.vms["az-h100-002"]  # evicted, deleted by hand
    (tmp_path / "states").write_text(
        "NodeName=az-h100-001 State=IDLE+CLOUD+POWERED_DOWN\n"
        "NodeName=az-h100-002 State=ALLOCATED+CLOUD\n"
        "NodeName=az-h100-003 State=ALLOCATED+CLOUD\n"
        "NodeName=az-h100-004 State=IDLE+CLOUD\n"
        "NodeName=az-h100-005 State=IDLE+CLOUD+POWERED_DOWN\n"
    )
    log.clear()
    assert programs.reconcile(config, log.append) == 0
    assert log == [
        "az-h100-001 reconcile: orphan removed (Slurm has it powered down)",
        "az-h100-002 reconcile: instance or container gone while Slurm has it up",
        "az-h100-005 reconcile: orphan removed (Slurm has it powered down)",
        # the pool is remote: the hub drops the peers of the nodes with no instance now
        "az-h100-001 reconcile: tunnel peer removed (no instance)",
        "az-h100-002 reconcile: tunnel peer removed (no instance)",
        "az-h100-005 reconcile: tunnel peer removed (no instance)",
    ]
    assert sorted(arm.vms) == ["az-h100-003", "az-h100-004"]
    assert any("skip=3" in p for m, p, _ in arm.requests if m == "GET")


def test_a_head_outside_azure_takes_its_token_through_the_federated_credential(
    config: BurstConfig,
    arm: FakeARM,
    scontrol: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the heads' credentials installed (the burst role's, root's alone: the stack's
    identity and the workstation's issuer key), the backend signs a JWT with the issuer's key
    (openssl; its kid in the header), exchanges it at the tenant's token endpoint as the client
    assertion of the identity, and takes the subscription from the file: it never asks a
    metadata service (there is none outside Azure), and no log line holds the key or the
    token. A key the issuer's key set no longer has fails the resume with Entra's words."""
    import json

    from cryptography.hazmat.primitives.asymmetric import rsa

    from provision.providers.cloud import issuer_jwk

    key, pem = rsa_key()
    jwk = issuer_jwk(pem)
    issuer = "https://burstoidc0a1b2c.blob.core.windows.net/oidc/"
    doc = {
        "tenant": "00000000-aaaa-bbbb-cccc-000000000001",
        "client_id": "00000000-aaaa-bbbb-cccc-0000000000c1",
        "subscription": SUBSCRIPTION,
        "issuer": issuer,
        "subject": "provision:burst:burst-heads",
        "kid": jwk["kid"],
        "private_key": pem.decode(),
    }
    path = tmp_path / "azure-burst-credentials.json"
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    monkeypatch.setenv("PROVISION_AZURE_CREDENTIALS", str(path))
    arm.issuers[issuer] = {jwk["kid"]: key.public_key()}
    arm.federated[doc["client_id"]] = (issuer, doc["subject"])
    log: list[str] = []
    assert programs.resume(config, ["az-h100-001"], log.append) == 0, log
    assert sorted(arm.vms) == ["az-h100-001"]
    (claims,) = arm.assertions
    assert claims["aud"] == "api://AzureADTokenExchange"
    assert claims["exp"] - claims["iat"] == 600 and claims["jti"]
    assert not [p for _, p, _ in arm.requests if p.startswith("/metadata/")]
    token_posts = [p for m, p, _ in arm.requests if p.endswith("/oauth2/v2.0/token")]
    assert token_posts == [f"/{doc['tenant']}/oauth2/v2.0/token"]
    text = "\n".join(log)
    assert "PRIVATE KEY" not in text and "fake-token" not in text
    # the issuer's key was made anew (another workstation's state): Entra refuses the assertion
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    arm.issuers[issuer] = {jwk["kid"]: other.public_key()}
    failed: list[str] = []
    assert programs.resume(config, ["az-h100-002"], failed.append) != 0
    assert "failed signature validation" in "\n".join(failed), failed
    assert "az-h100-002" not in arm.vms


def test_a_spot_pool_makes_spot_vms_and_an_evicted_one_returns_to_the_pool(
    config: BurstConfig, arm: FakeARM, scontrol: Path, tmp_path: Path
) -> None:
    """The stack gives a spot pool's scale set Spot priority, deleted on eviction, up to the
    on-demand price: each burst VM carries them. A VM of it that vanished was evicted: the
    reconciler marks its node down with a reason the cooldown returns to the pool."""
    from provision.burst import slurm

    profile = arm.scale_sets["burst-azh100"]["properties"]["virtualMachineProfile"]
    profile.update(
        {"priority": "Spot", "evictionPolicy": "Delete", "billingProfile": {"maxPrice": -1}}
    )
    assert programs.resume(config, ["az-h100-001", "az-h100-002"], lambda _m: None) == 0
    props = _puts(arm)["az-h100-001"]["properties"]  # type: ignore[index]
    assert (props["priority"], props["evictionPolicy"]) == ("Spot", "Delete")
    assert props["billingProfile"] == {"maxPrice": -1}
    del arm.vms["az-h100-002"]  # evicted: the eviction policy deleted it
    (tmp_path / "states").write_text(
        "NodeName=az-h100-001 State=ALLOCATED+CLOUD\nNodeName=az-h100-002 State=ALLOCATED+CLOUD\n"
    )
    assert programs.reconcile(config, lambda _m: None) == 0
    reason = f"Reason=burst: node vanished ({azure.SPOT_EVICTED})"
    assert f"update NodeName=az-h100-002 State=DOWN {reason}" in scontrol.read_text()
    assert reason.partition("=")[2].startswith(slurm.COOLDOWN_REASONS)


def test_an_infiniband_pools_vms_go_in_its_availability_set(
    config: BurstConfig, arm: FakeARM, scontrol: Path
) -> None:
    """A Flexible scale set carries no InfiniBand: the stack names an ND pool's availability
    set (one InfiniBand partition) in its scale set's tags, and each burst VM is made there
    from the scale set's profile, not in the scale set."""
    from provision.burst.config import TAG_AVAILABILITY_SET

    avset = (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/"
        "Microsoft.Compute/availabilitySets/burst-azh100-avset"
    )
    arm.scale_sets["burst-azh100"]["tags"] = {TAG_AVAILABILITY_SET: avset}
    assert programs.resume(config, ["az-h100-001"], lambda _m: None) == 0
    props = _puts(arm)["az-h100-001"]["properties"]  # type: ignore[index]
    assert props["availabilitySet"] == {"id": avset}
    assert "virtualMachineScaleSet" not in props


def test_the_standby_heads_end_of_the_tunnel_follows_slurms_addresses(
    config: BurstConfig, hub: object, scontrol: Path, tmp_path: Path
) -> None:
    """With two heads the one not in control is a hub too: its timer gives its end the peers
    of the remote burst nodes Slurm has up, at the NodeAddr resume set, and drops a peer whose
    node is powered down again; nothing changes: nothing is said."""
    from provision.burst.tunnel import Hub

    assert isinstance(hub, Hub)
    hub.add({"az-h100-003": "10.20.210.9"})  # suspended since: its peer goes
    (tmp_path / "states").write_text(
        "NodeName=az-h100-001 NodeAddr=10.20.210.5 State=ALLOCATED+CLOUD\n"
        "NodeName=az-h100-002 NodeAddr=az-h100-002 State=IDLE+CLOUD+POWERED_DOWN\n"
        "NodeName=az-h100-003 NodeAddr=az-h100-003 State=IDLE+CLOUD+POWERED_DOWN\n"
        "NodeName=az-h100-004 NodeAddr=10.20.210.7 State=IDLE+CLOUD+POWERING_UP\n"
    )
    log: list[str] = []
    assert programs.standby_tunnel(config, log.append) == 0
    assert hub.up() == {"az-h100-001": "10.20.210.5", "az-h100-004": "10.20.210.7"}
    assert log == [
        "az-h100-001 standby tunnel: peer at 10.20.210.5",
        "az-h100-004 standby tunnel: peer at 10.20.210.7",
        "az-h100-003 standby tunnel: peer removed",
    ]
    log.clear()
    assert programs.standby_tunnel(config, log.append) == 0
    assert log == []

"""The AWS burst backend against moto in server mode (tests/fakeec2.py): the real boto3 and the
real programs, EC2's API answered by moto, capacity errors injected as EC2 sends them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from provision.burst import programs, slurm
from provision.burst.aws import UNNAMED_GRACE_S, AwsBackend
from provision.burst.backend import BurstError
from provision.burst.config import TAG_NODE, BurstConfig, parse_config
from provision.cluster import Cluster
from provision.render import render
from provision.spec import load_spec

from .conftest import ROOT
from .fakeec2 import FakeEC2

pytest.importorskip("boto3")
pytest.importorskip("moto")

SPEC = ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml"
POOL = "awsh100"
ICE = (
    "InsufficientInstanceCapacity",
    "We currently do not have sufficient p5.48xlarge capacity in the Availability Zone you "
    "requested (us-east-1a).",
)


@pytest.fixture(scope="module")
def ec2() -> Iterator[FakeEC2]:
    with FakeEC2() as fake:
        fake.launch_template("burst-awsh100", "p5.48xlarge")
        yield fake


@pytest.fixture
def aws(ec2: FakeEC2, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeEC2]:
    """The fake EC2 as boto3 finds it, its counters reset, no instance left from a test."""
    for key, value in ec2.env().items():
        monkeypatch.setenv(key, value)
    ec2.calls.clear()
    ec2.fail.clear()
    ec2.rewrite.clear()
    yield ec2
    ec2.fail.clear()
    ec2.rewrite.clear()
    client = ec2.client()
    ids = [
        i["InstanceId"]
        for r in client.describe_instances()["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] != "terminated"
    ]
    if ids:
        client.terminate_instances(InstanceIds=ids)


@pytest.fixture
def config(hub: object) -> BurstConfig:
    """The AWS pool of the rendered configuration (the GCP and Azure pools: not built yet)."""
    full = parse_config(render(Cluster(load_spec(SPEC, unbuilt=True)))["files/burst/burst.json"])
    return replace(full, pools={POOL: full.pools[POOL]})


def _live(fake: FakeEC2) -> dict[str, dict[str, str]]:
    """Instance tags by node name, for the instances that are not terminated."""
    out = {}
    for r in fake.client().describe_instances()["Reservations"]:
        for i in r["Instances"]:
            # (EC2 adds its own aws:... tags, moto too)
            tags = {t["Key"]: t["Value"] for t in i.get("Tags", []) if ":" not in t["Key"]}
            if i["State"]["Name"] not in ("terminated", "shutting-down"):
                out[tags.get(TAG_NODE, i["InstanceId"])] = tags
    return out


def test_the_burst_configuration_of_an_aws_pool(config: BurstConfig) -> None:
    pool = config.pools[POOL]
    assert pool.backend == "aws" and pool.cloud is not None
    assert pool.cloud.template == "burst-awsh100"  # the name the stack gives the template
    assert pool.cloud.region == "us-east-1"
    assert pool.cloud.tags == {"provision-cluster": "burst", "provision-pool": POOL}
    assert sorted(pool.nodes) == [f"aws-h100-{i:03d}" for i in range(1, 17)]
    assert set(pool.nodes.values()) == {""}  # the cloud chooses, resume tells Slurm


def test_resume_makes_named_instances_from_the_template_in_one_call(
    config: BurstConfig, aws: FakeEC2, scontrol: Path
) -> None:
    log: list[str] = []
    nodes = ["aws-h100-001", "aws-h100-002", "aws-h100-003"]
    assert programs.resume(config, nodes, log.append) == 0
    assert aws.calls["RunInstances"] == 1 and aws.calls["CreateTags"] == 3
    live = _live(aws)
    assert sorted(live) == nodes
    for node in nodes:
        assert live[node] == {
            "provision-cluster": "burst",
            "provision-pool": POOL,
            "provision-node": node,
            "Name": node,
        }
    client = aws.client()
    made = [i for r in client.describe_instances()["Reservations"] for i in r["Instances"]]
    assert {i["InstanceType"] for i in made} == {"p5.48xlarge"}  # from the template
    addresses = {i["PrivateIpAddress"] for i in made}
    update = next(c for c in scontrol.read_text().splitlines() if "NodeAddr=" in c)
    assert update.startswith("update NodeName=aws-h100-001,aws-h100-002,aws-h100-003 NodeAddr=")
    assert set(update.split("NodeAddr=")[1].split(",")) == addresses
    assert [line.split(" (")[0] for line in log] == [f"{n} resume ok" for n in nodes]


def test_suspend_terminates_the_nodes_instances_only(
    config: BurstConfig, aws: FakeEC2, scontrol: Path
) -> None:
    log: list[str] = []
    programs.resume(config, ["aws-h100-004", "aws-h100-005"], log.append)
    log.clear()
    assert programs.suspend(config, ["aws-h100-004", "aws-h100-006"], log.append) == 0
    assert aws.calls["TerminateInstances"] == 1
    assert sorted(_live(aws)) == ["aws-h100-005"]
    assert log == [
        "aws-h100-004 suspend ok (awsh100)",
        "aws-h100-006 suspend ok (awsh100, was not there)",
    ]


def test_a_remote_pools_nodes_are_peers_of_the_hub_from_resume_to_suspend(
    config: BurstConfig, aws: FakeEC2, scontrol: Path, hub: Any
) -> None:
    """The pool is on a remote network: resume gives the hub each new node's peer at the
    address EC2 gave it, before Slurm is told; suspend takes the peer away; the reconciler
    drops a peer whose instance is gone; a restore puts back the peers still up."""
    assert config.pools[POOL].tunnel
    log: list[str] = []
    nodes = ["aws-h100-001", "aws-h100-002"]
    assert programs.resume(config, nodes, log.append) == 0
    client = aws.client()
    made = [i for r in client.describe_instances()["Reservations"] for i in r["Instances"]]
    address = {
        next(t["Value"] for t in i["Tags"] if t["Key"] == TAG_NODE): i["PrivateIpAddress"]
        for i in made
    }
    keys = {node: hub.peers.get(node) for node in nodes}
    assert hub.calls == [
        ("set", "wg-provision", "peer", keys[n], "allowed-ips", f"{address[n]}/32") for n in nodes
    ]
    assert hub.up() == {n: address[n] for n in nodes}
    hub.calls.clear()
    assert programs.suspend(config, ["aws-h100-001"], log.append) == 0
    assert hub.calls == [("set", "wg-provision", "peer", keys["aws-h100-001"], "remove")]
    assert hub.up() == {"aws-h100-002": address["aws-h100-002"]}
    # aws-h100-002's instance is terminated behind the programs' back: its peer goes too
    (instance,) = [
        i["InstanceId"] for i in made if address["aws-h100-002"] == i["PrivateIpAddress"]
    ]
    client.terminate_instances(InstanceIds=[instance])
    log.clear()
    assert programs.reconcile(config, log.append) == 0
    assert "aws-h100-002 reconcile: tunnel peer removed (no instance)" in log
    assert hub.up() == {}
    hub.calls.clear()
    assert hub.restore() == {} and hub.calls == []


def test_a_node_the_hub_cannot_take_is_removed_and_marked_down(
    config: BurstConfig, aws: FakeEC2, scontrol: Path, hub: Any
) -> None:
    def refuse(*argv: str) -> None:
        raise BurstError("wg set: Unable to access interface: No such device")

    hub.run = refuse
    log: list[str] = []
    assert programs.resume(config, ["aws-h100-003"], log.append) == 1
    assert _live(aws) == {}  # it could never register: terminated at once
    assert log[0].startswith("aws-h100-003 resume failed (awsh100, ")
    assert log[0].endswith("tunnel: wg set: Unable to access interface: No such device")
    assert "NodeAddr=" not in scontrol.read_text()
    assert (
        scontrol.read_text()
        .splitlines()[-1]
        .startswith(
            "update NodeName=aws-h100-003 State=DOWN Reason=burst resume failed: tunnel: wg set:"
        )
    )


def test_a_capacity_error_takes_the_pool_out_for_the_cooldown(
    config: BurstConfig, aws: FakeEC2, scontrol: Path, tmp_path: Path
) -> None:
    aws.fail["RunInstances"] = ICE
    log: list[str] = []
    assert programs.resume(config, ["aws-h100-007", "aws-h100-008"], log.append) == 1
    assert _live(aws) == {}
    down = scontrol.read_text().splitlines()[-1]
    assert down.startswith(
        "update NodeName=aws-h100-[007-008] State=DOWN "
        "Reason=burst resume failed: capacity: An error occurred (InsufficientInstanceCapacity)"
    )
    assert log[-1] == f"{POOL} out for {config.cooldown}s: no capacity"
    # Slurm now holds the reason and when it was set: the next resume in the pool is not even
    # tried, so the requeued job goes to the partition's next pool by weight
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    reason = down.split("Reason=", 1)[1]
    (tmp_path / "states").write_text(
        f"NodeName=aws-h100-007 State=DOWN+CLOUD Reason={reason} [root@{stamp}]\n"
        f"NodeName=aws-h100-008 State=DOWN+CLOUD Reason={reason} [root@{stamp}]\n"
        "NodeName=aws-h100-009 State=IDLE+CLOUD+POWERED_DOWN\n"
    )
    aws.fail.clear()
    calls = aws.calls["RunInstances"]
    log.clear()
    assert programs.resume(config, ["aws-h100-009"], log.append) == 1
    assert aws.calls["RunInstances"] == calls
    assert log[0].startswith(f"aws-h100-009 resume refused ({POOL}): pool {POOL} out for ")
    assert "InsufficientInstanceCapacity" in log[0]
    assert "Reason=burst pool out: pool awsh100 out for " in scontrol.read_text().splitlines()[-1]
    # once the cooldown is over the pool is asked again
    later = time.time() + config.cooldown + 1
    assert programs.resume(config, ["aws-h100-009"], log.append, now=later) == 0
    assert aws.calls["RunInstances"] == calls + 1
    assert sorted(_live(aws)) == ["aws-h100-009"]


def test_any_other_error_marks_the_nodes_down_without_taking_the_pool_out(
    config: BurstConfig, aws: FakeEC2, scontrol: Path
) -> None:
    aws.fail["RunInstances"] = ("InvalidLaunchTemplateName.NotFoundException", "no template")
    log: list[str] = []
    assert programs.resume(config, ["aws-h100-010"], log.append) == 1
    last = scontrol.read_text().splitlines()[-1]
    assert "Reason=burst resume failed: An error occurred (InvalidLaunchTemplateName" in last
    assert not any("out for" in line for line in log)


def test_reconcile_terminates_orphans_and_marks_reclaimed_nodes_down(
    config: BurstConfig, aws: FakeEC2, scontrol: Path, tmp_path: Path
) -> None:
    log: list[str] = []
    programs.resume(config, ["aws-h100-011", "aws-h100-012"], log.append)
    # one instance of the pool that was never named (a resume cut short)
    aws.client().run_instances(
        LaunchTemplate={"LaunchTemplateName": "burst-awsh100"},
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [
                    {"Key": "provision-cluster", "Value": "burst"},
                    {"Key": "provision-pool", "Value": POOL},
                ],
            }
        ],
    )
    # Slurm: 011 powered down (its instance is an orphan); 012 running a job, its instance
    # reclaimed (terminated behind our back); 013 running a job with no instance ever
    AwsBackend(config.pools[POOL]).stop(["aws-h100-012"])
    (tmp_path / "states").write_text(
        "NodeName=aws-h100-011 State=IDLE+CLOUD+POWERED_DOWN\n"
        "NodeName=aws-h100-012 State=ALLOCATED+CLOUD\n"
    )
    log.clear()
    # within the grace an unnamed instance may still be getting its name: left alone
    assert programs.reconcile(config, log.append) == 0
    assert len(_live(aws)) == 1 and "aws-h100-011" not in _live(aws)
    assert log == [
        "aws-h100-011 reconcile: orphan removed (Slurm has it powered down)",
        "aws-h100-012 reconcile: instance or container gone while Slurm has it up",
        # the pool is remote: the hub drops the peers of both
        "aws-h100-011 reconcile: tunnel peer removed (no instance)",
        "aws-h100-012 reconcile: tunnel peer removed (no instance)",
    ]
    log.clear()
    (tmp_path / "states").write_text("")
    assert programs.reconcile(config, log.append, now=time.time() + UNNAMED_GRACE_S + 5) == 0
    assert _live(aws) == {}
    assert len(log) == 1 and log[0].endswith("terminated (the pool's, never named)")


def test_without_boto3_the_nodes_go_down_with_the_fix(
    config: BurstConfig, scontrol: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    real = builtins.__import__

    def no_boto3(name: str, *args: object, **kwargs: object) -> object:
        if name == "boto3":
            raise ImportError(name)
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_boto3)
    log: list[str] = []
    assert programs.resume(config, ["aws-h100-014"], log.append) == 1
    assert "boto3 is not installed on this head" in scontrol.read_text()


def test_a_reclaimed_spot_node_is_marked_down_saying_so(
    config: BurstConfig, aws: FakeEC2, scontrol: Path, tmp_path: Path
) -> None:
    """EC2 takes a spot instance back: it lingers terminated with the state reason
    Server.SpotInstanceTermination (moto ends it as a user would: that code is EC2's own,
    put in its answer), and the reconciler marks the node down saying so; Slurm requeues its
    job."""
    from provision.burst.aws import SPOT_RECLAIMED

    log: list[str] = []
    programs.resume(config, ["aws-h100-014"], log.append)
    AwsBackend(config.pools[POOL]).stop(["aws-h100-014"])  # what EC2 does to it
    aws.rewrite["DescribeInstances"] = (
        b"<code>Client.UserInitiatedShutdown</code>",
        b"<code>Server.SpotInstanceTermination</code>",
    )
    (tmp_path / "states").write_text("NodeName=aws-h100-014 State=ALLOCATED+CLOUD\n")
    log.clear()
    assert programs.reconcile(config, log.append) == 0
    assert log[0] == f"aws-h100-014 reconcile: {SPOT_RECLAIMED} while Slurm has it up"
    last = [line for line in scontrol.read_text().splitlines() if "State=DOWN" in line][-1]
    assert f"Reason=burst: node vanished ({SPOT_RECLAIMED})" in last
    # its instance is gone for good: after the cooldown the name returns to the pool (idle~),
    # or a pool would shrink by one with each reclaim
    reason = f"burst: node vanished ({SPOT_RECLAIMED})"
    (tmp_path / "states").write_text(
        f"NodeName=aws-h100-014 State=DOWN+CLOUD Reason={reason} [root@2026-12-04T10:00:00]\n"
    )
    since = slurm.parse_reasons((tmp_path / "states").read_text())["aws-h100-014"][1]
    log.clear()
    assert programs.reconcile(config, log.append, now=since + config.cooldown - 1) == 0
    assert log == []
    assert programs.reconcile(config, log.append, now=since + config.cooldown) == 0
    assert log == [
        f"aws-h100-014 reconcile: cooldown of {config.cooldown}s over, powered down to idle~"
    ]
    assert scontrol.read_text().splitlines()[-1] == (
        "update NodeName=aws-h100-014 State=POWER_DOWN_FORCE"
    )

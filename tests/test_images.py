"""Elastic cloud pools' images (provision/providers/cloud/images.py, builders.py): what makes a
pool's image stale, the AWS builder against moto (tests/fakeec2.py: the real boto3, EC2's API
answered by moto) from the pool's launch template to the captured image, the inventory that
makes the builder an image, the stack's templates starting the image, and the verb's refusals.

The builder's converge itself (the roles over SSH) cannot reach a moto instance: it is the same
Ansible run apply makes, with the builder as one more host (the lab pool's image is made so,
live, in tests/integration/test_burst.py)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provision.burst.config import TAG_CLUSTER, TAG_POOL, cloud_template
from provision.cluster import Cluster
from provision.errors import OperationError
from provision.providers.cloud import images
from provision.render import render, write_render
from provision.state import State

from .conftest import ROOT, load_any
from .conftest import run_provision as provision
from .fakeec2 import FakeEC2

pytest.importorskip("boto3")
pytest.importorskip("moto")

SPEC = ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml"
POOL = "awsh100"
# moto's own stock images: Canonical's account, an older name than the stack's pattern
STOCK = ("099720109477", "ubuntu/images/hvm-ssd/ubuntu-*")
# the public subnet where the private pool's builder starts (the stack's builder_subnets output)
PUBLIC: dict[str, str] = {}


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return Cluster(load_any(SPEC))


@pytest.fixture
def state(tmp_path: Path, cluster: Cluster) -> State:
    state = State(tmp_path, cluster.spec.name)
    state.ensure()
    write_render(render(cluster), state.build)
    return state


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeEC2]:
    with FakeEC2() as ec2:
        yield ec2


@pytest.fixture
def ec2(fake: FakeEC2, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto's EC2 with the pool's launch template (made again each test), and nothing left
    running after it."""
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    client = fake.client()
    name = cloud_template("burst", POOL)
    for t in client.describe_launch_templates()["LaunchTemplates"]:
        client.delete_launch_template(LaunchTemplateId=t["LaunchTemplateId"])
    private = fake.launch_template(name, "p5.48xlarge", cards=32)
    # the zone's public subnet, where the stack has this private pool's builder start
    vpc = client.describe_subnets(SubnetIds=[private])["Subnets"][0]["VpcId"]
    PUBLIC[POOL] = client.create_subnet(VpcId=vpc, CidrBlock="10.20.0.0/20")["Subnet"]["SubnetId"]
    fake.calls.clear()
    fake.requests.clear()
    fake.fail.clear()
    yield client
    fake.fail.clear()
    live = [
        i["InstanceId"]
        for r in client.describe_instances()["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] not in ("terminated", "shutting-down")
    ]
    if live:
        client.terminate_instances(InstanceIds=live)


def _builder(cluster: Cluster, ec2: Any) -> Any:
    from provision.providers.cloud.builders import AwsBuilder

    return AwsBuilder(cluster, ec2=ec2, stock=STOCK, subnets=PUBLIC)


def _start(
    cluster: Cluster, state: State, ec2: Any, refreshed: list[int], pools: Any = None
) -> Any:
    reached: list[tuple[str, str]] = []
    builds = images.cloud_builds(
        cluster,
        state,
        _builder(cluster, ec2),
        lambda _: None,
        lambda: refreshed.append(1),
        pools,
        wait_ssh=lambda address, user: reached.append((address, user)),
    )
    assert builds is not None
    assert [a for a, _ in reached] == [launched.address for launched, _ in builds.launched]
    assert {u for _, u in reached} == {"ubuntu"}  # the image's login user
    return builds


def _builder_host(address: str, cloud: str) -> dict[str, Any]:
    """A remote pool's builder as the run's host: the pool's first node at the builder's
    address, made an image: no munge key, slurmd left to the join, no mounts."""
    return {
        "ansible_host": address,
        "burst_image_builder": True,
        "burst_image_cloud": cloud,
        "burst_image_remote": True,
        "munge_key_install": False,
        "slurm_start_daemons": False,
        "mounts_filesystems": [],
    }


def _live(ec2: Any) -> list[dict[str, Any]]:
    return [
        i
        for r in ec2.describe_instances()["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] not in ("terminated", "shutting-down")
    ]


def test_a_pools_image_goes_stale_with_its_own_inputs_only(cluster: Cluster) -> None:
    files = render(cluster)
    (view,) = [v for v in cluster.pools if v.name == POOL]
    source = images.source_image("aws", cluster.spec.os)
    digest = images.pool_digest(files, view, source)
    assert images.pool_digest(dict(files), view, source) == digest  # the same inputs

    def changed(rel: str, text: str) -> str:
        return images.pool_digest({**files, rel: files[rel] + text}, view, source)

    # another pool's files, the heads' hosts file and Slurm's files (not in the image) leave it
    for rel in ("files/nccl/gcph100.conf", "files/nftables/head.nft", "files/hosts"):
        assert changed(rel, "# other\n") == digest, rel
    assert changed("files/slurm/slurm.conf", "# other\n") == digest
    # what the builder is given changes it: the address sets, its own rules, NCCL's settings,
    # the cluster's variables, its pool's group in the inventory
    for rel in (
        "files/nftables/address-sets.nft",
        f"files/nftables/{POOL}.nft",
        f"files/nccl/{POOL}.conf",
        "inventory/group_vars/all.yml",
    ):
        assert changed(rel, "# new\n") != digest, rel
    inventory = files["inventory/hosts.yml"]
    grown = inventory.replace(
        f'provision_pool: !unsafe "{POOL}"', f'provision_pool: !unsafe "{POOL}"\n        new: 1'
    )
    assert grown != inventory
    assert images.pool_digest({**files, "inventory/hosts.yml": grown}, view, source) != digest
    # another stock image
    assert images.pool_digest(files, view, "aws:other/*") != digest


def test_plan_says_which_images_would_be_built_and_how_long(cluster: Cluster, state: State) -> None:
    files = render(cluster)
    (line,) = images.plan_lines(cluster, "aws", files, state)
    assert line == (
        "aws pool awsh100: image would be built (no image yet; about 40 min: a builder "
        "instance, the compute roles, the capture)"
    )
    (want,) = images.wanted(cluster, "aws", files, state)
    record = images.ImageRecord(POOL, "aws", "ami-0abc", want.digest, "ami-1", "now", 1500.0)
    images.save_record(state, record)
    assert images.plan_lines(cluster, "aws", files, state) == [
        "aws pool awsh100: image ami-0abc is current"
    ]
    assert images.wanted(cluster, "aws", files, state) == []
    # asked for by name: made again whatever it is
    assert [w.why for w in images.wanted(cluster, "aws", files, state, [POOL])] == ["asked for"]
    images.save_record(state, record.__class__(**{**record.__dict__, "digest": "old"}))
    (line,) = images.plan_lines(cluster, "aws", files, state)
    assert "its inputs changed; about 25 min" in line  # the last build's time


def test_an_aws_pools_image_from_its_template_to_the_stack(
    cluster: Cluster, state: State, ec2: Any, fake: FakeEC2
) -> None:
    """The builder is the pool's template (type, network) started from the stock image with a
    user data that runs no join; its inventory makes it the pool's first node without a munge
    key and with slurmd left to the join; finish stops it, captures the image with the cluster's
    tags and the digest, keeps the record, runs the stack again, and removes the builder."""
    refreshed: list[int] = []
    builds = _start(cluster, state, ec2, refreshed)
    ((launched, want),) = builds.launched
    (instance,) = _live(ec2)
    assert instance["InstanceId"] == launched.instance
    assert instance["InstanceType"] == "p5.48xlarge"
    # a private pool's builder: the template's interfaces, one per network card, each moved to
    # the zone's public subnet (the pool's nodes start in the private one)
    (asked,) = fake.requests["RunInstances"]
    nics = [
        {k.split(".", 2)[2]: v for k, v in asked.items() if k.startswith(f"NetworkInterface.{i}.")}
        for i in range(1, 33)
    ]
    assert [n["NetworkCardIndex"] for n in nics] == [str(card) for card in range(32)]
    assert [n["InterfaceType"] for n in nics] == ["efa"] + ["efa-only"] * 31
    assert {n["SubnetId"] for n in nics} == {PUBLIC[POOL]}
    assert "NetworkInterface.33.DeviceIndex" not in asked
    stock = [
        i["ImageId"]
        for i in ec2.describe_images(Owners=[STOCK[0]])["Images"]
        if i["Name"].startswith("ubuntu/images/hvm-ssd/ubuntu-")
    ]
    assert instance["ImageId"] in stock and launched.source == instance["ImageId"]
    data = ec2.describe_instance_attribute(InstanceId=launched.instance, Attribute="userData")
    assert base64.b64decode(data["UserData"]["Value"]).decode() == images.BUILDER_USER_DATA
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert tags[TAG_CLUSTER] == "burst" and tags[TAG_POOL] == POOL
    assert tags[images.TAG_BUILDER] == POOL
    assert builds.hosts == ["aws-h100-001"]  # the pool's first node: its groups and variables
    inventory = json.loads(builds.inventory.read_text())["all"]["hosts"]
    assert inventory == {"aws-h100-001": _builder_host(launched.address, "aws")}

    builds.finish(state, ok=True)
    record = images.records(state)[POOL]
    assert (record.cloud, record.digest, record.source) == ("aws", want.digest, launched.source)
    (image,) = ec2.describe_images(ImageIds=[record.image])["Images"]
    assert image["Name"].startswith(f"burst-{POOL}-{want.digest}-20")  # and the build's time
    tags = {t["Key"]: t["Value"] for t in image["Tags"]}
    assert tags == {TAG_CLUSTER: "burst", TAG_POOL: POOL, images.TAG_INPUTS: want.digest}
    snapshots = [m["Ebs"]["SnapshotId"] for m in image["BlockDeviceMappings"]]
    for snapshot in ec2.describe_snapshots(SnapshotIds=snapshots)["Snapshots"]:
        assert {t["Key"]: t["Value"] for t in snapshot["Tags"]}[TAG_POOL] == POOL
    assert fake.calls["StopInstances"] == 1  # stopped before the capture
    assert refreshed == [1]
    assert _live(ec2) == []
    assert not builds.inventory.exists()
    # the stack's program now starts the image (the Pulumi side: tests/test_cloud.py)
    from provision.providers.cloud import _images

    assert _images(state, "aws") == {POOL: record.image}
    assert images.wanted(cluster, "aws", images.read_render(state.build), state) == []

    # made again (asked for: it is current): the new image is kept, the old one and its
    # snapshots go
    builds = _start(cluster, state, ec2, refreshed, [POOL])
    builds.finish(state, ok=True)
    newer = images.records(state)[POOL].image
    assert newer != record.image
    mine = ec2.describe_images(Owners=["self"])["Images"]
    assert [i["ImageId"] for i in mine if i["Name"].startswith("burst-")] == [newer]
    assert (
        ec2.describe_snapshots(Filters=[{"Name": "snapshot-id", "Values": snapshots}])["Snapshots"]
        == []
    )


def test_destroy_removes_the_pools_images_and_their_records(
    cluster: Cluster, state: State, ec2: Any
) -> None:
    """The images are not the stack's: destroy removes them (and their snapshots) itself."""
    builds = _start(cluster, state, ec2, [])
    builds.finish(state, ok=True)
    made = images.records(state)[POOL].image
    other = images.ImageRecord("gcph100", "gcp", "img", "d", "s", "now", 1.0)
    images.save_record(state, other)
    removed = images.remove_images(cluster, state, _builder(cluster, ec2))
    assert removed == [made]
    assert [i for i in ec2.describe_images(Owners=["self"])["Images"] if i["ImageId"] == made] == []
    assert images.records(state) == {"gcph100": other}  # another cloud's record stays


def test_a_failed_converge_captures_nothing_and_removes_the_builder(
    cluster: Cluster, state: State, ec2: Any, fake: FakeEC2
) -> None:
    refreshed: list[int] = []
    builds = _start(cluster, state, ec2, refreshed)
    builds.finish(state, ok=False)
    assert images.records(state) == {}
    assert fake.calls["CreateImage"] == 0 and refreshed == []
    assert _live(ec2) == []


def test_a_builder_ec2_cannot_start_leaves_nothing(
    cluster: Cluster, state: State, ec2: Any, fake: FakeEC2
) -> None:
    fake.fail["RunInstances"] = (
        "InsufficientInstanceCapacity",
        "We currently do not have sufficient p5.48xlarge capacity.",
    )
    with pytest.raises(OperationError, match=r"aws: run_instances: .*InsufficientInstanceCapacity"):
        _start(cluster, state, ec2, [])
    fake.fail.clear()
    # it started but never answered SSH: removed
    with pytest.raises(OperationError, match="no SSH"):

        def no_ssh(address: str, user: str) -> None:
            raise OperationError(f"images: no SSH at {address}")

        images.cloud_builds(
            cluster, state, _builder(cluster, ec2), lambda _: None, lambda: None, wait_ssh=no_ssh
        )
    assert _live(ec2) == []
    assert not list((state.build / "inventory").glob("*image-hosts*"))


def test_a_builder_without_a_public_address_gets_an_elastic_ip(
    cluster: Cluster, state: State, ec2: Any
) -> None:
    """A type of several network cards gets no public address from EC2: the builder is reached
    at an Elastic IP on its primary interface, released with it."""
    from provision.providers.cloud.builders import AwsBuilder

    class NoPublic:  # EC2 as it answers for a multi-card type
        def __init__(self, real: Any) -> None:
            self.real = real

        def __getattr__(self, name: str) -> Any:
            method = getattr(self.real, name)
            if name != "describe_instances":
                return method

            def strip(**kwargs: Any) -> Any:
                answer = method(**kwargs)
                for r in answer["Reservations"]:
                    for i in r["Instances"]:
                        i.pop("PublicIpAddress", None)
                return answer

            return strip

    builder = AwsBuilder(cluster, ec2=NoPublic(ec2), stock=STOCK, subnets=PUBLIC)
    builds = images.cloud_builds(
        cluster, state, builder, lambda _: None, lambda: None, wait_ssh=lambda a, u: None
    )
    assert builds is not None
    ((launched, _),) = builds.launched
    (address,) = ec2.describe_addresses(AllocationIds=[launched.extra["allocation"]])["Addresses"]
    assert address["PublicIp"] == launched.address
    (instance,) = _live(ec2)
    primary = [
        n["NetworkInterfaceId"]
        for n in instance["NetworkInterfaces"]
        if n["Attachment"]["DeviceIndex"] == 0
    ]
    assert address["NetworkInterfaceId"] in primary
    builds.finish(state, ok=False)
    assert ec2.describe_addresses()["Addresses"] == []


def test_the_stack_starts_a_pools_own_image_once_made() -> None:
    pulumi = pytest.importorskip("pulumi")
    from provision.providers.cloud import component

    from .test_cloud import Recorder

    recorder = Recorder()
    pulumi.runtime.set_mocks(recorder, preview=False)
    cluster = Cluster(load_any(SPEC))
    made = {POOL: "ami-0baked", GCP_POOL: "projects/p/global/images/burst-gcph100-0baked"}

    @pulumi.runtime.test  # type: ignore[misc]
    def program() -> Any:
        built = {
            k: component(k, cluster, "ssh-ed25519 AAAA test", images=made) for k in ("aws", "gcp")
        }
        return pulumi.Output.all(*(m.templates for m in built.values()))

    program()
    (template,) = [t for t in recorder.of("LaunchTemplate") if t.name == "burst-awsh100-lt"]
    assert template.inputs["imageId"] == "ami-0baked"
    (gcp,) = recorder.of("compute/instanceTemplate:InstanceTemplate")
    assert gcp.inputs["disks"][0]["sourceImage"] == made[GCP_POOL]


def test_the_verb_says_what_it_cannot_build(tmp_path: Path) -> None:
    lab = provision("image", "build", "-f", str(ROOT / "examples" / "lab.yaml"),
                    "--state-dir", str(tmp_path))  # fmt: skip
    assert lab.returncode == 2
    assert "has no elastic pool: no image to build" in lab.stderr
    burst = ROOT / "examples" / "lab-burst.yaml"
    other = provision("image", "build", "nosuch", "-f", str(burst), "--state-dir", str(tmp_path))
    assert other.returncode == 2
    assert "'nosuch' is no elastic pool of cluster 'labburst' (they are: burst)" in other.stderr
    first = provision("image", "build", "-f", str(burst), "--state-dir", str(tmp_path))
    assert first.returncode == 2
    assert "has no render" in first.stderr and "run apply first" in first.stderr
    assert "Traceback" not in first.stderr + other.stderr + lab.stderr
    # a cloud pool's: rendered, but no Pulumi CLI here (the stack runs again after the capture):
    # one line before any builder is launched
    cloud = ROOT / "tests" / "data" / "cloud" / "aws-burst.yaml"
    assert provision("render", str(cloud), "--state-dir", str(tmp_path)).returncode == 0
    done = provision("image", "build", "-f", str(cloud), "--state-dir", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith("error: the aws pools need the Pulumi CLI"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_an_elastic_aws_pool_of_one_network_card_is_accepted(tmp_path: Path) -> None:
    """What the spec takes now: an elastic AWS pool whose type has one network card (its nodes
    get a public address, their way out); plan says its image is to be made and how the heads
    burst; its builder starts where its nodes do (the template's own interface). Azure's
    elastic pools stay refused (tests/data/bad_specs/67-)."""
    spec = ROOT / "tests" / "data" / "cloud" / "aws-burst.yaml"
    done = provision("plan", str(spec), "--state-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "aws pool awsl40s: image would be built (no image yet; about 40 min" in text
    assert "aws: the heads burst as the IAM user awsburst-burst" in text
    # its stack, under the mocks and the cloud's rules (tests/cloud_rules.py)
    pytest.importorskip("pulumi")
    from .test_cloud import build

    rec, _, _ = build(spec)
    (template,) = rec.of("LaunchTemplate")
    assert template.inputs["instanceType"] == "g6e.12xlarge"
    assert template.inputs["userData"] and template.inputs["iamInstanceProfile"]
    assert [u.inputs["name"] for u in rec.of("iam/user:User")] == ["awsburst-burst"]
    from provision.providers.cloud.builders import AwsBuilder

    builder = AwsBuilder(Cluster(load_any(spec)), ec2=object(), subnets={})
    assert builder._public_interfaces("awsl40s", "awsburst-awsl40s") == {}


def test_a_spot_pool_launches_one_time_spot_instances(tmp_path: Path) -> None:
    """capacity: spot: the pool's launch template asks EC2's spot market for one-time
    instances that end when reclaimed (a resume makes anew), its placement group kept; EC2's
    rule that only a persistent request may stop or hibernate holds (tests/cloud_rules.py);
    plan prices it as spot, at most the on-demand list price."""
    pytest.importorskip("pulumi")
    from . import cloud_rules
    from .test_cloud import build

    text = (ROOT / "tests" / "data" / "cloud" / "aws-burst.yaml").read_text()
    spec = tmp_path / "spot.yaml"
    # a price of the test's own (the site's profile names none)
    price = "    max_power_w: 2400\n    price: {usd_per_hour: 10.0, region: us-east-1, "
    price += "as_of: 2026-12-01, source: this test}\n"
    text = text.replace("    max_power_w: 2400\n", price)
    spec.write_text(text.replace("    elastic: true\n", "    elastic: true\n    capacity: spot\n"))
    rec, _, _ = build(spec)
    (template,) = rec.of("LaunchTemplate")
    assert template.inputs["instanceMarketOptions"] == {
        "marketType": "spot",
        "spotOptions": {
            "spotInstanceType": "one-time",
            "instanceInterruptionBehavior": "terminate",
        },
    }
    assert template.inputs["placement"]["groupName"] == "awsburst-awsl40s-pg"
    stopping = {
        **template.inputs,
        "instanceMarketOptions": {
            "marketType": "spot",
            "spotOptions": {"spotInstanceType": "one-time", "instanceInterruptionBehavior": "stop"},
        },
    }
    assert cloud_rules.refusals("aws:ec2/launchTemplate:LaunchTemplate", "t", stopping)
    done = provision("plan", str(spec), "--state-dir", str(tmp_path / "state"), "--json")
    assert done.returncode == 0, done.stderr
    (cost,) = json.loads(done.stdout)["cost_usd_per_hour"]
    assert cost["spot"] is True and cost["elastic"] is True
    assert cost["usd_per_hour"] == 80.0  # 8 nodes, at most the on-demand price
    shown = provision("plan", str(spec), "--state-dir", str(tmp_path / "state"))
    assert "spot: the market's price, at most" in " ".join(shown.stdout.split())


def _starter(cluster: Cluster, state: State, builder: Any, refreshed: list[int]) -> Any:
    """builds(pools): the cloud's builds started (the stack's refresh counted in refreshed),
    each builder waited for at its address as the spec's login user."""

    def start(pools: list[str] | None) -> Any:
        reached: list[tuple[str, str]] = []
        builds = images.cloud_builds(
            cluster,
            state,
            builder,
            lambda _: None,
            lambda: refreshed.append(1),
            pools,
            wait_ssh=lambda address, user: reached.append((address, user)),
        )
        assert builds is not None
        assert reached == [(builds.launched[0][0].address, "ubuntu")]
        return builds

    return start


# --- GCP: the builder against Compute Engine at the HTTP layer (tests/fakegcp.py) ---------------

GCP_POOL = "gcph100"


def test_a_gcp_pools_image_from_its_template_to_the_stack(cluster: Cluster, state: State) -> None:
    """The builder is made from the pool's instance template, its boot disk from the OS
    family's newest image (the template's disk type, zonal as an instance names it), the
    template's ssh-keys kept and a user data that runs no join; it is reached at its external
    address; finish stops it, makes the image from its boot disk with the cluster's labels and
    the digest, keeps the record, runs the stack again and deletes the builder. Made again, the
    old image goes; destroy's removal takes the rest."""
    from provision.burst import rest
    from provision.providers.cloud.builders import GcpBuilder

    from .fakegcp import PROJECT, TOKEN, FakeGCE

    template = cloud_template("burst", GCP_POOL)
    labels = {TAG_CLUSTER: "burst", TAG_POOL: GCP_POOL}
    family = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
    with FakeGCE({template: labels}) as gce:
        gce.template_properties[template] = {
            "machineType": "a3-highgpu-8g",
            "disks": [
                {
                    "boot": True,
                    "autoDelete": True,
                    "initializeParams": {
                        "sourceImage": family,
                        "diskSizeGb": "200",
                        "diskType": "pd-ssd",
                    },
                }
            ],
            "metadata": {
                "items": [
                    {"key": "ssh-keys", "value": "ubuntu:ssh-ed25519 AAAA builder"},
                    {"key": "user-data", "value": "#cloud-config\n# the pool's join\n"},
                ]
            },
            "labels": labels,
        }

        def call(method: str, url: str, body: object = None) -> Any:
            return rest.call(method, url, body, headers={"Authorization": f"Bearer {TOKEN}"})

        builder = GcpBuilder(cluster, call=call, project=PROJECT, base=f"{gce.url}/compute/v1")
        refreshed: list[int] = []

        start = _starter(cluster, state, builder, refreshed)

        builds = start(None)  # no image yet: only the GCP pool of this cloud
        ((launched, want),) = builds.launched
        assert want.view.name == GCP_POOL
        (body,) = gce.inserted
        (disk,) = body["disks"]
        assert disk["initializeParams"]["sourceImage"] == (
            "projects/ubuntu-os-cloud/global/images/ubuntu-2204-lts-v20261201"
        )
        assert disk["initializeParams"]["diskType"] == (
            f"projects/{PROJECT}/zones/us-central1-a/diskTypes/pd-ssd"
        )
        assert body["metadata"]["items"] == [
            {"key": "ssh-keys", "value": "ubuntu:ssh-ed25519 AAAA builder"},
            {"key": "user-data", "value": images.BUILDER_USER_DATA},
        ]
        assert body["labels"][images.TAG_BUILDER] == GCP_POOL
        (insert,) = [
            p
            for m, p, _ in gce.requests
            if m == "POST"
            and p.endswith(
                "sourceInstanceTemplate="
                + f"projects/{PROJECT}/global/instanceTemplates/{template}"
            )
        ]
        assert "/zones/us-central1-a/instances?" in insert
        assert launched.address.startswith("198.51.100.")
        assert json.loads(builds.inventory.read_text())["all"]["hosts"] == {
            "gcp-h100-001": _builder_host(launched.address, "gcp")
        }

        builds.finish(state, ok=True)
        record = images.records(state)[GCP_POOL]
        (name,) = gce.images
        assert name.startswith(f"burst-{GCP_POOL}-{want.digest}-20")  # and the build's time
        assert record.image == f"projects/{PROJECT}/global/images/{name}"
        assert (record.cloud, record.source) == ("gcp", launched.source)
        assert gce.images[name]["labels"] == {**labels, images.TAG_INPUTS: want.digest}
        assert gce.images[name]["sourceDisk"].endswith(f"/disks/{launched.instance}")
        assert gce.instances == {} and refreshed == [1]  # the builder deleted, the stack again
        assert not builds.inventory.exists()
        assert images.wanted(cluster, "gcp", images.read_render(state.build), state) == []

        again = start([GCP_POOL])
        again.finish(state, ok=True)
        newer = images.records(state)[GCP_POOL].image
        assert [f"projects/{PROJECT}/global/images/{n}" for n in gce.images] == [newer]

        failed = start([GCP_POOL])  # a failed converge: nothing captured, the builder gone
        failed.finish(state, ok=False)
        assert gce.instances == {} and images.records(state)[GCP_POOL].image == newer

        assert images.remove_images(cluster, state, builder) == [newer]
        assert gce.images == {} and GCP_POOL not in images.records(state)


def test_an_elastic_gcp_pool_is_accepted(tmp_path: Path) -> None:
    """The hybrid example's GCP H100 pool: plan says its image is to be made and which account
    the heads burst as; its stack carries the heads' account and key (tests/test_cloud.py)."""
    spec = ROOT / "examples" / "hybrid-burst.yaml"
    done = provision("plan", str(spec), "--state-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "gcp pool gcph100: image would be built (no image yet; about 40 min" in text
    assert "gcp: the heads burst as the service account hybridburst-burst-heads" in text
    assert "gcp pool gcph100: burst nodes join by themselves" in text


def test_a_gcp_spot_pool_makes_spot_vms_deleted_when_taken_back(tmp_path: Path) -> None:
    """capacity: spot on a GCP pool: its instance template makes Spot VMs that Compute Engine
    deletes when it takes them back (a resume makes anew), under its rules for their
    scheduling (tests/cloud_rules.py); the reconciler says a preempted node so
    (tests/test_burst_gcp.py)."""
    pytest.importorskip("pulumi")
    from . import cloud_rules
    from .test_cloud import build

    text = (ROOT / "examples" / "hybrid-burst.yaml").read_text()
    spec = tmp_path / "gcp-spot.yaml"
    old = "    zone: us-central1-a\n    count: 8\n    elastic: true\n"
    assert old in text
    spec.write_text(text.replace(old, old + "    capacity: spot\n"))
    rec, _, _ = build(spec)
    (template,) = rec.of("compute/instanceTemplate:InstanceTemplate")
    assert template.inputs["scheduling"] == {
        "provisioningModel": "SPOT",
        "preemptible": True,
        "instanceTerminationAction": "DELETE",
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
    }
    restarting = {**template.inputs["scheduling"], "automaticRestart": True}
    bad = {**template.inputs, "scheduling": restarting}
    assert cloud_rules.refusals("gcp:compute/instanceTemplate:InstanceTemplate", "t", bad)
    done = provision("plan", str(spec), "--state-dir", str(tmp_path / "state"), "--json")
    assert done.returncode == 0, done.stderr
    (cost,) = [c for c in json.loads(done.stdout)["cost_usd_per_hour"] if c["pool"] == "gcph100"]
    assert cost["spot"] is True


# --- Azure: the builder against Resource Manager at the HTTP layer (tests/fakeazure.py) --------

AZ_POOL = "azh100"


def test_an_azure_pools_image_from_its_scale_set_to_the_stack(
    cluster: Cluster, state: State
) -> None:
    """The builder is made in the pool's resource group from its scale set's VM profile with
    the OS's stock image, a user data that runs no join, a public address deleted with it, no
    node identity and no Spot priority; it is reached at that address; finish deallocates and
    generalizes it, makes a managed image of it with the cluster's tags and the digest, keeps
    the record, runs the stack again and deletes the builder with its address. Made again, the
    old image goes; destroy's removal takes the rest."""
    from provision.burst import rest
    from provision.burst.config import cloud_group
    from provision.providers.cloud.builders import AzureBuilder

    from .fakeazure import SUBSCRIPTION, TOKEN, FakeARM, scale_set

    group = cloud_group("burst")
    template = cloud_template("burst", AZ_POOL)
    subnet = (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/providers/"
        "Microsoft.Network/virtualNetworks/burst-vnet/subnets/burst-subnet"
    )
    made = scale_set(group, template, subnet, f"{template}-nsg", "ppg")
    made["tags"] = {TAG_CLUSTER: "burst", TAG_POOL: AZ_POOL}
    profile = made["properties"]["virtualMachineProfile"]
    profile.update(
        {"priority": "Spot", "evictionPolicy": "Delete", "billingProfile": {"maxPrice": -1}}
    )
    with FakeARM(group, {template: made}) as arm:

        def call(method: str, url: str, body: object = None) -> Any:
            return rest.call(method, url, body, headers={"Authorization": f"Bearer {TOKEN}"})

        builder = AzureBuilder(
            cluster, call=call, subscription=SUBSCRIPTION, base=arm.url, poll_s=0.01
        )
        refreshed: list[int] = []

        start = _starter(cluster, state, builder, refreshed)

        builds = start(None)  # no image yet: only the Azure pool of this cloud
        ((launched, want),) = builds.launched
        assert want.view.name == AZ_POOL
        (body,) = [b for m, p, b in arm.requests if m == "PUT" and "/virtualMachines/" in p]
        props = body["properties"]
        assert props["storageProfile"]["imageReference"] == {
            "publisher": "Canonical",
            "offer": "0001-com-ubuntu-server-jammy",
            "sku": "22_04-lts-gen2",
            "version": "latest",
        }
        assert base64.b64decode(props["userData"]).decode() == images.BUILDER_USER_DATA
        assert "identity" not in body and "priority" not in props
        assert body["tags"][images.TAG_BUILDER] == AZ_POOL
        ip = props["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
        public = ip["ipConfigurations"][0]["properties"]["publicIPAddressConfiguration"]
        assert public["properties"]["deleteOption"] == "Delete"
        assert launched.address.startswith("203.0.113.")
        assert json.loads(builds.inventory.read_text())["all"]["hosts"] == {
            "az-h100-001": _builder_host(launched.address, "azure")
        }

        builds.finish(state, ok=True)
        record = images.records(state)[AZ_POOL]
        (name,) = arm.images
        assert name.startswith(f"burst-{AZ_POOL}-{want.digest}-20")
        assert record.image == (
            f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/providers/"
            f"Microsoft.Compute/images/{name}"
        )
        assert arm.images[name]["tags"] == {
            TAG_CLUSTER: "burst",
            TAG_POOL: AZ_POOL,
            images.TAG_INPUTS: want.digest,
        }
        source = arm.images[name]["properties"]["sourceVirtualMachine"]["id"]
        assert source.endswith(f"/virtualMachines/{launched.instance}")
        posts = [p.split("?")[0].rpartition("/")[2] for m, p, _ in arm.requests if m == "POST"]
        assert posts == ["deallocate", "generalize"]
        # the builder deleted with its NIC and address, the stack again
        assert arm.vms == {} and arm.nics == {} and arm.addresses == {} and refreshed == [1]
        assert images.wanted(cluster, "azure", images.read_render(state.build), state) == []

        again = start([AZ_POOL])
        again.finish(state, ok=True)
        newer = images.records(state)[AZ_POOL].image
        assert [i["id"] for i in arm.images.values()] == [newer]

        failed = start([AZ_POOL])  # a failed converge: nothing captured, the builder gone
        failed.finish(state, ok=False)
        assert arm.vms == {} and images.records(state)[AZ_POOL].image == newer

        assert images.remove_images(cluster, state, builder) == [newer]
        assert arm.images == {} and AZ_POOL not in images.records(state)

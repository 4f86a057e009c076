"""Each cloud's part of a pool image's build (images.py): a builder instance from the pool's
template booted from the OS's stock image, its capture, its removal, and the pool's older images
removed once the stack starts the new one.

AWS through boto3 with the workstation's credentials (the same chain as the stack's), as EC2's
documentation has an AMI made from an instance: the instance stopped first (a consistent root
volume), CreateImage with the image's and its snapshot's tags, the image waited for until
`available`. The builder is the pool's own instance type from the pool's launch template (its
subnet, security group, placement and encrypted root volume), with the stock image and a user
data that runs nothing of the join in place of the template's; a type of several network cards
gets no public address from EC2, so the builder gets an Elastic IP on its primary interface, as
the lasting nodes of such a type do. Such a pool's nodes live in a private subnet (aws.py): its
builder is started with the template's interfaces moved to the zone's public subnet.
"""

from __future__ import annotations

import contextlib
from typing import Any

from provision.burst.backend import one_line
from provision.burst.config import cloud_template
from provision.cluster import Cluster, PoolView
from provision.errors import OperationError
from provision.providers.cloud.images import BUILDER_USER_DATA, Launched

# EC2's waiters: seconds between looks, and how many (an image of a 200 GB disk takes minutes)
_WAIT = {
    "instance_running": (5, 120),
    "instance_stopped": (5, 180),
    "image_available": (15, 240),
    "instance_terminated": (5, 120),
}


class AwsBuilder:
    cloud = "aws"

    def __init__(
        self,
        cluster: Cluster,
        ec2: Any = None,
        stock: tuple[str, str] | None = None,
        subnets: dict[str, str] | None = None,
    ) -> None:
        """subnets: a private pool's -> the public subnet its builder starts in (the stack's
        builder_subnets output)."""
        from provision.providers.cloud.layout import IMAGES

        self.cluster = cluster
        self.subnets = subnets or {}
        self.region = next(
            (v.pool.region for v in cluster.pools if v.pool.provider == "aws" and v.pool.region),
            None,
        )
        if ec2 is None:
            import boto3

            ec2 = boto3.session.Session(region_name=self.region).client("ec2")
        self.ec2 = ec2
        owner, pattern = stock or IMAGES[cluster.spec.os]["aws"]
        self.owner, self.pattern = owner, pattern

    def _call(self, method: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.ec2, method)(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise OperationError(f"aws: {method}: {one_line(exc)}") from None

    def _wait(self, name: str, **kwargs: Any) -> None:
        from botocore.exceptions import WaiterError

        delay, attempts = _WAIT[name]
        try:
            self.ec2.get_waiter(name).wait(
                **kwargs, WaiterConfig={"Delay": delay, "MaxAttempts": attempts}
            )
        except WaiterError as exc:
            raise OperationError(
                f"aws: waiting for {name.replace('_', ' ')}: {one_line(exc)}"
            ) from None

    def stock_image(self) -> str:
        """The newest available image of the OS's publisher matching the stack's pattern."""
        found = self._call(
            "describe_images",
            Owners=[self.owner],
            Filters=[
                {"Name": "name", "Values": [self.pattern]},
                {"Name": "state", "Values": ["available"]},
            ],
        )["Images"]
        if not found:
            raise OperationError(
                f"aws: no image {self.pattern} of owner {self.owner} in {self.region}"
            )
        return str(max(found, key=lambda i: i.get("CreationDate", ""))["ImageId"])

    def launch(self, view: PoolView, name: str, tags: dict[str, str]) -> Launched:
        stock = self.stock_image()
        pairs = [{"Key": "Name", "Value": name}] + [
            {"Key": k, "Value": v} for k, v in sorted(tags.items())
        ]
        template = cloud_template(self.cluster.spec.name, view.name)
        made = self._call(
            "run_instances",
            LaunchTemplate={"LaunchTemplateName": template, "Version": "$Latest"},
            **self._public_interfaces(view.name, template),
            ImageId=stock,
            UserData=BUILDER_USER_DATA,
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": pairs}],
        )["Instances"][0]
        launched = Launched(view.name, view.nodes[0].name, made["InstanceId"], "", stock)
        try:
            self._wait("instance_running", InstanceIds=[launched.instance])
            instance = self._instance(launched.instance)
            launched.address = instance.get("PublicIpAddress", "")
            if not launched.address:  # several network cards: EC2 gives the instance none
                self._elastic_ip(launched, instance, pairs)
        except BaseException:
            self.remove(launched)  # nothing half-made stays
            raise
        return launched

    def _public_interfaces(self, pool: str, template: str) -> dict[str, Any]:
        """A private pool's builder: the template's interfaces (every network card, as its
        nodes have them), each in the zone's public subnet, where the workstation reaches the
        builder at an Elastic IP; RunInstances' interfaces replace the template's. Nothing for
        the other pools."""
        from provision.providers.cloud.layout import layout

        shape = layout(self.cluster, "aws", "")
        if not any(p.private for p in shape.pools if p.name == pool):
            return {}
        subnet = self.subnets.get(pool)
        if not subnet:
            raise OperationError(
                f"aws: the stack names no public subnet for pool {pool}'s builder (a stack "
                "made before private pools): run apply, then build again"
            )
        (version,) = self._call(
            "describe_launch_template_versions",
            LaunchTemplateName=template,
            Versions=["$Latest"],
        )["LaunchTemplateVersions"]
        kept = ("DeviceIndex", "NetworkCardIndex", "InterfaceType", "Groups")
        interfaces = [
            {
                **{k: nic[k] for k in kept if k in nic},
                "SubnetId": subnet,
                "DeleteOnTermination": True,
            }
            for nic in version["LaunchTemplateData"].get("NetworkInterfaces", [])
        ]
        return {"NetworkInterfaces": interfaces} if interfaces else {}

    def _instance(self, instance_id: str) -> dict[str, Any]:
        found = self._call("describe_instances", InstanceIds=[instance_id])["Reservations"]
        return dict(found[0]["Instances"][0])

    def _elastic_ip(
        self, launched: Launched, instance: dict[str, Any], tags: list[dict[str, str]]
    ) -> None:
        primary = next(
            (
                n["NetworkInterfaceId"]
                for n in instance.get("NetworkInterfaces", [])
                if n.get("Attachment", {}).get("DeviceIndex", 0) == 0
                and n.get("Attachment", {}).get("NetworkCardIndex", 0) == 0
            ),
            None,
        )
        if primary is None:
            raise OperationError(f"aws: builder {launched.instance} has no primary interface")
        address = self._call(
            "allocate_address",
            Domain="vpc",
            TagSpecifications=[{"ResourceType": "elastic-ip", "Tags": tags}],
        )
        launched.extra["allocation"] = address["AllocationId"]
        self._call(
            "associate_address",
            AllocationId=address["AllocationId"],
            NetworkInterfaceId=primary,
        )
        launched.address = address["PublicIp"]

    def capture(self, launched: Launched, name: str, tags: dict[str, str]) -> str:
        pairs = [{"Key": k, "Value": v} for k, v in sorted(tags.items())]
        self._call("stop_instances", InstanceIds=[launched.instance])
        self._wait("instance_stopped", InstanceIds=[launched.instance])
        image = str(
            self._call(
                "create_image",
                InstanceId=launched.instance,
                Name=name,
                Description=f"pool {launched.pool} of cluster {self.cluster.spec.name}",
                TagSpecifications=[{"ResourceType": "image", "Tags": pairs}],
            )["ImageId"]
        )
        self._wait("image_available", ImageIds=[image])
        # its snapshots tagged as the image is: the cluster's, found and removed with it
        snapshots = self._snapshots(image)
        if snapshots:
            self._call("create_tags", Resources=snapshots, Tags=pairs)
        return image

    def _snapshots(self, image: str) -> list[str]:
        (found,) = self._call("describe_images", ImageIds=[image])["Images"]
        return [
            str(m["Ebs"]["SnapshotId"])
            for m in found.get("BlockDeviceMappings", [])
            if m.get("Ebs", {}).get("SnapshotId")
        ]

    def remove(self, launched: Launched) -> None:
        self._call("terminate_instances", InstanceIds=[launched.instance])
        allocation = launched.extra.get("allocation")
        if allocation:  # released once its instance is gone (it is associated until then)
            self._wait("instance_terminated", InstanceIds=[launched.instance])
            self._call("release_address", AllocationId=allocation)

    def prune(self, pool: str, tags: dict[str, str], keep: str) -> list[str]:
        """The pool's images other than `keep`, deregistered, and their snapshots deleted."""
        found = self._call(
            "describe_images",
            Owners=["self"],
            Filters=[{"Name": f"tag:{k}", "Values": [v]} for k, v in sorted(tags.items())],
        )["Images"]
        removed = []
        for image in found:
            if image["ImageId"] == keep:
                continue
            self._call("deregister_image", ImageId=image["ImageId"])
            for mapping in image.get("BlockDeviceMappings", []):
                snapshot = mapping.get("Ebs", {}).get("SnapshotId")
                if snapshot:
                    with contextlib.suppress(OperationError):  # shared elsewhere: left
                        self._call("delete_snapshot", SnapshotId=snapshot)
            removed.append(str(image["ImageId"]))
        return removed


# Compute Engine's operations: how long a builder waits for one (an image of a 200 GB disk
# takes minutes; operations/wait answers within about two)
GCP_OPERATION_S = 1200


class GcpBuilder:
    """Compute Engine's part, through its REST API with the workstation's credentials (the
    token of `gcloud auth application-default print-access-token`, as the stack's; the project
    of GOOGLE_PROJECT), as Compute Engine's documentation has a custom image made: the builder
    made from the pool's instance template (`instances.insert` with `sourceInstanceTemplate`;
    the body's disks, metadata and labels take the template's place), its boot disk from the
    OS family's newest image and a user data that runs nothing (the template's `ssh-keys` kept);
    then stopped (a consistent disk), `images.insert` from its boot disk with the cluster's
    labels, and deleted. GCP pools' nodes have an external address: the builder is reached
    there."""

    cloud = "gcp"

    def __init__(
        self,
        cluster: Cluster,
        call: Any = None,
        project: str | None = None,
        base: str | None = None,
    ) -> None:
        import os

        from provision.providers.cloud import ENV_GCP_ENDPOINT, GCE

        self.cluster = cluster
        self.project = (
            project or os.environ.get("GOOGLE_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT")
        )
        if not self.project:
            raise OperationError("gcp: no project for the image builds: set GOOGLE_PROJECT")
        self.base = base or os.environ.get(ENV_GCP_ENDPOINT) or GCE
        self._call_fn = call or self._rest

    def _rest(self, method: str, url: str, body: object = None) -> Any:
        from provision.burst import rest
        from provision.providers.cloud import _cli_output

        token = _cli_output(["gcloud", "auth", "application-default", "print-access-token"])
        if token is None:
            raise OperationError(
                "gcp: no token from `gcloud auth application-default print-access-token`"
            )
        return rest.call(method, url, body, headers={"Authorization": f"Bearer {token}"})

    def _call(self, method: str, path: str, body: object = None) -> Any:
        from provision.burst.backend import BurstError

        url = path if path.startswith("http") else f"{self.base}/{path}"
        try:
            return self._call_fn(method, url, body)
        except (BurstError, OSError) as exc:
            raise OperationError(f"gcp: {method} {path.split('?')[0]}: {one_line(exc)}") from None

    def _zone(self, view_or_pool: str) -> str:
        view = next(v for v in self.cluster.pools if v.name == view_or_pool)
        if not view.pool.zone:
            raise OperationError(f"gcp: pool {view.name} has no zone: set pools[].zone")
        return f"projects/{self.project}/zones/{view.pool.zone}"

    def _wait(self, operation: dict[str, Any], where: str) -> None:
        import time

        deadline = time.monotonic() + GCP_OPERATION_S
        while operation.get("status") != "DONE":
            if time.monotonic() > deadline:
                raise OperationError(f"gcp: operation {operation.get('name')} still running")
            operation = self._call("POST", f"{where}/operations/{operation['name']}/wait")
        errors = (operation.get("error") or {}).get("errors") or []
        if errors:
            text = "; ".join(f"{e.get('code')}: {e.get('message', '')}" for e in errors[:2])
            raise OperationError(f"gcp: {operation.get('operationType', 'operation')}: {text}")

    def stock_image(self) -> str:
        """The newest image of the OS's family (the stack's), as a path the API takes."""
        from provision.providers.cloud.layout import IMAGES

        (family_path,) = IMAGES[self.cluster.spec.os]["gcp"]
        project, _, family = family_path.partition("/")
        found = self._call("GET", f"projects/{project}/global/images/family/{family}")
        return f"projects/{project}/global/images/{found['name']}"

    def launch(self, view: PoolView, name: str, tags: dict[str, str]) -> Launched:
        stock = self.stock_image()
        zone = self._zone(view.name)
        template = cloud_template(self.cluster.spec.name, view.name)
        source = f"projects/{self.project}/global/instanceTemplates/{template}"
        props = self._call("GET", source).get("properties", {})
        disks = []
        for disk in props.get("disks", []):
            disk = {**disk, "initializeParams": dict(disk.get("initializeParams", {}))}
            params = disk["initializeParams"]
            if disk.get("boot"):
                params["sourceImage"] = stock
            kind = params.get("diskType")
            if kind and "/" not in kind:  # a template names the type, an instance its zone's
                params["diskType"] = f"{zone}/diskTypes/{kind}"
            disks.append(disk)
        items = [
            i for i in (props.get("metadata") or {}).get("items", []) if i.get("key") != "user-data"
        ]
        items.append({"key": "user-data", "value": BUILDER_USER_DATA})
        labels = {**props.get("labels", {}), **{k: v.lower() for k, v in tags.items()}}
        body = {"name": name, "disks": disks, "metadata": {"items": items}, "labels": labels}
        self._wait(
            self._call("POST", f"{zone}/instances?sourceInstanceTemplate={source}", body), zone
        )
        launched = Launched(view.name, view.nodes[0].name, name, "", stock)
        try:
            instance = self._call("GET", f"{zone}/instances/{name}")
            configs = (instance.get("networkInterfaces") or [{}])[0].get("accessConfigs") or [{}]
            launched.address = str(configs[0].get("natIP", ""))
            if not launched.address:
                raise OperationError(f"gcp: builder {name} has no external address")
            boot: dict[str, Any] = next((d for d in instance.get("disks", []) if d.get("boot")), {})
            launched.extra["disk"] = str(boot.get("source", f"{zone}/disks/{name}"))
            launched.extra["zone"] = zone
        except BaseException:
            self.remove(launched)  # nothing half-made stays
            raise
        return launched

    def capture(self, launched: Launched, name: str, tags: dict[str, str]) -> str:
        zone = launched.extra.get("zone") or self._zone(launched.pool)
        self._wait(self._call("POST", f"{zone}/instances/{launched.instance}/stop"), zone)
        where = f"projects/{self.project}/global"
        body = {
            "name": name,
            "sourceDisk": launched.extra.get("disk", f"{zone}/disks/{launched.instance}"),
            "description": f"pool {launched.pool} of cluster {self.cluster.spec.name}",
            "labels": {k: v.lower() for k, v in tags.items()},
        }
        self._wait(self._call("POST", f"{where}/images", body), where)
        return f"{where}/images/{name}"

    def remove(self, launched: Launched) -> None:
        zone = launched.extra.get("zone") or self._zone(launched.pool)
        self._call("DELETE", f"{zone}/instances/{launched.instance}")  # its disk goes with it

    def prune(self, pool: str, tags: dict[str, str], keep: str) -> list[str]:
        """The pool's images other than `keep`, deleted."""
        import urllib.parse

        where = f"projects/{self.project}/global"
        labels = " AND ".join(f'labels.{k}="{v.lower()}"' for k, v in sorted(tags.items()))
        removed, token = [], ""
        found: list[dict[str, Any]] = []
        while True:
            query = {"filter": labels, **({"pageToken": token} if token else {})}
            page = self._call("GET", f"{where}/images?{urllib.parse.urlencode(query)}")
            found += page.get("items", [])
            token = page.get("nextPageToken", "")
            if not token:
                break
        for image in found:
            path = f"{where}/images/{image['name']}"
            if path == keep:
                continue
            self._call("DELETE", path)
            removed.append(path)
        return removed


# Resource Manager's long operations: how long a builder waits for one (a VM's provisioning, its
# deallocation, an image of a 200 GB disk), and how often it looks
AZURE_WAIT_S = 1800
AZURE_POLL_S = 10.0
AZURE_COMPUTE_API = "2024-07-01"
AZURE_NETWORK_API = "2024-05-01"


class AzureBuilder:
    """Azure's part, through Resource Manager's REST API with the workstation's credentials (a
    service principal's ARM_* variables, else the Azure CLI's token, as the stack's; the
    subscription of ARM_SUBSCRIPTION_ID or the CLI's), as Azure's guide to a managed image of a
    generalized Linux VM has it: the builder made in the pool's resource group from the pool's
    scale set's VM profile (provision/burst/azure.py vm_body: size, disk, NIC settings, security
    group, placement) with the OS's stock image, a user data that runs nothing, a public address
    (burst VMs have none; the workstation reaches the builder there), no node identity and no
    Spot priority; the seal deprovisions Azure's agent; then deallocated, generalized, and
    captured as a managed image with the cluster's tags, and deleted with its NIC, disk and
    address."""

    cloud = "azure"

    def __init__(
        self,
        cluster: Cluster,
        call: Any = None,
        subscription: str | None = None,
        base: str | None = None,
        poll_s: float = AZURE_POLL_S,
    ) -> None:
        import os

        from provision.providers.cloud import ARM, ENV_AZURE_ENDPOINT

        self.cluster = cluster
        self.base = base or os.environ.get(ENV_AZURE_ENDPOINT) or ARM
        self._call_fn = call or self._rest
        self._token: str | None = None
        self.subscription = subscription or os.environ.get("ARM_SUBSCRIPTION_ID") or ""
        self.poll_s = poll_s

    def _credentials(self) -> str:
        import os

        from provision.providers.cloud import _azure_token

        if self._token is None:
            found = _azure_token(dict(os.environ))
            if found is None:
                raise OperationError(
                    "azure: no token for the image builds (ARM_CLIENT_ID, ARM_CLIENT_SECRET and "
                    "ARM_TENANT_ID, or `az login`)"
                )
            self._token, subscription = found
            self.subscription = self.subscription or subscription
        return self._token

    def _rest(self, method: str, url: str, body: object = None) -> Any:
        from provision.burst import rest

        token = self._credentials()
        return rest.call(method, url, body, headers={"Authorization": f"Bearer {token}"})

    def _call(self, method: str, path: str, body: object = None) -> Any:
        from provision.burst.backend import BurstError

        url = path if path.startswith("http") else f"{self.base}{path}"
        try:
            return self._call_fn(method, url, body)
        except (BurstError, OSError) as exc:
            raise OperationError(
                f"azure: {method} {path.split('?')[0].rpartition('/providers/')[2]}: "
                f"{one_line(exc)}"
            ) from None

    def _group(self) -> str:
        from provision.burst.config import cloud_group

        if not self.subscription:
            self._credentials()
        if not self.subscription:
            raise OperationError(
                "azure: no subscription for the image builds: set ARM_SUBSCRIPTION_ID"
            )
        return (
            f"/subscriptions/{self.subscription}/resourceGroups/"
            f"{cloud_group(self.cluster.spec.name)}/providers"
        )

    def _vm(self, name: str, query: str = "") -> str:
        return (
            f"{self._group()}/Microsoft.Compute/virtualMachines/{name}"
            f"?api-version={AZURE_COMPUTE_API}{query}"
        )

    def _until(self, what: str, done: Any) -> Any:
        """Look every poll_s until done(answer) says so (True, or an error's text)."""
        import time

        deadline = time.monotonic() + AZURE_WAIT_S
        while True:
            answer = done()
            if answer is True:
                return
            if isinstance(answer, str):
                raise OperationError(f"azure: {what}: {answer}")
            if time.monotonic() > deadline:
                raise OperationError(f"azure: {what}: still not done after {AZURE_WAIT_S}s")
            time.sleep(self.poll_s)

    def stock_image(self) -> dict[str, str]:
        """The OS's Marketplace image (the stack's), its newest version."""
        from provision.providers.cloud.layout import IMAGES

        publisher, offer, sku = IMAGES[self.cluster.spec.os]["azure"]
        return {"publisher": publisher, "offer": offer, "sku": sku, "version": "latest"}

    def launch(self, view: PoolView, name: str, tags: dict[str, str]) -> Launched:
        import base64

        from provision.burst.azure import vm_body

        stock = self.stock_image()
        template = cloud_template(self.cluster.spec.name, view.name)
        scale_set = self._call(
            "GET",
            f"{self._group()}/Microsoft.Compute/virtualMachineScaleSets/{template}"
            f"?api-version={AZURE_COMPUTE_API}",
        )
        try:
            body = vm_body(name, scale_set, {**scale_set.get("tags", {}), **tags})
        except (KeyError, TypeError) as exc:
            raise OperationError(f"azure: scale set {template}: no VM profile ({exc})") from None
        props = body["properties"]
        props["storageProfile"]["imageReference"] = stock
        props["userData"] = base64.b64encode(BUILDER_USER_DATA.encode()).decode()
        for key in ("priority", "evictionPolicy", "billingProfile"):
            props.pop(key, None)  # a builder is not evicted mid-build
        body.pop("identity", None)  # it reads no secret
        primary = props["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
        primary["ipConfigurations"] = [
            {
                **primary["ipConfigurations"][0],
                "properties": {
                    **primary["ipConfigurations"][0]["properties"],
                    "publicIPAddressConfiguration": {
                        "name": f"{name}-ip",
                        "sku": {"name": "Standard"},
                        "properties": {
                            "publicIPAllocationMethod": "Static",
                            "deleteOption": "Delete",
                        },
                    },
                },
            }
        ]
        self._call("PUT", self._vm(name), body)
        source = "/".join(stock[k] for k in ("publisher", "offer", "sku"))
        launched = Launched(view.name, view.nodes[0].name, name, "", source)
        try:
            self._until(f"builder {name}", lambda: self._provisioned(name))
            launched.address = self._public_address(name)
            launched.extra["location"] = str(body["location"])
        except BaseException:
            self.remove(launched)  # nothing half-made stays
            raise
        return launched

    def _provisioned(self, name: str) -> bool | str | None:
        vm = self._call("GET", self._vm(name, "&$expand=instanceView"))
        state = vm.get("properties", {}).get("provisioningState")
        if state == "Succeeded":
            return True
        if state == "Failed":
            from provision.burst.azure import vm_failure

            return vm_failure(vm)[1]
        return None

    def _public_address(self, name: str) -> str:
        vm = self._call("GET", self._vm(name))
        nics = vm.get("properties", {}).get("networkProfile", {}).get("networkInterfaces", [])
        if not nics:
            raise OperationError(f"azure: builder {name} has no NIC")
        nic = self._call("GET", f"{nics[0]['id']}?api-version={AZURE_NETWORK_API}")
        configs = nic.get("properties", {}).get("ipConfigurations", [])
        public = configs[0].get("properties", {}).get("publicIPAddress", {}) if configs else {}
        if not public.get("id"):
            raise OperationError(f"azure: builder {name} has no public address")
        address = self._call("GET", f"{public['id']}?api-version={AZURE_NETWORK_API}")
        found = address.get("properties", {}).get("ipAddress", "")
        if not found:
            raise OperationError(f"azure: builder {name}'s public address has no IP yet")
        return str(found)

    def _deallocated(self, name: str) -> bool:
        vm = self._call("GET", self._vm(name, "&$expand=instanceView"))
        statuses = vm.get("properties", {}).get("instanceView", {}).get("statuses", [])
        return any(s.get("code") == "PowerState/deallocated" for s in statuses)

    def capture(self, launched: Launched, name: str, tags: dict[str, str]) -> str:
        vm = launched.instance
        self._call("POST", self._vm(vm).replace("?", "/deallocate?", 1))
        self._until(f"deallocating builder {vm}", lambda: self._deallocated(vm) or None)
        self._call("POST", self._vm(vm).replace("?", "/generalize?", 1))
        image = f"{self._group()}/Microsoft.Compute/images/{name}"
        body = {
            "location": launched.extra.get("location")
            or self._call("GET", self._vm(vm))["location"],
            "tags": tags,
            "properties": {
                "sourceVirtualMachine": {
                    "id": f"{self._group()}/Microsoft.Compute/virtualMachines/{vm}"
                },
                "hyperVGeneration": "V2",  # the stock images are Generation 2
            },
        }
        self._call("PUT", f"{image}?api-version={AZURE_COMPUTE_API}", body)

        def made() -> bool | str | None:
            state = (
                self._call("GET", f"{image}?api-version={AZURE_COMPUTE_API}")
                .get("properties", {})
                .get("provisioningState")
            )
            return (
                True
                if state == "Succeeded"
                else (f"image {name}: {state}" if state == "Failed" else None)
            )

        self._until(f"image {name}", made)
        return image

    def remove(self, launched: Launched) -> None:
        # its NIC, disk and public address go with it (deleteOption)
        self._call("DELETE", self._vm(launched.instance))

    def prune(self, pool: str, tags: dict[str, str], keep: str) -> list[str]:
        """The pool's images other than `keep`, deleted."""
        url: str | None = (
            f"{self._group()}/Microsoft.Compute/images?api-version={AZURE_COMPUTE_API}"
        )
        removed = []
        while url:
            page = self._call("GET", url)
            for image in page.get("value", []):
                mine = image.get("tags") or {}
                path = str(image.get("id", ""))
                if path.lower() == keep.lower() or not all(
                    mine.get(k) == v for k, v in tags.items()
                ):
                    continue
                self._call("DELETE", f"{path}?api-version={AZURE_COMPUTE_API}")
                removed.append(path)
            url = page.get("nextLink")
        return removed

"""The images an elastic cloud pool's instances start from, baked the way the lab pool's image
is: a builder instance from the pool's own template (its type, network, disk), booted from the
OS's stock image, joins the Ansible run as the pool's first node (the compute roles, the join's
needs, no munge key, slurmd left to the join) and seals itself in the last play; then it is
stopped and captured (EC2 CreateImage, a Compute Engine image, an Azure managed image), and
removed, whether the run went well or not. The stack then starts the pool's template from the
image.

An image is made again when its pool's inputs change (`pool_digest`): what the builder is given
of the render (the cluster's variables, the pool's group and its first node in the inventory,
the pool's firewall and NCCL files and the address sets), the roles, the node programs (the join
is one of them) and the stock image asked for. A change elsewhere (another pool, a head's files)
leaves it. What each pool's image is, and from what, is kept in the state (images.json).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from provision import assets
from provision.burst.backend import one_line
from provision.burst.config import TAG_CLUSTER, TAG_POOL, cloud_template, fit_name
from provision.changes import GROUP_VARS, INVENTORY, inventory_document
from provision.cluster import Cluster, PoolView
from provision.errors import OperationError
from provision.render.output import read_render
from provision.spec.nodes import login_user
from provision.state import State

RECORDS = "images.json"
# the clouds whose builder is made (builders.py)
BUILDERS = frozenset({"aws", "gcp", "azure"})
IMAGE_INVENTORY = "cloud-image-hosts.yml"
# the tag (label) an image carries: the digest of the inputs it was made from
TAG_INPUTS = "provision-inputs"
TAG_BUILDER = "provision-image-builder"
# what a build takes, where no build of the pool was timed yet: a GPU pool's driver, CUDA and
# fabric software dominate (what plan says)
ESTIMATE_S = {True: 40 * 60, False: 15 * 60}
SSH_WAIT_S = 600


@dataclass(frozen=True)
class ImageRecord:
    pool: str
    cloud: str
    image: str  # the cloud's ID of it: ami-..., a Compute Engine image's name, an Azure image ID
    digest: str  # of the inputs it was made from
    source: str  # the stock image the builder booted
    built: str  # when (UTC, ISO 8601)
    seconds: float  # how long the build took, launch to captured


def records(state: State) -> dict[str, ImageRecord]:
    path = state.dir / RECORDS
    if not path.exists():
        return {}
    return {pool: ImageRecord(**doc) for pool, doc in json.loads(path.read_text()).items()}


def save_record(state: State, record: ImageRecord) -> None:
    _write_records(state, {**records(state), record.pool: record})


def _write_records(state: State, found: dict[str, ImageRecord]) -> None:
    doc = {pool: asdict(r) for pool, r in sorted(found.items())}
    (state.dir / RECORDS).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def elastic_pools(cluster: Cluster, cloud: str) -> list[PoolView]:
    return [v for v in cluster.pools if v.pool.elastic and v.pool.provider == cloud]


def _pool_inventory(text: str, pool: str, host: str) -> str:
    """The inventory as the pool's builder sees it: the groups its first node is in, with their
    variables, and the node's own (canonical JSON)."""
    children = (inventory_document(text).get("all") or {}).get("children") or {}
    mine = {}
    for group, body in sorted(children.items()):
        hosts = (body or {}).get("hosts") or {}
        if host in hosts or group == f"pool_{pool}":
            mine[group] = {"vars": (body or {}).get("vars") or {}, "host": hosts.get(host)}
    return json.dumps(mine, sort_keys=True, default=str)


def _package_files() -> Iterator[tuple[str, bytes]]:
    """The node programs the image carries (the join among them): the package's Python files."""
    package = assets.package_dir()
    for path in sorted(package.rglob("*.py")):
        yield str(path.relative_to(package)), path.read_bytes()


def pool_digest(files: dict[str, str], view: PoolView, source: str) -> str:
    """What a pool's image is made from, as one digest (see the module's text)."""
    name = view.name
    h = hashlib.sha256(f"{name}\n{source}\n".encode())
    parts = {
        GROUP_VARS: files.get(GROUP_VARS, ""),
        "pool inventory": _pool_inventory(files.get(INVENTORY, ""), name, view.nodes[0].name),
    }
    for rel in (
        "files/nftables/address-sets.nft",
        f"files/nftables/{name}.nft",
        f"files/nccl/{name}.conf",
    ):
        parts[rel] = files.get(rel, "")
    for rel, text in sorted(parts.items()):
        h.update(f"{rel}\n{text}\n".encode())
    assets.hash_collection(h)
    for rel, data in _package_files():
        h.update(f"{rel}\n".encode() + data)
    return h.hexdigest()[:16]


def source_image(cloud: str, os_name: str) -> str:
    """The stock image a builder boots, as the stack names it (layout.IMAGES)."""
    from provision.providers.cloud.layout import IMAGES

    return f"{cloud}:" + "/".join(IMAGES[os_name][cloud])


@dataclass(frozen=True)
class Wanted:
    """A pool whose image is to be made, and why."""

    view: PoolView
    digest: str
    why: str  # "no image yet", "its inputs changed", "asked for"


def wanted(
    cluster: Cluster,
    cloud: str,
    files: dict[str, str],
    state: State,
    pools: list[str] | None = None,
) -> list[Wanted]:
    """The elastic pools of this cloud whose image is missing or made from other inputs; with
    `pools`, those pools whatever their image."""
    made = records(state)
    source = source_image(cloud, cluster.spec.os)
    out = []
    for view in elastic_pools(cluster, cloud):
        digest = pool_digest(files, view, source)
        record = made.get(view.name)
        if pools is not None:
            if view.name in pools:
                out.append(Wanted(view, digest, "asked for"))
        elif record is None:
            out.append(Wanted(view, digest, "no image yet"))
        elif record.digest != digest:
            out.append(Wanted(view, digest, "its inputs changed"))
    return out


def estimate_s(view: PoolView, record: ImageRecord | None) -> float:
    """How long the pool's build may take: its last one, or a rough figure."""
    return record.seconds if record else ESTIMATE_S[view.profile.gpu is not None]


def plan_lines(cluster: Cluster, cloud: str, files: dict[str, str], state: State) -> list[str]:
    """For plan: each elastic pool's image, made or to be made, and roughly how long."""
    made = records(state)
    todo = {w.view.name: w for w in wanted(cluster, cloud, files, state)}
    lines = []
    for view in elastic_pools(cluster, cloud):
        if view.name in todo:
            minutes = round(estimate_s(view, made.get(view.name)) / 60)
            lines.append(
                f"{cloud} pool {view.name}: image would be built ({todo[view.name].why}; "
                f"about {minutes} min: a builder instance, the compute roles, the capture)"
            )
        else:
            lines.append(f"{cloud} pool {view.name}: image {made[view.name].image} is current")
    return lines


# --- the builders ------------------------------------------------------------------------


@dataclass
class Launched:
    """A builder instance: where this machine reaches it, and what its removal needs."""

    pool: str
    host: str  # its inventory name: the pool's first node
    instance: str  # the cloud's ID or name of it
    address: str  # its public address
    source: str  # the stock image it booted (the cloud's ID)
    started: float = field(default_factory=time.monotonic)
    extra: dict[str, str] = field(default_factory=dict)  # e.g. an Elastic IP's allocation


class Builder(Protocol):
    """One cloud's part: start a builder from the pool's template, capture it, remove it."""

    cloud: str

    def launch(self, view: PoolView, name: str, tags: dict[str, str]) -> Launched: ...

    def capture(self, launched: Launched, name: str, tags: dict[str, str]) -> str: ...

    def remove(self, launched: Launched) -> None: ...

    def prune(self, pool: str, tags: dict[str, str], keep: str) -> list[str]: ...


def image_name(cluster: str, pool: str, digest: str, built: str) -> str:
    """An image's name every cloud takes: lower-case letters, digits and hyphens; one name per
    build (built: its UTC time to the millisecond, digits only), since EC2 and Compute Engine
    each refuse a second image of a name, and a build asked for again has the same inputs."""
    return fit_name(f"{cluster}-{pool}-{digest}-{built}".lower())


# What the builder's first boot does: nothing of the pool's join (the template's user data is
# replaced for the builder); the stock image's cloud-init still gives the login user the key.
BUILDER_USER_DATA = "#cloud-config\n{}\n"


@dataclass
class CloudImageBuilds:
    """The builders of one cloud's stale pool images, as the converge takes them (providers'
    ImageBuilds): more hosts of the run, sealed by its last play, captured in finish."""

    cloud: str
    builder: Builder
    cluster: Cluster
    launched: list[tuple[Launched, Wanted]]
    inventory: Path
    say: Callable[[str], None]
    # the stack again, so the pools' templates start the new images
    refresh: Callable[[], None]

    @property
    def hosts(self) -> list[str]:
        return [launched.host for launched, _ in self.launched]

    @property
    def images(self) -> list[str]:
        return [f"{self.cloud} pool {w.view.name}" for _, w in self.launched]

    def finish(self, state: State, ok: bool) -> None:
        made = []
        try:
            for launched, want in self.launched if ok else []:
                made.append(self._capture(state, launched, want))
        finally:
            for launched, _ in self.launched:
                try:
                    self.builder.remove(launched)
                    self.say(f"images: {self.cloud}: builder {launched.instance} removed")
                except Exception as exc:  # said: a builder left behind costs money
                    self.say(
                        f"images: {self.cloud}: builder {launched.instance} could not be "
                        f"removed ({one_line(exc)}): remove it by hand"
                    )
            self.inventory.unlink(missing_ok=True)
        if made:
            self.say(f"images: {self.cloud}: the stack again, so the templates start them")
            self.refresh()
            for record in made:
                tags = _tags(self.cluster, record.pool)
                for old in self.builder.prune(record.pool, tags, keep=record.image):
                    self.say(f"images: {self.cloud} pool {record.pool}: old image {old} removed")

    def _capture(self, state: State, launched: Launched, want: Wanted) -> ImageRecord:
        now = datetime.datetime.now(datetime.UTC)
        name = image_name(
            self.cluster.spec.name, want.view.name, want.digest, now.strftime("%Y%m%d%H%M%S%f")[:17]
        )
        tags = {**_tags(self.cluster, want.view.name), TAG_INPUTS: want.digest}
        self.say(f"images: {self.cloud} pool {want.view.name}: capturing {name}")
        image = self.builder.capture(launched, name, tags)
        took = time.monotonic() - launched.started
        record = ImageRecord(
            pool=want.view.name,
            cloud=self.cloud,
            image=image,
            digest=want.digest,
            source=launched.source,
            built=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            seconds=round(took, 1),
        )
        save_record(state, record)  # kept at once: a later failure does not lose it
        self.say(f"images: {self.cloud} pool {want.view.name}: {image} ({took / 60:.0f} min)")
        return record


def _tags(cluster: Cluster, pool: str) -> dict[str, str]:
    return {TAG_CLUSTER: cluster.spec.name, TAG_POOL: pool}


def start_builds(
    cluster: Cluster,
    state: State,
    builder: Builder,
    todo: list[Wanted],
    say: Callable[[str], None],
    refresh: Callable[[], None],
    wait_ssh: Callable[[str, str], None],
) -> CloudImageBuilds:
    """Launch a builder per pool and write the inventory that adds them to the run. A launch
    that fails removes the builders already made."""
    cloud = builder.cloud
    launched: list[tuple[Launched, Wanted]] = []
    user = login_user(cluster.spec, cloud)
    try:
        for want in todo:
            name = f"{cloud_template(cluster.spec.name, want.view.name)}-image"
            tags = {**_tags(cluster, want.view.name), TAG_BUILDER: want.view.name}
            say(f"images: {cloud} pool {want.view.name}: a builder ({want.why})")
            one = builder.launch(want.view, fit_name(name), tags)
            launched.append((one, want))
            say(f"images: {cloud} pool {want.view.name}: builder {one.instance} at {one.address}")
        for one, _ in launched:
            wait_ssh(one.address, user)
    except BaseException as exc:
        for one, _ in launched:
            try:
                builder.remove(one)
            except Exception as gone:
                why = one_line(gone)
                say(f"images: {cloud}: builder {one.instance} could not be removed ({why})")
        if isinstance(exc, (OperationError, KeyboardInterrupt)):
            raise
        why = one_line(exc)
        raise OperationError(f"images: {cloud}: a builder could not start ({why})") from exc
    hosts = {one.host: builder_vars(one, want.view) for one, want in launched}
    path = state.build / "inventory" / f"{cloud}-{IMAGE_INVENTORY}"
    path.write_text(json.dumps({"all": {"hosts": hosts}}, indent=1) + "\n")  # JSON is YAML
    return CloudImageBuilds(cloud, builder, cluster, launched, path, say, refresh)


def builder_vars(launched: Launched, view: PoolView) -> dict[str, Any]:
    """The builder as a host of the run: the pool's first node (its groups and variables come
    from the rendered inventory) reached at the builder's address, with what makes it an image:
    no munge key (each node reads it at boot), slurmd left to the join, no mounts of the cluster
    (a builder is not on the cluster's network), and the seal at the end."""
    return {
        "ansible_host": launched.address,
        "burst_image_builder": True,
        "burst_image_cloud": view.pool.provider,
        "burst_image_remote": view.pool.network is not None,
        "munge_key_install": False,
        "slurm_start_daemons": False,
        "mounts_filesystems": [],
    }


def remove_images(cluster: Cluster, state: State, builder: Builder) -> list[str]:
    """Every image of the cluster's elastic pools on this cloud, and the records of them (what
    destroy does once the stack is gone): what was removed."""
    removed = []
    made = records(state)
    for view in elastic_pools(cluster, builder.cloud):
        removed += builder.prune(view.name, _tags(cluster, view.name), keep="")
        made.pop(view.name, None)
    _write_records(state, made)  # another cloud's records stay
    return removed


def wait_for_ssh(address: str, user: str, timeout: float = SSH_WAIT_S) -> None:
    """Until sshd answers at the address (a cloud image's first boot takes a minute or two)."""
    import socket

    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, 22), timeout=10) as conn:
                conn.settimeout(10)
                if conn.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise OperationError(
                f"images: no SSH at {address} after {timeout:.0f} s (as {user}): is this "
                "machine inside security.admin_cidrs?"
            )
        time.sleep(5)


def cloud_builds(
    cluster: Cluster,
    state: State,
    builder: Builder,
    say: Callable[[str], None],
    refresh: Callable[[], None],
    pools: list[str] | None = None,
    wait_ssh: Callable[[str, str], None] = wait_for_ssh,
) -> CloudImageBuilds | None:
    """The builds of this cloud's stale pool images (or of `pools`), started; None: none."""
    todo = wanted(cluster, builder.cloud, read_render(state.build), state, pools)
    if not todo:
        return None
    return start_builds(cluster, state, builder, todo, say, refresh, wait_ssh)

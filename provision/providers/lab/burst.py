"""What a lab cluster with elastic pools needs on the workstation: the podman API its head
drives (a `podman system service` on a socket in the state directory, mounted into the head
only), and an image per elastic pool with the compute roles already applied, so a burst node
boots straight into slurmd.

An image is made by apply: a builder container (hostname: the pool's first node) joins the
Ansible run of site.yml like any node, except that slurmd is enabled but not started; then it
is sealed (munge key and Slurm files out, `slurmd --conf-server` in) and committed. It is made
again when the render, the roles or the base image change (a digest in the image's label).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import provision.providers.lab.podman as podman
from provision import assets
from provision.burst.config import LAB_LABEL, lab_container_prefix, lab_image
from provision.cluster import Cluster
from provision.errors import OperationError
from provision.render.output import read_render
from provision.state import State

INPUTS_LABEL = "provision.inputs"
IMAGE_INVENTORY = "image-hosts.yml"
API_WAIT_S = 15


def api_dir(state: State) -> Path:
    return state.dir / "podman-api"


def elastic_lab_pools(cluster: Cluster) -> list[str]:
    return [v.name for v in cluster.pools if v.pool.elastic and v.pool.provider == "lab"]


# --- the API service ------------------------------------------------------------------------


def _pid_alive(pidfile: Path) -> bool:
    try:
        pid = int(pidfile.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def ensure_api_service(state: State, log: Callable[[str], None]) -> Path:
    """Start `podman system service` on state/podman-api/podman.sock unless it runs."""
    folder = api_dir(state)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    sock, pidfile = folder / "podman.sock", folder / "service.pid"
    if _pid_alive(pidfile) and sock.is_socket():
        return sock
    sock.unlink(missing_ok=True)
    with open(state.dir / "podman-api.log", "ab") as out:
        proc = subprocess.Popen(
            [podman.require(), "system", "service", "--time=0", f"unix://{sock.resolve()}"],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            env=podman.env(),
            start_new_session=True,  # outlives this apply: the head uses it whenever jobs wait
        )
    pidfile.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + API_WAIT_S
    while not sock.is_socket():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise OperationError(
                f"podman system service did not start (log: {state.dir / 'podman-api.log'})"
            )
        time.sleep(0.1)
    log(f"lab: podman API for the head's burst programs at {sock}")
    return sock


def stop_api_service(state: State) -> None:
    pidfile = api_dir(state) / "service.pid"
    if _pid_alive(pidfile):
        os.kill(int(pidfile.read_text()), signal.SIGTERM)
    pidfile.unlink(missing_ok=True)


# --- the pools' images ------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageBuild:
    pool: str
    host: str  # the inventory host: the pool's first node name
    container: str
    image: str
    digest: str


def _digest(cluster: Cluster, state: State, base_id: str, pool: str) -> str:
    h = hashlib.sha256(f"{base_id}\n{pool}\n".encode())
    for rel, content in sorted(read_render(state.build).items()):
        h.update(f"{rel}\n{content}\n".encode())
    # the collection whose roles made the image: a change to them makes it again
    assets.hash_collection(h)
    return h.hexdigest()[:16]


def stale_images(
    cluster: Cluster, state: State, base_image: str, pools: list[str] | None = None
) -> list[ImageBuild]:
    """The elastic lab pools whose image is missing or made from other inputs; with `pools`,
    those pools whatever their image."""
    base_id = podman.text("image", "inspect", base_image, "--format", "{{.Id}}")
    builds = []
    elastic = elastic_lab_pools(cluster)
    for view in cluster.pools:
        if view.name not in elastic or (pools is not None and view.name not in pools):
            continue
        image = lab_image(cluster.spec.name, view.name)
        digest = _digest(cluster, state, base_id, view.name)
        if pools is None and podman.image_label(image, INPUTS_LABEL) == digest:
            continue
        container = f"{lab_container_prefix(cluster.spec.name)}image-{view.name}"
        builds.append(ImageBuild(view.name, view.nodes[0].name, container, image, digest))
    return builds


def start_builders(
    builds: list[ImageBuild], base_image: str, cluster: Cluster, state: State
) -> Path:
    """Start a builder container per image and write the inventory that adds them to the run:
    each as its pool's first node, reached with `podman exec`, with slurmd left stopped."""
    hosts = {}
    for build in builds:
        podman.podman("rm", "-f", "-t", "0", build.container, check=False)
        podman.podman(
            "run",
            "-d",
            "--name",
            build.container,
            "--hostname",
            build.host,
            # podman's default network: a builder never reaches the cluster's slurmctld
            "--label",
            f"{LAB_LABEL}={cluster.spec.name}",
            "--systemd=always",
            "--cap-add",
            "NET_ADMIN",
            "--no-hosts",
            base_image,
            "/sbin/init",
        )
        hosts[build.host] = {
            "ansible_connection": "containers.podman.podman",
            "ansible_host": build.container,
            # the slurm role's own option (not the renderer's: render/contract.py)
            "slurm_start_daemons": False,
        }
    names = {b.host: None for b in builds}
    pools = {f"pool_{b.pool}": {"hosts": {b.host: None}} for b in builds}
    doc = {
        "all": {
            "hosts": hosts,
            "children": {"compute": {"hosts": names}, "provider_lab": {"hosts": names}, **pools},
        }
    }
    path = state.build / "inventory" / IMAGE_INVENTORY
    path.write_text(json.dumps(doc, indent=1) + "\n")  # JSON is YAML
    return path


# The builder becomes an image: no munge key (each node gets the head's at resume), no copied
# Slurm files (slurmd fetches them from slurmctld: configless), munge taking its key as root
# copied it, and slurmd starting without a local slurm.conf. `-b`: a container shares the
# workstation's uptime, so slurmd reports its own start as the boot; slurmctld takes a node it
# powered up only once it has booted after the request ("Still waiting for boot of node").
SEAL = """set -e
systemctl stop slurmd munge 2>/dev/null || true
rm -f /etc/munge/munge.key /etc/slurm/slurm.conf /etc/slurm/gres.conf /etc/slurm/cgroup.conf
echo 'SLURMD_OPTIONS="-b --conf-server {conf_server}"' > /etc/default/slurmd
D=/etc/systemd/system
mkdir -p $D/munge.service.d $D/slurmd.service.d
printf '[Service]\\nExecStartPre=+/bin/chown munge:munge /etc/munge/munge.key\\n' \
  > $D/munge.service.d/provision-burst.conf
printf '[Unit]\\nConditionPathExists=\\n' > $D/slurmd.service.d/provision-burst.conf
apt-get clean
"""


def finish_builders(builds: list[ImageBuild], conf_server: str, state: State, ok: bool) -> None:
    """Seal and commit each builder when the run went well; remove them either way."""
    try:
        for build in builds if ok else []:
            podman.podman("exec", build.container, "sh", "-c", SEAL.format(conf_server=conf_server))
            podman.podman(
                "commit",
                "--quiet",
                "--change",
                f"LABEL {INPUTS_LABEL}={build.digest}",
                "--change",
                "CMD=/sbin/init",
                build.container,
                build.image,
            )
    finally:
        for build in builds:
            podman.podman("rm", "-f", "-t", "0", build.container, check=False)
        (state.build / "inventory" / IMAGE_INVENTORY).unlink(missing_ok=True)


def remove_images(cluster_name: str, pools: list[str]) -> None:
    for pool in pools:
        podman.podman("rmi", "-f", lab_image(cluster_name, pool), check=False)

"""A cloud on this machine for the burst nodes of a lab cluster, so that a new node boots the way
an EC2 instance does: from the pool's image with Debian's real cloud-init reading the user data
the AWS burst backend sent, and with the join program fetching the munge key from a secret
store with the instance's own credentials.

What stands in for AWS, on the lab network's gateway (the address every lab container routes
to):
- moto in-process, behind TLS on port 443, as `ec2.REGION.amazonaws.com` and
  `secretsmanager.REGION.amazonaws.com`: the head's boto3 and the node's reach it under the
  real names (an /etc/hosts line), trusting this rig's own CA (installed in their system store),
  with nothing in the product pointed elsewhere. moto's private addresses are the pool's lab
  addresses, handed out in order, so an instance's PrivateIpAddress is where its container is.
- an instance metadata service (IMDSv2: a session token, the instance's tags, the instance
  profile's credentials), told apart by the caller's address; a node reaches it at
  169.254.169.254 through a DNAT of its own output that the rig's image sets before cloud-init
  (a real cloud's hypervisor answers that address; a container's network cannot).
- a hypervisor: a thread that makes a container for each instance moto has made, seeded as
  NoCloud with exactly that instance's user data (DescribeInstanceAttribute), and removes the
  container once the instance is terminated.

The rig's image is the pool's image (the compute roles already applied by apply) with the burst
role's image tasks and seal run on it, as a cloud pool's builder runs them at the end of its
converge (cloud-init, boto3, the wheel; munge and slurmd left to the join; no key, no Slurm
files, no host keys, cloud-init cleaned), then the rig's own lines: its CA, its names in
/etc/hosts and the DNAT unit. One more line a cloud image does not need: slurmd is started with
`-b` (a container shares this machine's uptime, so without it slurmd reports a boot from before
the resume, which slurmctld waits past).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import secrets
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from provision.providers.lab import podman
from provision.run.wheel import build_wheel

REGION = "us-east-1"
IMDS_PORT = 8169
ROLE = "lab-burst-node"
SERVICES = ("ec2", "secretsmanager")
IMAGE_LABEL = "provision.labcloud"


def hosts_line(gateway: str) -> str:
    return f"{gateway} " + " ".join(f"{s}.{REGION}.amazonaws.com" for s in SERVICES)


# --- TLS ------------------------------------------------------------------------------------


def make_tls(folder: Path, gateway: str) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for the services' names and the gateway's address: the CA's
    certificate, the server's certificate and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=2)

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("lab cloud CA"))
        .issuer_name(name("lab cloud CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(f"{s}.{REGION}.amazonaws.com") for s in SERVICES]
    sans.append(x509.IPAddress(ipaddress.ip_address(gateway)))
    cert = (
        x509.CertificateBuilder()
        .subject_name(name(f"ec2.{REGION}.amazonaws.com"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "ca.crt", folder / "server.crt", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    paths[2].chmod(0o600)
    return paths


# --- the image ------------------------------------------------------------------------------

NFT = """table ip lab_cloud
delete table ip lab_cloud
table ip lab_cloud {{
  chain output {{
    type nat hook output priority -100; policy accept;
    ip daddr 169.254.169.254 tcp dport 80 dnat to {gateway}:{port}
  }}
}}
"""

UNIT = """[Unit]
Description=The lab cloud's network: the metadata address answered by the workstation
DefaultDependencies=no
After=nftables.service
Before=cloud-init-local.service cloud-init.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/nft -f /etc/lab-cloud.nft

[Install]
WantedBy=sysinit.target
"""

CLOUD_CFG = """datasource_list: [NoCloud, None]
network: {config: disabled}
"""

# the rig's own lines, on top of the sealed image
CONTAINERFILE = """FROM {base}
COPY lab-cloud.nft /etc/lab-cloud.nft
COPY lab-cloud.service /etc/systemd/system/lab-cloud.service
COPY 99-lab-cloud.cfg /etc/cloud/cloud.cfg.d/99-lab-cloud.cfg
COPY hosts /etc/hosts
COPY slurmd-boot.conf /etc/systemd/system/slurmd.service.d/lab-cloud-boot.conf
RUN touch /etc/cloud/cloud-init.enabled \\
 && systemctl enable lab-cloud.service && mkdir -p /var/lib/cloud/seed/nocloud
LABEL {label}={digest}
"""

# What a cloud pool's builder runs at the end of its converge (site.yml's last play), run here
# on a container of the lab pool's image: the product's own tasks and seal make the image
SEAL_PLAY = """- name: An elastic cloud pool's image, as its builder's last play makes it
  hosts: all
  gather_facts: true
  pre_tasks:
    - name: Refresh the package lists (on a builder, the common role did at the run's start)
      ansible.builtin.apt:
        update_cache: true
    - name: Read the installed packages
      gpu_provision.cluster.installed_packages:
  tasks:
    - name: Role burst, the image's part
      ansible.builtin.include_role:
        name: gpu_provision.cluster.burst
        tasks_from: image.yml
"""


def sealed_image(base: str, folder: Path, tag: str) -> str:
    """The lab pool's image with the burst role's image tasks and seal run on it, as on a
    cloud builder (AWS: cloud-init, boto3, the wheel; munge and slurmd left to the join; the
    seal), made again when the role, the wheel or the base change: the image's name."""
    from provision.assets import ansible_cfg, collection_dir, collections_path

    folder.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel(folder)
    role = collection_dir() / "roles" / "burst"
    base_id = podman.text("image", "inspect", base, "--format", "{{.Id}}")
    h = hashlib.sha256(base_id.encode() + SEAL_PLAY.encode() + wheel.read_bytes())
    for path in sorted(p for p in role.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(role)).encode() + path.read_bytes())
    image = f"{tag}-sealed:{h.hexdigest()[:16]}"
    if podman.image_exists(image):
        return image
    _drop_older(f"{tag}-sealed", image)
    container = f"{tag.rsplit('/', 1)[-1]}-sealer"
    podman.podman("rm", "-f", "-t", "0", container, check=False)
    podman.podman(
        "run", "-d", "--name", container, "--systemd=always", "--cap-add", "NET_ADMIN",
        base, "/sbin/init",
    )  # fmt: skip
    try:
        play = folder / "seal.yml"
        play.write_text(SEAL_PLAY)
        variables = {
            "burst_wheel_src": str(wheel),
            "burst_image_cloud": "aws",
            "burst_image_remote": False,
            "ansible_python_interpreter": "/usr/bin/python3",
        }
        argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", f"{container},"]
        argv += ["-c", "containers.podman.podman", "-e", json.dumps(variables), str(play)]
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env={
                **podman.env(),
                "ANSIBLE_CONFIG": str(ansible_cfg()),
                "ANSIBLE_COLLECTIONS_PATH": str(collections_path()),
                "ANSIBLE_HOME": str(folder / "ansible"),
            },
            timeout=900,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the image tasks failed:\n{done.stdout[-4000:]}{done.stderr}")
        podman.podman("stop", "-t", "10", container)
        podman.podman("commit", "--quiet", "--change", "CMD=/sbin/init", container, image)
    finally:
        podman.podman("rm", "-f", "-t", "0", container, check=False)
    return image


# this run's CA on top (a new one each run: the cached image above holds none)
TRUST = """FROM {image}
COPY ca.crt /usr/local/share/ca-certificates/lab-cloud.crt
RUN update-ca-certificates
"""


def build_image(sealed: str, folder: Path, gateway: str, ca: Path, tag: str) -> str:
    """The sealed pool's image (sealed_image) as a cloud image of the lab (made again when an
    input changes), with this run's CA trusted: the image's name."""
    folder.mkdir(parents=True, exist_ok=True)
    hosts = podman.text("run", "--rm", "--no-hosts", sealed, "cat", "/etc/hosts")
    slurmd = podman.text("run", "--rm", sealed, "cat", "/lib/systemd/system/slurmd.service")
    exec_start = next(line for line in slurmd.splitlines() if line.startswith("ExecStart="))
    files = {
        "lab-cloud.nft": NFT.format(gateway=gateway, port=IMDS_PORT),
        "lab-cloud.service": UNIT,
        "99-lab-cloud.cfg": CLOUD_CFG,
        "hosts": hosts.rstrip("\n") + "\n" + hosts_line(gateway) + "\n",
        "slurmd-boot.conf": "[Service]\nExecStart=\n"
        + exec_start.replace("/slurmd ", "/slurmd -b ", 1)
        + "\n",
    }
    base_id = podman.text("image", "inspect", sealed, "--format", "{{.Id}}")
    h = hashlib.sha256(base_id.encode() + CONTAINERFILE.encode())
    for rel, text in sorted(files.items()):
        h.update(f"{rel}\n{text}".encode())
    digest = h.hexdigest()[:16]
    image = f"{tag}:{digest}"
    if not podman.image_exists(image):
        _drop_older(tag, image, keep=f"{tag}:run")
        _build(folder, image, files, sealed, digest)
    trust = folder / "trust"
    trust.mkdir(exist_ok=True)
    (trust / "ca.crt").write_bytes(ca.read_bytes())
    (trust / "Containerfile").write_text(TRUST.format(image=image))
    # the last run's goes first (it would be left nameless, its layers kept)
    podman.podman("rmi", "-f", f"{tag}:run", check=False)
    podman.podman("build", "-q", "-t", f"{tag}:run", str(trust))
    return f"{tag}:run"


def _drop_older(repository: str, image: str, keep: str = "") -> None:
    """The repository's images made from other inputs (an earlier run's: each change to the
    roles or the wheel makes a new one), removed before `image` is made, so that they do not
    pile up on a machine that runs the tests again and again."""
    tags = podman.text("images", "--format", "{{.Repository}}:{{.Tag}}", "--filter",
                       f"reference={repository}")  # fmt: skip
    for old in tags.split():
        if old not in (image, keep) and old.rsplit(":", 1)[0] == repository:
            podman.podman("rmi", "-f", old, check=False)


def _build(folder: Path, image: str, files: dict[str, str], base: str, digest: str) -> None:
    for rel, text in files.items():
        (folder / rel).write_text(text)
    (folder / "Containerfile").write_text(
        CONTAINERFILE.format(base=base, label=IMAGE_LABEL, digest=digest)
    )
    podman.podman("build", "-q", "-t", image, str(folder))


# --- the cloud ------------------------------------------------------------------------------


class LabCloud:
    """moto behind TLS, the metadata service and the hypervisor, on the lab's gateway."""

    def __init__(
        self,
        gateway: str,
        addresses: list[str],
        network: str,
        image: str,
        prefix: str,
        label: str,
        tls: tuple[Path, Path, Path],
    ) -> None:
        self.gateway, self.network, self.image = gateway, network, image
        self.prefix, self.label, self.tls = prefix, label, tls
        self.free = list(addresses)  # moto's private addresses: the pool's, in order
        self.boots: dict[str, float] = {}  # instance -> when its container started
        self.containers: dict[str, str] = {}  # instance -> container
        self.errors: dict[str, str] = {}  # instance -> why the hypervisor could not boot it
        self._stop = threading.Event()
        self._servers: list[Any] = []
        self._threads: list[threading.Thread] = []
        self.credentials = {
            "AccessKeyId": "ASIA" + secrets.token_hex(8).upper(),
            "SecretAccessKey": secrets.token_urlsafe(30),
            "Token": secrets.token_urlsafe(60),
        }

    # moto's EC2 and Secrets Manager, in this process, so the address patch below applies
    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(
            service,
            region_name=REGION,
            endpoint_url=f"https://{self.gateway}",
            verify=str(self.tls[0]),
            aws_access_key_id="lab",
            aws_secret_access_key="lab",
        )

    def ec2(self) -> Any:
        return self.client("ec2")

    def secrets(self) -> Any:
        return self.client("secretsmanager")

    def _next_address(self, *_: Any, **__: Any) -> str:
        if not self.free:
            raise RuntimeError("the lab cloud has no address left for an instance")
        return self.free.pop(0)

    def _serve(self, server: Any) -> None:
        self._servers.append(server)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _instances(self) -> list[dict[str, Any]]:
        found = []
        for page in self.ec2().get_paginator("describe_instances").paginate():
            for reservation in page["Reservations"]:
                found += reservation["Instances"]
        return found

    def _instance_at(self, address: str) -> dict[str, Any] | None:
        return next(
            (
                i
                for i in self._instances()
                if i.get("PrivateIpAddress") == address and i["State"]["Name"] != "terminated"
            ),
            None,
        )

    def _metadata(self, cloud: LabCloud) -> type[BaseHTTPRequestHandler]:
        tokens: set[str] = set()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def _answer(self, status: int, body: str, ctype: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                if self.path != "/latest/api/token":
                    return self._answer(404, "")
                token = secrets.token_urlsafe(32)
                tokens.add(token)
                return self._answer(200, token)

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") not in tokens:
                    return self._answer(401, "")  # IMDSv2 only, as the launch template says
                instance = cloud._instance_at(self.client_address[0])
                if instance is None:
                    return self._answer(404, "")
                tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                path = self.path.removeprefix("/latest/meta-data/")
                creds = "iam/security-credentials/"
                if path.startswith("tags/instance/"):
                    value = tags.get(path.removeprefix("tags/instance/"))
                    return self._answer(200, value) if value else self._answer(404, "")
                if path == "instance-id":
                    return self._answer(200, instance["InstanceId"])
                if path == "placement/region":
                    return self._answer(200, REGION)
                if path in (creds, creds.rstrip("/")):
                    return self._answer(200, ROLE)
                if path == creds + ROLE:
                    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=6)
                    doc = {
                        "Code": "Success",
                        "Type": "AWS-HMAC",
                        "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                        **cloud.credentials,
                    }
                    return self._answer(200, json.dumps(doc), "application/json")
                return self._answer(404, "")

        return Handler

    def _boot(self, instance: dict[str, Any]) -> None:
        iid, address = instance["InstanceId"], instance["PrivateIpAddress"]
        data = self.ec2().describe_instance_attribute(InstanceId=iid, Attribute="userData")
        user_data = base64.b64decode(data["UserData"].get("Value", ""))
        name = f"{self.prefix}{iid}"
        host = "ip-" + address.replace(".", "-")
        podman.podman("rm", "-f", "-t", "0", name, check=False)
        podman.podman(
            "create",
            "--name",
            name,
            "--hostname",
            host,
            "--label",
            self.label,
            "--network",
            self.network,
            "--ip",
            address,
            "--systemd=always",
            "--cap-add",
            "NET_ADMIN,SYS_NICE,SYS_ADMIN",  # SYS_ADMIN: the join sets the host name
            "--no-hosts",
            self.image,
            "/sbin/init",
        )
        with tempfile.TemporaryDirectory() as folder:
            seed = Path(folder)
            (seed / "user-data").write_bytes(user_data)
            (seed / "meta-data").write_text(f"instance-id: {iid}\nlocal-hostname: {host}\n")
            for part in ("user-data", "meta-data"):
                target = f"{name}:/var/lib/cloud/seed/nocloud/{part}"
                podman.podman("cp", str(seed / part), target)
        podman.podman("start", name)
        self.containers[iid] = name
        self.boots[iid] = time.monotonic()

    def _hypervisor(self) -> None:
        while not self._stop.wait(0.5):
            try:
                for instance in self._instances():
                    iid, state = instance["InstanceId"], instance["State"]["Name"]
                    if state in ("pending", "running") and iid not in self.containers:
                        if iid not in self.errors:
                            try:
                                self._boot(instance)
                            except Exception as exc:
                                self.errors[iid] = f"{type(exc).__name__}: {exc}"
                    elif state in ("shutting-down", "terminated") and iid in self.containers:
                        podman.podman("rm", "-f", "-t", "0", self.containers.pop(iid))
                        self.free.append(instance["PrivateIpAddress"])
                        self.free.sort(key=ipaddress.ip_address)
            except Exception as exc:
                self.errors["hypervisor"] = f"{type(exc).__name__}: {exc}"

    @contextmanager
    def running(self) -> Iterator[LabCloud]:
        from moto.ec2.models import instances
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        class Quiet(MotoRequestHandler):
            def log_request(self, *_: Any) -> None:
                pass

        saved: Callable[..., str] = instances.random_private_ip  # type: ignore[attr-defined]
        instances.random_private_ip = self._next_address  # type: ignore[attr-defined]
        try:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(self.tls[1]), str(self.tls[2]))
            app = DomainDispatcherApplication(create_backend_app)
            self._serve(
                make_server(
                    self.gateway,
                    443,
                    app,
                    threaded=True,
                    request_handler=Quiet,
                    ssl_context=context,
                )
            )
            self._serve(ThreadingHTTPServer((self.gateway, IMDS_PORT), self._metadata(self)))
            hypervisor = threading.Thread(target=self._hypervisor, daemon=True)
            hypervisor.start()
            self._threads.append(hypervisor)
            yield self
        finally:
            self._stop.set()
            for server in self._servers:
                server.shutdown()
            for thread in self._threads:
                thread.join(timeout=10)
            for name in self.containers.values():
                podman.podman("rm", "-f", "-t", "0", name, check=False)
            instances.random_private_ip = saved  # type: ignore[attr-defined]


def console(container: str) -> str:
    """What cloud-init wrote of its run, the join's lines included."""
    done = subprocess.run(
        [podman.require(), "exec", container, "cat", "/var/log/cloud-init-output.log"],
        capture_output=True,
        text=True,
        env=podman.env(),
        check=False,
    )
    return done.stdout

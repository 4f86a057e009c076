"""The node's side of a burst: what a new cloud instance runs at its first boot to join the
cluster by itself, with no human and no secret in its user data.

The pool's user data (render/userdata.py) is a `#cloud-config` that writes JOIN_CONFIG (what
the node must know of the cluster, nothing secret) and runs `python3 -m provision.burst join`
from this project's wheel, which the pool's image carries. In order, each step said with its
seconds on stdout (cloud-init's log and the serial console):

1. the metadata service is closed to every user but root (an nftables rule on the node's own
   output), before anything a job can run exists: a job must never read the instance's
   credentials;
2. the node's name, from its own metadata: AWS from the instance's tag (the burst program tags
   each instance after one RunInstances made them all, so the tag is waited for), GCP and
   Azure from the instance's own name, which the burst program gave it;
3. the munge key, from the cloud's secret store, read with the instance's own identity (an
   instance profile, a service account, a user-assigned managed identity, each allowed to read
   this cluster's secret alone), written 0400 munge:munge and never printed;
4. on a remote pool, the tunnel: its WireGuard key and the hub's public key from the pool's
   tunnel secret (read the same way), its own address from its metadata, and the spoke's
   configuration (burst/tunnel.py) up, so the head is reached through the hub, which took this
   node's peer at resume;
5. each controller's name and address into /etc/hosts (the cloud's resolver does not know an
   on-premises head), the node's name as its host name;
6. munge, then `slurmd --conf-server ADDRESS:PORT[,ADDRESS:PORT] -N NAME` (the primary first,
   then the backup of an HA pair): slurmd fetches slurm.conf from whichever slurmctld is in
   control (configless) and registers, and Slurm's resume is done;
7. on a spot instance, the watch for the cloud's reclaim notice (notice.py), as a transient
   systemd unit.

A step that fails ends the program with exit code 1 and a line naming the step and the cause;
slurmd is never started without its key, so the node never registers and Slurm's resume fails
after ResumeTimeout (the job is requeued, the burst programs remove the instance). Only the
standard library, and boto3 for AWS's Secrets Manager (the pool's image has python3-boto3).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from provision.burst import rest
from provision.burst.backend import BurstError, one_line
from provision.burst.config import MUNGE_KEY, TAG_NODE, TUNNEL_INTERFACE
from provision.burst.tunnel import Backup, parse_tunnel_secret, spoke_config

JOIN_CONFIG = Path("/etc/provision/join.json")
# where slurmd's unit reads its options (Debian's and Ubuntu's slurmd.service, Rocky's too)
SLURMD_DEFAULTS = {"debian": Path("/etc/default/slurmd"), "redhat": Path("/etc/sysconfig/slurmd")}
METADATA_ADDRESS = "169.254.169.254"  # every cloud's instance metadata service
AWS_METADATA = f"http://{METADATA_ADDRESS}"
GCP_METADATA = "http://metadata.google.internal/computeMetadata/v1"
AZURE_METADATA = f"http://{METADATA_ADDRESS}"
GCP_SECRETS = "https://secretmanager.googleapis.com/v1"
KEY_VAULT_API = "7.4"
# the shortest munge key munged takes (it refuses a shorter one at start)
MUNGE_KEY_MIN = 32
# how long the node waits for the tag with its name (AWS: tagged right after launch)
NAME_WAIT_S = 180
# how long a refusal of the node's identity by the secret store is asked again (a new grant)
DENIED_WAIT_S = 300
NFT_TABLE = "provision_metadata"
# a spot node's watch for its cloud's reclaim notice (notice.py), a transient unit
SPOT_WATCH_UNIT = "provision-spot-notice"


@dataclass(frozen=True)
class JoinConfig:
    """What a burst node knows of its cluster before it joins: no secret."""

    cluster: str
    cloud: str  # aws, gcp or azure: where the node's metadata and secret store are
    # (host name, address) of each slurmctld, the primary first: where the node reaches them
    # (through the tunnel when remote)
    controllers: tuple[tuple[str, str], ...]
    port: int  # slurmctld's port
    # where the munge key is: the AWS secret's name, the GCP secret's name in the node's
    # project, or the Azure Key Vault secret's URL (https://VAULT.vault.azure.net/secrets/NAME)
    secret: str
    region: str = ""  # AWS: the secret's region
    identity: str = ""  # Azure: the client ID of the user-assigned identity that reads it
    # a remote pool's: the hub's host:port, the ranges the node sends into the tunnel, and
    # where the pool's tunnel keys are (named as `secret` is); "" where the pool is not remote
    tunnel_endpoint: str = ""
    tunnel_routes: tuple[str, ...] = ()
    tunnel_secret: str = ""
    # with two heads: the other heads' host:port, in the controllers' order after the first (the
    # node dials each; through it it reaches that head alone)
    tunnel_backups: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @property
    def conf_server(self) -> str:
        """`slurmd --conf-server`'s value: every controller's address and port, in order."""
        return ",".join(f"{address}:{self.port}" for _, address in self.controllers)


def parse_join_config(text: str) -> JoinConfig:
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    known = set(JoinConfig.__dataclass_fields__)
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ValueError(f"unknown keys: {', '.join(unknown)}")
    pairs = doc.get("controllers")
    if (
        not isinstance(pairs, list)
        or not pairs
        or not all(isinstance(p, list) and len(p) == 2 for p in pairs)
        or not all(isinstance(v, str) and v for p in pairs for v in p)
    ):
        raise ValueError("controllers: not a list of [host name, address] pairs")
    routes = doc.get("tunnel_routes", [])
    if not isinstance(routes, list) or not all(isinstance(r, str) for r in routes):
        raise ValueError("tunnel_routes: not a list of ranges")
    backups = doc.get("tunnel_backups", [])
    if not isinstance(backups, list) or not all(isinstance(b, str) and b for b in backups):
        raise ValueError("tunnel_backups: not a list of host:port")
    config = JoinConfig(
        **{
            **doc,
            "controllers": tuple((n, a) for n, a in pairs),
            "tunnel_routes": tuple(routes),
            "tunnel_backups": tuple(backups),
        }
    )
    if bool(config.tunnel_endpoint) != bool(config.tunnel_secret) or (
        config.tunnel_endpoint and not config.tunnel_routes
    ):
        raise ValueError("tunnel: an endpoint, its routes and a secret, or none of them")
    if config.tunnel_backups and len(config.tunnel_backups) != len(config.controllers) - 1:
        raise ValueError("tunnel_backups: one per controller after the first")
    if config.cloud not in ("aws", "gcp", "azure"):
        raise ValueError(f"cloud {config.cloud!r}: not aws, gcp or azure")
    return config


# --- 1. the metadata service for root alone ------------------------------------------------


def metadata_guard() -> str:
    """The nftables table that drops what any user but root sends to the metadata service
    (IPv4, and AWS's IPv6 address of it). Replaced whole each time: running it twice leaves
    one table. Its chain comes before NAT (mangle's priority, -150): a DNAT of the node's own
    output (a container runtime's, kube-proxy's) would otherwise rewrite the address before a
    filter at priority 0 sees it."""
    return (
        f"table inet {NFT_TABLE}\n"
        f"delete table inet {NFT_TABLE}\n"
        f"table inet {NFT_TABLE} {{\n"
        "  chain output {\n"
        "    type filter hook output priority mangle; policy accept;\n"
        f"    ip daddr {METADATA_ADDRESS} meta skuid != 0 counter reject\n"
        "    ip6 daddr fd00:ec2::254 meta skuid != 0 counter reject\n"
        "  }\n"
        "}\n"
    )


# --- 2. the node's name ---------------------------------------------------------------------


class Metadata:
    """The instance's own metadata service, on one cloud; base points elsewhere in tests."""

    def __init__(self, cloud: str, base: str | None = None) -> None:
        self.cloud = cloud
        self.base = (
            base or {"aws": AWS_METADATA, "gcp": GCP_METADATA, "azure": AZURE_METADATA}[cloud]
        )
        self._aws_token = ""

    def aws(self, path: str) -> tuple[int, str]:
        """(status, text) of an AWS metadata path, with IMDSv2's session token (made anew
        when it expired: a spot node's watch outlives one)."""
        status, text = self._aws_once(path)
        if status == 401:
            self._aws_token = ""
            status, text = self._aws_once(path)
        return status, text

    def _aws_once(self, path: str) -> tuple[int, str]:
        if not self._aws_token:  # IMDSv2: the launch template requires the session token
            status, token = rest.text(
                f"{self.base}/latest/api/token",
                {"X-aws-ec2-metadata-token-ttl-seconds": "21600"},
                method="PUT",
            )
            if status != 200 or not token:
                raise BurstError(f"the metadata service gave no token (HTTP {status})")
            self._aws_token = token
        return rest.text(
            f"{self.base}/latest/meta-data/{path}", {"X-aws-ec2-metadata-token": self._aws_token}
        )

    def name(self, wait_s: float = NAME_WAIT_S, poll_s: float = 2) -> str:
        """The node's name: AWS's tag (waited for), or the instance's own name."""
        if self.cloud == "gcp":
            status, value = rest.text(f"{self.base}/instance/name", {"Metadata-Flavor": "Google"})
        elif self.cloud == "azure":
            status, value = rest.text(
                f"{self.base}/metadata/instance/compute/name?api-version=2021-02-01&format=text",
                {"Metadata": "true"},
            )
        else:
            deadline = time.monotonic() + wait_s
            while True:
                status, value = self.aws(f"tags/instance/{TAG_NODE}")
                if (status == 200 and value.strip()) or time.monotonic() >= deadline:
                    break
                time.sleep(poll_s)
            if status == 404:
                raise BurstError(
                    f"no tag {TAG_NODE} on this instance after {wait_s:.0f}s (the launch "
                    "template allows tags in the metadata; the burst program tags each instance)"
                )
        value = value.strip()
        if status != 200 or not value:
            raise BurstError(f"the metadata service names no instance (HTTP {status})")
        return value

    def address(self) -> str:
        """The instance's private address on its first interface."""
        if self.cloud == "gcp":
            status, value = rest.text(
                f"{self.base}/instance/network-interfaces/0/ip", {"Metadata-Flavor": "Google"}
            )
        elif self.cloud == "azure":
            status, value = rest.text(
                f"{self.base}/metadata/instance/network/interface/0/ipv4/ipAddress/0/"
                "privateIpAddress?api-version=2021-02-01&format=text",
                {"Metadata": "true"},
            )
        else:
            status, value = self.aws("local-ipv4")
        if status != 200 or not value.strip():
            raise BurstError(f"the metadata service gives no address (HTTP {status})")
        return value.strip()

    def spot(self) -> bool:
        """Whether the cloud may take this instance back: AWS's `instance-life-cycle` is
        `spot`, GCP's `scheduling/preemptible` TRUE, Azure's `compute/priority` Spot."""
        if self.cloud == "aws":
            status, value = self.aws("instance-life-cycle")
            return status == 200 and value.strip() == "spot"
        if self.cloud == "gcp":
            status, value = rest.text(
                f"{self.base}/instance/scheduling/preemptible", {"Metadata-Flavor": "Google"}
            )
            return status == 200 and value.strip().upper() == "TRUE"
        status, value = rest.text(
            f"{self.base}/metadata/instance/compute/priority?api-version=2021-02-01&format=text",
            {"Metadata": "true"},
        )
        return status == 200 and value.strip().lower() == "spot"

    def gcp_project(self) -> str:
        status, value = rest.text(f"{self.base}/project/project-id", {"Metadata-Flavor": "Google"})
        if status != 200 or not value.strip():
            raise BurstError(f"the metadata service names no project (HTTP {status})")
        return value.strip()

    def token(self, resource: str = "", identity: str = "") -> str:
        """A bearer token for the instance's identity (GCP's service account, Azure's
        user-assigned identity, for resource)."""
        if self.cloud == "gcp":
            url = f"{self.base}/instance/service-accounts/default/token"
            headers = {"Metadata-Flavor": "Google"}
        else:
            query = {"api-version": "2018-02-01", "resource": resource}
            if identity:
                query["client_id"] = identity
            url = f"{self.base}/metadata/identity/oauth2/token?{urllib.parse.urlencode(query)}"
            headers = {"Metadata": "true"}
        return rest.Token(url, headers)()


# --- 3. the munge key -----------------------------------------------------------------------


class Denied(BurstError):
    """The store refused the identity: a grant made moments ago may not have reached it yet."""


def _aws_secret(config: JoinConfig, ref: str) -> bytes:
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise BurstError("boto3 is not installed (the pool's image has python3-boto3)") from None
    client = boto3.client(
        "secretsmanager",
        region_name=config.region or None,
        config=Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=10),
    )
    try:
        answer = client.get_secret_value(SecretId=ref)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        kind = (
            Denied
            if code in ("AccessDeniedException", "UnrecognizedClientException")
            else BurstError
        )
        raise kind(f"Secrets Manager: {one_line(exc)}") from None
    except BotoCoreError as exc:
        raise BurstError(f"Secrets Manager: {one_line(exc)}") from None
    if "SecretBinary" in answer:
        return bytes(answer["SecretBinary"])
    return base64.b64decode(answer.get("SecretString", ""))


def _bearer_secret(store: str, url: str, token: str, value: Callable[[Any], str]) -> bytes:
    """GET a secret with a bearer token; the base64 value the answer holds, decoded."""
    answer = rest.call("GET", url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    try:
        return base64.b64decode(value(answer))
    except (KeyError, TypeError, ValueError):
        raise BurstError(f"{store}: the answer holds no secret value") from None


def _gcp_secret(ref: str, metadata: Metadata, api: str) -> bytes:
    name = ref
    if not name.startswith("projects/"):
        name = f"projects/{metadata.gcp_project()}/secrets/{name}"
    url = f"{api}/{name}/versions/latest:access"
    return _bearer_secret("Secret Manager", url, metadata.token(), lambda a: a["payload"]["data"])


def _azure_secret(config: JoinConfig, ref: str, metadata: Metadata) -> bytes:
    # the token's audience is the vaults' domain of the secret's cloud (vault.azure.net in
    # Azure's public cloud)
    host = urllib.parse.urlsplit(ref).netloc
    domain = host.split(".", 1)[1] if ".vault." in f".{host}" else "vault.azure.net"
    token = metadata.token(f"https://{domain}", config.identity)
    url = f"{ref}?api-version={KEY_VAULT_API}"
    return _bearer_secret("Key Vault", url, token, lambda a: a["value"])


def _read_secret(config: JoinConfig, ref: str, metadata: Metadata, gcp_api: str) -> bytes:
    try:
        if config.cloud == "aws":
            return _aws_secret(config, ref)
        if config.cloud == "gcp":
            return _gcp_secret(ref, metadata, gcp_api)
        return _azure_secret(config, ref, metadata)
    except rest.HTTPError as exc:
        if exc.status in (401, 403):
            raise Denied(f"the secret store refused: {exc}") from None
        raise BurstError(f"the secret store refused: {exc}") from None


def fetch_secret(
    config: JoinConfig,
    ref: str,
    metadata: Metadata,
    gcp_api: str = GCP_SECRETS,
    denied_wait_s: float = DENIED_WAIT_S,
    poll_s: float = 5,
) -> bytes:
    """A secret from the cloud's secret store. A refusal of the identity is asked again for a
    while: the clouds apply a new grant within seconds to minutes (IAM's eventual consistency;
    Azure's role assignments take up to ten), and a pool's first burst may come right after its
    stack made the grant. A missing secret or any other error ends it at once."""
    deadline = time.monotonic() + denied_wait_s
    while True:
        try:
            return _read_secret(config, ref, metadata, gcp_api)
        except Denied:
            if time.monotonic() >= deadline:
                raise
            time.sleep(poll_s)


def fetch_key(
    config: JoinConfig,
    metadata: Metadata,
    gcp_api: str = GCP_SECRETS,
    denied_wait_s: float = DENIED_WAIT_S,
    poll_s: float = 5,
) -> bytes:
    """The munge key (fetch_secret); a key too short for munged is refused."""
    key = fetch_secret(config, config.secret, metadata, gcp_api, denied_wait_s, poll_s)
    if len(key) < MUNGE_KEY_MIN:
        raise BurstError(f"the secret holds {len(key)} bytes, not a munge key")
    return key


# --- 4 and 5: the node's files, munge and slurmd -------------------------------------------


def write_key(key: bytes, path: Path = MUNGE_KEY, owner: str = "munge", mode: int = 0o400) -> None:
    """The key, 0400 (mode) and owned by munge (owner) from its first byte on disk (never
    readable by others even for a moment), replacing what was there in one rename."""
    import pwd

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.join")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        if os.geteuid() == 0:
            user = pwd.getpwnam(owner)
            os.fchown(fd, user.pw_uid, user.pw_gid)
        os.write(fd, key)
    finally:
        os.close(fd)
    tmp.replace(path)


def hosts_entry(text: str, name: str, address: str) -> str:
    """/etc/hosts with the controller's name at its address: an earlier line for that name is
    replaced, everything else kept."""
    kept = [line for line in text.splitlines() if name not in line.split("#", 1)[0].split()[1:]]
    return "\n".join([*kept, f"{address} {name}"]) + "\n"


def slurmd_options(config: JoinConfig, node: str) -> str:
    return f'SLURMD_OPTIONS="--conf-server {config.conf_server} -N {node}"\n'


def _command(*argv: str) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BurstError(f"{' '.join(argv)}: {one_line(Exception(done.stderr))}")


def join(
    config: JoinConfig,
    metadata: Metadata,
    say: Callable[[str], None],
    root: Path = Path("/"),
    run: Callable[..., None] = _command,
    nft: Callable[[str], None] | None = None,
    gcp_api: str = GCP_SECRETS,
    key_owner: str = "munge",
) -> str:
    """Every step in order; the node's name. root, run (every command: hostname, systemctl),
    nft, gcp_api and key_owner stand in for the node's files and commands, Secret Manager and
    the munge user in tests."""
    node = ""

    def step(what: str, action: Callable[[], str | None]) -> None:
        started = time.monotonic()
        try:
            detail = action()
        except (BurstError, OSError, ValueError, KeyError) as exc:
            raise BurstError(f"{what}: {one_line(exc)}") from None
        said = f": {detail}" if detail else ""
        say(f"join {what}: ok in {time.monotonic() - started:.1f}s{said}")

    def guard() -> str:
        (nft or _nft)(metadata_guard())
        return "the metadata service answers root alone"

    def name() -> str:
        nonlocal node
        node = metadata.name()
        return node

    def key() -> str:
        key_path = root / MUNGE_KEY.relative_to("/")
        write_key(fetch_key(config, metadata, gcp_api), key_path, key_owner)
        return f"written to {MUNGE_KEY}"

    def wireguard() -> str:
        secret = fetch_secret(config, config.tunnel_secret, metadata, gcp_api)
        private, hub, keys = parse_tunnel_secret(secret, node)
        if len(keys) != len(config.tunnel_backups):
            raise BurstError(
                f"the tunnel secret names {len(keys)} other heads, the join "
                f"{len(config.tunnel_backups)}"
            )
        address = metadata.address()
        backups = [
            Backup(key, endpoint, head_address)
            for key, endpoint, (_, head_address) in zip(
                keys, config.tunnel_backups, config.controllers[1:], strict=True
            )
        ]
        text = spoke_config(
            private, hub, address, config.tunnel_endpoint, list(config.tunnel_routes), backups
        )
        conf = root / "etc" / "wireguard" / f"{TUNNEL_INTERFACE}.conf"
        conf.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_key(text.encode(), conf, "root", 0o600)
        run("systemctl", "enable", f"wg-quick@{TUNNEL_INTERFACE}")
        run("systemctl", "restart", f"wg-quick@{TUNNEL_INTERFACE}")
        more = "".join(f" and {b.endpoint}" for b in backups)
        return f"{address} to the hub at {config.tunnel_endpoint}{more}"

    def names() -> str:
        hosts = root / "etc" / "hosts"
        text = hosts.read_text() if hosts.exists() else ""
        for name, address in config.controllers:
            text = hosts_entry(text, name, address)
        hosts.write_text(text)
        (root / "etc" / "hostname").write_text(f"{node}\n")
        run("hostname", node)
        return ", ".join(f"{name} at {address}" for name, address in config.controllers)

    def daemons() -> str:
        family = "redhat" if (root / "etc" / "redhat-release").exists() else "debian"
        defaults = root / SLURMD_DEFAULTS[family].relative_to("/")
        defaults.parent.mkdir(parents=True, exist_ok=True)
        defaults.write_text(slurmd_options(config, node))
        # enabled too: the pool's image leaves both disabled for the join (a reboot starts them)
        run("systemctl", "enable", "munge")
        run("systemctl", "restart", "munge")
        # restart, not start: a slurmd the image left enabled may run already, without the key
        # and the options just written
        run("systemctl", "enable", "slurmd")
        run("systemctl", "restart", "slurmd")
        return f"slurmd --conf-server {config.conf_server} -N {node}"

    def spot() -> str:
        try:  # the node is joined already: a look that fails costs the watch, not the node
            if not metadata.spot():
                return "not a spot instance: nothing to watch"
        except BurstError as exc:
            return f"not watched for a reclaim notice ({one_line(exc)})"
        path = os.environ.get("PYTHONPATH", "")
        run(
            "systemd-run",
            f"--unit={SPOT_WATCH_UNIT}",
            "--property=Restart=on-failure",
            "--property=RestartSec=5",
            *([f"--setenv=PYTHONPATH={path}"] if path else []),
            "python3",
            "-m",
            "provision.burst",
            "notice",
        )
        return f"{SPOT_WATCH_UNIT} watches for the cloud's reclaim notice"

    step("metadata", guard)
    step("name", name)
    step("munge key", key)
    if config.tunnel_endpoint:
        step("tunnel", wireguard)
    step("names", names)
    step("slurmd", daemons)
    step("spot", spot)
    return node


def _nft(script: str) -> None:
    done = subprocess.run(
        ["nft", "-f", "-"], input=script, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise BurstError(f"nft: {one_line(Exception(done.stderr))}")

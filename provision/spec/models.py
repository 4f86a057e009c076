"""The cluster spec: pydantic models that are the single source of truth.

The JSON Schema (`provision schema`), the spec reference in docs/spec.md, the rendered Ansible
variables and every rendered file come from these classes. Checks that need more than one field
live in `checks/`, next to them.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
import typing
from datetime import date
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from provision.errors import NOT_ONE_LINE
from provision.spec.paths import FileKind, workstation_file

OsName = Literal["ubuntu22.04", "ubuntu24.04", "debian12", "rocky9"]
SchedulerKind = Literal["slurm", "kubernetes"]
ProviderKind = Literal["static", "lab", "aws", "gcp", "azure"]
PoolRole = Literal["head", "login", "compute", "storage"]
FabricKind = Literal["infiniband", "roce", "ethernet"]

# The order providers are planned, created and listed in: the order of ProviderKind.
PROVIDER_ORDER: tuple[ProviderKind, ...] = typing.get_args(ProviderKind)
CLOUD_PROVIDERS: tuple[ProviderKind, ...] = ("aws", "gcp", "azure")
# Providers that can create a node when a job waits and remove it when idle.
BURST_PROVIDERS: tuple[ProviderKind, ...] = ("lab", "aws", "gcp", "azure")

_HOSTNAME_RE = re.compile(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?")
_POOL_RE = re.compile(r"[a-z][a-z0-9]{0,30}")
_USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_VERSION_RE = re.compile(r"[0-9]+(\.[0-9]+){0,3}")
_SSH_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)


def _hostname(value: str) -> str:
    if not _HOSTNAME_RE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a valid host name: use lower-case letters, digits and '-', "
            "starting with a letter, at most 63 characters"
        )
    return value


def _hostname_prefix(value: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,50}", value):
        raise ValueError(
            f"{value!r} is not a valid host name prefix: lower-case letters, digits and '-', "
            "starting with a letter"
        )
    return value


def _pool_name(value: str) -> str:
    if not _POOL_RE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a valid pool name: use lower-case letters and digits, "
            "starting with a letter, at most 31 characters"
        )
    return value


def _user_name(value: str) -> str:
    if not _USER_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid user name: use lower-case letters, digits, '_'")
    return value


def _version(value: str) -> str:
    if not _VERSION_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a version: write it like 550 or 12.4 or 2.21.5")
    return value


def _ssh_public_key(value: str) -> str:
    if "PRIVATE KEY" in value:
        raise ValueError(
            "this is a private key: put only public keys (the .pub file) in the spec, "
            "and remove the private key from the file now"
        )
    parts = value.split()
    if len(parts) < 2 or parts[0] not in _SSH_KEY_TYPES:
        raise ValueError(
            "not an SSH public key: expected '<type> <base64> [comment]' with type one of "
            + ", ".join(_SSH_KEY_TYPES)
        )
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the SSH public key's base64 part is damaged") from None
    # The blob starts with its own length-prefixed key type; a mismatch means a pasting error.
    inner_len = int.from_bytes(blob[:4], "big") if len(blob) >= 4 else -1
    if inner_len < 0 or blob[4 : 4 + inner_len].decode("ascii", "replace") != parts[0]:
        raise ValueError(f"the SSH public key's data does not match its type {parts[0]}")
    return value


def _abs_path(value: str) -> str:
    # letters, digits and . _ - only: a path reaches exports, mount units and (in a lab) a
    # podman --volume argument, where ':' or ',' would start options
    if (
        not re.fullmatch(r"(/[A-Za-z0-9._-]+)+", value)
        or "/../" in value + "/"
        or "/./" in value + "/"
    ):
        raise ValueError(
            f"{value!r} must be an absolute, normalised path below / of letters, digits and "
            "'._-', like /home"
        )
    return value


def _directory(value: str) -> str:
    """An absolute path, / included."""
    return value if value == "/" else _abs_path(value)


def port_range(value: int | str) -> str:
    text = str(value)
    m = re.fullmatch(r"([0-9]{1,5})(?:-([0-9]{1,5}))?", text)
    if not m:
        raise ValueError(f"{text!r} is not a port or port range: write 8080 or 60001-63000")
    low = int(m.group(1))
    high = int(m.group(2) or low)
    if not (1 <= low <= high <= 65535):
        raise ValueError(f"{text!r}: ports run 1-65535 and a range goes low-high")
    return text if low != high else str(low)


def _url(value: str) -> str:
    # RFC 3986's characters less those a shell or a template gives meaning to ({ } $ ' ` ;)
    if not re.fullmatch(r"(https?|file)://[A-Za-z0-9._~:/?#\[\]@!&()*+,=%-]+", value):
        raise ValueError(f"{value!r} is not a URL: write it like https://mirror.example.org/nvidia")
    return value.rstrip("/")


def _matching(pattern: str, message: str) -> AfterValidator:
    """A validator: the whole value matches `pattern`, or `message` ({!r} is the value)."""

    def check(value: str) -> str:
        if not re.fullmatch(pattern, value):
            raise ValueError(message.format(value))
        return value

    return AfterValidator(check)


Hostname = Annotated[str, AfterValidator(_hostname)]
# the kernel's rule: up to 15 bytes, no slash, no white space
InterfaceName = Annotated[
    str,
    _matching(
        r"[A-Za-z0-9_.:-]{1,15}",
        "{!r} is not a network interface name (1-15 of A-Z a-z 0-9 _ . : -)",
    ),
]
# a network card's address, kept as Linux and iPXE write it: lower case, with colons
MacAddress = Annotated[
    str,
    _matching(
        r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}",
        "{!r} is not a MAC address: write it like 52:54:00:12:34:56",
    ),
    AfterValidator(str.lower),
]
RdmaDevice = Annotated[
    str, _matching(r"[a-z][a-z0-9_]{0,63}", "{!r} is not an RDMA device name: write it like mlx5_0")
]
HostnamePrefix = Annotated[str, AfterValidator(_hostname_prefix)]
PoolName = Annotated[str, AfterValidator(_pool_name)]
UserName = Annotated[str, AfterValidator(_user_name)]
Version = Annotated[str, AfterValidator(_version)]
SshPublicKey = Annotated[str, AfterValidator(_ssh_public_key)]
AbsPath = Annotated[str, AfterValidator(_abs_path)]


def _on_workstation(kind: FileKind) -> AfterValidator:
    """A file on the workstation (spec/paths.py): made absolute against the spec's directory
    (the loader's context), refused where a spec may not point."""

    def check(value: str, info: ValidationInfo) -> str:
        one_line(value)  # before the value is shown in a message
        context = info.context if isinstance(info.context, dict) else {}
        spec_dir = Path(context.get("spec_dir") or Path.cwd()).absolute()
        return workstation_file(value, kind, spec_dir)

    return AfterValidator(check)


SecretFile = Annotated[str, _on_workstation("secret")]
SshKeyFile = Annotated[str, _on_workstation("ssh key")]
CaFile = Annotated[str, _on_workstation("ca bundle")]
Directory = Annotated[str, AfterValidator(_directory)]
PortRange = Annotated[int | str, AfterValidator(port_range)]
MigProfile = Annotated[
    str,
    _matching(r"[1-7]g\.[0-9]+gb", "{!r} is not a MIG profile: write it like 1g.10gb or 3g.40gb"),
]
Url = Annotated[str, AfterValidator(_url)]
EmailAddress = Annotated[
    str,
    _matching(
        r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63})*",
        "{!r} is not a mail address: write it like ops@example.org",
    ),
]
SmtpUser = Annotated[
    str,
    _matching(
        r"[A-Za-z0-9._@+-]{1,128}", "{!r} is not a user name: 1-128 of A-Z a-z 0-9 . _ @ + -"
    ),
]
HostPort = Annotated[
    str,
    _matching(
        r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?:[0-9]{1,5}",
        "{!r} is not host:port: write it like mail.example.org:587",
    ),
]
GpgFingerprint = Annotated[
    str,
    _matching(
        r"[0-9A-F]{40}",
        "{!r} is not an OpenPGP fingerprint: 40 upper-case hex digits, no spaces "
        "(gpg --show-keys --with-colons KEYFILE prints it on the fpr line)",
    ),
]
Sha256 = Annotated[
    str, _matching(r"[0-9a-f]{64}", "not a SHA-256: 64 lower-case hex digits (sha256sum prints it)")
]
ProfileName = Annotated[
    str,
    _matching(
        r"[a-z0-9][a-z0-9._-]{0,62}",
        "{!r} is not a profile name: lower-case letters, digits, '.', '_' and '-'",
    ),
]
DomainName = Annotated[
    str,
    _matching(
        r"([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z]([a-z0-9-]{0,61}[a-z0-9])?",
        "{!r} is not a DNS domain: labels of lower-case letters, digits and '-', joined by dots",
    ),
]
TimeServer = Annotated[
    str,
    _matching(
        r"([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?",
        "{!r} is not a time server: a host name like pool.ntp.org or an address like 10.0.0.1",
    ),
]
CloudPlace = Annotated[
    str,
    _matching(
        r"[a-z0-9][a-z0-9-]{0,62}",
        "{!r} is not a cloud region or zone: lower-case letters, digits and '-', "
        "like us-east-1 or us-central1-a",
    ),
]
InstanceType = Annotated[
    str,
    _matching(
        r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}",
        "{!r} is not an instance type: letters, digits, '.', '_' and '-', like p5.48xlarge",
    ),
]
# a cloud reservation's name: EC2's cr-..., a Compute Engine reservation (or its shared path), an
# Azure capacity reservation group's resource ID; each cloud's own form is checked with the pool
ReservationName = Annotated[
    str,
    _matching(
        r"/?[A-Za-z0-9][A-Za-z0-9._()/-]{0,299}",
        "{!r} is not a reservation: letters, digits and '.', '_', '-', '(', ')', '/', like "
        "cr-0123456789abcdef0",
    ),
]
GresType = Annotated[
    str,
    _matching(
        r"[a-z0-9][a-z0-9_-]{0,31}",
        "{!r} is not a GRES type name: lower-case letters, digits, '_' and '-', like h100",
    ),
]
# slurm.conf: `Key=Value` on one line; white space would start another key, '#' a comment
SlurmKey = Annotated[
    str, _matching(r"[A-Za-z][A-Za-z0-9]{0,63}", "{!r} is not a slurm.conf key, like SchedulerType")
]
SlurmValue = Annotated[
    str,
    _matching(
        r"[^\s#\"'\\{}]{1,1024}",
        "{!r} is not a slurm.conf value: no spaces, quotes, braces, '#' or backslashes",
    ),
]
NfsOptions = Annotated[
    str,
    _matching(
        r"[A-Za-z0-9_=.,:/@-]{1,512}",
        "{!r} is not a list of options: letters, digits and _ = . , : / @ - only, like rw,sync",
    ),
]
# Prometheus' durations: a number and a unit, like 15s, 5m or 30d
Duration = Annotated[
    str,
    _matching(
        r"[1-9][0-9]{0,5}(ms|s|m|h|d|w|y)",
        "{!r} is not a duration: a number and one of ms s m h d w y, like 15s or 30d",
    ),
]
MountSource = Annotated[
    str,
    _matching(
        r"[A-Za-z0-9.@,:_-]{1,253}:/[A-Za-z0-9._/-]*",
        "{!r} should be 'server:/path' (a node name or address, then the exported path)",
    ),
]


def one_line(value: object) -> None:
    """Refuse a line break or control character anywhere in a value (keys of mappings too)."""
    if isinstance(value, str):
        bad = NOT_ONE_LINE.search(value)
        if bad:
            shown = value if len(value) <= 40 else value[:37] + "..."
            raise ValueError(
                f"{shown!r} holds a line break or control character ({bad.group()!r}): "
                "a spec value is one line of plain text"
            )
    elif isinstance(value, list | tuple):
        for item in value:
            one_line(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            one_line(key)
            one_line(item)


class Model(BaseModel):
    """Base for every spec model: unknown keys are errors, so typos never pass silently, and
    every text value is one line (a field added later gets that check without asking)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="after")
    @classmethod
    def _one_line(cls, value: object) -> object:
        one_line(value)
        return value


# --- hardware profiles (data files in provision/profiles/) ---------------------------------


class GpuSpec(Model):
    model: str = Field(description="GPU model, e.g. H100-SXM5-80GB")
    slurm_type: GresType = Field(description="GRES type name used in gres.conf, e.g. h100")
    count: int = Field(ge=1, le=16, description="GPUs per node")
    memory_gib: int = Field(ge=1, description="memory per GPU in GiB")
    nvlink: bool = Field(description="GPUs are linked by NVLink")
    nvswitch: bool = Field(description="NVLink runs through NVSwitch (needs the fabric manager)")
    nvlink_links: int = Field(
        default=0, ge=0, le=32, description="NVLink links per GPU that verify expects up"
    )
    pcie_gen: int | None = Field(
        default=None, ge=1, le=6, description="PCIe generation each GPU's link must reach"
    )
    pcie_width: int | None = Field(
        default=None, ge=1, le=32, description="PCIe lanes each GPU's link must run at"
    )
    mig_profiles: list[str] = Field(
        default=[], description="MIG instance profiles the GPU offers, e.g. 1g.10gb; none: no MIG"
    )
    nccl_busbw_gbs: float | None = Field(
        default=None,
        gt=0,
        description="NCCL all_reduce bus bandwidth (GB/s, largest message) one node must reach",
    )


class HcaSpec(Model):
    model: str = Field(description="adapter model, e.g. ConnectX-7")
    count: int = Field(ge=1, description="adapters of this kind per node")
    rate_gbps: int = Field(ge=1, description="line rate per adapter port in Gb/s")
    kind: Literal["infiniband", "roce", "ethernet", "efa"] = Field(description="link layer")
    purpose: Literal["compute", "storage", "management"] = "compute"
    devices: list[RdmaDevice] = Field(
        default=[],
        description="RDMA device names, one per adapter (mlx5_0, ...); unset: NCCL and verify "
        "take every device of this link layer",
    )
    netdevs: list[InterfaceName] = Field(
        default=[],
        description="network interfaces, one per adapter (ibp24s0, ...); unset: ib0, ib1, ... "
        "on InfiniBand; RoCE adapters need them for fabric addresses",
    )
    soft: bool = Field(
        default=False,
        description="software RoCE (the kernel's rdma_rxe), no adapter: the rdma role makes "
        "each device over its netdev, for RDMA verbs where a node has no RDMA card (the path, "
        "not its speed); kind roce, with devices and netdevs named",
    )

    @model_validator(mode="after")
    def _one_name_per_adapter(self) -> HcaSpec:
        for field in ("devices", "netdevs"):
            names = getattr(self, field)
            if names and len(names) != self.count:
                raise ValueError(f"{field} names {len(names)} adapters but count is {self.count}")
        if self.soft and (self.kind != "roce" or not self.devices or not self.netdevs):
            raise ValueError(
                "soft RoCE (soft: true) is kind roce with its devices and netdevs named "
                "(rxe0 over eth1, ...): the rdma role makes each device over its netdev"
            )
        return self


class CpuSpec(Model):
    model: str
    sockets: int = Field(ge=1)
    cores_per_socket: int = Field(ge=1)
    threads_per_core: int = Field(ge=1, le=8)


class PriceSpec(Model):
    usd_per_hour: float = Field(gt=0, description="on-demand price per node-hour in USD")
    region: CloudPlace = Field(description="region the price was read for")
    as_of: date = Field(description="the day the price was read")
    source: str = Field(description="where the price was read")


class Profile(Model):
    """A hardware profile: what one node of a pool is."""

    description: str
    providers: list[ProviderKind] = Field(min_length=1, description="where this hardware exists")
    cpu: CpuSpec
    memory_gib: int = Field(ge=1)
    gpu: GpuSpec | None = None
    hcas: list[HcaSpec] = []
    max_power_w: int = Field(ge=1, description="maximum power draw of one node in watts")
    instance_type: InstanceType | None = Field(
        default=None, description="cloud instance or VM size"
    )
    price: PriceSpec | None = None


# --- the cluster spec ----------------------------------------------------------------------


class ManagementNetwork(Model):
    cidr: ipaddress.IPv4Network = Field(description="management network; node addresses live here")
    domain: DomainName | None = Field(default=None, description="DNS domain appended in /etc/hosts")
    gateway: ipaddress.IPv4Address | None = Field(
        default=None,
        description="the network's router: the default route the nodes that boot from the "
        "network get from the head's DHCP (the others keep their own); unset: none",
    )


class BmcNetwork(Model):
    cidr: ipaddress.IPv4Network = Field(description="out-of-band network of the nodes' BMCs")
    protocol: Literal["redfish", "ipmi"] = Field(
        default="redfish", description="how `provision power` talks to the BMCs"
    )
    port: int | None = Field(
        default=None, ge=1, le=65535, description="BMC port; unset: 443 (Redfish), 623 (IPMI)"
    )
    verify_tls: bool = Field(
        default=True, description="check the BMCs' HTTPS certificates (Redfish)"
    )
    ca_file: CaFile | None = Field(
        default=None,
        description="CA bundle that signed the BMCs' certificates (Redfish): beside the spec, in "
        "a secrets directory or the system's certificate directories",
    )


class RoceSettings(Model):
    """Quality of service for RDMA over Converged Ethernet: lossless class for NCCL's traffic."""

    trust: Literal["dscp", "pcp"] = Field(
        default="dscp", description="what the adapters classify by: DSCP (L3) or PCP (VLAN)"
    )
    traffic_class: int = Field(
        default=106,
        ge=0,
        le=255,
        description="IP traffic class of RDMA traffic (NCCL_IB_TC): DSCP << 2 | ECN; 106 = DSCP 26",
    )
    priority: int = Field(default=3, ge=0, le=7, description="switch priority of that DSCP")
    pfc: bool = Field(default=True, description="priority flow control on that priority")


class Fabric(Model):
    kind: FabricKind = Field(description="high-speed interconnect between compute nodes")
    subnet: ipaddress.IPv4Network | None = Field(
        default=None, description="IPoIB or RoCE subnet; absent for a plain Ethernet fabric"
    )
    rdma: Literal["inbox", "doca"] = Field(
        default="inbox",
        description="RDMA stack: inbox (the distribution's rdma-core) or doca (NVIDIA DOCA-OFED, "
        "version from software.doca)",
    )
    doca_mirror_url: Url | None = Field(
        default=None, description="local mirror of NVIDIA's DOCA repository (same paths below it)"
    )
    doca_key_fingerprint: GpgFingerprint | None = Field(
        default=None,
        description="full fingerprint of the key that signs the DOCA repository (or your "
        "mirror); the node's keyring must hold exactly this key",
    )
    subnet_managers: list[Hostname] = Field(
        default=[],
        description="nodes that run opensm, by priority (first is master); none: a managed "
        "switch runs the subnet manager",
    )
    ipoib_mode: Literal["datagram", "connected"] = Field(
        default="datagram",
        description="IPoIB transport mode; connected only on ConnectX-3 and older (ConnectX-4 "
        "and later run Enhanced IPoIB, datagram only)",
    )
    mtu: int | None = Field(
        default=None,
        ge=576,
        le=65520,
        description="fabric interface MTU; unset: 4092 (IPoIB datagram, also its most), 65520 "
        "(connected), 9000 (RoCE)",
    )
    bootstrap_interface: InterfaceName | None = Field(
        default=None,
        description="interface NCCL bootstraps over (NCCL_SOCKET_IFNAME); unset: any but "
        "loopback and container bridges",
    )
    roce: RoceSettings = Field(default=RoceSettings(), description="RoCE quality of service")
    ib_write_bw_gbps: float | None = Field(
        default=None,
        gt=0,
        description="ib_write_bw a node pair must reach per adapter; unset: 93.75% of the rate",
    )
    link_downed_limit: int = Field(
        default=5, ge=0, description="link-down events per port (LinkDownedCounter) verify allows"
    )


class RemoteNetwork(Model):
    """An address range away from the management network (a cloud's network, another site),
    joined to it by the WireGuard tunnel from the first head."""

    name: PoolName = Field(description="what pools call it in their `network`")
    cidr: ipaddress.IPv4Network = Field(
        description="its addresses: a cloud's network is made with this range; must not overlap "
        "the other networks"
    )


class Tunnel(Model):
    """WireGuard between the heads (the hubs) and every node on a remote network."""

    endpoint: TimeServer | None = Field(
        default=None,
        description="the head's address or DNS name as remote nodes reach it (its public "
        "address, or a NAT that forwards the port to it); unset: its management address. "
        "With two heads: endpoints",
    )
    endpoints: list[TimeServer] = Field(
        default=[],
        description="with two heads: each head's address or DNS name as remote nodes reach it, "
        "in the heads' order (a remote node dials both; the first carries its traffic to the "
        "cluster, the second reaches the second head's slurmctld when the first is down); "
        "unset: their management addresses",
    )
    port: int = Field(default=51820, ge=1, le=65535, description="the head's WireGuard UDP port")
    sources: list[ipaddress.IPv4Network] = Field(
        default=[ipaddress.IPv4Network("0.0.0.0/0")],
        min_length=1,
        description="where remote nodes' tunnel packets may come from (their public or NAT "
        "addresses); WireGuard answers nothing that is not signed by a peer's key",
    )


class Networks(Model):
    """The cluster's networks; they must not overlap."""

    management: ManagementNetwork = Field(description="the network Ansible and the daemons use")
    bmc: BmcNetwork | None = Field(default=None, description="out-of-band network, if any")
    fabric: Fabric = Field(
        default=Fabric(kind="ethernet"), description="high-speed network between compute nodes"
    )
    time_servers: list[TimeServer] = Field(
        default=[], description="NTP servers the head pool follows; other nodes follow the head"
    )
    remote: list[RemoteNetwork] = Field(
        default=[],
        description="networks away from the management network: each cloud's, or another "
        "site's; their nodes reach the cluster through the tunnel",
    )
    tunnel: Tunnel = Field(
        default=Tunnel(), description="the WireGuard path between the head and remote networks"
    )


class Host(Model):
    name: Hostname = Field(description="host name")
    address: ipaddress.IPv4Address | None = Field(default=None, description="management address")
    bmc_address: ipaddress.IPv4Address | None = Field(default=None, description="BMC address")
    mac: MacAddress | None = Field(
        default=None,
        description="the MAC address of the network card the node boots from (pools with "
        "boot: network)",
    )


class Reservation(Model):
    """Capacity the cloud holds for the pool: its lasting and burst nodes launch into it."""

    id: ReservationName = Field(
        description="AWS: the Capacity Reservation's ID (cr-...); GCP: the reservation's name, "
        "or projects/PROJECT/reservations/NAME when another project shares it; Azure: the "
        "capacity reservation group's resource ID"
    )
    capacity_block: bool = Field(
        default=False,
        description="AWS: the ID is a Capacity Block for ML's (instances launch in the "
        "capacity-block market, while the block is active)",
    )


class Pool(Model):
    """A group of identical nodes with one role."""

    name: PoolName = Field(description="pool name; also the Slurm partition and Ansible group")
    role: PoolRole = Field(description="what the nodes do: head runs the controller")
    profile: ProfileName = Field(description="hardware profile name (see `provision profiles`)")
    provider: ProviderKind = Field(default="static", description="where the nodes come from")
    count: int | None = Field(default=None, ge=1, le=100_000, description="nodes in the pool")
    hosts: list[Host] | None = Field(
        default=None, min_length=1, description="explicit nodes (instead of count)"
    )
    hostname_prefix: HostnamePrefix | None = Field(
        default=None, description="names are prefix + zero-padded index; default the pool name"
    )
    index_width: int = Field(default=3, ge=1, le=6, description="digits in generated names")
    first_address: ipaddress.IPv4Address | None = Field(
        default=None, description="address of the first counted node; the rest follow in order"
    )
    first_bmc_address: ipaddress.IPv4Address | None = Field(
        default=None, description="BMC address of the first counted node"
    )
    gpus: int | None = Field(
        default=None, ge=0, description="GPUs per node you expect; must agree with the profile"
    )
    boot: Literal["disk", "network"] = Field(
        default="disk",
        description="disk: the node's own operating system; network: the node boots the "
        "pool's image from the first head's boot server and runs from memory (diskless; "
        "static hosts, each with its mac and BMC: apply powers them on)",
    )
    elastic: bool = Field(
        default=False,
        description=(
            "nodes are created when jobs wait and removed when idle (lab, aws and gcp pools; on "
            "aws a type of several network cards starts in a private subnet behind a NAT "
            "gateway; azure: not supported yet)"
        ),
    )
    capacity: Literal["on-demand", "spot"] = Field(
        default="on-demand",
        description="how the cloud sells the pool's instances: on-demand, or spot (AWS Spot, "
        "GCP Spot VMs: cheaper, and taken back when the cloud needs them; a reclaimed node is "
        "marked down and its job requeued). Elastic aws and gcp pools only; azure: not "
        "supported yet",
    )
    mig: list[MigProfile] | None = Field(
        default=None,
        min_length=1,
        description="MIG layout applied to every GPU of the pool at boot, e.g. seven 1g.10gb",
    )
    network: PoolName | None = Field(
        default=None,
        description="the remote network (network.remote) the nodes live on, reached through "
        "the tunnel; unset: the management network. Cloud pools need one",
    )
    region: CloudPlace | None = Field(default=None, description="cloud region (cloud providers)")
    zone: CloudPlace | None = Field(
        default=None, description="cloud zone (cloud providers; gcp pools need one)"
    )
    reservation: Reservation | None = Field(
        default=None,
        description="capacity reserved in the cloud that the pool's nodes launch into (cloud "
        "pools; its placement replaces the pool's placement group)",
    )

    @property
    def size(self) -> int:
        """Nodes in the pool: its hosts, or its count."""
        return len(self.hosts) if self.hosts is not None else self.count or 0


class Partition(Model):
    """A partition over several compute pools, beside each pool's own: Slurm fills the lowest
    node weight first, so a job sent here runs on lasting nodes before elastic ones are made."""

    name: PoolName = Field(description="partition name (not a pool's)")
    pools: list[PoolName] = Field(min_length=1, description="compute pools whose nodes it holds")


SlurmName = Annotated[
    str,
    _matching(
        r"[a-z][a-z0-9_-]{0,31}",
        "{!r} is not a Slurm account or QoS name: lower-case letters, digits, _ and -, "
        "starting with a letter",
    ),
]
SlurmTime = Annotated[
    str,
    _matching(
        r"([0-9]{1,3}-)?[0-9]{1,2}:[0-9]{2}:[0-9]{2}|[0-9]{1,7}",
        "{!r} is not a Slurm time limit: write minutes (90), HH:MM:SS or D-HH:MM:SS (2-00:00:00)",
    ),
]
# The trackable resources a QoS may limit (sacctmgr(1)'s TRES): mem in megabytes
TRES_NAMES = ("cpu", "mem", "node", "billing", "gres/gpu")


class Qos(Model):
    """A quality of service: a priority, the QoS it may preempt, and limits on what its jobs
    hold (sacctmgr's GrpTRES, MaxTRES, MaxTRESPerUser, MaxWall)."""

    name: SlurmName = Field(description="QoS name; normal is Slurm's default one")
    priority: int = Field(default=0, ge=0, le=1_000_000, description="added to its jobs' priority")
    preempt: list[SlurmName] = Field(
        default=[], description="QoS whose running jobs this one's may requeue to start"
    )
    grp_tres: dict[str, int] = Field(
        default={},
        description="limits on all its running jobs together, by TRES, like {gres/gpu: 16} "
        "(cpu, mem in MB, node, billing, gres/gpu)",
    )
    max_tres_per_job: dict[str, int] = Field(default={}, description="limits on each job")
    max_tres_per_user: dict[str, int] = Field(
        default={}, description="limits on each user's running jobs together"
    )
    max_wall: SlurmTime | None = Field(
        default=None, description="longest time limit a job may have, like 2-00:00:00"
    )


class Account(Model):
    """A Slurm account: a node of the fair-share tree, with the users who charge to it."""

    name: SlurmName = Field(description="account name")
    parent: SlurmName | None = Field(
        default=None, description="the account it is under; unset: the root of the tree"
    )
    fairshare: int = Field(
        default=1, ge=1, le=1_000_000, description="its shares among its parent's children"
    )
    users: list[UserName] = Field(
        default=[],
        description="users (from users, or the directory's where there is one: identity) who "
        "may charge to it; a user's first account is their default",
    )
    qos: list[SlurmName] = Field(
        default=[], description="QoS its jobs may ask for; unset: Slurm's normal"
    )
    default_qos: SlurmName | None = Field(
        default=None, description="the QoS its jobs get unless they ask (one of qos)"
    )


class SlurmSettings(Model):
    """Slurm: accounting, the default partition and extra slurm.conf keys."""

    accounting: bool = Field(default=False, description="slurmdbd with MariaDB on the head pool")
    default_partition: PoolName | None = Field(
        default=None,
        description="pool or partition that is the default; the first compute pool if unset",
    )
    partitions: list[Partition] = Field(
        default=[], description="partitions over several pools (each pool keeps its own too)"
    )
    srun_port_range: PortRange = Field(
        default="60001-63000", description="ports srun listens on (SrunPortRange)"
    )
    suspend_time: int = Field(
        default=600,
        ge=30,
        le=7 * 86400,
        description="seconds an elastic node may stay idle before it is removed (SuspendTime)",
    )
    resume_timeout: int = Field(
        default=600,
        ge=60,
        le=86400,
        description="seconds an elastic node may take from created to registered (ResumeTimeout)",
    )
    burst_cooldown: int = Field(
        default=600,
        ge=0,
        le=86400,
        description=(
            "seconds elastic nodes that failed to start stay down before they are tried again"
        ),
    )
    qos: list[Qos] = Field(
        default=[], description="QoS in slurmdbd (accounting), kept as the spec has them"
    )
    accounts: list[Account] = Field(
        default=[],
        description="the accounts' tree in slurmdbd (accounting); with accounts, a user with "
        "no account is refused at submit, and jobs are ordered by fair share",
    )
    oci_runtime: Literal["runc", "crun"] | None = Field(
        default=None,
        description="Slurm's own OCI containers: `srun --container=BUNDLE` (and sbatch's, "
        "salloc's) runs each task in the user's OCI bundle (a root file system and its "
        "config.json), rootless as the job's user, through runc or crun from the OS's packages "
        "on the compute nodes (oci.conf); unset: --container is refused",
    )
    config: dict[SlurmKey, SlurmValue | int | bool] = Field(
        default={}, description="extra slurm.conf keys; they override the rendered defaults"
    )


# Kubernetes releases this version of provision is written and checked for: kubeadm's
# v1beta4 configuration API (1.31 on), containerd 1.6's CRI, and the pause image each pins.
KUBERNETES_MINORS = ("1.31", "1.32", "1.33")
_KUBE_VERSION_RE = re.compile(r"1\.([0-9]+)\.([0-9]+)")


def _kubernetes_version(value: str) -> str:
    match = _KUBE_VERSION_RE.fullmatch(value)
    if match is None:
        raise ValueError(
            f"{value!r} is not a Kubernetes release: give the exact one, e.g. 1.33.5 "
            "(kubeadm, kubelet and kubectl are installed and held at it)"
        )
    if f"1.{match[1]}" not in KUBERNETES_MINORS:
        raise ValueError(f"Kubernetes {value} is not supported: use a 1.31, 1.32 or 1.33 release")
    return value


KubernetesVersion = Annotated[str, AfterValidator(_kubernetes_version)]


class KubernetesSettings(Model):
    version: KubernetesVersion = Field(
        default="1.33.5",
        description="Kubernetes release (exact: 1.33.5); kubeadm, kubelet and kubectl are "
        "installed and held at it",
    )
    ha: bool = Field(
        default=False,
        description="highly available control plane: 3+ head nodes behind a virtual address "
        "(keepalived and haproxy on the heads; on heads in a cloud, its internal load "
        "balancer)",
    )
    api_address: ipaddress.IPv4Address | None = Field(
        default=None,
        description="the API's virtual address on the management network (ha: required); "
        "no node may have it; on heads in a cloud, a free address in their subnet, which the "
        "cloud's load balancer takes",
    )
    etcd: Literal["stacked", "external"] = Field(
        default="stacked",
        description="stacked: kubeadm runs etcd beside each API server; external: etcd runs on "
        "the head nodes as its own service, with its own certificates",
    )
    pod_cidr: ipaddress.IPv4Network = Field(
        default=ipaddress.IPv4Network("10.244.0.0/16"), description="pod network"
    )
    service_cidr: ipaddress.IPv4Network = Field(
        default=ipaddress.IPv4Network("10.96.0.0/12"), description="service network"
    )


class Software(Model):
    nvidia_driver: Version | None = Field(
        default=None, description="driver branch (550) or exact version (550.90.07)"
    )
    cuda: Version | None = Field(default=None, description="CUDA toolkit version (12.4)")
    cudnn: Version | None = Field(default=None, description="cuDNN version (9.1)")
    nccl: Version | None = Field(default=None, description="NCCL version (2.21.5)")
    slurm: Version | None = Field(
        default=None,
        description="Slurm version from the OS's packages (Debian 12: 22.05, Ubuntu 22.04: "
        "21.08, 24.04: 23.11, Rocky 9: EPEL's, checked on the node)",
    )
    dcgm: Version | None = Field(default=None, description="DCGM version (3.3.7)")
    container_toolkit: Version | None = Field(
        default=None, description="NVIDIA Container Toolkit version (1.16.2)"
    )
    nccl_tests: Version | None = Field(
        default=None, description="nccl-tests release built for verify (2.13.10)"
    )
    doca: Version | None = Field(
        default=None, description="DOCA-OFED release (2.9.1), with network.fabric.rdma doca"
    )
    efa: Version | None = Field(
        default=None,
        description="AWS EFA installer release for pools with EFA (1.50.0; its signature is "
        "checked against AWS's key); unset: the efa role's",
    )


class NvidiaSettings(Model):
    """Where the GPU software comes from and which parts a GPU node gets."""

    source: Literal["nvidia", "distro", "mirror"] = Field(
        default="nvidia",
        description="nvidia: NVIDIA's repositories; distro: Debian non-free / Ubuntu "
        "restricted; mirror: a local mirror of NVIDIA's repositories (air-gapped sites)",
    )
    mirror_url: Url | None = Field(
        default=None,
        description="base URL of the mirror (source mirror); NVIDIA's repository paths below it",
    )
    driver_modules: Literal["open", "dkms", "precompiled"] = Field(
        default="open",
        description="kernel modules: open (NVIDIA's open modules), dkms (proprietary, built "
        "on the node) or precompiled (signed builds for the distribution's kernel)",
    )
    reboot: bool = Field(
        default=False,
        description="reboot a node when its loaded kernel module differs from the installed "
        "driver (never in containers)",
    )
    dcgm: bool = Field(default=True, description="DCGM host engine on GPU nodes")
    dcgm_exporter_port: int = Field(
        default=9400, ge=1, le=65535, description="port of the DCGM exporter (Prometheus)"
    )
    dcgm_exporter_url: Url | None = Field(
        default=None,
        description="URL of a dcgm-exporter binary (NVIDIA ships it as a container image); "
        "unset: only the host engine runs",
    )
    dcgm_exporter_sha256: Sha256 | None = Field(
        default=None, description="SHA-256 of that binary; required with dcgm_exporter_url"
    )
    container_toolkit: bool = Field(
        default=True, description="NVIDIA Container Toolkit (enroot/pyxis, containers)"
    )
    enroot: bool = Field(
        default=False,
        description="Enroot on the GPU nodes and Pyxis on every Slurm node: users' jobs in "
        "containers (srun --container-image); NVIDIA's release packages, checked against "
        "enroot_sha256, enroot_caps_sha256 and pyxis_sha256",
    )
    enroot_version: Version = Field(default="3.5.0", description="Enroot release")
    enroot_sha256: Sha256 | None = Field(
        default=None,
        description="SHA-256 of the enroot package of that release for the cluster's OS (the "
        ".deb on Debian and Ubuntu, the .rpm on Rocky)",
    )
    enroot_caps_sha256: Sha256 | None = Field(
        default=None, description="SHA-256 of its enroot+caps package (the same OS's)"
    )
    pyxis_version: Version = Field(
        default="0.20.0", description="Pyxis release (built on the node)"
    )
    pyxis_sha256: Sha256 | None = Field(
        default=None, description="SHA-256 of the Pyxis source archive of that release"
    )
    enroot_scratch: AbsPath = Field(
        default="/var/lib/enroot",
        description="each GPU node's local scratch, where Enroot keeps the users' images and "
        "unpacked containers (/raid on DGX)",
    )
    nccl_tests: bool = Field(default=True, description="build nccl-tests for `provision verify`")
    nccl_tests_sha256: Sha256 | None = Field(
        default=None,
        description="SHA-256 of the nccl-tests source archive; the build refuses an archive "
        "without one",
    )


class AdminUser(Model):
    name: UserName = Field(description="login name")
    ssh_keys: list[SshPublicKey] = Field(
        min_length=1, description="public keys; the only way in (no passwords)"
    )
    sudo: bool = Field(default=True, description="passwordless sudo")
    uid: int | None = Field(
        default=None,
        ge=1000,
        le=59999,
        description="user and group ID, the same on every node; needed when /home is on shared "
        "storage (storage.mounts), where files have one owner everywhere; unset: the node's next",
    )


class Group(Model):
    """A group of the cluster's users, the same on every node."""

    name: UserName = Field(description="group name")
    gid: int = Field(ge=1000, le=59999, description="group ID, the same on every node")


class User(Model):
    """A person who runs jobs: an account on every node, the same ID everywhere, no sudo."""

    name: UserName = Field(description="login name")
    uid: int = Field(
        ge=1000,
        le=59999,
        description="user ID, the same on every node, and the ID of the user's own group; "
        "files on shared storage have one owner everywhere",
    )
    groups: list[UserName] = Field(
        default=[], description="groups (from groups) the user is also in"
    )
    ssh_keys: list[SshPublicKey] = Field(
        default=[],
        description="public keys that log the user in to the login nodes (the heads where the "
        "cluster has no login pool); no passwords",
    )


DirectoryKind = Literal["ldap", "active_directory", "freeipa"]
# the LDAP schema SSSD reads each kind of directory with, and the attribute its keys are in
DIRECTORY_SCHEMAS: dict[str, str] = {"ldap": "rfc2307", "active_directory": "ad", "freeipa": "ipa"}
DIRECTORY_KEY_ATTRIBUTES: dict[str, str] = {
    "ldap": "sshPublicKey",  # the openssh-lpk schema's
    "active_directory": "sshPublicKey",  # a site's extension: AD has none of its own
    "freeipa": "ipaSshPubKey",
}
LdapUri = Annotated[
    str,
    _matching(
        r"ldaps?://[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?(:[0-9]{1,5})?",
        "{!r} is not an LDAP server: write it like ldaps://ldap.example.org (or ldap:// with "
        "StartTLS), with no path",
    ),
]
# RFC 4514's distinguished names, less what an INI file or a shell reads as its own
DistinguishedName = Annotated[
    str,
    _matching(
        r"[A-Za-z][A-Za-z0-9-]*=[^=,;#\\\"<>]+(,\s*[A-Za-z][A-Za-z0-9-]*=[^=,;#\\\"<>]+)*",
        "{!r} is not a distinguished name: write it like dc=example,dc=org",
    ),
]
DirectoryName = Annotated[
    str,
    _matching(
        r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}",
        "{!r} is not a directory group name: letters, digits, '.', '_' and '-' (a name with "
        "spaces or commas is not supported yet)",
    ),
]
LdapAttribute = Annotated[
    str, _matching(r"[A-Za-z][A-Za-z0-9-]{0,63}", "{!r} is not an LDAP attribute name")
]


class Identity(Model):
    """A directory the nodes take users and groups from (SSSD): LDAP, Active Directory or
    FreeIPA, read over TLS, with access limited to some of its groups."""

    kind: DirectoryKind = Field(
        default="ldap",
        description="ldap (RFC 2307 posixAccount/posixGroup, like OpenLDAP's nis schema), "
        "active_directory (its uidNumber/gidNumber: IDs are the directory's, not mapped), "
        "freeipa (read over LDAP; the nodes are not enrolled)",
    )
    rfc2307bis: bool = Field(
        default=False,
        description="kind ldap: groups list their members by DN (groupOfNames' member), not "
        "by name (memberUid)",
    )
    uris: list[LdapUri] = Field(
        min_length=1,
        description="the directory's servers, tried in order: all ldaps://, or all ldap:// "
        "(then StartTLS is required); never in the clear",
    )
    base_dn: DistinguishedName = Field(description="where users and groups are searched")
    ca_file: CaFile = Field(
        description="the CA certificate(s) that sign the servers' certificates (PEM; beside "
        "the spec, in a secrets directory or the system's certificate directories): the nodes "
        "trust no other for the directory"
    )
    bind_dn: DistinguishedName | None = Field(
        default=None,
        description="the account the nodes read the directory as (unset: anonymously)",
    )
    bind_password_file: SecretFile | None = Field(
        default=None,
        description="file on the workstation holding bind_dn's password (one line, mode 0600, "
        "beside the spec or in a secrets directory); it reaches the nodes in a file only root "
        "reads, never the spec, the rendered files or the logs",
    )
    allowed_groups: list[DirectoryName] = Field(
        min_length=1,
        description="the directory groups whose members may log in (to the login nodes, or "
        "the heads where there is no login pool); the directory's other users are refused",
    )
    ssh_key_attribute: LdapAttribute | None = Field(
        default=None,
        description="the attribute holding a user's SSH public keys (unset: sshPublicKey; "
        "ipaSshPubKey on FreeIPA); keys are the only way in",
    )

    @property
    def schema_name(self) -> str:
        if self.kind == "ldap" and self.rfc2307bis:
            return "rfc2307bis"
        return DIRECTORY_SCHEMAS[self.kind]

    @property
    def key_attribute(self) -> str:
        return self.ssh_key_attribute or DIRECTORY_KEY_ATTRIBUTES[self.kind]


class FirewallRule(Model):
    name: PoolName = Field(description="short name; appears as a comment in the rule set")
    port: PortRange = Field(description="port or range, like 8888 or 30000-32767")
    protocol: Literal["tcp", "udp"] = "tcp"
    sources: list[ipaddress.IPv4Network | Literal["cluster", "admin"]] = Field(
        min_length=1, description="CIDRs, 'cluster' (all node addresses) or 'admin'"
    )
    pools: list[PoolName] | None = Field(
        default=None, description="pools it applies to; all if unset"
    )
    open_to_internet: bool = Field(
        default=False,
        description="opt-in: the sources may admit more than a /8 of public addresses "
        "(0.0.0.0/0 included)",
    )


class Security(Model):
    """Admin networks and users, and the firewall's extra rules."""

    admin_cidrs: list[ipaddress.IPv4Network] = Field(
        min_length=1, description="networks allowed to reach SSH and the admin services"
    )
    allow_admin_from_anywhere: bool = Field(
        default=False,
        description="opt-in needed before the admin networks may cover more than a /8 of "
        "public addresses (0.0.0.0/0 included)",
    )
    admins: list[AdminUser] = Field(default=[], description="admin users on every node")
    user_cidrs: list[ipaddress.IPv4Network] = Field(
        default=[],
        description="networks the users (users) log in from: SSH on the login nodes, or the "
        "heads where there is no login pool; the admin networks reach every node's SSH",
    )
    firewall_rules: list[FirewallRule] = Field(
        default=[], description="extra ports to open, beyond the services the cluster runs"
    )


class SshAccess(Model):
    user: UserName = Field(
        default="root",
        description="user Ansible logs in as (sudo if not root); on AWS nodes the image's own "
        "(ubuntu, admin on Debian, rocky), on Azure and GCP azureuser and provision in place "
        "of root",
    )
    port: int = Field(default=22, ge=1, le=65535, description="SSH port")
    private_key_file: SshKeyFile | None = Field(
        default=None,
        description="path to the private key, beside the spec, in ~/.ssh or a secrets "
        "directory; the lab generates its own",
    )


class Converge(Model):
    mode: Literal["auto", "push", "pull"] = Field(
        default="auto",
        description="how the roles reach the nodes: push (this workstation runs every node's "
        "tasks over SSH), pull (the heads by push, then each compute and login node runs the "
        "same roles with its own Ansible, which provision sends it: the workstation's work no "
        "longer grows with the nodes; Slurm clusters on debian12 and ubuntu24.04), auto (pull "
        "from 50 compute and login nodes where pull is supported, else push)",
    )


class ExportClient(Model):
    """Who may mount an export, and how: the nodes of some pools, or a network."""

    pools: list[PoolName] | None = Field(
        default=None, description="pools whose nodes may mount it (by their addresses)"
    )
    network: ipaddress.IPv4Network | None = Field(
        default=None, description="or a network that may mount it, like 10.1.0.0/16"
    )
    access: Literal["rw", "ro"] = Field(default="rw", description="read-write or read-only")
    squash: Literal["root", "none", "all"] = Field(
        default="root",
        description="users mapped to nobody: root (root_squash), none (no_root_squash), all",
    )

    @model_validator(mode="after")
    def _pools_or_network(self) -> ExportClient:
        if (self.pools is None) == (self.network is None):
            raise ValueError("give either pools or network")
        return self


class Export(Model):
    pool: PoolName = Field(description="pool whose nodes serve this export")
    path: AbsPath = Field(description="directory to export")
    clients: list[ExportClient] = Field(
        default=[],
        description="who may mount it; unset: every node of the cluster, read-write, root squashed",
    )


class Mount(Model):
    source: MountSource = Field(
        description="nfs/nfs4: 'server:/path', a node name or address, then the export; "
        "lustre: 'mgsnid[:mgsnid]:/fsname', like 10.0.0.5@tcp:/scratch"
    )
    path: AbsPath = Field(description="mount point")
    pools: list[PoolName] | None = Field(
        default=None, description="pools that mount it; all if unset"
    )
    fstype: Literal["nfs", "nfs4", "lustre"] = Field(
        default="nfs4", description="nfs4 (also a Weka or other appliance's NFS), nfs, lustre"
    )
    options: NfsOptions = Field(default="defaults,_netdev", description="mount options")


class Storage(Model):
    nfs_server: Literal["ganesha", "kernel"] = Field(
        default="ganesha",
        description="the exports' NFSv4 server: ganesha (nfs-ganesha, in user space: it runs "
        "in containers too) or kernel (the kernel's nfsd: nfs-kernel-server, nfs-utils on "
        "Rocky), NFSv4 alone either way",
    )
    exports: list[Export] = Field(default=[], description="directories nodes serve over NFSv4")
    mounts: list[Mount] = Field(default=[], description="what nodes mount")


class EmailReceiver(Model):
    """Mail through an SMTP relay; the password stays in a file on the workstation."""

    to: EmailAddress = Field(description="address the alerts go to")
    sender: EmailAddress = Field(
        description="address the alerts come from (the relay may insist on one)"
    )
    smarthost: HostPort = Field(
        description="the SMTP relay, as host:port, like mail.example.org:587"
    )
    require_tls: bool = Field(
        default=True, description="insist on STARTTLS (false for a relay on a trusted network)"
    )
    username: SmtpUser | None = Field(
        default=None,
        description="user name the relay knows the cluster by (LOGIN/PLAIN/CRAM-MD5 auth)",
    )
    password_file: SecretFile | None = Field(
        default=None,
        description="file on the workstation holding that user's password (one line, mode 0600), "
        "beside the spec or in a secrets directory ($PROVISION_SECRETS_DIR, by default "
        "~/.config/provision); it is copied to the monitoring node, readable by Alertmanager only",
    )


class Receiver(Model):
    """Where Alertmanager sends the cluster's alerts: a webhook or a mailbox."""

    name: PoolName = Field(description="short name of the receiver")
    webhook: Url | None = Field(
        default=None,
        description="URL Alertmanager POSTs each group of alerts to, as JSON (its webhook format)",
    )
    email: EmailReceiver | None = Field(default=None, description="or mail through an SMTP relay")


class Grafana(Model):
    """Grafana beside Prometheus, from Grafana's own package repository, with this project's
    dashboards (cluster, GPU health, fabric, Slurm queue) provisioned from files."""

    port: int = Field(default=3000, ge=1, le=65535, description="Grafana's web port")


class Monitoring(Model):
    """Prometheus and Alertmanager on one node, a node exporter on every node."""

    pool: PoolName | None = Field(
        default=None,
        description="pool whose first node runs Prometheus and Alertmanager; unset: the head pool",
    )
    prometheus_port: int = Field(default=9090, ge=1, le=65535, description="Prometheus' web port")
    alertmanager_port: int = Field(
        default=9093, ge=1, le=65535, description="Alertmanager's web port"
    )
    node_exporter_port: int = Field(
        default=9100, ge=1, le=65535, description="node exporter's port on every node"
    )
    scrape_interval: Duration = Field(
        default="15s", description="how often Prometheus reads every target"
    )
    retention: Duration = Field(default="15d", description="how long Prometheus keeps samples")
    storage_path: AbsPath = Field(
        default="/var/lib/prometheus/metrics2",
        description="directory of Prometheus' database on the monitoring node",
    )
    receivers: list[Receiver] = Field(
        default=[], description="who gets the alerts; none: they show in Alertmanager only"
    )
    grafana: Grafana | None = Field(
        default=None,
        description="Grafana on the monitoring node; its admin password is a cluster secret "
        "(grafana-admin.password in the state directory)",
    )


class DiskThreshold(Model):
    path: Directory = Field(description="a directory on the file system to watch, like /")
    min_free_percent: int = Field(
        ge=1, le=99, description="the node is drained when less than this much stays free"
    )


class DcgmDiag(Model):
    """DCGM's diagnostics (`dcgmi diag -r LEVEL`) on the GPU pools' nodes, as a health check:
    a failure drains the node naming the failed test."""

    level: int = Field(
        default=1,
        ge=1,
        le=3,
        description="1: software and deployment (seconds); 2: adds PCIe and memory (about two "
        "minutes); 3: adds stress, power and bandwidth (about half an hour)",
    )
    when: Literal["prolog", "periodic"] = Field(
        default="prolog",
        description="before every job (levels 1 and 2), or every `every` seconds on an idle "
        "node, held by a drain while it runs (levels 2 and 3 from a timer of their own, "
        "provision-dcgm-diag.timer, outside slurmd's 60 s limit on its health program)",
    )
    every: int | None = Field(
        default=None,
        ge=60,
        le=30 * 86400,
        description="periodic: seconds between two passing runs on a node; unset: a day",
    )


class Health(Model):
    """Checks slurmd runs on every compute node: a failing one drains the node, naming it."""

    interval: int = Field(
        default=300,
        ge=10,
        le=86400,
        description="seconds between runs on each node (Slurm's HealthCheckInterval)",
    )
    prolog: bool = Field(
        default=True,
        description="also run the checks before every job on GPU nodes (Slurm's Prolog): a "
        "failing check drains the node and the job goes back to the queue",
    )
    dcgm_diag: DcgmDiag | None = Field(
        default=None, description="DCGM's diagnostics too (needs nvidia.dcgm and a GPU pool)"
    )
    disks: list[DiskThreshold] = Field(
        default=[DiskThreshold(path="/", min_free_percent=5)],
        description="file systems that must keep free space; the spec's mounts, GPUs and "
        "fabric ports are checked as the profile and storage.mounts say",
    )


class Spec(Model):
    """A GPU cluster: where its nodes come from and what runs on them."""

    name: Hostname = Field(description="cluster name; names the state directory and resources")
    os: OsName = Field(description="operating system every node runs")
    scheduler: SchedulerKind = Field(
        default="slurm",
        description="workload manager: Slurm, or Kubernetes (kubeadm, Calico, the device plugin)",
    )
    slurm: SlurmSettings = Field(default=SlurmSettings(), description="Slurm settings")
    kubernetes: KubernetesSettings = Field(
        default=KubernetesSettings(),
        description="Kubernetes settings (scheduler kubernetes)",
    )
    network: Networks = Field(description="management, out-of-band and fabric networks")
    pools: list[Pool] = Field(min_length=1, description="groups of identical nodes")
    software: Software = Field(default=Software(), description="pinned software versions")
    nvidia: NvidiaSettings = Field(
        default=NvidiaSettings(), description="GPU software: package source and parts"
    )
    security: Security = Field(description="who may reach the nodes, and how")
    ssh: SshAccess = Field(default=SshAccess(), description="how Ansible logs in to the nodes")
    converge: Converge = Field(
        default=Converge(), description="how the roles reach the nodes: push or pull"
    )
    storage: Storage = Field(
        default=Storage(), description="NFS exports the cluster serves, and what nodes mount"
    )
    groups: list[Group] = Field(default=[], description="groups of the cluster's users")
    users: list[User] = Field(
        default=[],
        description="the cluster's users: on every node with pinned IDs; one removed from the "
        "list is locked out (its home kept)",
    )
    identity: Identity | None = Field(
        default=None,
        description="a directory (LDAP, Active Directory, FreeIPA) the nodes take more users "
        "and groups from, through SSSD",
    )
    health: Health | None = Field(
        default=None,
        description="node health checks that drain a sick compute node and resume it once well "
        "(Slurm)",
    )
    monitoring: Monitoring | None = Field(
        default=None,
        description="Prometheus, Alertmanager and node exporters, with the cluster's alert rules",
    )
    profiles: dict[ProfileName, Profile] = Field(
        default={}, description="extra hardware profiles, by name, beside the built-in ones"
    )

    @property
    def monitoring_pool(self) -> str | None:
        """The pool whose first node runs Prometheus and Alertmanager, if any."""
        if self.monitoring is None:
            return None
        heads = [p.name for p in self.pools if p.role == "head"]
        return self.monitoring.pool or (heads[0] if heads else None)

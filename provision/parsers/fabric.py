"""Pure functions over the RDMA tools' output (ibstat, ibv_devinfo, sminfo, perfquery,
ib_write_bw), and the fabric findings drawn from them.

Standard library only, like gpu_parsers: a script can load it on a node with python3 alone.
Tested on the outputs in tests/data/fabric/ (see its README for which were recorded where).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# ibstat prints the port rate in Gb/s; the names the trade uses for each
RATE_NAMES = {
    10: "SDR",
    20: "DDR",
    40: "QDR",
    56: "FDR",
    100: "EDR",
    200: "HDR",
    400: "NDR",
    800: "XDR",
}
# ib_write_bw a healthy link reaches, as a share of its rate (400G NDR: 375 Gb/s)
WRITE_BW_SHARE = 0.9375


@dataclass(frozen=True)
class Port:
    number: int
    state: str  # Active, Down, Initializing, ...
    physical: str  # LinkUp, Polling, Disabled, ...
    rate_gbps: int | None
    link_layer: str  # InfiniBand or Ethernet
    sm_lid: int | None = None
    lid: int | None = None


@dataclass(frozen=True)
class Ca:
    name: str
    ca_type: str = ""
    firmware: str = ""
    ports: tuple[Port, ...] = field(default=())


def _int(text: str) -> int | None:
    text = text.strip()
    try:
        return int(text, 0)
    except ValueError:
        return None


def parse_ibstat(text: str) -> list[Ca]:
    """`ibstat`: one block per CA ("CA 'mlx5_0'"), its ports indented below."""
    cas: list[Ca] = []
    ca: dict[str, object] | None = None
    port: dict[str, str] | None = None
    ports: list[Port] = []

    def close_port() -> None:
        nonlocal port
        if port is not None:
            ports.append(
                Port(
                    number=int(port["number"]),
                    state=port.get("State", ""),
                    physical=port.get("Physical state", ""),
                    # "400", or with the speed's name where it has one: "10 (FDR10)"
                    rate_gbps=_int(port.get("Rate", "").split(" (")[0]),
                    link_layer=port.get("Link layer", ""),
                    sm_lid=_int(port.get("SM lid", "")),
                    lid=_int(port.get("Base lid", "")),
                )
            )
            port = None

    def close_ca() -> None:
        nonlocal ca, ports
        close_port()
        if ca is not None:
            cas.append(
                Ca(
                    str(ca["name"]),
                    str(ca.get("CA type", "")),
                    str(ca.get("Firmware version", "")),
                    tuple(ports),
                )
            )
        ca, ports = None, []

    for line in text.splitlines():
        m = re.match(r"^CA '([^']+)'", line)
        if m:
            close_ca()
            ca = {"name": m.group(1)}
            continue
        m = re.match(r"^\s+Port (\d+):\s*$", line)
        if m and ca is not None:
            close_port()
            port = {"number": m.group(1)}
            continue
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        if port is not None:
            port[key] = value.strip()
        elif ca is not None:
            ca[key] = value.strip()
    close_ca()
    return cas


@dataclass(frozen=True)
class DevPort:
    device: str
    port: int
    state: str  # PORT_ACTIVE, PORT_DOWN, ...
    active_mtu: int | None
    link_layer: str


def parse_ibv_devinfo(text: str) -> list[DevPort]:
    """`ibv_devinfo`: "hca_id: mlx5_0" blocks, then "port: 1" blocks with their fields."""
    out: list[DevPort] = []
    device = ""
    fields: dict[str, str] | None = None

    def close() -> None:
        nonlocal fields
        if fields is not None:
            mtu = re.match(r"\s*(\d+)", fields.get("active_mtu", ""))
            out.append(
                DevPort(
                    device,
                    int(fields["port"]),
                    fields.get("state", "").split(" ")[0],
                    int(mtu.group(1)) if mtu else None,
                    fields.get("link_layer", ""),
                )
            )
            fields = None

    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        value = value.strip()
        if key == "hca_id":
            close()
            device = value
        elif key == "port":
            close()
            fields = {"port": value}
        elif fields is not None:
            fields[key] = value
    close()
    return out


@dataclass(frozen=True)
class SmInfo:
    lid: int
    guid: str
    priority: int
    state: str  # SMINFO_MASTER, SMINFO_STANDBY, ...


def parse_sminfo(text: str) -> SmInfo | None:
    """`sminfo`: "sminfo: sm lid 1 sm guid 0x..., activity count N priority P state S NAME"."""
    m = re.search(
        r"sm lid (\d+) sm guid (0x[0-9a-fA-F]+), activity count \d+ priority (\d+) "
        r"state \d+ (\w+)",
        text,
    )
    if not m:
        return None
    return SmInfo(int(m.group(1)), m.group(2), int(m.group(3)), m.group(4))


def parse_perfquery(text: str) -> dict[str, int]:
    """`perfquery`: "Name:.....value" lines; the counters, by name."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+):\.*(\S+)\s*$", line.strip())
        if m:
            value = _int(m.group(2))
            if value is not None:
                out[m.group(1)] = value
    return out


@dataclass(frozen=True)
class WriteBw:
    size_bytes: int
    iterations: int
    peak_gbps: float
    average_gbps: float


def parse_ib_write_bw(text: str) -> WriteBw | None:
    """`ib_write_bw --report_gbits` (client or server): the row under the "#bytes" header."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("#bytes") and "BW average" in line:
            for row in lines[i + 1 :]:
                cols = row.split()
                if len(cols) >= 4 and cols[0].isdigit():
                    try:
                        return WriteBw(int(cols[0]), int(cols[1]), float(cols[2]), float(cols[3]))
                    except ValueError:
                        return None
            return None
    return None


# --- findings --------------------------------------------------------------------------------


def rate_name(gbps: int) -> str:
    return f"{RATE_NAMES[gbps]} {gbps}" if gbps in RATE_NAMES else f"{gbps} Gb/s"


def fabric_devices(cas: list[Ca], devices: list[str], link_layer: str) -> list[str]:
    """The adapters to check: the profile's names, or every CA with a port of the link layer."""
    return devices or sorted(
        {ca.name for ca in cas for p in ca.ports if p.link_layer.lower() == link_layer.lower()}
    )


def hca_findings(
    cas: list[Ca], devices: list[str], count: int, rate_gbps: int, link_layer: str
) -> list[tuple[str, bool, str]]:
    """Every fabric adapter present, its port Active/LinkUp at the expected rate.

    `devices`: the profile's names for the adapters (may be empty: then any `count` adapters
    of the link layer); `link_layer`: InfiniBand or Ethernet (RoCE)."""
    ports = {
        ca.name: p for ca in cas for p in ca.ports if p.link_layer.lower() == link_layer.lower()
    }
    wanted = fabric_devices(cas, devices, link_layer)[: len(devices) or count]
    out: list[tuple[str, bool, str]] = []
    missing = [d for d in devices if d not in ports]
    found = len(wanted) - len(missing) if devices else len(ports)
    out.append(
        (
            "hca count",
            found >= count and not missing,
            f"{found} of {count} {link_layer} adapters"
            + (f"; missing {', '.join(missing)}" if missing else ""),
        )
    )
    for name in wanted:
        port = ports.get(name)
        if port is None:
            continue
        up = port.state == "Active" and port.physical == "LinkUp"
        at_rate = port.rate_gbps == rate_gbps
        out.append(
            (
                f"hca {name}",
                up and at_rate,
                f"port {port.number} {port.state}/{port.physical} at "
                f"{rate_name(port.rate_gbps) if port.rate_gbps else 'no rate'}"
                + ("" if at_rate else f", expected {rate_name(rate_gbps)}"),
            )
        )
    return out


def sm_finding(info: SmInfo | None, raw: str) -> tuple[str, bool, str]:
    if info is None:
        first = next((ln.strip() for ln in raw.splitlines() if ln.strip()), "no answer")
        return ("subnet manager", False, f"not reachable: {first[:120]}")
    return (
        "subnet manager",
        info.state == "SMINFO_MASTER",
        f"master at lid {info.lid} ({info.guid}, priority {info.priority})"
        if info.state == "SMINFO_MASTER"
        else f"lid {info.lid} answers as {info.state}, not master",
    )


def link_flap_finding(device: str, counters: dict[str, int], limit: int) -> tuple[str, bool, str]:
    downed = counters.get("LinkDownedCounter")
    recoveries = counters.get("LinkErrorRecoveryCounter", 0)
    symbols = counters.get("SymbolErrorCounter", 0)
    if downed is None:
        return (f"link flaps {device}", False, "no LinkDownedCounter in perfquery's answer")
    return (
        f"link flaps {device}",
        downed <= limit,
        f"{downed} link-down events (limit {limit}), {recoveries} error recoveries, "
        f"{symbols} symbol errors",
    )


def write_bw_threshold(rate_gbps: int, override: float | None) -> float:
    return override if override is not None else round(rate_gbps * WRITE_BW_SHARE, 2)


def write_bw_finding(
    pair: str, device: str, result: WriteBw | None, raw: str, threshold: float
) -> tuple[str, bool, str]:
    name = f"ib_write_bw {pair} {device}"
    if result is None and "GPU buffer" in raw and "Couldn't allocate MR" in raw:
        # perftest made its buffer in GPU memory, and the adapter could not register it
        return (
            name,
            False,
            "GPU memory could not be registered with the adapter (Couldn't allocate MR): "
            "GPUDirect RDMA does not work here (nvidia-peermem not loaded, or no DMA-BUF)",
        )
    if result is None:
        tail = " ".join(raw.split())[-160:] or "no output"
        return (name, False, f"no result: {tail}")
    return (
        name,
        result.average_gbps >= threshold,
        f"{result.average_gbps:.2f} Gb/s average at {result.size_bytes} B "
        f"(threshold {threshold:g})",
    )


# --- EFA (AWS): libfabric's efa provider and the aws-ofi-nccl plugin ---------------------------

# where AWS's installer puts fi_info, and the plugin's library name (NCCL loads libnccl-net*.so)
FI_INFO = "/opt/amazon/efa/bin/fi_info"
OFI_NCCL_DIR = "/opt/amazon/ofi-nccl/"


def parse_fi_info(text: str) -> list[str]:
    """The efa provider's reliable-datagram domains in `fi_info -p efa -t FI_EP_RDM`: one per
    EFA device (rdmap79s0-rdm on a p5, efa_0-rdm from older libfabric)."""
    domains: list[str] = []
    provider = domain = ""
    for line in text.splitlines():
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if key == "provider":
            provider, domain = value, ""
        elif key == "domain":
            domain = value
        elif key == "type" and value == "FI_EP_RDM" and provider == "efa" and domain:
            domains.append(domain)
    return list(dict.fromkeys(domains))


def ofi_nccl_libraries(ldconfig_p: str) -> list[str]:
    """The NCCL network plugins the dynamic linker finds under the plugin's directory
    (`ldconfig -p`: '\tlibnccl-net-ofi.so (libc6,x86-64) => /opt/amazon/ofi-nccl/lib/...')."""
    out = []
    for line in ldconfig_p.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libnccl-net") and path.startswith(OFI_NCCL_DIR):
            out.append(path)
    return out


def efa_findings(rc: int, fi_info: str, count: int, ldconfig_p: str) -> list[tuple[str, bool, str]]:
    """Every EFA interface the profile promises answers as an efa domain of libfabric, and the
    dynamic linker finds aws-ofi-nccl (else NCCL falls back to TCP sockets)."""
    domains = parse_fi_info(fi_info) if rc == 0 else []
    if rc != 0 and not domains:
        first = next((ln.strip() for ln in fi_info.splitlines() if ln.strip()), f"exit {rc}")
        efa = ("efa", False, f"libfabric's efa provider has no device: {first[:120]}")
    else:
        shown = ", ".join(domains[:2]) + (", ..." if len(domains) > 2 else "")
        efa = (
            "efa",
            len(domains) >= count,
            f"{len(domains)} of {count} EFA devices in libfabric's efa provider"
            + (f" ({shown})" if domains else ""),
        )
    plugins = ofi_nccl_libraries(ldconfig_p)
    plugin = (
        "efa.nccl_plugin",
        bool(plugins),
        f"aws-ofi-nccl found by the dynamic linker: {plugins[0]}"
        if plugins
        else f"no libnccl-net*.so under {OFI_NCCL_DIR} in the dynamic linker's cache: NCCL "
        "would fall back to TCP sockets",
    )
    return [efa, plugin]

"""The fabric: addressing from the spec, the NCCL settings, and the parsers and findings of the
RDMA tools on the outputs in tests/data/fabric/ (README there says which were recorded where)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from provision.cluster import Cluster
from provision.parsers import fabric as fp
from provision.render.gpu import nccl_settings
from provision.spec.fabric import fabric_addresses, rail_subnets, rails
from provision.spec.loader import load_spec
from provision.spec.nodes import expand_nodes
from provision.spec.profiles import load_profiles
from provision.verify.fabric import pairs, write_bw_command

from .conftest import ROOT, load_rendered

DATA = Path(__file__).parent / "data" / "fabric"
DGX_DEVICES = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]


def _read(name: str) -> str:
    return (DATA / name).read_text()


# --- addressing ------------------------------------------------------------------------------


def test_rails_split_the_subnet_and_keep_the_management_offset() -> None:
    spec = load_spec(ROOT / "examples" / "dgx-8.yaml")
    addresses, problems = fabric_addresses(spec, load_profiles(spec.profiles), expand_nodes(spec))
    assert problems == []
    assert "head01" not in addresses  # no InfiniBand adapter, no fabric address
    dgx01 = addresses["dgx01"]
    # 10.20.0.21 is host 21 of its /24; eight rails of 10.22.0.0/16 are eight /19s
    assert dgx01 == [f"10.22.{32 * r}.21/19" for r in range(8)]
    assert len({a for addrs in addresses.values() for a in addrs}) == 8 * 8


def test_addresses_do_not_move_when_a_pool_is_added_before() -> None:
    spec = load_spec(ROOT / "examples" / "dgx-8.yaml")
    profiles = load_profiles(spec.profiles)
    before, _ = fabric_addresses(spec, profiles, expand_nodes(spec))
    extra = spec.pools[1].model_copy(
        update={
            "name": "early",
            "hostname_prefix": "early",
            "count": 2,
            "first_address": ipaddress.IPv4Address("10.20.0.100"),
        }
    )
    grown = spec.model_copy(update={"pools": [spec.pools[0], extra, *spec.pools[1:]]})
    after, problems = fabric_addresses(grown, profiles, expand_nodes(grown))
    assert problems == []
    assert {k: v for k, v in after.items() if k in before} == before
    assert after["early01"][0] == "10.22.0.100/19"


def test_rail_subnets() -> None:
    net = ipaddress.IPv4Network("10.12.0.0/16")
    assert rail_subnets(net, 1) == [net]
    assert [str(s) for s in rail_subnets(net, 3)] == [
        "10.12.0.0/18",
        "10.12.64.0/18",
        "10.12.128.0/18",
    ]
    assert rail_subnets(ipaddress.IPv4Network("10.0.0.0/30"), 2) == []  # /31s hold no host


def test_rails_take_the_profiles_names_or_ib_n() -> None:
    profiles = load_profiles({})
    dgx = rails(profiles["dgx-h100"], "infiniband")
    assert [r.device for r in dgx] == DGX_DEVICES
    assert dgx[0].netdev == "ibp24s0" and dgx[-1].netdev == "ibp220s0"
    a100 = rails(profiles["dgx-a100"], "infiniband")
    assert [r.netdev for r in a100][:2] == ["ib0", "ib1"] and a100[0].device is None
    assert rails(profiles["dgx-h100"], "roce") == []  # its Ethernet adapters are for storage
    assert rails(profiles["l40s-pcie"], "roce")[1].netdev == "ens1f1np1"


def test_nccl_settings_come_from_the_fabric() -> None:
    cluster = Cluster(load_spec(ROOT / "examples" / "k8s.yaml"))
    view = next(v for v in cluster.pools if v.profile.gpu)
    settings = {k: v for k, v, _ in nccl_settings(cluster, view)}
    assert settings["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"
    assert settings["NCCL_IB_TC"] == "106" and settings["NCCL_IB_GID_INDEX"] == "3"
    dgx8 = Cluster(load_spec(ROOT / "examples" / "dgx-8.yaml"))
    view = next(v for v in dgx8.pools if v.profile.gpu)
    settings = {k: v for k, v, _ in nccl_settings(dgx8, view)}
    assert settings["NCCL_SOCKET_IFNAME"] == "enp170s0f0"
    assert settings["NCCL_IB_HCA"] == "=" + ",".join(DGX_DEVICES)
    assert "NCCL_IB_TC" not in settings


def test_inventory_carries_addresses_and_subnet_manager_priorities() -> None:
    from provision.render import render_inventory

    inventory = load_rendered(
        render_inventory(Cluster(load_spec(ROOT / "examples" / "dgx-8.yaml")))
    )["all"]["children"]
    assert inventory["subnet_manager"]["hosts"] == {
        "dgx01": {"opensm_priority": 15},
        "dgx02": {"opensm_priority": 14},
    }
    assert sorted(inventory["fabric"]["hosts"]) == [f"dgx{i:02d}" for i in range(1, 9)]
    pool = inventory["pool_dgx"]
    assert pool["vars"]["provision_fabric_devices"] == DGX_DEVICES
    assert pool["hosts"]["dgx08"]["provision_fabric_addresses"][7] == "10.22.224.28/19"


# --- parsers ---------------------------------------------------------------------------------


def test_ibstat_healthy_dgx() -> None:
    cas = fp.parse_ibstat(_read("ibstat-dgx-healthy.txt"))
    assert len(cas) == 12
    assert cas[0].name == "mlx5_0" and cas[0].firmware == "28.39.1002"
    port = cas[0].ports[0]
    assert (port.state, port.physical, port.rate_gbps, port.link_layer, port.sm_lid) == (
        "Active",
        "LinkUp",
        400,
        "InfiniBand",
        1,
    )
    findings = fp.hca_findings(cas, DGX_DEVICES, 8, 400, "InfiniBand")
    assert all(ok for _, ok, _ in findings), findings
    assert findings[0] == ("hca count", True, "8 of 8 InfiniBand adapters")


def test_ibstat_degraded_port_and_rate() -> None:
    findings = dict(
        (name, (ok, ev))
        for name, ok, ev in fp.hca_findings(
            fp.parse_ibstat(_read("ibstat-dgx-degraded.txt")), DGX_DEVICES, 8, 400, "InfiniBand"
        )
    )
    assert findings["hca mlx5_4"] == (False, "port 1 Down/Polling at SDR 10, expected NDR 400")
    assert findings["hca mlx5_9"] == (False, "port 1 Active/LinkUp at HDR 200, expected NDR 400")
    assert findings["hca mlx5_0"][0] and findings["hca count"][0]


def test_ibstat_without_rdma_finds_nothing() -> None:
    assert fp.parse_ibstat(_read("no-rdma/ibstat.txt")) == []
    findings = fp.hca_findings([], DGX_DEVICES, 8, 400, "InfiniBand")
    assert findings == [
        ("hca count", False, "0 of 8 InfiniBand adapters; missing " + ", ".join(DGX_DEVICES))
    ]


def test_ibv_devinfo_roce() -> None:
    ports = fp.parse_ibv_devinfo(_read("ibv_devinfo-roce.txt"))
    assert [(p.device, p.port, p.state, p.active_mtu, p.link_layer) for p in ports] == [
        ("mlx5_0", 1, "PORT_ACTIVE", 4096, "Ethernet"),
        ("mlx5_1", 1, "PORT_DOWN", 1024, "Ethernet"),
    ]
    assert fp.parse_ibv_devinfo(_read("no-rdma/ibv_devinfo.txt")) == []


def test_sminfo() -> None:
    master = fp.parse_sminfo(_read("sminfo-master.txt"))
    assert master == fp.SmInfo(1, "0x946dae0300a1b200", 15, "SMINFO_MASTER")
    assert fp.sm_finding(master, "") == (
        "subnet manager",
        True,
        "master at lid 1 (0x946dae0300a1b200, priority 15)",
    )
    standby = fp.parse_sminfo(_read("sminfo-standby.txt"))
    assert standby is not None and not fp.sm_finding(standby, "")[1]
    raw = _read("no-rdma/sminfo.txt")
    assert fp.parse_sminfo(raw) is None
    _, ok, evidence = fp.sm_finding(None, raw)
    assert not ok and evidence.startswith("not reachable: ibwarn:")


@pytest.mark.parametrize(
    ("name", "ok", "downed"),
    [
        ("perfquery-steady.txt", True, 1),
        ("perfquery-flapping.txt", False, 23),
    ],
)
def test_perfquery_link_flaps(name: str, ok: bool, downed: int) -> None:
    counters = fp.parse_perfquery(_read(name))
    assert counters["LinkDownedCounter"] == downed
    assert counters["PortXmitData"] == 4294967295
    assert "CounterSelect" in counters  # hex values read too
    check, passed, evidence = fp.link_flap_finding("mlx5_0", counters, 5)
    assert (check, passed) == ("link flaps mlx5_0", ok)
    assert evidence.startswith(f"{downed} link-down events (limit 5)")


def test_perfquery_without_rdma() -> None:
    counters = fp.parse_perfquery(_read("no-rdma/perfquery.txt"))
    assert counters == {}
    assert not fp.link_flap_finding("mlx5_0", counters, 5)[1]


@pytest.mark.parametrize(
    ("name", "gbps", "ok"),
    [
        ("ib_write_bw-ndr-gpudirect.txt", 391.42, True),
        ("ib_write_bw-ndr-slow.txt", 212.87, False),
    ],
)
def test_ib_write_bw(name: str, gbps: float, ok: bool) -> None:
    result = fp.parse_ib_write_bw(_read(name))
    assert result is not None and result.average_gbps == gbps and result.size_bytes == 65536
    threshold = fp.write_bw_threshold(400, None)
    assert threshold == 375.0
    _, passed, evidence = fp.write_bw_finding("a->b", "mlx5_0", result, "", threshold)
    assert passed is ok and f"{gbps:.2f} Gb/s" in evidence and "threshold 375" in evidence


def test_ib_write_bw_without_rdma() -> None:
    raw = _read("no-rdma/ib_write_bw.txt")
    assert fp.parse_ib_write_bw(raw) is None
    _, ok, evidence = fp.write_bw_finding("a->b", "mlx5_0", None, raw, 375.0)
    assert not ok and "Unable to find the Infiniband/RoCE device" in evidence


def test_pairs_and_commands() -> None:
    nodes = expand_nodes(load_spec(ROOT / "examples" / "dgx-8.yaml"))[1:]
    assert [(a.name, b.name) for a, b in pairs(nodes[:3])] == [
        ("dgx01", "dgx02"),
        ("dgx03", "dgx01"),
    ]
    assert len(pairs(nodes)) == 4 and pairs(nodes[:1]) == []
    assert write_bw_command("mlx5_3", 18516, 1, "10.20.0.22") == (
        "timeout 120 ib_write_bw -d mlx5_3 --report_gbits -F -D 5 -p 18516 --use_cuda=1 10.20.0.22"
    )
    assert "--use_cuda" not in write_bw_command("mlx5_0", 18515, None, None)


def test_fabric_check_script_on_a_host_without_rdma(tmp_path: Path) -> None:
    """The script runs with python3 alone, records what the tools said, and fails honestly."""
    import subprocess
    import sys

    r = subprocess.run(
        [
            sys.executable,
            "-S",
            str(ROOT / "scripts" / "fabric-check.py"),
            "--count",
            "2",
            "--rate",
            "200",
            "--devices",
            "mlx5_0,mlx5_1",
            "--record",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 1
    assert "FAIL hca count: 0 of 2 InfiniBand adapters; missing mlx5_0, mlx5_1" in r.stdout
    assert "FAIL subnet manager: not reachable" in r.stdout
    assert {p.name for p in tmp_path.iterdir()} >= {
        "ibstat.txt",
        "sminfo.txt",
        "perfquery-mlx5_0.txt",
    }


class _Recorded:
    """Stands for a node's SSH session: answers each command with a file of tests/data/fabric."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def run(self, command: str, sudo: bool = False, timeout: float = 60.0) -> object:
        from provision.verify.remote import Output

        self.asked.append(command)
        for prefix, name in self.answers.items():
            if command.startswith(prefix):
                return Output(0, _read(name), "")
        return Output(127, "", f"{command.split()[0]}: not found")


def test_check_fabric_asks_the_tools_and_reports_per_adapter(tmp_path: Path) -> None:
    from provision.state import State
    from provision.verify import VerifyContext
    from provision.verify.fabric import check_fabric

    cluster = Cluster(load_spec(ROOT / "examples" / "dgx-8.yaml"))
    ctx = VerifyContext(cluster, State(tmp_path, "dgx8"), "")
    node = next(n for n in cluster.nodes if n.name == "dgx03")
    remote = _Recorded(
        {
            "ibstat": "ibstat-dgx-degraded.txt",
            "sminfo": "sminfo-master.txt",
            "perfquery -C mlx5_4 ": "perfquery-flapping.txt",
            "perfquery": "perfquery-steady.txt",
        }
    )
    results = {r.check: r for r in check_fabric(ctx, node, remote)}  # type: ignore[arg-type]
    assert results["hca count"].passed and results["subnet manager"].passed
    assert not results["hca mlx5_4"].passed and not results["hca mlx5_9"].passed
    assert results["hca mlx5_11"].passed
    assert not results["link flaps mlx5_4"].passed and results["link flaps mlx5_0"].passed
    assert "perfquery -C mlx5_11 -P 1" in remote.asked
    head = next(n for n in cluster.nodes if n.name == "head01")
    assert check_fabric(ctx, head, remote) == []  # type: ignore[arg-type]


# --- EFA (AWS) ---------------------------------------------------------------------------------


def test_fi_info_lists_one_efa_domain_per_device() -> None:
    p5 = fp.parse_fi_info(_read("fi_info-p5.txt"))
    assert len(p5) == 32 and p5[0] == "rdmap79s0-rdm" and len(set(p5)) == 32
    assert fp.parse_fi_info(_read("fi_info-p4d-degraded.txt")) == [
        "efa_0-rdm",
        "efa_1-rdm",
        "efa_2-rdm",
    ]
    assert fp.parse_fi_info(_read("fi_info-no-efa.txt")) == []
    # another provider's domains are not EFA's
    tcp = "provider: tcp\n    domain: eth0\n    type: FI_EP_RDM\n"
    assert fp.parse_fi_info(tcp) == []


def test_efa_findings_count_the_devices_and_find_the_plugin() -> None:
    cache = _read("ldconfig-p-ofi-nccl.txt")
    assert fp.ofi_nccl_libraries(cache) == [
        "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net-ofi.so"
    ]
    good = fp.efa_findings(0, _read("fi_info-p5.txt"), 32, cache)
    assert [ok for _, ok, _ in good] == [True, True]
    assert good[0][2].startswith("32 of 32 EFA devices") and "rdmap79s0-rdm" in good[0][2]
    short = fp.efa_findings(0, _read("fi_info-p4d-degraded.txt"), 4, cache)
    assert short[0][:2] == ("efa", False) and short[0][2].startswith("3 of 4")
    none = fp.efa_findings(255, _read("fi_info-no-efa.txt"), 4, "")
    assert none[0] == (
        "efa",
        False,
        "libfabric's efa provider has no device: fi_getinfo: -61 (No data available)",
    )
    assert none[1][:2] == ("efa.nccl_plugin", False) and "TCP sockets" in none[1][2]


def test_check_efa_runs_on_efa_pools_only(tmp_path: Path) -> None:
    from provision.state import State
    from provision.verify import VerifyContext
    from provision.verify.fabric import check_efa

    cluster = Cluster(load_spec(ROOT / "tests" / "data" / "cloud" / "cluster.yaml"))
    ctx = VerifyContext(cluster, State(tmp_path, "cloudy"), "")
    remote = _Recorded(
        {fp.FI_INFO: "fi_info-p4d-degraded.txt", "ldconfig -p": "ldconfig-p-ofi-nccl.txt"}
    )
    p4d = next(n for n in cluster.nodes if n.pool == "awsa100")
    results = {r.check: r for r in check_efa(ctx, p4d, remote)}  # type: ignore[arg-type]
    assert not results["efa"].passed and results["efa.nccl_plugin"].passed
    assert remote.asked == [f"{fp.FI_INFO} -p efa -t FI_EP_RDM", "ldconfig -p"]
    for name in ("head01", "gcph100001", "aza100001"):
        node = next(n for n in cluster.nodes if n.name == name)
        assert check_efa(ctx, node, remote) == []  # type: ignore[arg-type]


def test_a_clouds_infiniband_is_the_clouds_not_the_sites() -> None:
    """An ND VM's adapters are on Azure's fabric: no rail, no address, no OpenSM of the site's,
    whatever the spec's fabric; they count as the cloud's own InfiniBand instead."""
    from provision.spec.fabric import cloud_infiniband

    profiles = load_profiles()
    nd, dgx = profiles["azure-nd-h100-v5"], profiles["dgx-h100"]
    assert rails(nd, "infiniband") == [] and cloud_infiniband(nd) == 8
    assert len(rails(dgx, "infiniband")) == 8 and cloud_infiniband(dgx) == 0
    assert cloud_infiniband(profiles["aws-p5.48xlarge"]) == 0  # EFA is not InfiniBand


def test_check_fabric_on_a_clouds_infiniband_asks_only_ibstat(tmp_path: Path) -> None:
    from provision.state import State
    from provision.verify import VerifyContext
    from provision.verify.fabric import check_fabric

    cluster = Cluster(load_spec(ROOT / "examples" / "hybrid-cloud.yaml"))
    ctx = VerifyContext(cluster, State(tmp_path, "hybrid"), "")
    node = next(n for n in cluster.nodes if n.pool == "azh100")  # ND H100 v5: 8 x NDR
    healthy = _Recorded({"ibstat": "ibstat-dgx-healthy.txt"})
    results = {r.check: r for r in check_fabric(ctx, node, healthy)}  # type: ignore[arg-type]
    assert results["hca count"].passed and results["hca count"].evidence.startswith("8 of 8")
    assert all(r.passed for r in results.values()) and len(results) == 9
    assert healthy.asked == ["ibstat"]  # Azure's subnet manager and counters are not asked
    degraded = _Recorded({"ibstat": "ibstat-dgx-degraded.txt"})
    failed = [r.check for r in check_fabric(ctx, node, degraded) if not r.passed]  # type: ignore[arg-type]
    assert failed == ["hca mlx5_4", "hca mlx5_9"]


def test_gpudirect_without_peer_memory_names_the_cause() -> None:
    """perftest made its buffer in GPU memory and the adapter could not register it: the
    finding says GPUDirect RDMA does not work, not just "no result"."""
    raw = _read("ib_write_bw-cuda-no-peermem.txt")
    assert fp.parse_ib_write_bw(raw) is None
    _, ok, evidence = fp.write_bw_finding("a->b", "mlx5_3", None, raw, 375.0)
    assert not ok and evidence.startswith("GPU memory could not be registered")
    assert "GPUDirect RDMA does not work" in evidence
    # the recorded GPUDirect run parses past perftest's CUDA lines
    result = fp.parse_ib_write_bw(_read("ib_write_bw-ndr-gpudirect.txt"))
    assert result is not None and result.average_gbps == 391.42


@pytest.mark.parametrize(
    ("os_name", "rdma", "dmabuf"),
    [
        ("debian12", "inbox", True),
        ("rocky9", "inbox", True),
        ("ubuntu22.04", "inbox", False),
        ("debian12", "doca", False),
        ("rocky9", "doca", False),
    ],
)
def test_gpudirect_goes_through_dmabuf_where_peermem_is_not_loaded(
    os_name: str, rdma: str, dmabuf: bool
) -> None:
    """The rdma role loads nvidia-peermem only with DOCA or on Ubuntu's kernels; elsewhere
    verify's GPUDirect test registers GPU memory through DMA-BUF (after --use_cuda, as perftest
    wants it)."""
    from provision.verify.fabric import gpudirect_through_dmabuf

    assert gpudirect_through_dmabuf(os_name, rdma) is dmabuf
    command = write_bw_command("mlx5_0", 18515, 0, "10.20.0.22", dmabuf)
    assert ("--use_cuda=0 --use_cuda_dmabuf" in command) is dmabuf
    assert "--use_cuda_dmabuf" not in write_bw_command("mlx5_0", 18515, None, None, True)


def test_soft_roce_rails_and_nccls_gid_index(tmp_path: Path) -> None:
    """The metal lab's soft RoCE (lab-vm-roce): one rail, rxe0 over eth1, soft; NCCL's GID
    index is soft RoCE's IPv4 one (1: rdma_rxe has no RoCE v1 entries), not ConnectX's 3."""
    cluster = Cluster(load_spec(ROOT / "examples" / "metal-lab.yaml"))
    view = next(v for v in cluster.pools if v.name == "cpu")
    assert [(r.netdev, r.device, r.soft) for r in rails(view.profile, "roce")] == [
        ("eth1", "rxe0", True)
    ]
    settings = {k: v for k, v, _ in nccl_settings(cluster, view)}
    assert settings["NCCL_IB_GID_INDEX"] == "1" and settings["NCCL_IB_HCA"] == "=rxe0"
    roce = Cluster(load_spec(ROOT / "examples" / "roce.yaml"))
    gpu = next(v for v in roce.pools if v.profile.gpu is not None)
    assert {k: v for k, v, _ in nccl_settings(roce, gpu)}["NCCL_IB_GID_INDEX"] == "3"


def test_soft_roce_is_checked_as_an_adapter_on_a_metal_lab_machine(tmp_path: Path) -> None:
    """A metal lab machine's rxe0 (recorded there): ibstat's rate with its speed's name
    ("10 (FDR10)") is read as 10, the link-down counter is found among soft RoCE's
    hw_counters (an adapter keeps it in counters/), and the recorded write test parses and
    passes the example's threshold."""
    from provision.state import State
    from provision.verify import VerifyContext
    from provision.verify.fabric import check_fabric
    from provision.verify.remote import Output

    class Machine:
        def run(self, command: str, sudo: bool = False, timeout: float = 60.0) -> Output:
            if command == "ibstat":
                return Output(0, _read("ibstat-soft-roce.txt"), "")
            first = "cat /sys/class/infiniband/rxe0/ports/1/counters/link_downed 2>/dev/null"
            if command.startswith(first + " || "):  # soft RoCE has no counters/ directory
                assert "/ports/1/hw_counters/link_downed" in command
                return Output(0, "1\n", "")
            return Output(127, "", "not found")

    cluster = Cluster(load_spec(ROOT / "examples" / "metal-lab.yaml"))
    ctx = VerifyContext(cluster, State(tmp_path, "metal"), "")
    node = next(n for n in cluster.nodes if n.name == "cpu001")
    results = {r.check: r for r in check_fabric(ctx, node, Machine())}  # type: ignore[arg-type]
    assert [(c, r.passed) for c, r in results.items()] == [
        ("hca count", True),
        ("hca rxe0", True),
        ("link flaps rxe0", True),
    ]
    assert results["hca rxe0"].evidence == "port 1 Active/LinkUp at SDR 10"
    assert results["link flaps rxe0"].evidence.startswith("1 link-down events (limit 5)")
    result = fp.parse_ib_write_bw(_read("ib_write_bw-soft-roce.txt"))
    assert result is not None and result.average_gbps == 0.095816
    threshold = cluster.spec.network.fabric.ib_write_bw_gbps
    assert threshold is not None and fp.write_bw_finding("a->b", "rxe0", result, "", threshold)[1]

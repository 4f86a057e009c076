"""What the fabric roles would write and install on every supported OS, rendered through the
roles' own defaults, variables and templates by Ansible's templating: the RDMA stack (inbox and
DOCA-OFED, whose repository is unreachable here), the interface files in each OS's form, the
RoCE QoS script and OpenSM's file. Compared with tests/golden/fabric-roles/ (`make goldens`)."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import ROLES_DIR, ROOT, assert_golden
from .test_nvidia_sources import FACTS, _variables

ROLES = ROLES_DIR
GOLDEN = ROOT / "tests" / "golden" / "fabric-roles"
FABRIC = {
    "provision_fabric_netdevs": ["ibp24s0", "ibp64s0"],
    "provision_fabric_devices": ["mlx5_0", "mlx5_3"],
    "provision_fabric_addresses": ["10.22.0.21/19", "10.22.32.21/19"],
    "rdma_doca_version": "2.9.1",
    "group_names": ["compute", "fabric", "gpu"],
}


def _templar(os_name: str, extra: dict[str, Any]) -> Any:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    variables = _variables(os_name, "nvidia") | FABRIC | extra
    return Templar(loader=DataLoader(), variables=variables)


def _render(templar: Any, text: str) -> str:
    from ansible.template import trust_as_template

    value = templar.template(trust_as_template(text))
    return "\n".join(value) if isinstance(value, list) else str(value).strip()


def _file(templar: Any, role: str, name: str) -> str:
    return _render(templar, (ROLES / role / "templates" / name).read_text())


def render_case(os_name: str) -> str:
    ib = _templar(os_name, {"provision_fabric": "infiniband"})
    lines = [f"# {os_name}: rendered through the fabric roles' variables and templates"]
    lines.append("\n## rdma inbox packages\n" + _render(ib, "{{ _rdma_packages.inbox }}"))
    doca = _templar(os_name, {"provision_fabric": "infiniband", "rdma_stack": "doca"})
    lines.append(
        "\n## rdma doca\n"
        + _render(
            doca,
            "{{ _rdma_packages.doca | join(', ') }} from "
            "{{ _rdma_doca_repo }}/ (key {{ _rdma_doca_key_file }})",
        )
    )
    mirror = _templar(
        os_name, {"rdma_stack": "doca", "rdma_doca_mirror_url": "https://mirror.example.org/doca/"}
    )
    lines.append("\n## rdma doca from a mirror\n" + _render(mirror, "{{ _rdma_doca_repo }}/"))
    renderer = _render(ib, "{{ _ipoib_renderer }}")
    lines.append(f"\n## ipoib renderer\n{renderer}, MTU {_render(ib, '{{ _ipoib_mtu }}')}")
    if renderer == "netplan":
        lines.append(
            "\n## /etc/netplan/60-provision-fabric.yaml\n" + _file(ib, "ipoib", "netplan.yaml.j2")
        )
    elif renderer == "networkmanager":
        first = _templar(
            os_name, {"provision_fabric": "infiniband", "item": ["ibp24s0", "10.22.0.21/19"]}
        )
        lines.append(
            "\n## provision-fabric-ibp24s0.nmconnection\n"
            + _file(first, "ipoib", "nmconnection.j2")
        )
    else:
        lines.append(
            "\n## /etc/network/interfaces.d/60-provision-fabric\n"
            + _file(ib, "ipoib", "interfaces.j2")
        )
    roce = _templar(
        os_name,
        {
            "provision_fabric": "roce",
            "provision_fabric_netdevs": ["ens1f0np0", "ens1f1np1"],
            "provision_fabric_devices": ["mlx5_0", "mlx5_1"],
            "item": ["ens1f0np0", "10.31.0.21/17"],
        },
    )
    lines.append("\n## /usr/local/sbin/rdma-roce-qos\n" + _file(roce, "rdma", "rdma-roce-qos.j2"))
    if renderer == "networkmanager":
        lines.append(
            "\n## RoCE: provision-fabric-ens1f0np0.nmconnection\n"
            + _file(roce, "ipoib", "nmconnection.j2")
        )
    lines.append("\n## opensm\n" + _render(ib, "{{ _opensm_conf }}"))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("os_name", list(FACTS))
def test_fabric_roles_render_as_golden(os_name: str, update_goldens: bool) -> None:
    got = render_case(os_name)
    assert_golden(GOLDEN / f"{os_name}.txt", got, update_goldens)


def test_each_os_gets_its_own_form() -> None:
    assert "infiniband-mode: datagram" in render_case("ubuntu22.04")
    rocky = render_case("rocky9")
    assert "type=infiniband" in rocky and "transport-mode=datagram" in rocky
    assert "https://linux.mellanox.com/public/repo/doca/2.9.1/rhel9.5/x86_64/" in rocky
    assert "/etc/rdma/opensm.conf" in rocky and "libibverbs-utils" in rocky
    debian = render_case("debian12")
    assert "iface ibp64s0 inet static" in debian and "address 10.22.32.21/19" in debian
    assert "/doca/2.9.1/debian12/x86_64/" in debian
    assert "https://mirror.example.org/doca/2.9.1/ubuntu24.04/x86_64/" in render_case("ubuntu24.04")


def test_soft_roce_is_made_over_its_netdev_and_its_qos_leaves_dcb_alone() -> None:
    """A profile's soft RoCE device (rdma_rxe over a plain card) beside an adapter: the rdma
    role's script makes that one device over its interface, and the QoS script (run here with
    --dry-run by a real shell) sets the adapter's DCB and the traffic class of both, and no
    DCB of the plain card, which has none."""
    import subprocess

    soft = _templar(
        "debian12",
        {
            "provision_fabric": "roce",
            "provision_fabric_netdevs": ["ens1f0np0", "eth1"],
            "provision_fabric_devices": ["mlx5_0", "rxe0"],
            "provision_fabric_soft_devices": ["rxe0"],
        },
    )
    made = _file(soft, "rdma", "rdma-soft-roce.j2")
    assert "rdma link add rxe0 type rxe netdev eth1" in made
    assert "mlx5_0" not in made and "modprobe rdma_rxe" in made
    qos = _file(soft, "rdma", "rdma-roce-qos.j2")
    run = subprocess.run(
        ["sh", "-s", "--", "--dry-run"], input=qos, capture_output=True, text=True, check=True
    )
    dry = run.stdout.splitlines()
    assert [line.split()[:2] for line in dry if line.startswith("dcb")] == [
        ["dcb", "app"],
        ["dcb", "pfc"],
    ]
    assert all("eth1" not in line for line in dry)
    assert "mkdir -p /sys/kernel/config/rdma_cm/rxe0" in dry
    assert [line for line in dry if "default_roce_tos" in line and "rxe0" in line]
    hardware = _file(_templar("debian12", {"provision_fabric": "roce"}), "rdma", "rdma-roce-qos.j2")
    assert "soft" not in hardware

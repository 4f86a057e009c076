"""The netboot role's files, as Ansible's own templating makes them from its defaults, vars and
Debian family file: dnsmasq's configuration checked by the real `dnsmasq --test`, the iPXE
scripts (the chain by MAC address, each node's kernel line), nginx's site. Live, the role boots a
machine from the network in tests/integration/test_netboot.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROLES_DIR, ROOT, run_provision

ROLE = ROLES_DIR / "netboot"
NODES = [
    {"name": "cpu001", "mac": "52:54:00:AA:00:01", "address": "10.0.0.21", "image": "compute"},
    {"name": "gpu001", "mac": "52:54:00:aa:00:02", "address": "10.0.0.31", "image": "gpu"},
]


def _variables(**values: Any) -> dict[str, Any]:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import trust_as_template

    loader = DataLoader()
    variables: dict[str, Any] = {}
    for part in ("defaults/main.yml", "vars/main.yml", "vars/Debian.yml"):
        for key, value in loader.load((ROLE / part).read_text()).items():
            variables[key] = trust_as_template(value) if isinstance(value, str) else value
    given = {
        "netboot_address": "10.0.0.1",
        "netboot_network": "10.0.0.0/24",
        "netboot_router": "10.0.0.254",
        "netboot_images": {"compute": "/images/compute", "gpu": "/images/gpu"},
        "netboot_nodes": NODES,
        "ansible_managed": "Managed by Ansible",
    }
    return {**variables, **given, **values}


def _template(text: str, **values: Any) -> Any:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    templar = Templar(loader=DataLoader(), variables=_variables(**values))
    return templar.template(trust_as_template(text))


def test_dnsmasq_answers_only_the_nodes_and_passes_its_own_check(tmp_path: Path) -> None:
    conf = str(_template((ROLE / "templates" / "dnsmasq.conf.j2").read_text()))
    lines = conf.splitlines()
    assert "port=0" in lines  # no DNS
    assert "dhcp-range=10.0.0.0,static" in lines  # addresses only for the hosts below
    assert [x for x in lines if x.startswith("dhcp-host=")] == [
        "dhcp-host=52:54:00:aa:00:01,10.0.0.21,cpu001",
        "dhcp-host=52:54:00:aa:00:02,10.0.0.31,gpu001",
    ]
    assert "dhcp-option=option:router,10.0.0.254" in lines
    assert "dhcp-boot=tag:!ipxe,tag:!efi64,undionly.kpxe" in lines
    assert "dhcp-boot=tag:!ipxe,tag:efi64,snponly.efi" in lines
    assert "dhcp-boot=tag:ipxe,http://10.0.0.1:8069/boot.ipxe" in lines
    assert "tftp-root=/usr/lib/ipxe" in lines
    dnsmasq = shutil.which("dnsmasq") or shutil.which("dnsmasq", path="/usr/sbin")
    if dnsmasq is None:
        pytest.fail("needs dnsmasq (scripts/setup.sh installs dnsmasq-base)")
    path = tmp_path / "provision-boot.conf"
    path.write_text(conf)
    check = subprocess.run([dnsmasq, "--test", f"--conf-file={path}"], capture_output=True)
    assert check.returncode == 0, check.stderr
    # the same check refuses a broken file, as the role's validate does before it is replaced
    path.write_text(conf.replace("dhcp-range=10.0.0.0,static", "dhcp-range=10.0.0.0,nonsense"))
    assert subprocess.run([dnsmasq, "--test", f"--conf-file={path}"]).returncode != 0
    # no router: no default route handed out
    bare = str(_template((ROLE / "templates" / "dnsmasq.conf.j2").read_text(), netboot_router=""))
    assert "option:router" not in bare


def test_each_node_boots_its_own_image_by_its_mac() -> None:
    scripts = {f["path"]: f["content"] for f in _template("{{ _netboot_scripts }}")}
    assert scripts["/srv/provision-boot/boot.ipxe"] == (
        "#!ipxe\nchain http://10.0.0.1:8069/nodes/${mac:hexhyp}.ipxe\n"
    )
    gpu = scripts["/srv/provision-boot/nodes/52-54-00-aa-00-02.ipxe"].splitlines()
    assert gpu == [
        "#!ipxe",
        "kernel http://10.0.0.1:8069/gpu/vmlinuz initrd=initrd.img boot=live "
        "fetch=http://10.0.0.1:8069/gpu/root.squashfs systemd.hostname=gpu001 "
        "console=ttyS0,115200 net.ifnames=0",
        "initrd http://10.0.0.1:8069/gpu/initrd.img",
        "boot",
    ]
    # iPXE writes a MAC in lower case: an upper-case one in the input still matches
    assert "/srv/provision-boot/nodes/52-54-00-aa-00-01.ipxe" in scripts
    assert len(scripts) == 3
    dirs = [d["path"] for d in _template("{{ _netboot_dirs }}")]
    assert dirs == [
        "/srv/provision-boot",
        "/srv/provision-boot/nodes",
        "/srv/provision-boot/compute",
        "/srv/provision-boot/gpu",
    ]


def test_nginx_serves_the_images_read_only_on_the_nodes_network() -> None:
    site = str(_template((ROLE / "templates" / "nginx.conf.j2").read_text()))
    assert "listen 10.0.0.1:8069;" in site and "root /srv/provision-boot;" in site
    assert "limit_except GET { deny all; }" in site and "autoindex off;" in site


def test_a_pool_that_boots_from_the_network_is_checked_and_refused_for_now(
    tmp_path: Path,
) -> None:
    from provision.errors import SpecError
    from provision.spec.loader import load_spec

    spec = tmp_path / "metal.yaml"
    spec.write_text("""\
name: metal
os: debian12
network:
  management: {cidr: 10.92.0.0/24}
  bmc: {cidr: 10.93.0.0/24}
pools:
  - {name: head, role: head, profile: cpu-node, hosts: [{name: head001, address: 10.92.0.11}]}
  - name: cpu
    role: compute
    profile: cpu-node
    boot: network
    hosts:
      - {name: cpu001, address: 10.92.0.21, bmc_address: 10.93.0.21, mac: "52:54:00:AB:00:21"}
      - {name: cpu002, address: 10.92.0.22, bmc_address: 10.93.0.22, mac: "52:54:00:ab:00:22"}
security:
  admin_cidrs: [10.9.0.0/24]
""")
    # every check but the one for what apply does not build yet passes; MACs as iPXE writes them
    loaded = load_spec(spec, unbuilt=True)
    assert [h.mac for h in loaded.pools[1].hosts or []] == [
        "52:54:00:ab:00:21",
        "52:54:00:ab:00:22",
    ]
    with pytest.raises(SpecError) as refused:
        load_spec(spec)
    assert [f"{i.line} {i.path}" for i in refused.value.issues] == ["11 pools[1].boot"]
    assert "not supported yet" in refused.value.issues[0].message


def test_a_mac_address_reaches_the_terminal_as_written() -> None:

    bad = ROOT / "tests" / "data" / "bad_specs" / "156-mac-twice.yaml"
    r = run_provision("validate", str(bad))
    assert r.returncode == 2
    # rich would turn ":ab:" into an emoji
    assert "pools[1].hosts[1].mac: MAC address 52:54:00:ab:00:21 is also" in r.stderr, r.stderr

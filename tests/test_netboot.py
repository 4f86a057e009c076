"""The netboot role's files, as Ansible's own templating makes them from its defaults, vars and
Debian family file: dnsmasq's configuration checked by the real `dnsmasq --test`, the iPXE
scripts (the chain by MAC address, each node's kernel line), nginx's site. Live, the role boots a
machine from the network, through `provision apply`, in tests/integration/test_metal.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from provision.spec.loader import load_spec

from .conftest import EXAMPLES, ROLES_DIR, ROOT, run_provision, unwrap_unsafe

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
        "netboot_images": {"compute": "/cache/0c0c0c0c0c0c0c0c", "gpu": "/cache/9a9a9a9a9a9a9a9a"},
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
    # no router: no default route handed out; no name server known: none
    bare = str(_template((ROLE / "templates" / "dnsmasq.conf.j2").read_text(), netboot_router=""))
    assert "option:router" not in bare and "dns-server" not in bare


def test_the_nodes_get_the_servers_own_name_servers_unless_told() -> None:
    import base64

    resolv = "# resolv\nnameserver 127.0.0.53\nnameserver 10.255.255.53\n nameserver 10.0.0.9 \n"
    resolv += "nameserver fe80::1\nsearch lab\n"
    read = {"content": base64.b64encode(resolv.encode()).decode()}
    template = (ROLE / "templates" / "dnsmasq.conf.j2").read_text()
    lines = str(_template(template, _netboot_resolv=read)).splitlines()
    assert [x for x in lines if "dns-server" in x] == [
        "dhcp-option=option:dns-server,10.255.255.53,10.0.0.9"
    ]  # not the loopback's resolver, not an IPv6 one (DHCP's option 6 is IPv4)
    told = str(_template(template, _netboot_resolv=read, netboot_dns=["10.0.0.53"])).splitlines()
    assert [x for x in told if "dns-server" in x] == ["dhcp-option=option:dns-server,10.0.0.53"]


def test_each_node_boots_its_own_image_by_its_mac() -> None:
    scripts = {f["path"]: f["content"] for f in _template("{{ _netboot_scripts }}")}
    assert scripts["/srv/provision-boot/boot.ipxe"] == (
        "#!ipxe\nchain http://10.0.0.1:8069/nodes/${mac:hexhyp}.ipxe\n"
    )
    gpu = scripts["/srv/provision-boot/nodes/52-54-00-aa-00-02.ipxe"].splitlines()
    assert gpu == [
        "#!ipxe",
        "kernel http://10.0.0.1:8069/gpu/vmlinuz initrd=initrd.img boot=live nonetworking "
        "fetch=http://10.0.0.1:8069/gpu/root.squashfs systemd.hostname=gpu001 "
        "provision.image=9a9a9a9a9a9a9a9a console=ttyS0,115200 net.ifnames=0",
        "initrd http://10.0.0.1:8069/gpu/initrd.img",
        "boot",
    ]
    # iPXE writes a MAC in lower case: an upper-case one in the input still matches; each
    # node's kernel is told its own pool's image (the directory's name: its id)
    compute = scripts["/srv/provision-boot/nodes/52-54-00-aa-00-01.ipxe"]
    assert " provision.image=0c0c0c0c0c0c0c0c " in compute
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


METAL = """\
name: metal
os: debian12
network:
  management: {cidr: 10.92.0.0/24, gateway: 10.92.0.1}
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
  - {name: disk, role: compute, profile: cpu-node, hosts: [{name: disk001, address: 10.92.0.31}]}
security:
  admin_cidrs: [10.9.0.0/24]
"""


def _inventory(files: dict[str, str], tmp_path: Path) -> dict[str, Any]:
    """The render's inventory as the real ansible-inventory reads it (unsafe values unwrapped)."""
    import sys

    from provision.render import write_render

    write_render(files, tmp_path / "out")
    listed = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "--list", "-i",
         str(tmp_path / "out" / "inventory" / "hosts.yml")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    data: dict[str, Any] = unwrap_unsafe(json.loads(listed.stdout))
    return data


def test_the_first_head_serves_the_pools_that_boot_from_the_network(tmp_path: Path) -> None:
    """The rendered inventory, read by the real ansible-inventory: head001 is the boot server
    with each node by its MAC, address and pool; its firewall lets the booting nodes' DHCP
    (from 0.0.0.0, to its address or the broadcast), TFTP and HTTP to its address in (another
    head of its pool, which has the same rule set, takes none of it), and no other pool's
    does."""
    from provision.cluster import Cluster
    from provision.render import render

    (tmp_path / "metal.yaml").write_text(METAL)
    files = render(Cluster(load_spec(tmp_path / "metal.yaml", unbuilt=True)))
    data = _inventory(files, tmp_path)
    assert data["boot_server"]["hosts"] == ["head001"]
    head = data["_meta"]["hostvars"]["head001"]
    assert (head["netboot_address"], head["netboot_network"], head["netboot_router"]) == (
        "10.92.0.11",
        "10.92.0.0/24",
        "10.92.0.1",
    )
    assert head["netboot_nodes"] == [
        {"name": "cpu001", "mac": "52:54:00:ab:00:21", "address": "10.92.0.21", "image": "cpu"},
        {"name": "cpu002", "mac": "52:54:00:ab:00:22", "address": "10.92.0.22", "image": "cpu"},
    ]
    assert not any(k.startswith("netboot_") for k in data["_meta"]["hostvars"]["cpu001"])
    sets = files["files/nftables/address-sets.nft"]
    booted = sets.split("set netboot_nodes {")[1].split("elements = {")[1].split("}")[0]
    assert booted.split() == ["10.92.0.21,", "10.92.0.22,"]
    boot = [
        line.strip() for line in files["files/nftables/head.nft"].splitlines() if "boot" in line
    ]
    dhcp = "ip daddr { 10.92.0.11, 255.255.255.255 } udp dport 67"
    assert boot == [
        f'ip saddr 0.0.0.0/32 {dhcp} accept comment "dhcp for the nodes that boot"',
        f'ip saddr @netboot_nodes {dhcp} accept comment "dhcp for the nodes that boot"',
        "ip saddr @netboot_nodes ip daddr 10.92.0.11 udp dport 69 accept comment "
        '"tftp for the nodes that boot (iPXE)"',
        "ip saddr @netboot_nodes ip daddr 10.92.0.11 tcp dport 8069 accept comment "
        '"http for the nodes that boot (images)"',
    ]
    for pool in ("cpu", "disk"):
        assert "boot" not in files[f"files/nftables/{pool}.nft"]
    # the real nft reads the head's whole rule set with the sets (a syntax error fails here)
    (tmp_path / "sets.nft").write_text(sets)
    ruleset = tmp_path / "head.nft"
    ruleset.write_text(
        files["files/nftables/head.nft"].replace(
            "/etc/nftables.d/provision-sets.nft", str(tmp_path / "sets.nft")
        )
    )
    nft = shutil.which("nft") or "/usr/sbin/nft"
    done = subprocess.run([nft, "-c", "-f", str(ruleset)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_pool_that_boots_from_the_network_is_taken_with_its_macs_as_ipxe_writes_them(
    tmp_path: Path,
) -> None:
    from provision.spec.loader import load_spec

    spec = tmp_path / "metal.yaml"
    spec.write_text(METAL)
    loaded = load_spec(spec)
    assert [h.mac for h in loaded.pools[1].hosts or []] == [
        "52:54:00:ab:00:21",
        "52:54:00:ab:00:22",
    ]


def test_a_mac_address_reaches_the_terminal_as_written() -> None:

    bad = ROOT / "tests" / "data" / "bad_specs" / "156-mac-twice.yaml"
    r = run_provision("validate", str(bad))
    assert r.returncode == 2
    # rich would turn ":ab:" into an emoji
    assert "pools[1].hosts[1].mac: MAC address 52:54:00:ab:00:21 is also" in r.stderr, r.stderr


def test_plan_says_which_nodes_boot_from_the_network_and_what_apply_does(tmp_path: Path) -> None:
    spec = tmp_path / "metal.yaml"
    spec.write_text(METAL)
    r = run_provision("plan", str(spec), "--state-dir", str(tmp_path / "state"))
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stdout.split())
    assert (
        "boot: cpu[001-002] boot from the network, served by head001 (DHCP for their MAC "
        "addresses, iPXE, their pool's image run from memory); apply builds the image (with the "
        "packages its roles install), converges head001 and powers each of them that does not "
        "answer SSH through its BMC"
    ) in said, r.stdout
    assert (  # running nodes are booted into a new image only in drained batches
        "then waits for it; a running node on an older image than its pool's keeps it, and "
        "apply --batch N boots it into the new one in its drained batch"
    ) in said, r.stdout
    r = run_provision("plan", str(spec), "--json", "--state-dir", str(tmp_path / "state"))
    assert json.loads(r.stdout)["network_boot"].startswith("cpu[001-002] boot from the network")
    # a cluster without such a pool: nothing said
    plain = run_provision("plan", str(ROOT / "examples" / "lab.yaml"), "--json",
                          "--state-dir", str(tmp_path / "state"))  # fmt: skip
    assert json.loads(plain.stdout)["network_boot"] is None
    # a GPU pool's image carries the driver, built for its kernel
    gpus = run_provision("plan", str(ROOT / "examples" / "gpu-diskless.yaml"), "--json",
                         "--state-dir", str(tmp_path / "state"))  # fmt: skip
    assert gpus.returncode == 0, gpus.stderr
    assert (
        "apply builds the image (with the packages its roles install; in that of pool(s) gpu the "
        "NVIDIA driver, its module built for the image's kernel), converges head01"
    ) in json.loads(gpus.stdout)["network_boot"]


BOOTING_EXAMPLES = [
    p for p in EXAMPLES if any(pool.boot == "network" for pool in load_spec(p).pools)
]


@pytest.mark.parametrize("example", BOOTING_EXAMPLES, ids=lambda p: p.stem)
def test_every_example_with_machines_that_boot_gets_a_dnsmasq_file_and_ipxe_scripts_that_hold(
    example: Path, tmp_path: Path
) -> None:
    """The boot server's variables as the real ansible-inventory reads them from the example's
    render, through the role's templates: dnsmasq's file passes the real `dnsmasq --test` and
    answers each machine by its MAC with its address; each machine has its iPXE script, which
    boots its pool's image under its own name."""
    from provision.cluster import Cluster
    from provision.render import render
    from provision.render.netboot import booted_nodes
    from provision.spec.nodes import lab_mac

    cluster = Cluster(load_spec(example))
    data = _inventory(render(cluster), tmp_path)
    (server,) = data["boot_server"]["hosts"]
    given = {k: v for k, v in data["_meta"]["hostvars"][server].items() if k.startswith("netboot_")}
    pools = sorted({n["image"] for n in given["netboot_nodes"]})
    given["netboot_images"] = {pool: f"/cache/{pool}" for pool in pools}
    conf = str(_template((ROLE / "templates" / "dnsmasq.conf.j2").read_text(), **given))
    nodes = booted_nodes(cluster)
    assert len(nodes) == len(given["netboot_nodes"]) > 0
    # the spec's MAC addresses, as iPXE writes them; the metal lab's from their addresses
    macs = {h.name: str(h.mac).lower() for p in cluster.spec.pools for h in p.hosts or [] if h.mac}
    macs |= {n.name: lab_mac(n.address) for n in nodes if n.provider == "lab" and n.address}
    hosts = [x for x in conf.splitlines() if x.startswith("dhcp-host=")]
    assert hosts == [f"dhcp-host={macs[n.name]},{n.address},{n.name}" for n in nodes]
    dnsmasq = shutil.which("dnsmasq") or shutil.which("dnsmasq", path="/usr/sbin")
    assert dnsmasq is not None, "needs dnsmasq (scripts/setup.sh installs dnsmasq-base)"
    path = tmp_path / "provision-boot.conf"
    path.write_text(conf)
    check = subprocess.run([dnsmasq, "--test", f"--conf-file={path}"], capture_output=True)
    assert check.returncode == 0, check.stderr
    scripts = {f["path"]: f["content"] for f in _template("{{ _netboot_scripts }}", **given)}
    address = given["netboot_address"]
    for node in nodes:
        script = scripts[f"/srv/provision-boot/nodes/{macs[node.name].replace(':', '-')}.ipxe"]
        assert f"kernel http://{address}:8069/{node.pool}/vmlinuz " in script
        assert f" systemd.hostname={node.name} " in script

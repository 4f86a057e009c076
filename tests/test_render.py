"""Rendering: goldens for every artifact of every example (the examples' are inventories/, the
not-built features' tests/golden/), determinism, real-parser checks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provision.cluster import Cluster
from provision.render import render, write_render
from provision.spec import load_spec

from .conftest import EXAMPLES, ROOT, UNBUILT, load_any, load_rendered, unwrap_unsafe

GOLDEN = Path(__file__).parent / "golden"
# the examples' renders are the repository's example inventories
INVENTORIES = ROOT / "inventories"
UNBUILT_DIR = ROOT / "tests" / "data" / "unbuilt"
# every example, and the specs of features not built yet (their rendered parts)
RENDERED = EXAMPLES + UNBUILT


def _render(example: Path) -> dict[str, str]:
    return render(Cluster(load_any(example)))


@pytest.mark.parametrize("example", RENDERED, ids=lambda p: p.stem)
def test_golden(example: Path, update_goldens: bool) -> None:
    files = _render(example)
    golden_dir = (INVENTORIES if example in EXAMPLES else GOLDEN) / example.stem
    if update_goldens:
        shutil.rmtree(golden_dir, ignore_errors=True)
        for rel, content in files.items():
            (golden_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (golden_dir / rel).write_text(content)
        return
    expected = {
        str(p.relative_to(golden_dir)): p.read_text()
        for p in sorted(golden_dir.rglob("*"))
        if p.is_file()
    }
    assert sorted(files) == sorted(expected), "after a deliberate change: make goldens"
    for rel, content in files.items():
        assert content == expected[rel], f"{example.stem}/{rel} differs from its golden copy"


_DIGESTS = """
import hashlib, json, sys
from provision.render import render
from provision.cluster import Cluster
from provision.spec import load_spec
out = {}
for path in sys.argv[1:]:
    spec = load_spec(path, unbuilt="unbuilt" in path)
    for rel, text in render(Cluster(spec)).items():
        out[path + ":" + rel] = hashlib.sha256(text.encode()).hexdigest()
print(json.dumps(out, sort_keys=True))
"""


def test_deterministic_across_processes_and_hash_seeds() -> None:
    """Byte-identical in two interpreters whose set and dict-of-str orders differ."""
    import json
    import os

    digests = []
    for seed in ("1", "4242"):
        done = subprocess.run(
            [sys.executable, "-c", _DIGESTS, *map(str, RENDERED)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        digests.append(json.loads(done.stdout))
    assert len(digests[0]) > 40 and digests[0] == digests[1]


@pytest.mark.parametrize("example", RENDERED, ids=lambda p: p.stem)
def test_inventory_and_vars_are_valid_yaml(example: Path) -> None:
    files = _render(example)
    inventory = load_rendered(files["inventory/hosts.yml"])
    groups = inventory["all"]["children"]
    spec = load_any(example)
    for pool in spec.pools:
        assert f"pool_{pool.name}" in groups
    variables = load_rendered(files["inventory/group_vars/all.yml"])
    assert variables["provision_cluster"] == spec.name


def test_inventory_parsed_by_ansible(tmp_path: Path) -> None:
    """The real ansible-inventory reads the rendered inventory and sees every host and var."""
    import json

    files = _render(ROOT / "examples" / "dgx-superpod.yaml")
    write_render(files, tmp_path)
    ansible_inventory = Path(sys.executable).parent / "ansible-inventory"
    assert ansible_inventory.exists(), "ansible-core is a dependency"
    out = subprocess.run(
        [str(ansible_inventory), "-i", str(tmp_path / "inventory" / "hosts.yml"), "--list"],
        check=True,
        capture_output=True,
        text=True,
    )
    data = unwrap_unsafe(json.loads(out.stdout))
    assert isinstance(data, dict)
    assert len(data["compute"]["hosts"]) == 34
    assert data["gpu"]["hosts"] == data["compute"]["hosts"]
    assert data["_meta"]["hostvars"]["mig001"]["provision_mig_layout"] == ["1g.10gb"] * 7
    assert data["_meta"]["hostvars"]["mig001"]["provision_nvswitch"] is True
    assert data["_meta"]["hostvars"]["gpu001"]["ansible_host"] == "10.10.1.1"
    assert data["_meta"]["hostvars"]["gpu001"]["provision_pool"] == "gpu"
    assert data["_meta"]["hostvars"]["gpu001"]["ansible_become"] is True
    assert data["_meta"]["hostvars"]["login01"]["provision_cluster"] == "superpod"


def test_elastic_nodes_are_cloud_state_not_inventory() -> None:
    files = render(Cluster(load_any(UNBUILT_DIR / "cloud-burst.yaml")))
    inventory: Any = load_rendered(files["inventory/hosts.yml"])

    def hosts(group: dict[str, Any]) -> set[str]:
        found = set(group.get("hosts") or {})
        for child in (group.get("children") or {}).values():
            found |= hosts(child or {})
        return found

    every = hosts(inventory["all"])
    assert "head01" in every and not {n for n in every if n.startswith(("aws-", "gcp-", "az-"))}
    # the hub knows their names (their tunnel keys), nothing more
    hub = inventory["all"]["children"]["tunnel"]["hosts"]["head01"]
    assert "aws-h100-001" in hub["tunnel_burst_peers"]
    assert (
        "NodeName=aws-h100-[001-016] CPUs=192 Boards=1 SocketsPerBoard=2 CoresPerSocket=48 "
        "ThreadsPerCore=2 RealMemory=1992294 Gres=gpu:h100:8 "
        "Feature=aws-p5_48xlarge,aws,elastic Weight=5604 State=CLOUD"
    ) in files["files/slurm/slurm.conf"]
    assert "SuspendTime=600" in files["files/slurm/slurm.conf"]


def test_slurm_conf_grows_with_pools_not_nodes(tmp_path: Path) -> None:
    small = (ROOT / "examples" / "dgx-superpod.yaml").read_text()
    big = small.replace("count: 32", "count: 999").replace(
        "first_address: 10.10.1.1", "first_address: 10.10.4.1"
    )
    (tmp_path / "big.yaml").write_text(big)
    a = _render(ROOT / "examples" / "dgx-superpod.yaml")["files/slurm/slurm.conf"]
    b = _render(tmp_path / "big.yaml")["files/slurm/slurm.conf"]
    assert len(a.splitlines()) == len(b.splitlines())
    assert "NodeName=gpu[001-999]" in b


def test_slurm_config_overrides(tmp_path: Path) -> None:
    text = (
        (ROOT / "examples" / "dgx-superpod.yaml")
        .read_text()
        .replace(
            "  accounting: true\n",
            "  accounting: true\n  config:\n    ProctrackType: proctrack/linuxproc\n"
            "    PrologFlags: Contain\n    EnforcePartLimits: true\n",
        )
    )
    (tmp_path / "pod.yaml").write_text(text)
    conf = _render(tmp_path / "pod.yaml")["files/slurm/slurm.conf"]
    assert "ProctrackType=proctrack/linuxproc" in conf
    assert "ProctrackType=proctrack/cgroup" not in conf
    assert "PrologFlags=Contain" in conf
    assert "EnforcePartLimits=YES" in conf


@pytest.mark.parametrize("example", RENDERED, ids=lambda p: p.stem)
def test_nftables_rules_parse(example: Path, tmp_path: Path) -> None:
    """nft itself checks every rendered rule set (needs nft and CAP_NET_ADMIN, as in CI)."""
    nft = shutil.which("nft") or ("/usr/sbin/nft" if Path("/usr/sbin/nft").exists() else None)
    if nft is None:
        pytest.skip("nft is not installed (the README's test command installs it)")
    files = _render(example)
    sets = tmp_path / "sets.nft"
    sets.write_text(files["files/nftables/address-sets.nft"])
    checked: list[str] = []
    for rel, content in files.items():
        if not rel.startswith("files/nftables/") or rel.endswith("sets.nft"):
            continue
        checked.append(rel)
        ruleset = tmp_path / Path(rel).name
        ruleset.write_text(content.replace("/etc/nftables.d/provision-sets.nft", str(sets)))
        out = subprocess.run([nft, "-c", "-f", str(ruleset)], capture_output=True, text=True)
        if out.returncode != 0 and "Operation not permitted" in out.stderr:
            pytest.skip("nft -c needs CAP_NET_ADMIN")
        assert out.returncode == 0, f"{rel}: {out.stderr}"
    assert checked, "no rule set rendered"


def test_firewall_admits_only_what_the_spec_allows() -> None:
    files = _render(ROOT / "examples" / "lab.yaml")
    head = files["files/nftables/head.nft"]
    compute = files["files/nftables/compute.nft"]
    assert "policy drop;" in head and "policy drop;" in compute
    assert "ip saddr @admin tcp dport 22 accept" in head
    assert 'ip saddr @cluster_nodes tcp dport 6817 accept comment "slurmctld"' in head
    assert "ip saddr @head_nodes tcp dport 3306 accept" in head
    assert "6818" not in head and "6817" not in compute
    assert 'ip saddr @cluster_nodes tcp dport 6818 accept comment "slurmd"' in compute
    sets = files["files/nftables/address-sets.nft"]
    admin = sets.split("set admin {")[1].split("}")[0]
    assert "10.77.0.1/32" in admin and "10.77.0.11" not in admin
    cluster = sets.split("set cluster_nodes {")[1].split("}")[0]
    assert "10.77.0.1/32" not in cluster and "10.77.0.1," not in cluster  # workstation
    assert all(a in cluster for a in ("10.77.0.11", "10.77.0.12", "10.77.0.13"))


def test_dcgm_exporter_port_opens_only_where_an_exporter_runs() -> None:
    spec = load_spec(ROOT / "examples" / "dgx-superpod.yaml")
    rule = 'tcp dport 9400 accept comment "dcgm-exporter (GPU metrics)"'
    files = render(Cluster(spec))
    assert f"ip saddr @admin {rule}" in files["files/nftables/gpu.nft"]
    assert f"ip saddr @cluster_nodes {rule}" in files["files/nftables/mig.nft"]
    assert "9400" not in files["files/nftables/head.nft"]  # no GPUs there
    no_exporter = spec.model_copy(
        update={
            "nvidia": spec.nvidia.model_copy(
                update={"dcgm_exporter_url": None, "dcgm_exporter_sha256": None}
            )
        }
    )
    assert "9400" not in render(Cluster(no_exporter))["files/nftables/gpu.nft"]


def test_write_render_replaces_and_prunes_only_its_own(tmp_path: Path) -> None:
    files = _render(ROOT / "examples" / "lab.yaml")
    (tmp_path / "notes.txt").write_text("mine")
    changed = write_render(files, tmp_path)
    assert sorted(changed) == sorted(files)
    assert write_render(files, tmp_path) == []  # nothing to do the second time
    fewer = {k: v for k, v in files.items() if not k.startswith("files/slurm/")}
    changed = write_render(fewer, tmp_path)
    assert sorted(changed) == sorted(k for k in files if k.startswith("files/slurm/"))
    assert not (tmp_path / "files" / "slurm" / "slurm.conf").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"
    (tmp_path / "files" / "hosts").write_text("edited by hand\n")
    assert write_render(fewer, tmp_path) == ["files/hosts"]  # hand edits are put back


def _with(example: str, tmp_path: Path, **changes: object) -> Path:
    """A copy of an example with top-level keys merged in (one level deep)."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    doc = yaml.load((ROOT / "examples" / example).read_text())
    for key, value in changes.items():
        if isinstance(value, dict) and key in doc:
            doc[key].update(value)
        else:
            doc[key] = value
    out = tmp_path / example
    with out.open("w") as fh:
        yaml.dump(doc, fh)
    return out


def test_the_ssh_port_moves_the_firewall_and_the_cloud_rules(tmp_path: Path) -> None:
    from provision.providers.cloud.layout import layout as cloud_layout

    spec = load_spec(_with("hybrid-cloud.yaml", tmp_path, ssh={"port": 2222}))
    files = render(Cluster(spec))
    rules = [
        f
        for name, f in files.items()
        if name.startswith("files/nftables/") and not name.endswith("sets.nft")
    ]
    assert rules and all("ip saddr @admin tcp dport 2222 accept" in f for f in rules)
    assert not any("dport 22 " in f for f in rules)
    assert "ansible_port: 2222" in files["inventory/hosts.yml"]
    layout = cloud_layout(Cluster(spec), "aws", "ssh-ed25519 AAAA test")
    ssh = [i for p in layout.pools for i in p.ingress if "ssh" in i.description]
    assert ssh and all((i.from_port, i.to_port) == (2222, 2222) for i in ssh)


def test_slurm_ports_from_the_spec_reach_slurm_conf_firewall_and_verify(tmp_path: Path) -> None:
    from provision.spec.ports import service_ports

    spec = load_spec(
        _with(
            "lab.yaml",
            tmp_path,
            slurm={"config": {"SlurmctldPort": "7817-7818", "SlurmdPort": 7819}},
        )
    )
    files = render(Cluster(spec))
    conf = files["files/slurm/slurm.conf"]
    assert "SlurmctldPort=7817-7818\n" in conf and "SlurmdPort=7819\n" in conf
    assert "tcp dport 7817-7818 accept" in files["files/nftables/head.nft"]
    assert "tcp dport 7819 accept" in files["files/nftables/compute.nft"]
    assert "6817" not in files["files/nftables/head.nft"]
    ports = service_ports(spec)
    assert (ports.slurmctld_first, ports.slurmd) == ("7817", "7819")


def test_an_elastic_cloud_pools_network_is_admitted_before_its_nodes_exist(tmp_path: Path) -> None:
    """The cloud gives a burst node its address when it is made, after the render: the sets
    admit the pool's whole network (slurmctld, slurmd and srun take a node that has not
    registered yet); a lasting node's address inside that range is left to the range, which
    nftables needs (overlapping elements of an interval set are refused), and nft takes it."""
    import ipaddress

    from provision.render.firewall import address_sets

    text = (UNBUILT_DIR / "cloud-burst.yaml").read_text()
    lasting = (
        "  - name: awscpu\n    role: compute\n    profile: aws-p5.48xlarge\n    provider: aws\n"
        "    network: aws\n    hostname_prefix: aws-cpu-\n    region: us-east-1\n    count: 1\n"
    )
    spec = tmp_path / "burst.yaml"
    spec.write_text(text.replace("software:\n", lasting + "software:\n", 1))
    cluster = Cluster(
        load_spec(spec, unbuilt=True),
        addresses={"aws-cpu-001": ipaddress.IPv4Address("10.21.0.5")},
    )
    sets = address_sets(cluster)
    for name in ("cluster_nodes", "compute_nodes"):
        assert sets[name][-3:] == ["10.21.0.0/16", "10.22.0.0/16", "10.23.0.0/16"], name
        assert "10.21.0.5" not in sets[name] and "10.20.1.1" in sets[name]
    assert sets["head_nodes"] == ["10.20.0.10"]
    files = render(cluster)
    nft = shutil.which("nft") or "/usr/sbin/nft"
    (tmp_path / "sets.nft").write_text(files["files/nftables/address-sets.nft"])
    ruleset = files["files/nftables/head.nft"].replace(
        "/etc/nftables.d/provision-sets.nft", str(tmp_path / "sets.nft")
    )
    (tmp_path / "head.nft").write_text(ruleset)
    out = subprocess.run(
        [nft, "-c", "-f", str(tmp_path / "head.nft")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    # a lab pool's reserved addresses are listed, not a range
    lab = address_sets(Cluster(load_any(ROOT / "examples" / "lab-burst.yaml")))
    assert not any("/" in a for a in lab["cluster_nodes"])


def test_a_pool_called_sets_has_rules_of_its_own_beside_the_address_sets(tmp_path: Path) -> None:
    """The firewall's address sets are not named as a pool could be (pool names have no '-'):
    a pool called `sets` once replaced them with its own rules."""
    spec = tmp_path / "lab.yaml"
    text = (ROOT / "examples" / "lab.yaml").read_text()
    spec.write_text(text.replace("name: compute", "name: sets").replace("[compute]", "[sets]"))
    files = render(Cluster(load_spec(spec)))
    assert "# Pool sets (role compute)" in files["files/nftables/sets.nft"]
    assert "set compute_nodes" not in files["files/nftables/sets.nft"]
    assert "set compute_nodes {" in files["files/nftables/address-sets.nft"]

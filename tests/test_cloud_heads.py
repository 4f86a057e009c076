"""Heads in a cloud: a cluster wholly in one cloud (its network the management network), and an
HA Kubernetes control plane there behind the cloud's internal load balancer. The clouds' parts
run under Pulumi's mocks with the clouds' documented rules (tests/cloud_rules.py); the heads'
redirect of their own API traffic runs for real, in the kernel of a network namespace."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from provision.cluster import Cluster
from provision.render import render

from .conftest import ROOT, load_any
from .conftest import run_provision as provision
from .test_cloud import Recorder, build

DATA = ROOT / "tests" / "data" / "cloud"
SPECS = {cloud: DATA / f"k8s-ha-{cloud}.yaml" for cloud in ("aws", "gcp", "azure")}
SLURM = DATA / "slurm-aws.yaml"
HEADS = ("cp001", "cp002", "cp003")
CHECK = ("/readyz", 6443)  # what each cloud's health check asks of an API server


@pytest.fixture(scope="module")
def stacks() -> dict[str, tuple[Recorder, Cluster, dict[str, Any]]]:
    return {cloud: build(path) for cloud, path in SPECS.items()}


def _variant(tmp_path: Path, source: Path, old: str, new: str) -> Path:
    text = source.read_text()
    assert old in text
    path = tmp_path / source.name
    path.write_text(text.replace(old, new))
    return path


def test_the_heads_are_instances_of_their_clouds_stack(stacks: Any) -> None:
    for cloud, (_, _, outputs) in stacks.items():
        nodes = outputs[cloud]
        assert set(HEADS) <= set(nodes), cloud
        assert all(nodes[h]["private"] and nodes[h]["public"] for h in HEADS), cloud


def test_aws_fronts_the_api_servers_with_an_internal_nlb_of_ip_targets(stacks: Any) -> None:
    rec, _, outputs = stacks["aws"]
    (balancer,) = rec.of("lb/loadBalancer:LoadBalancer")
    assert balancer.inputs["internal"] is True
    assert balancer.inputs["loadBalancerType"] == "network"
    (mapping,) = balancer.inputs["subnetMappings"]
    assert mapping["privateIpv4Address"] == "10.40.100.200"
    # in the heads' zone's subnet (the pools name two zones: each has its own)
    subnet = next(m for m in rec.of("ec2/subnet:Subnet") if f"{m.name}-id" == mapping["subnetId"])
    assert subnet.inputs["availabilityZone"] == "us-east-1b"
    assert subnet.inputs["cidrBlock"] == "10.40.0.0/17"
    (group,) = rec.of("lb/targetGroup:TargetGroup")
    # IP targets with client IP preservation off: a head's own connection through the
    # balancer comes back to it from the balancer's address (the hairpin AWS documents)
    assert group.inputs["targetType"] == "ip"
    assert group.inputs["preserveClientIp"] == "false"
    assert (group.inputs["protocol"], group.inputs["port"]) == ("TCP", 6443)
    check = group.inputs["healthCheck"]
    assert (check["protocol"], check["path"], int(check["port"])) == ("HTTPS", *CHECK)
    targets = [a.inputs for a in rec.of("lb/targetGroupAttachment:TargetGroupAttachment")]
    assert sorted(t["targetId"] for t in targets) == sorted(
        outputs["aws"][h]["private"] for h in HEADS
    )
    assert {t["targetGroupArn"] for t in targets} == {f"arn:aws:lb/targetGroup:{group.name}"}
    (listener,) = rec.of("lb/listener:Listener")
    assert (listener.inputs["protocol"], listener.inputs["port"]) == ("TCP", 6443)
    assert listener.inputs["defaultActions"] == [
        {"type": "forward", "targetGroupArn": f"arn:aws:lb/targetGroup:{group.name}"}
    ]


def test_gcp_fronts_the_api_servers_with_an_internal_passthrough_balancer(stacks: Any) -> None:
    rec, _, _ = stacks["gcp"]
    (address,) = rec.of("compute/address:Address")
    assert address.inputs["addressType"] == "INTERNAL"
    assert address.inputs["address"] == "10.40.200.200"
    assert address.inputs["subnetwork"] == "kgcp-subnet-id"
    (group,) = rec.of("compute/instanceGroup:InstanceGroup")
    assert group.inputs["instances"] == [f"https://compute/kgcp-{h}" for h in HEADS]
    assert group.inputs["zone"] == "us-central1-a"
    (check,) = rec.of("compute/regionHealthCheck:RegionHealthCheck")
    https = check.inputs["httpsHealthCheck"]
    assert (https["requestPath"], https["port"]) == CHECK
    (backend,) = rec.of("compute/regionBackendService:RegionBackendService")
    assert backend.inputs["loadBalancingScheme"] == "INTERNAL"
    assert backend.inputs["healthChecks"] == f"{check.name}-id"
    assert backend.inputs["backends"] == [
        {"group": f"https://compute/{group.name}", "balancingMode": "CONNECTION"}
    ]
    (rule,) = rec.of("compute/forwardingRule:ForwardingRule")
    assert rule.inputs["loadBalancingScheme"] == "INTERNAL"
    assert rule.inputs["ipAddress"] == "10.40.200.200"
    assert (rule.inputs["ipProtocol"], rule.inputs["ports"]) == ("TCP", ["6443"])
    assert rule.inputs["backendService"] == f"{backend.name}-id"


def test_azure_fronts_the_api_servers_with_an_internal_standard_balancer(stacks: Any) -> None:
    rec, _, _ = stacks["azure"]
    (balancer,) = rec.of("network:LoadBalancer")
    (frontend,) = balancer.inputs["frontendIPConfigurations"]
    assert frontend["privateIPAllocationMethod"] == "Static"
    assert frontend["privateIPAddress"] == "10.40.200.200"
    assert frontend["subnet"]["id"] == "kazure-subnet-id"
    own = "kazure-rg-id/providers/Microsoft.Network/loadBalancers/kazure-api"
    (probe,) = balancer.inputs["probes"]
    assert (probe["protocol"], probe["requestPath"], probe["port"]) == ("Https", *CHECK)
    (rule,) = balancer.inputs["loadBalancingRules"]
    assert (rule["protocol"], rule["frontendPort"], rule["backendPort"]) == ("Tcp", 6443, 6443)
    assert rule["enableFloatingIP"] is False
    assert rule["frontendIPConfiguration"]["id"] == f"{own}/frontendIPConfigurations/api"
    assert rule["probe"]["id"] == f"{own}/probes/readyz"
    pool = f"{own}/backendAddressPools/heads"
    assert rule["backendAddressPool"]["id"] == pool
    members = {
        nic.name.removeprefix("kazure-").removesuffix("-nic")
        for nic in rec.of("network:NetworkInterface")
        if nic.inputs["ipConfigurations"][0].get("loadBalancerBackendAddressPools")
        == [{"id": pool}]
    }
    assert members == set(HEADS)  # the workers' NICs stay out


# what takes the address in each cloud, and what is given addresses from the same range
TAKERS = {
    "aws": ("pulumi_aws", "lb.LoadBalancer", "ec2.Instance"),
    "gcp": ("pulumi_gcp", "compute.Address", "compute.InstanceFromTemplate"),
    "azure": ("pulumi_azure_native", "network.LoadBalancer", "network.NetworkInterface"),
}


@pytest.mark.parametrize("cloud", sorted(SPECS))
def test_the_balancer_takes_its_address_before_any_node_is_given_one(
    cloud: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cloud gives instances free addresses of the subnet: every node's instance (or NIC)
    waits for the resource that holds the API's address (Pulumi's depends_on)."""
    package, holder, taker = TAKERS[cloud]
    module = __import__(package)
    for part in taker.split(".")[:-1]:
        module = getattr(module, part)
    cls = getattr(module, taker.split(".")[-1])
    waits: dict[str, list[str]] = {}
    original = cls.__init__

    def init(self: Any, resource_name: str, *args: Any, **kwargs: Any) -> None:
        opts = kwargs.get("opts")
        waits[resource_name] = [
            type(d).__module__ + "." + type(d).__name__
            for d in (getattr(opts, "depends_on", None) or [])
        ]
        original(self, resource_name, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", init)
    build(SPECS[cloud])
    name = holder.split(".")[-1]
    assert len(waits) == 5  # three heads and two workers
    assert all(any(d.endswith(f".{name}") for d in deps) for deps in waits.values()), waits


@pytest.mark.parametrize("cloud", sorted(SPECS))
def test_cloud_heads_reach_the_api_through_the_balancers_address(cloud: str) -> None:
    files = render(Cluster(load_any(SPECS[cloud])))
    address = "10.40.100.200" if cloud == "aws" else "10.40.200.200"
    assert f"controlPlaneEndpoint: {address}:6443" in files["files/kubernetes/kubeadm.yaml"]
    group_vars = files["inventory/group_vars/all.yml"]
    assert f'kubernetes_node_api_endpoint: !unsafe "{address}:6443"' in group_vars
    assert "api_endpoint_vrrp: false" in group_vars  # no keepalived: the balancer holds it
    heads, workers = files["files/nftables/cp.nft"], files["files/nftables/gpu.nft"]
    redirect = f"ip daddr {address} tcp dport 6443 redirect to :8443"
    assert redirect in heads and "type nat hook output" in heads
    assert "redirect" not in workers
    assert "vrrp" not in heads and "dport 8443" not in heads
    sources = {
        "aws": [f"{address}/32"],  # the balancer's own address (client IPs not preserved)
        "gcp": ["35.191.0.0/16", "130.211.0.0/22"],  # Google's health checkers
        "azure": ["168.63.129.16/32"],  # Azure's probes
    }[cloud]
    for source in sources:
        assert f"ip saddr {source} tcp dport 6443 accept" in heads


def test_heads_on_premises_keep_keepalived_and_no_redirect() -> None:
    files = render(Cluster(load_any(ROOT / "examples" / "k8s.yaml")))
    heads = files["files/nftables/cp.nft"]
    assert "ip protocol vrrp accept" in heads and "dport 8443" in heads
    assert "nat hook" not in heads
    assert "api_endpoint_vrrp" not in files["inventory/group_vars/all.yml"]
    assert "controlPlaneEndpoint: 10.30.0.10:8443" in files["files/kubernetes/kubeadm.yaml"]


def _rule_sets(files: dict[str, str], tmp_path: Path) -> dict[str, Path]:
    sets = tmp_path / "sets.nft"
    sets.write_text(files["files/nftables/address-sets.nft"])
    out = {}
    for pool in ("cp", "gpu"):
        path = tmp_path / f"{pool}.nft"
        text = files[f"files/nftables/{pool}.nft"]
        path.write_text(text.replace("/etc/nftables.d/provision-sets.nft", str(sets)))
        out[pool] = path
    return out


# In a network namespace of its own: the node's address on one end of a veth pair (the
# balancer's address routes out of it, and nothing answers there), the rendered rule set
# loaded, a listener standing in for haproxy on 8443; then a connection to the balancer's
# address on the API's port
_PROBE = r"""
set -e
ip link set lo up
ip link add node0 type veth peer name far0
ip addr add 10.40.0.11/16 dev node0
ip link set node0 up
ip link set far0 up
nft -f "$1"
"$2" - <<'PY'
import socket, threading
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", 8443))
server.listen()
def answer():
    conn, _ = server.accept()
    conn.sendall(b"haproxy")
    conn.close()
threading.Thread(target=answer, daemon=True).start()
try:
    with socket.create_connection(("10.40.200.200", 6443), timeout=2) as conn:
        print(conn.recv(16).decode())
except OSError as exc:
    print(f"no answer: {exc}")
PY
"""


def test_a_heads_own_api_traffic_goes_to_its_haproxy_in_the_kernel(tmp_path: Path) -> None:
    """Real nft and a real kernel: the head's rendered rule set sends its connection to the
    balancer's address to the local haproxy port; a worker's, without the redirect, does not
    (it would go through the balancer). Needs root's network namespaces, as in CI."""
    unshare, nft = shutil.which("unshare"), shutil.which("nft") or "/usr/sbin/nft"
    if unshare is None or not Path(nft).exists():
        pytest.skip("unshare or nft is missing (the README's test command installs nft)")
    files = render(Cluster(load_any(SPECS["gcp"])))
    paths = _rule_sets(files, tmp_path)
    got = {}
    for pool, path in paths.items():
        run = subprocess.run(
            [unshare, "--net", "sh", "-c", _PROBE, "probe", str(path), sys.executable],
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode != 0 and "Operation not permitted" in run.stderr:
            pytest.skip("network namespaces need CAP_SYS_ADMIN")
        assert run.returncode == 0, run.stderr
        got[pool] = run.stdout.strip()
    assert got["cp"] == "haproxy"
    assert got["gpu"].startswith("no answer"), got["gpu"]


@pytest.mark.parametrize("cloud", sorted(SPECS))
def test_the_cloud_heads_rule_sets_parse(cloud: str, tmp_path: Path) -> None:
    nft = shutil.which("nft") or "/usr/sbin/nft"
    if not Path(nft).exists():
        pytest.skip("nft is not installed (the README's test command installs it)")
    for path in _rule_sets(render(Cluster(load_any(SPECS[cloud]))), tmp_path).values():
        out = subprocess.run([nft, "-c", "-f", str(path)], capture_output=True, text=True)
        if out.returncode != 0 and "Operation not permitted" in out.stderr:
            pytest.skip("nft -c needs CAP_NET_ADMIN")
        assert out.returncode == 0, out.stderr


def test_an_api_address_the_balancer_cannot_take_is_refused_at_its_line(tmp_path: Path) -> None:
    outside = _variant(tmp_path, SPECS["aws"], "10.40.100.200", "10.40.200.200")
    for command in (["validate"], ["plan", "--state-dir", str(tmp_path / "state")]):
        result = provision(*command, str(outside))
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip() == (
            f"{outside}:10: kubernetes.api_address: 10.40.200.200 is outside the heads' subnet "
            "in us-east-1b 10.40.0.0/17, where aws's load balancer takes the API's address: "
            "pick a free address there"
        )
    (tmp_path / "gcp").mkdir()
    kept = _variant(tmp_path / "gcp", SPECS["gcp"], "10.40.200.200", "10.40.255.254")
    result = provision("validate", str(kept))
    assert result.returncode == 2
    assert "10.40.255.254 is one of the addresses gcp keeps for itself in 10.40.0.0/16" in (
        result.stderr
    )


def test_pools_beyond_the_heads_cloud_are_not_supported_yet(tmp_path: Path) -> None:
    text = SLURM.read_text().replace(
        "security:",
        "  - {name: onprem, role: compute, profile: cpu-node, count: 1,\n"
        "     first_address: 10.40.1.1}\nsecurity:",
    )
    path = tmp_path / "mixed.yaml"
    path.write_text(text)
    result = provision("validate", str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"{path}:15: pools[3].provider: not supported yet: with the heads on aws, a pool on "
        "static (the tunnel's hub is a head, and a cloud head's public address is not known "
        "before its instance exists); put every pool on aws, or the heads on premises"
    )


def test_plan_says_the_heads_are_in_the_cloud(tmp_path: Path) -> None:
    result = provision("plan", str(SLURM), "--state-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "aws: the heads are here: its network is the cluster's management network" in text
    assert "WireGuard" not in text


def test_plan_says_the_balancer_is_in_the_cloud(tmp_path: Path) -> None:
    result = provision("plan", str(SPECS["azure"]), "--state-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert (
        "azure: an internal Standard Load Balancer (a static frontend address) at "
        "10.40.200.200:6443 in front of the cp pool's API servers"
    ) in text


def test_burst_nodes_in_the_heads_cloud_join_its_private_address() -> None:
    """A Slurm cluster wholly in AWS: the elastic pool's user data names the head instance's
    private address (the stack's), and the heads admit the pool's range before its nodes
    exist (they are on the management network, which is the cloud's)."""
    rec, cluster, outputs = build(SLURM, munge_key=b"k" * 32)
    assert outputs["aws"]["head001"]["public"]  # Ansible's way in
    (template,) = [m for m in rec.of("launchTemplate:LaunchTemplate") if m.inputs.get("userData")]
    text = base64.b64decode(template.inputs["userData"]).decode()
    assert "k" * 32 not in text
    config = json.loads(yaml.safe_load(text)["write_files"][0]["content"])
    assert config["controllers"] == [["head001", outputs["aws"]["head001"]["private"]]]
    assert config["tunnel_endpoint"] == ""  # no tunnel: the same network
    sets = render(cluster)["files/nftables/address-sets.nft"]
    assert "10.40.0.0/16," in sets.split("set cluster_nodes")[1].split("set head_nodes")[0]

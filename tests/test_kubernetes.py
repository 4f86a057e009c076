"""Kubernetes: the spec's checks, the rendered kubeadm, containerd, haproxy and etcd files, the
firewall's rules, etcd's certificates, and the interface filter keepalived's template uses.

What runs live (containerd, etcd, keepalived, haproxy) is Molecule's `kubernetes` scenario; no
kubeadm or kubelet can be installed here, so kubeadm's configuration is checked against the
fields and types of the API versions it names (KUBEADM_TYPES below)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shlex
import stat
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from provision.cluster import Cluster
from provision.errors import SpecError
from provision.pki import API_CLIENT, ETCD_DIR, Member, etcd_members, make_etcd_pki
from provision.render import render
from provision.render.firewall import pool_rules, rule_lines
from provision.render.kubernetes import vrrp_router_id
from provision.spec import load_spec
from provision.verify.remote import Output

from .conftest import COLLECTION, ROOT

K8S = ROOT / "examples" / "k8s.yaml"

# The fields of kubeadm.k8s.io/v1beta4, kubelet.config.k8s.io/v1beta1 and
# kubeproxy.config.k8s.io/v1alpha1 the renderer may write, with their types (from the Go types
# of Kubernetes 1.31-1.33: cmd/kubeadm/app/apis/kubeadm/v1beta4, k8s.io/kubelet/config/v1beta1,
# k8s.io/kube-proxy/config/v1alpha1). A key outside them, or a value of another type, fails:
# kubeadm would refuse it ("unknown field") or read it as something else.
_STR, _LIST_STR, _MAP_STR = str, [str], {str: str}
KUBEADM_TYPES: dict[tuple[str, str], dict[str, object]] = {
    ("kubeadm.k8s.io/v1beta4", "ClusterConfiguration"): {
        "clusterName": _STR,
        "kubernetesVersion": _STR,
        "controlPlaneEndpoint": _STR,
        "certificatesDir": _STR,
        "imageRepository": _STR,
        "networking": {"podSubnet": _STR, "serviceSubnet": _STR, "dnsDomain": _STR},
        "apiServer": {"certSANs": _LIST_STR},
        "etcd": {
            "local": {"dataDir": _STR, "serverCertSANs": _LIST_STR, "peerCertSANs": _LIST_STR},
            "external": {"endpoints": _LIST_STR, "caFile": _STR, "certFile": _STR, "keyFile": _STR},
        },
    },
    ("kubelet.config.k8s.io/v1beta1", "KubeletConfiguration"): {
        "cgroupDriver": _STR,
        "containerRuntimeEndpoint": _STR,
        "clusterDomain": _STR,
        "systemReserved": _MAP_STR,
        "kubeReserved": _MAP_STR,
        "evictionHard": _MAP_STR,
    },
    ("kubeproxy.config.k8s.io/v1alpha1", "KubeProxyConfiguration"): {
        "mode": _STR,
        "clusterCIDR": _STR,
    },
}


def _check_type(value: object, schema: object, at: str) -> list[str]:
    if schema is str:
        return [] if isinstance(value, str) else [f"{at}: {value!r} is not a string"]
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{at}: not a list"]
        return [p for i, v in enumerate(value) for p in _check_type(v, schema[0], f"{at}[{i}]")]
    assert isinstance(schema, dict)
    if not isinstance(value, dict):
        return [f"{at}: not a mapping"]
    if list(schema) == [str]:  # a map of strings
        return [p for k, v in value.items() for p in _check_type(v, str, f"{at}.{k}")]
    problems = [f"{at}.{k}: unknown field" for k in value if k not in schema]
    for key, sub in value.items():
        if key in schema:
            problems += _check_type(sub, schema[key], f"{at}.{key}")
    return problems


def kubeadm_problems(text: str) -> list[str]:
    problems = []
    for doc in yaml.safe_load_all(text):
        kind = (doc.pop("apiVersion", None), doc.pop("kind", None))
        if kind not in KUBEADM_TYPES:
            problems.append(f"{kind}: not a type kubeadm {KUBEADM_TYPES.keys()} takes")
            continue
        problems += _check_type(doc, KUBEADM_TYPES[kind], kind[1])
    return problems


def _spec(tmp_path: Path, text: str) -> Cluster:
    path = tmp_path / "k.yaml"
    path.write_text(text)
    return Cluster(load_spec(path))


BASE = """\
name: kc
os: debian12
scheduler: kubernetes
kubernetes: {KUBE}
network:
  management: {{cidr: 10.5.0.0/24}}
pools:
  - {{name: head, role: head, profile: cpu-node, count: {HEADS}, first_address: 10.5.0.11}}
  - {{name: gpu, role: compute, profile: dgx-h100, count: 2, first_address: 10.5.0.20}}
security:
  admin_cidrs: [10.9.0.0/24]
"""


def _text(kube: str = "{}", heads: int = 1) -> str:
    return BASE.format(KUBE=kube, HEADS=heads)


def _errors(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    return "\n".join(str(i) for i in caught.value.issues)


# --- the spec


def test_apply_takes_kubernetes(tmp_path: Path) -> None:
    path = tmp_path / "k.yaml"
    path.write_text(_text())
    assert load_spec(path).scheduler == "kubernetes"
    assert load_spec(ROOT / "examples" / "lab-k8s.yaml").kubernetes.ha


@pytest.mark.parametrize(
    ("kube", "heads", "message"),
    [
        ("{ha: true, api_address: 10.5.0.5}", 1, "at least 3 head nodes"),
        ("{ha: true}", 3, "an HA control plane needs api_address"),
        ("{api_address: 10.5.0.5}", 3, "set ha: true, or remove it"),
        ("{ha: true, api_address: 10.6.0.5}", 3, "not a host address of the management network"),
        ("{ha: true, api_address: 10.5.0.255}", 3, "not a host address of the management network"),
        ("{ha: true, api_address: 10.5.0.12}", 3, "head002 has 10.5.0.12, the API's virtual"),
        ("{version: '1.33'}", 1, "give the exact one, e.g. 1.33.5"),
        ("{version: '1.29.3'}", 1, "Kubernetes 1.29.3 is not supported"),
        ("{etcd: embedded}", 1, "'stacked' or 'external'"),
        ("{pod_cidr: 10.5.0.0/16}", 1, "overlaps network.management.cidr"),
    ],
)
def test_bad_kubernetes_settings(tmp_path: Path, kube: str, heads: int, message: str) -> None:
    assert message in _errors(tmp_path, _text(kube, heads))


def test_kubernetes_on_rocky_and_workers_beyond_the_heads_cloud_are_not_supported_yet(
    tmp_path: Path,
) -> None:
    assert "Kubernetes on rocky9" in _errors(tmp_path, _text().replace("debian12", "rocky9"))
    cloud = _text("{ha: true, api_address: 10.5.0.5}", 3).replace(
        "profile: cpu-node, count: 3, first_address: 10.5.0.11",
        "profile: aws-m7i.4xlarge, count: 3, provider: aws, region: us-east-1",
    )
    assert "with the heads on aws, a pool on static" in _errors(tmp_path, cloud)


def test_lab_nodes_never_get_the_api_address(tmp_path: Path) -> None:
    text = (
        _text("{ha: true, api_address: 10.5.0.11}", 3)
        .replace(
            "cpu-node, count: 3, first_address: 10.5.0.11", "lab-container, count: 3, provider: lab"
        )
        .replace(
            "dgx-h100, count: 2, first_address: 10.5.0.20", "lab-container, count: 2, provider: lab"
        )
    )
    cluster = _spec(tmp_path, text)
    assert ipaddress.IPv4Address("10.5.0.11") not in {n.address for n in cluster.nodes}


# --- the render


def test_the_example_renders_every_kubernetes_file() -> None:
    files = render(Cluster(load_spec(K8S)))
    kube = sorted(f for f in files if f.startswith("files/kubernetes/"))
    assert kube == [
        "files/kubernetes/calico.yaml",
        "files/kubernetes/containerd/cp.toml",
        "files/kubernetes/containerd/gpu.toml",
        "files/kubernetes/etcd/cp001.env",
        "files/kubernetes/etcd/cp002.env",
        "files/kubernetes/etcd/cp003.env",
        "files/kubernetes/haproxy.cfg",
        "files/kubernetes/kubeadm.yaml",
        "files/kubernetes/nvidia-device-plugin.yaml",
    ]
    assert not any(f.startswith("files/slurm/") for f in files)


def _validate(text: str, version: str) -> list[str]:
    """kubernetes-validate's complaints about each document, against the release's schemas
    (strict: a field the release does not know is one)."""
    problems = []
    for doc in yaml.safe_load_all(text):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            problems.append(f"{doc['kind']}: {str(err).splitlines()[0]}")
    return problems


@pytest.mark.parametrize("version", ["1.31.0", "1.32.0", "1.33.0"])
def test_gpu_manifests_are_valid_for_each_supported_release(version: str) -> None:
    files = render(Cluster(load_spec(K8S)))
    text = files["files/kubernetes/nvidia-device-plugin.yaml"]
    assert _validate(text, version) == []
    runtime_class, daemonset, discovery = yaml.safe_load_all(text)
    assert runtime_class["handler"] == "nvidia"
    pod = daemonset["spec"]["template"]["spec"]
    gfd = discovery["spec"]["template"]["spec"]
    assert (
        pod["nodeSelector"]
        == gfd["nodeSelector"]
        == runtime_class["scheduling"]["nodeSelector"]
        == {"nvidia.com/gpu.present": "true"}
    )
    assert pod["runtimeClassName"] == gfd["runtimeClassName"] == "nvidia"
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env == {"FAIL_ON_INIT_ERROR": "true", "MIG_STRATEGY": "none"}
    # feature discovery writes its labels where Node Feature Discovery's worker reads them
    (container,) = gfd["containers"]
    assert container["command"] == ["/usr/bin/gpu-feature-discovery"]
    assert container["image"] == pod["containers"][0]["image"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    paths = {v["name"]: v["hostPath"]["path"] for v in gfd["volumes"]}
    features = "/etc/kubernetes/node-feature-discovery/features.d"
    assert mounts == paths == {"output-dir": features, "host-sys": "/sys"}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["MIG_STRATEGY"] == "none" and env["GFD_SLEEP_INTERVAL"] == "60s"


def test_the_manifest_check_sees_an_unknown_field_and_a_wrong_type() -> None:
    files = render(Cluster(load_spec(K8S)))
    runtime_class, daemonset, _ = yaml.safe_load_all(
        files["files/kubernetes/nvidia-device-plugin.yaml"]
    )
    runtime_class["handlers"] = runtime_class.pop("handler")
    daemonset["spec"]["template"]["spec"]["containers"][0]["env"] = {"MIG_STRATEGY": "none"}
    problems = _validate(yaml.safe_dump_all([runtime_class, daemonset]), "1.33.0")
    assert len(problems) == 2
    assert "'handlers' was unexpected" in problems[0] or "'handler' is a required" in problems[0]
    assert problems[1].startswith("DaemonSet: ")


def test_mig_pools_advertise_each_profile_and_cpu_clusters_get_no_plugin(tmp_path: Path) -> None:
    mig = _text().replace("dgx-h100, count: 2", "dgx-h100, count: 2, mig: [1g.10gb, 1g.10gb]")
    files = render(_spec(tmp_path, mig))
    documents = list(yaml.safe_load_all(files["files/kubernetes/nvidia-device-plugin.yaml"]))
    for daemonset in documents[1:]:  # the plugin and feature discovery
        pod = daemonset["spec"]["template"]["spec"]
        env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
        assert env["MIG_STRATEGY"] == "mixed", daemonset["metadata"]["name"]
    cpu = _text().replace("dgx-h100", "cpu-node")
    assert "files/kubernetes/nvidia-device-plugin.yaml" not in render(_spec(tmp_path, cpu))


def test_calico_takes_the_pod_network_and_finds_nodes_on_the_management_network() -> None:
    files = render(Cluster(load_spec(K8S)))
    (installation,) = yaml.safe_load_all(files["files/kubernetes/calico.yaml"])
    network = installation["spec"]["calicoNetwork"]
    assert [p["cidr"] for p in network["ipPools"]] == ["10.244.0.0/16"]
    assert network["ipPools"][0]["encapsulation"] == "VXLAN" and network["bgp"] == "Disabled"
    assert network["nodeAddressAutodetectionV4"] == {"cidrs": ["10.30.0.0/16"]}


def test_kubeadm_configuration_has_only_kubeadms_fields_and_types() -> None:
    files = render(Cluster(load_spec(K8S)))
    text = files["files/kubernetes/kubeadm.yaml"]
    assert kubeadm_problems(text) == []
    cluster, kubelet, proxy = yaml.safe_load_all(text)
    assert cluster["kubernetesVersion"] == "v1.33.5"
    assert cluster["controlPlaneEndpoint"] == "10.30.0.10:8443"
    assert cluster["networking"] == {
        "podSubnet": "10.244.0.0/16", "serviceSubnet": "10.96.0.0/12", "dnsDomain": "cluster.local"
    }  # fmt: skip
    assert cluster["apiServer"]["certSANs"][:3] == ["10.30.0.10", "cp001", "10.30.0.11"]
    assert cluster["etcd"]["external"]["endpoints"] == [
        f"https://10.30.0.{n}:2379" for n in (11, 12, 13)
    ]
    assert kubelet["cgroupDriver"] == "systemd"
    assert proxy["clusterCIDR"] == "10.244.0.0/16"


def test_the_schema_check_sees_an_unknown_field_and_a_wrong_type() -> None:
    text = (
        "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n"
        "networking: {podSubnet: 10.0.0.0/8, podCIDR: x}\napiServer: {certSANs: a}\n"
        "---\napiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\n"
    )
    problems = kubeadm_problems(text)
    assert "ClusterConfiguration.networking.podCIDR: unknown field" in problems
    assert "ClusterConfiguration.apiServer.certSANs: not a list" in problems
    assert any("v1beta3" in p for p in problems)


def test_stacked_etcd_and_one_head(tmp_path: Path) -> None:
    files = render(_spec(tmp_path, _text()))
    cluster = next(yaml.safe_load_all(files["files/kubernetes/kubeadm.yaml"]))
    assert cluster["etcd"] == {"local": {"dataDir": "/var/lib/etcd"}}
    assert cluster["controlPlaneEndpoint"] == "10.5.0.11:6443"
    assert "files/kubernetes/haproxy.cfg" not in files
    assert not any("/etcd/" in f for f in files)
    assert kubeadm_problems(files["files/kubernetes/kubeadm.yaml"]) == []


def test_containerd_per_pool() -> None:
    files = render(Cluster(load_spec(K8S)))
    gpu, cp = (
        files["files/kubernetes/containerd/gpu.toml"],
        files["files/kubernetes/containerd/cp.toml"],
    )
    assert 'default_runtime_name = "nvidia"' in gpu
    assert 'BinaryName = "/usr/bin/nvidia-container-runtime"' in gpu
    assert 'default_runtime_name = "runc"' in cp and "nvidia" not in cp
    for text in (gpu, cp):
        assert text.count("SystemdCgroup = true") == text.count("runtime_type =")
        assert 'snapshotter = "overlayfs"' in text
        assert 'sandbox_image = "registry.k8s.io/pause:3.10"' in text


def test_containerd_in_the_lab_uses_the_native_snapshotter() -> None:
    files = render(Cluster(load_spec(ROOT / "molecule" / "kubernetes" / "cluster.yaml")))
    assert 'snapshotter = "native"' in files["files/kubernetes/containerd/head.toml"]


def test_haproxy_and_etcd_name_every_head() -> None:
    files = render(Cluster(load_spec(K8S)))
    haproxy = files["files/kubernetes/haproxy.cfg"]
    assert "bind *:8443" in haproxy
    # its own user in a chroot, logging to the journal (no /dev/log in the chroot)
    assert "  chroot /var/lib/haproxy\n  user haproxy\n  group haproxy\n" in haproxy
    assert "log stdout" in haproxy and "/dev/log" not in haproxy
    for n in (1, 2, 3):
        assert f"server cp00{n} 10.30.0.1{n}:6443" in haproxy
    env = dict(
        line.split("=", 1)
        for line in files["files/kubernetes/etcd/cp002.env"].splitlines()
        if line and not line.startswith("#")
    )
    assert env["ETCD_NAME"] == "cp002"
    assert env["ETCD_ADVERTISE_CLIENT_URLS"] == "https://10.30.0.12:2379"
    assert env["ETCD_INITIAL_CLUSTER"] == ",".join(
        f"cp00{n}=https://10.30.0.1{n}:2380" for n in (1, 2, 3)
    )
    assert env["ETCD_CLIENT_CERT_AUTH"] == env["ETCD_PEER_CLIENT_CERT_AUTH"] == "true"


def test_firewall_rules_of_a_kubernetes_cluster() -> None:
    cluster = Cluster(load_spec(K8S))
    rules = pool_rules(cluster)
    cp, gpu = rule_lines(rules["cp"]), rule_lines(rules["gpu"])
    assert 'ip saddr @head_nodes ip protocol vrrp accept comment "keepalived (VRRP)"' in cp
    assert 'ip saddr @head_nodes tcp dport 2379-2380 accept comment "etcd"' in cp
    assert 'ip saddr @admin tcp dport 8443 accept comment "kube-apiserver (haproxy)"' in cp
    assert not any("2379" in line or "vrrp" in line or "6443" in line for line in gpu)
    assert 'ip saddr @head_nodes tcp dport 10250 accept comment "kubelet"' in gpu
    # pods on a head reach the API from the pod network; Typha from every node
    assert 'ip saddr 10.244.0.0/16 tcp dport 6443 accept comment "kube-apiserver"' in cp
    for lines in (cp, gpu):
        assert 'ip saddr @cluster_nodes tcp dport 5473 accept comment "calico typha"' in lines


def test_group_vars_name_the_virtual_address() -> None:
    files = render(Cluster(load_spec(K8S)))
    group = yaml.safe_load(files["inventory/group_vars/all.yml"].replace("!unsafe ", ""))
    assert group["api_endpoint_address"] == "10.30.0.10"
    assert group["api_endpoint_router_id"] == vrrp_router_id("k8s")
    assert group["provision_kubernetes_etcd"] == "external"
    assert 1 <= vrrp_router_id("k8s") <= 255
    assert len({vrrp_router_id(f"c{i}") for i in range(50)}) > 40  # names spread


# --- etcd's certificates


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_etcd_certificates_made_once_private_and_for_each_member(tmp_path: Path) -> None:
    members = [Member("h1", ("10.0.0.11",)), Member("h2", ("10.0.0.12",))]
    made = make_etcd_pki(tmp_path, members, "c")
    assert made == ["ca", "h1", "h2", API_CLIENT]
    pki = tmp_path / ETCD_DIR
    assert stat.S_IMODE(pki.stat().st_mode) == 0o700
    for key in pki.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    ca = _cert(pki / "ca.crt")
    h1 = _cert(pki / "h1.crt")
    assert h1.issuer == ca.subject
    ca.public_key().verify(
        h1.signature, h1.tbs_certificate_bytes, h1.signature_algorithm_parameters
    )  # type: ignore[arg-type,call-arg]
    alt = h1.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(alt.get_values_for_type(x509.DNSName)) == ["h1", "localhost"]
    assert sorted(str(a) for a in alt.get_values_for_type(x509.IPAddress)) == [
        "10.0.0.11",
        "127.0.0.1",
    ]
    usage = h1.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    client = _cert(pki / f"{API_CLIENT}.crt")
    assert list(client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    before = {p.name: p.read_bytes() for p in pki.iterdir()}
    assert make_etcd_pki(tmp_path, members, "c") == []  # nothing due: nothing made
    assert {p.name: p.read_bytes() for p in pki.iterdir()} == before
    # a head's address changed: only its certificate is made again
    assert make_etcd_pki(tmp_path, [members[0], Member("h2", ("10.0.0.22",))], "c") == ["h2"]
    assert (pki / "h1.crt").read_bytes() == before["h1.crt"]


def test_a_certificate_near_its_end_is_renewed(tmp_path: Path) -> None:
    members = [Member("h1", ("10.0.0.11",))]
    make_etcd_pki(tmp_path, members, "c")
    now = datetime.datetime.now(datetime.UTC)
    assert make_etcd_pki(tmp_path, members, "c", now + datetime.timedelta(days=300)) == []
    later = now + datetime.timedelta(days=340)  # under 30 days left of 365
    assert make_etcd_pki(tmp_path, members, "c", later) == ["h1", API_CLIENT]
    assert _cert(tmp_path / ETCD_DIR / "h1.crt").not_valid_after_utc > later


def test_a_loose_etcd_key_is_refused(tmp_path: Path) -> None:
    make_etcd_pki(tmp_path, [Member("h1", ())], "c")
    key = tmp_path / ETCD_DIR / "h1.key"
    key.chmod(0o644)
    from provision.errors import UsageError

    with pytest.raises(UsageError, match="readable by others"):
        make_etcd_pki(tmp_path, [Member("h1", ())], "c")


def test_members_are_the_heads() -> None:
    cluster = Cluster(load_spec(K8S))
    assert etcd_members(cluster) == [Member(f"cp00{n}", (f"10.30.0.1{n}",)) for n in (1, 2, 3)]


# --- keepalived's interface


def test_interface_in_finds_the_management_interface() -> None:
    import importlib.util

    path = COLLECTION / "plugins" / "filter" / "interface_in.py"
    loaded = importlib.util.spec_from_file_location("interface_in", path)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    facts = {
        "interfaces": ["lo", "eno1", "ib0", "bond-mgmt"],
        "lo": {"ipv4": {"address": "127.0.0.1"}},
        "eno1": {"ipv4": {"address": "192.168.1.5"}},
        "ib0": {"ipv4": {"address": "10.31.0.5"}},
        "bond_mgmt": {
            "ipv4": {"address": "172.16.0.9"},
            "ipv4_secondaries": [{"address": "10.30.0.11"}],
        },
    }
    assert module.interface_in(facts, "10.30.0.10/16") == {
        "interface": "bond-mgmt", "address": "10.30.0.11"
    }  # fmt: skip
    assert module.interface_in(facts, "10.31.0.0/16")["interface"] == "ib0"
    with pytest.raises(Exception, match=r"no interface of this host has an address in 10\.99"):
        module.interface_in(facts, "10.99.0.1/16")


# --- kubeadm, kubelet and kubectl (the kubernetes_packages role): no Kubernetes repository is
# reachable here; the repository file and the package names go through Ansible's templating,
# the key check is tests/test_repo_keys.py (real gpg), the unreachable repository's message is
# live in Molecule's kubernetes scenario


def _packages_templar(version: str, **more: object) -> object:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    role = COLLECTION / "roles" / "kubernetes_packages"
    variables: dict[str, object] = {}
    for part in ("defaults", "vars"):
        loaded = yaml.safe_load((role / part / "main.yml").read_text())
        variables |= {
            k: trust_as_template(v) if isinstance(v, str) else v for k, v in loaded.items()
        }
    variables |= {"kubernetes_packages_version": version, "ansible_managed": "managed", **more}
    return Templar(loader=DataLoader(), variables=variables)


def _expr(templar: object, text: str) -> object:
    from ansible.template import trust_as_template

    return templar.template(trust_as_template(text))  # type: ignore[attr-defined]


@pytest.mark.parametrize("os_name", ["debian12", "ubuntu22.04", "ubuntu24.04"])
def test_the_repository_of_the_minor_release(os_name: str) -> None:
    # the upstream repository is one for every Debian-family OS: the same file on each
    templar = _packages_templar("1.32.9", ansible_distribution=os_name)
    role = COLLECTION / "roles" / "kubernetes_packages"
    text = (role / "templates" / "kubernetes.sources.j2").read_text()
    sources = str(_expr(templar, text))
    assert "URIs: https://pkgs.k8s.io/core:/stable:/v1.32/deb/\n" in sources
    assert "Suites: /\n" in sources and "Signed-By: /etc/apt/keyrings/kubernetes.asc" in sources
    assert _expr(templar, "{{ _kubernetes_packages_key_url }}") == (
        "https://pkgs.k8s.io/core:/stable:/v1.32/deb/Release.key"
    )
    mirrored = _packages_templar("1.33.5", kubernetes_packages_repository="http://mirror.site/k8s")
    assert _expr(mirrored, "{{ _kubernetes_packages_url }}") == "http://mirror.site/k8s/v1.33/deb/"


def test_the_packages_are_pinned_to_the_release() -> None:
    role = COLLECTION / "roles" / "kubernetes_packages"
    tasks = yaml.safe_load((role / "tasks" / "main.yml").read_text())
    install = next(t for t in tasks if t["name"].startswith("Install kubeadm"))
    names = _expr(_packages_templar("1.33.5"), install["ansible.builtin.apt"]["name"])
    assert names == ["kubeadm=1.33.5-*", "kubelet=1.33.5-*", "kubectl=1.33.5-*"]
    # a node that runs an older release: only kubeadm moves, the kubelet and kubectl follow
    # once kubeadm upgraded the node (kubelet.yml); one whose kubelet was removed is new again
    for status, moved in (
        ("ii 1.32.9-1.1", ["kubeadm=1.33.5-*"]),
        ("rc 1.32.9-1.1", ["kubeadm=1.33.5-*", "kubelet=1.33.5-*", "kubectl=1.33.5-*"]),
        ("", ["kubeadm=1.33.5-*", "kubelet=1.33.5-*", "kubectl=1.33.5-*"]),
    ):
        templar = _packages_templar("1.33.5", _kubernetes_packages_kubelet={"stdout": status})
        assert _expr(templar, install["ansible.builtin.apt"]["name"]) == moved, status
    later = yaml.safe_load((role / "tasks" / "kubelet.yml").read_text())
    names = _expr(_packages_templar("1.33.5"), later[0]["ansible.builtin.apt"]["name"])
    assert names == ["kubelet=1.33.5-*", "kubectl=1.33.5-*"]
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    from provision.spec.models import KubernetesSettings

    assert defaults["kubernetes_packages_version"] == KubernetesSettings().version


# --- what a Kubernetes cluster says (provision/parsers/kubernetes.py), on the outputs of
# tests/data/kubernetes/, written in kubectl's form (no API server here)

KUBE_DATA = ROOT / "tests" / "data" / "kubernetes"
EXPECTED = {
    **{f"cp00{i}": ("control-plane", 0) for i in (1, 2, 3)},
    **{f"gpu00{i}": ("worker", 8) for i in (1, 2)},
}


def test_a_healthy_cluster_has_no_findings() -> None:
    from provision.parsers import kubernetes as kp

    nodes = kp.parse_nodes((KUBE_DATA / "nodes-healthy.json").read_text())
    assert [n.name for n in nodes] == ["cp001", "cp002", "cp003", "gpu001", "gpu002"]
    assert nodes[3].gpus_allocatable == 8 and nodes[0].roles == {"control-plane"}
    assert kp.node_findings(nodes, EXPECTED, "1.33.5") == []
    pods = kp.parse_pods((KUBE_DATA / "pods-healthy.json").read_text())
    heads = ["cp001", "cp002", "cp003"]
    assert kp.control_plane_findings(pods, heads, stacked_etcd=False) == []
    assert kp.unhealthy_pods(pods) == []
    log = (KUBE_DATA / "gpu-pod-log.txt").read_text()
    assert kp.gpu_pod_findings("Succeeded", log, 1) == []


def test_a_degraded_cluster_names_every_problem() -> None:
    from provision.parsers import kubernetes as kp

    nodes = kp.parse_nodes((KUBE_DATA / "nodes-degraded.json").read_text())
    assert kp.node_findings(nodes, EXPECTED, "1.33.5") == [
        "gpu002: not in the cluster",
        "gpu003: in the cluster but not in the spec",
        "cp002: not Ready",
        "cp003: kubelet v1.32.9, the spec pins v1.33.5",
        "gpu001: 7 nvidia.com/gpu allocatable, the profile has 8",
    ]
    pods = kp.parse_pods((KUBE_DATA / "pods-degraded.json").read_text())
    heads = ["cp001", "cp002", "cp003"]
    assert kp.control_plane_findings(pods, heads, stacked_etcd=False) == [
        "cp002: kube-apiserver is Pending, not ready",
        "cp003: no kube-scheduler pod",
    ]
    # stacked etcd: kubeadm's etcd pods are expected too, and none is there
    assert len(kp.control_plane_findings(pods, heads, stacked_etcd=True)) == 5
    assert kp.unhealthy_pods(pods) == [
        "kube-system/kube-apiserver-cp002 on cp002: Pending",
        "kube-system/nvidia-device-plugin-daemonset-x7k2m on gpu001: Running",
    ]
    assert kp.gpu_pod_findings("Failed", "", 1) == [
        "the GPU pod ended Failed",
        "the GPU pod saw 0 GPU(s), it asked for 1",
    ]


def test_feature_discovery_must_count_the_profiles_gpus() -> None:
    from provision.parsers import kubernetes as kp

    text = (KUBE_DATA / "nodes-healthy.json").read_text()
    nodes = kp.parse_nodes(text)
    assert (nodes[3].gpu_product, nodes[3].gpu_count) == ("NVIDIA-H100-80GB-HBM3", 8)
    count = '"nvidia.com/gpu.count": '
    four = kp.parse_nodes(text.replace(f'{count}"8"', f'{count}"4"'))
    assert kp.node_findings(four, EXPECTED) == [
        f"gpu00{i}: GPU feature discovery counts 4 GPUs (nvidia.com/gpu.count), the profile has 8"
        for i in (1, 2)
    ]
    # a MIG pool (its GPUs expected as 0 whole ones) and the heads are not asked for labels
    mig = {**EXPECTED, "gpu001": ("worker", 0), "gpu002": ("worker", 0)}
    assert [p for p in kp.node_findings(four, mig) if "feature discovery" in p] == []


def test_a_cordoned_worker_and_a_list_that_is_not_one() -> None:
    from provision.parsers import kubernetes as kp

    nodes = kp.parse_nodes((KUBE_DATA / "nodes-degraded.json").read_text())
    cordoned = {"gpu003": ("worker", 8)}
    assert kp.node_findings(nodes, cordoned)[-2:] == [
        "gpu003: cordoned (unschedulable)",
        # registered with the GPU label, its GPUs advertised, but never labelled by feature
        # discovery (Node Feature Discovery missing, or feature discovery failing there)
        "gpu003: no nvidia.com/gpu.product label (GPU feature discovery has not labelled it)",
    ]
    with pytest.raises(ValueError, match="not a kubectl list"):
        kp.parse_nodes('{"kind": "Node"}')


def _fake_kubectl(directory: Path, nodes: str, pods: str) -> Path:
    """A kubectl that answers from tests/data/kubernetes/ and keeps what was applied."""
    script = directory / "kubectl"
    script.write_text(
        f"""#!/bin/bash
case "$*" in
  "get nodes -o json") cat {KUBE_DATA / nodes} ;;
  "get pods -A -o json") cat {KUBE_DATA / pods} ;;
  "apply -f -") cat > {directory / "applied.json"}; echo "pod/provision-gpu-check created" ;;
  "get pod provision-gpu-check -o jsonpath={{.status.phase}}") printf Succeeded ;;
  "logs provision-gpu-check") cat {KUBE_DATA / "gpu-pod-log.txt"} ;;
  delete*) ;;
  *) echo "unexpected: $*" >&2; exit 3 ;;
esac
"""
    )
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("state", ["healthy", "degraded"])
def test_the_check_script_against_a_stand_in_kubectl(tmp_path: Path, state: str) -> None:
    import json
    import subprocess
    import sys

    _fake_kubectl(tmp_path, f"nodes-{state}.json", f"pods-{state}.json")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "k8s-check.py"), "--heads", "cp001,cp002,cp003",
         "--workers", "gpu001,gpu002", "--gpus", "8", "--version", "1.33.5",
         "--record", str(tmp_path / "rec")],
        capture_output=True, text=True, check=False, timeout=60,
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert "PASS a pod with one GPU" in done.stdout, done.stdout + done.stderr
    applied = json.loads((tmp_path / "applied.json").read_text())
    container = applied["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert container["command"] == ["nvidia-smi", "-L"]
    assert sorted((tmp_path / "rec").iterdir()) == sorted(
        tmp_path / "rec" / n
        for n in ("nodes.json", "pods.json", "gpu-pod-apply.txt", "gpu-pod-log.txt")
    )
    if state == "healthy":
        assert done.returncode == 0 and "k8s-check: 4 passed, 0 failed" in done.stdout
    else:
        assert done.returncode == 1
        assert "FAIL nodes\n     gpu002: not in the cluster" in done.stdout
        assert (
            "FAIL control plane" in done.stdout and "k8s-check: 1 passed, 3 failed" in done.stdout
        )


# --- verify, through kubectl on a head (a stand-in remote answering from tests/data/kubernetes)

VERIFY_SPEC = """\
name: kv
os: debian12
scheduler: kubernetes
kubernetes: {etcd: external}
network:
  management: {cidr: 10.5.0.0/24}
pools:
  - {name: cp, role: head, profile: cpu-node, count: 3, first_address: 10.5.0.11}
  - {name: gpu, role: compute, profile: dgx-h100, count: 2, first_address: 10.5.0.20}
security:
  admin_cidrs: [10.9.0.0/24]
"""


class _Head:
    """A head's SSH session whose kubectl answers from recorded-form outputs."""

    def __init__(self, nodes: str, pods: str, phase: str = "Succeeded", api_up: bool = True):
        self.files = {"get nodes -o json": nodes, "get pods -A -o json": pods}
        self.phase, self.api_up, self.applied = phase, api_up, ""
        self.commands: list[str] = []

    def run(self, command: str, sudo: bool = False, timeout: float = 60.0) -> Output:
        from provision.verify.kubernetes import GPU_POD, KUBECTL

        assert sudo and KUBECTL in command, command
        self.commands.append(command)
        args = command.split(KUBECTL, 1)[1].strip()
        if not self.api_up:
            return Output(1, "", "The connection to the server 10.5.0.11:6443 was refused\n")
        if args in self.files:
            return Output(0, (KUBE_DATA / self.files[args]).read_text(), "")
        if args == "apply -f -":
            self.applied = command.split(" | ")[0].removeprefix("echo ")
            return Output(0, f"pod/{GPU_POD} created\n", "")
        if args.startswith(f"get pod {GPU_POD} -o jsonpath"):
            return Output(0, self.phase, "")
        if args == f"logs {GPU_POD}":
            return Output(0, (KUBE_DATA / "gpu-pod-log.txt").read_text(), "")
        if args.startswith(f"delete pod {GPU_POD}"):
            return Output(0, "", "")
        raise AssertionError(f"unexpected: {command}")


def _verify(tmp_path: Path, head: _Head) -> list[tuple[str, bool, str]]:
    from provision.verify import VerifyContext
    from provision.verify.kubernetes import check_kubernetes

    cluster = _spec(tmp_path, VERIFY_SPEC)
    ctx = VerifyContext(cluster, None, "")  # type: ignore[arg-type]
    results = check_kubernetes(ctx, {"cp001": head}, gpu_wait_s=5)  # type: ignore[dict-item]
    return [(r.check, r.passed, r.evidence) for r in results]


def test_verify_passes_a_healthy_cluster_and_runs_a_gpu_pod(tmp_path: Path) -> None:
    head = _Head("nodes-healthy.json", "pods-healthy.json")
    results = _verify(tmp_path, head)
    assert [(c, p) for c, p, _ in results] == [
        ("kubernetes API", True),
        ("kubernetes nodes", True),
        ("kubernetes control plane", True),
        ("kube-system pods", True),
        ("a pod with one GPU", True),
    ]
    assert results[1][2] == "all 5 Ready"
    # the pod asked for one GPU on the GPU workers, and was removed after
    pod = json.loads(shlex.split(head.applied)[0])
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["gpu001", "gpu002"]
    assert "delete pod provision-verify-gpu --wait=false" in head.commands[-1]
    assert kubernetes_validate.validate(pod, "1.33.0", strict=True) is not None


def test_verify_names_what_is_wrong(tmp_path: Path) -> None:
    results = _verify(tmp_path, _Head("nodes-degraded.json", "pods-degraded.json", "Failed"))
    failed = {c: e for c, p, e in results if not p}
    assert set(failed) == {
        "kubernetes nodes", "kubernetes control plane", "kube-system pods", "a pod with one GPU"
    }  # fmt: skip
    assert "cp002: not Ready" in failed["kubernetes nodes"]
    assert "gpu001: 7 nvidia.com/gpu allocatable, the profile has 8" in failed["kubernetes nodes"]
    assert failed["a pod with one GPU"].startswith("the GPU pod ended Failed")
    down = _verify(tmp_path, _Head("nodes-healthy.json", "pods-healthy.json", api_up=False))
    assert down == [
        (
            "kubernetes API", False,
            "kubectl get nodes: The connection to the server 10.5.0.11:6443 was refused",
        )
    ]  # fmt: skip


def test_verify_expects_no_gpu_on_heads_and_mig_pools(tmp_path: Path) -> None:
    from provision.verify.kubernetes import expected_nodes

    mig = VERIFY_SPEC.replace("dgx-h100, count: 2", "dgx-h100, count: 2, mig: [1g.10gb]")
    assert expected_nodes(_spec(tmp_path, VERIFY_SPEC))["gpu001"] == ("worker", 8)
    expected = expected_nodes(_spec(tmp_path, mig))
    assert expected["gpu001"] == ("worker", 0) and expected["cp001"] == ("control-plane", 0)

"""Monitoring: the alert rules under `promtool test rules`, and what the renderer writes for
Prometheus, Alertmanager and the firewall. Live in the lab: tests/integration/test_lab.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from provision.cluster import Cluster
from provision.providers.cloud.layout import layout as cloud_layout
from provision.render import render
from provision.spec import load_spec
from provision.spec.models import Monitoring

from .conftest import ROLES_DIR, ROOT

ROLE = ROLES_DIR / "monitoring"
RULE_FILES = sorted((ROLE / "files" / "rules").glob("*.yml"))
RULE_TESTS = sorted((ROLE / "tests").glob("*.test.yml"))


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool") or str(ROOT / ".venv" / "bin" / "promtool")
    assert Path(found).exists(), "promtool is missing: `make setup` unpacks it into .venv/bin"
    return found


def _alerts(path: Path) -> list[dict]:  # type: ignore[type-arg]
    groups = yaml.safe_load(path.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


@pytest.mark.parametrize("tests", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(promtool: str, tests: Path) -> None:
    r = subprocess.run(
        [promtool, "test", "rules", tests.name],
        cwd=tests.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_a_broken_expectation_fails(promtool: str, tmp_path: Path) -> None:
    """The runner catches a wrong expectation: a node that answers raises no NodeDown."""
    tests = yaml.safe_load((ROLE / "tests" / "node.test.yml").read_text())
    tests["rule_files"] = [str(ROLE / "files" / "rules" / "node.yml")]
    first = tests["tests"][0]
    first["input_series"][0]["values"] = "1x8"  # gpu001 answers throughout
    tests["tests"] = [first]
    path = tmp_path / "broken.test.yml"
    path.write_text(yaml.safe_dump(tests))
    r = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 1 and "FAILED" in r.stdout + r.stderr


def test_every_alert_is_seen_firing_in_a_test_and_names_its_node() -> None:
    fired: dict[str, list[dict]] = {}  # type: ignore[type-arg]
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                fired.setdefault(check["alertname"], []).extend(check.get("exp_alerts") or [])
    names = [a["alert"] for path in RULE_FILES for a in _alerts(path)]
    assert len(names) == len(set(names)), names
    for name in names:
        assert fired.get(name), f"{name} is never seen firing in {ROLE / 'tests'}"
        for alert in fired[name]:
            assert alert["exp_labels"].get("node"), f"{name} fires without a node label"
            assert alert["exp_labels"]["node"] in alert["exp_annotations"]["summary"], name


def test_rule_files_and_rendered_files_pass_promtool(promtool: str, tmp_path: Path) -> None:
    r = subprocess.run(
        [promtool, "check", "rules", *map(str, RULE_FILES)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for example in ("lab.yaml", "dgx-8.yaml"):
        files = render(Cluster(load_spec(ROOT / "examples" / example)))
        config = tmp_path / "prometheus.yml"
        config.write_text(files["files/monitoring/prometheus.yml"])
        rules = tmp_path / "cluster.yml"
        rules.write_text(files["files/monitoring/cluster-rules.yml"])
        for args in (["check", "config", "--syntax-only", str(config)], ["check", "rules", rules]):
            r = subprocess.run(
                [promtool, *map(str, args)], capture_output=True, text=True, check=False
            )
            assert r.returncode == 0, (example, r.stdout + r.stderr)


def test_every_lasting_node_is_a_target_named_by_its_node() -> None:
    cluster = Cluster(load_spec(ROOT / "examples" / "dgx-8.yaml"))
    files = render(cluster)
    config = yaml.safe_load(files["files/monitoring/prometheus.yml"])
    jobs = {j["job_name"]: j["static_configs"] for j in config["scrape_configs"]}
    assert set(jobs) == {"prometheus", "alertmanager", "node"}  # no DCGM exporter URL: no job
    targets = {c["labels"]["node"]: c["targets"] for c in jobs["node"]}
    assert targets == {n.name: [f"{n.address}:9100"] for n in cluster.nodes}
    assert jobs["prometheus"] == [
        {"targets": ["localhost:9090"], "labels": {"node": "head01", "pool": "head"}}
    ]
    assert config["global"]["external_labels"] == {"cluster": "dgx8"}
    # the GPU count each node of a pool should show (GpuMissing compares with it)
    groups = yaml.safe_load(files["files/monitoring/cluster-rules.yml"])["groups"]
    rules = groups[0]["rules"]
    recorded = {(r["record"], r["labels"]["pool"]): r["expr"] for r in rules if "labels" in r}
    assert {"record": "provision:health_interval_seconds", "expr": "vector(300)"} in rules
    assert recorded[("provision:pool_gpus_expected", "dgx")] == "vector(8)"
    assert recorded[("provision:pool_nodes_expected", "dgx")] == "vector(8)"
    assert ("provision:pool_gpus_expected", "head") not in recorded
    # the receivers get every alert, grouped per alert and node
    manager = yaml.safe_load(files["files/monitoring/alertmanager.yml"])
    assert manager["route"]["group_by"] == ["alertname", "node"]
    assert manager["route"]["routes"] == [{"receiver": "oncall", "continue": True}]
    hook = manager["receivers"][1]["webhook_configs"][0]
    assert hook == {"url": "https://alerts.example.org/hooks/dgx8", "send_resolved": True}
    group_vars = files["inventory/group_vars/all.yml"]
    assert "monitoring_retention: !unsafe " in group_vars and "30d" in group_vars
    hosts = yaml.safe_load(files["inventory/hosts.yml"].replace("!unsafe ", ""))
    assert list(hosts["all"]["children"]["monitoring"]["hosts"]) == ["head01"]


def test_the_dcgm_exporters_are_scraped_and_answer_the_monitoring_node_only() -> None:
    spec = load_spec(ROOT / "examples" / "dgx-superpod.yaml")
    spec = spec.model_copy(update={"monitoring": Monitoring(pool="login")})
    files = render(Cluster(spec))
    config = yaml.safe_load(files["files/monitoring/prometheus.yml"])
    dcgm = next(j for j in config["scrape_configs"] if j["job_name"] == "dcgm")
    assert all(c["targets"][0].endswith(":9400") for c in dcgm["static_configs"])
    assert {c["labels"]["pool"] for c in dcgm["static_configs"]} == {"gpu", "mig"}
    gpu = files["files/nftables/gpu.nft"]
    rule = 'tcp dport 9400 accept comment "dcgm-exporter (GPU metrics)"'
    assert f"ip saddr @monitoring_nodes {rule}" in gpu
    assert f"ip saddr @admin {rule}" not in gpu and f"ip saddr @cluster_nodes {rule}" not in gpu
    login = files["files/nftables/login.nft"]
    assert 'ip saddr @admin tcp dport 9090 accept comment "prometheus web"' in login
    assert "9090" not in files["files/nftables/head.nft"]
    watcher = Cluster(spec).monitoring_node
    assert watcher is not None and watcher.pool == "login"
    sets = files["files/nftables/sets.nft"].split("set monitoring_nodes {")[1].split("}")[0]
    assert str(watcher.address) in sets and sets.count(",") == 1


def test_lab_firewall_admits_the_monitoring_node_to_the_exporters() -> None:
    files = render(Cluster(load_spec(ROOT / "examples" / "lab.yaml")))
    compute = files["files/nftables/compute.nft"]
    assert 'ip saddr @monitoring_nodes tcp dport 9100 accept comment "node exporter' in compute
    assert "9090" not in compute and "9093" not in compute
    head = files["files/nftables/head.nft"]
    for port, name in (("9090", "prometheus"), ("9093", "alertmanager")):
        assert f'ip saddr @admin tcp dport {port} accept comment "{name} web"' in head


def test_cloud_pools_admit_the_on_premises_monitoring_node_alone() -> None:
    cluster = Cluster(load_spec(ROOT / "examples" / "hybrid-cloud.yaml"))
    spec = cluster.spec.model_copy(update={"monitoring": Monitoring()})
    cluster = Cluster(spec)
    watcher = cluster.monitoring_node
    assert watcher is not None and watcher.address is not None
    shape = cloud_layout(cluster, "aws", "ssh-ed25519 AAAA test")
    exporter = [i for p in shape.pools for i in p.ingress if i.description.startswith("node exp")]
    assert exporter and all(i.cidrs == (f"{watcher.address}/32",) for i in exporter)

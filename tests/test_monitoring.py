"""Monitoring: the alert rules under `promtool test rules`, and what the renderer writes for
Prometheus, Alertmanager and the firewall. Live in the lab: tests/integration/test_lab.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provision.cluster import Cluster
from provision.providers.cloud.layout import layout as cloud_layout
from provision.render import render
from provision.render.firewall import admin_reach
from provision.spec import load_spec
from provision.spec.models import EmailReceiver, Monitoring, Receiver, Spec
from provision.spec.unbuilt import ALERTMANAGER, PASSWORD_FILE_SINCE

from .conftest import EXAMPLES, ROLES_DIR, ROOT

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
        {"targets": ["127.0.0.1:9090"], "labels": {"node": "head01", "pool": "head"}}
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
    assert manager["route"]["routes"] == [
        {"receiver": "oncall", "continue": True},
        {"receiver": "opsmail", "continue": True},
    ]
    hook = manager["receivers"][1]["webhook_configs"][0]
    assert hook == {"url": "https://alerts.example.org/hooks/dgx8", "send_resolved": True}
    # mail through a relay that takes the cluster's mail without a login (Ubuntu 22.04's
    # Alertmanager could read a password only inline)
    assert manager["receivers"][2]["email_configs"] == [
        {
            "to": "hpc-ops@example.org",
            "from": "alertmanager@dgx8.example.org",
            "smarthost": "mail.example.org:587",
            "require_tls": True,
            "send_resolved": True,
        }
    ]
    assert "auth_password" not in files["files/monitoring/alertmanager.yml"]
    group_vars = files["inventory/group_vars/all.yml"]
    assert "monitoring_retention: !unsafe " in group_vars and "30d" in group_vars
    hosts = yaml.safe_load(files["inventory/hosts.yml"].replace("!unsafe ", ""))
    assert list(hosts["all"]["children"]["monitoring"]["hosts"]) == ["head01"]


def test_the_dcgm_exporters_are_scraped_and_answer_the_monitoring_node_only() -> None:
    spec = load_spec(ROOT / "examples" / "dgx-superpod.yaml")
    spec = spec.model_copy(update={"monitoring": Monitoring()})
    files = render(Cluster(spec))
    config = yaml.safe_load(files["files/monitoring/prometheus.yml"])
    dcgm = next(j for j in config["scrape_configs"] if j["job_name"] == "dcgm")
    assert all(c["targets"][0].endswith(":9400") for c in dcgm["static_configs"])
    assert {c["labels"]["pool"] for c in dcgm["static_configs"]} == {"gpu", "mig"}
    gpu = files["files/nftables/gpu.nft"]
    rule = 'tcp dport 9400 accept comment "dcgm-exporter (GPU metrics)"'
    assert f"ip saddr @monitoring_nodes {rule}" in gpu
    assert f"ip saddr @admin {rule}" not in gpu and f"ip saddr @cluster_nodes {rule}" not in gpu
    # Prometheus and Alertmanager on the head's loopback: no pool's firewall opens them
    for name, text in files.items():
        if name.startswith("files/nftables/"):
            assert "dport 9090 " not in text and "dport 9093 " not in text, name
    watcher = Cluster(spec).monitoring_node
    assert watcher is not None and watcher.pool == "head"
    sets = files["files/nftables/address-sets.nft"].split("set monitoring_nodes {")[1].split("}")[0]
    assert str(watcher.address) in sets and sets.count(",") == 1


def test_lab_firewall_admits_the_monitoring_node_to_the_exporters() -> None:
    files = render(Cluster(load_spec(ROOT / "examples" / "lab.yaml")))
    compute = files["files/nftables/compute.nft"]
    assert 'ip saddr @monitoring_nodes tcp dport 9100 accept comment "node exporter' in compute
    assert "9090" not in compute and "9093" not in compute
    head = files["files/nftables/head.nft"]
    assert "9090" not in head and "9093" not in head  # their loopback only (through SSH)


def test_cloud_pools_admit_the_exporters_to_their_own_network_alone() -> None:
    """The on-premises monitoring node scrapes a cloud node through the tunnel: the cloud's
    firewall sees only the tunnel's packets, the nodes' own flows; inside, the cloud's range."""
    cluster = Cluster(load_spec(ROOT / "examples" / "hybrid-cloud.yaml"))
    spec = cluster.spec.model_copy(update={"monitoring": Monitoring()})
    cluster = Cluster(spec)
    watcher = cluster.monitoring_node
    assert watcher is not None and watcher.address is not None
    shape = cloud_layout(cluster, "aws", "ssh-ed25519 AAAA test")
    exporter = [i for p in shape.pools for i in p.ingress if i.description.startswith("node exp")]
    assert exporter and all(i.cidrs == ("10.21.0.0/16",) for i in exporter)


# --- Grafana ---------------------------------------------------------------------------------

DASHBOARDS = sorted((ROLES_DIR / "grafana" / "files" / "dashboards").glob("*.json"))
# what Grafana puts in a query before Prometheus sees it: every value of a variable, a window
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$pool": ".*", "$node": ".*"}


def panel_queries(path: Path) -> list[tuple[str, str]]:
    """(panel title, query as Prometheus gets it) for every panel and variable of a dashboard."""
    board = json.loads(path.read_text())
    found = []
    for panel in board["panels"]:
        for target in panel["targets"]:
            found.append((panel["title"], target["expr"]))
    for variable in board["templating"]["list"]:
        # label_values(SELECTOR, label): Grafana asks Prometheus for SELECTOR's series
        inner = re.fullmatch(r"label_values\((.*), *[a-z_]+\)", variable["definition"])
        assert inner, f"{path.name}: variable {variable['name']} is not label_values(...)"
        found.append((f"variable {variable['name']}", inner[1]))
    queries = []
    for title, expr in found:
        for name, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(name, value)
        assert "$" not in expr, f"{path.name}: {title}: a variable Grafana does not fill: {expr}"
        queries.append((title, expr))
    return queries


def _promtool_parses(
    promtool: str, queries: list[str], tmp_path: Path
) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    rules = [{"record": f"panel:query_{i}", "expr": q} for i, q in enumerate(queries)]
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    return subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )


def test_every_panel_query_parses(promtool: str, tmp_path: Path) -> None:
    """Each query of each dashboard goes through Prometheus' own parser (promtool checks it as a
    recording rule's expression); live, the lab's Prometheus answers each (test_lab.py)."""
    assert [p.name for p in DASHBOARDS] == ["cluster.json", "fabric.json", "gpu.json", "slurm.json"]
    queries = [q for path in DASHBOARDS for _, q in panel_queries(path)]
    assert len(queries) > 40
    r = _promtool_parses(promtool, queries, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    # and the check can fail: one unbalanced parenthesis
    broken = _promtool_parses(promtool, [*queries, "sum(rate(up[1m])"], tmp_path)
    assert broken.returncode == 1 and "panel:query_" in broken.stdout + broken.stderr


def test_dashboards_name_the_provisioned_data_source_and_are_distinct() -> None:
    from provision.render.monitoring import GRAFANA_DATASOURCE_UID

    uids = set()
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        uids.add(board["uid"])
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), path.name
        for panel in board["panels"]:
            sources = [panel["datasource"], *(t["datasource"] for t in panel["targets"])]
            assert all(s == {"type": "prometheus", "uid": GRAFANA_DATASOURCE_UID} for s in sources)
    assert len(uids) == len(DASHBOARDS)
    role = yaml.safe_load((ROLES_DIR / "grafana" / "vars" / "main.yml").read_text())
    assert sorted(role["_grafana_dashboards"]) == sorted(p.name for p in DASHBOARDS)


def test_gpu_panels_read_only_fields_the_dcgm_exporter_is_given() -> None:
    counters = (ROLES_DIR / "dcgm" / "files" / "counters.csv").read_text()
    given = {line.split(",")[0].strip() for line in counters.splitlines() if line.strip()}
    read = 0
    for path in DASHBOARDS:
        for title, expr in panel_queries(path):
            for field in re.findall(r"\bDCGM_FI_[A-Z_]+", expr):
                assert field in given, f"{path.name}: {title} reads {field}, not exported"
                read += 1
    assert read, "no panel reads a DCGM field: the dashboards or the pattern changed"


def test_grafana_renders_its_data_source_firewall_and_variables() -> None:
    spec = load_spec(ROOT / "examples" / "dgx-8.yaml")
    files = render(Cluster(spec))
    sources = yaml.safe_load(files["files/monitoring/grafana-datasources.yml"])["datasources"]
    assert sources == [
        {
            "name": "Prometheus",
            "uid": "prometheus",
            "type": "prometheus",
            "access": "proxy",
            "url": "http://127.0.0.1:9090",
            "isDefault": True,
            "editable": False,
            "jsonData": {"timeInterval": "15s"},
        }
    ]
    # the web page answers the admin networks, on the monitoring node only
    assert (
        'ip saddr @admin tcp dport 3000 accept comment "grafana web"'
        in files["files/nftables/head.nft"]
    )
    assert "dport 3000" not in files["files/nftables/dgx.nft"]
    group_vars = files["inventory/group_vars/all.yml"]
    assert "provision_grafana: true" in group_vars
    lab = render(Cluster(load_spec(ROOT / "examples" / "lab.yaml")))
    assert "files/monitoring/grafana-datasources.yml" not in lab
    assert "grafana" not in lab["inventory/group_vars/all.yml"]


def test_grafana_role_templates_render_with_the_spec_port() -> None:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    role = ROLES_DIR / "grafana"
    variables = {
        **yaml.safe_load((role / "defaults" / "main.yml").read_text()),
        **yaml.safe_load((role / "vars" / "main.yml").read_text()),
        "grafana_port": 3001,
        "ansible_managed": "managed",
    }
    templar = Templar(loader=DataLoader(), variables=variables)

    def rendered(name: str) -> str:
        text = (role / "templates" / name).read_text()
        return str(templar.template(trust_as_template(text)))

    unit = rendered("grafana.conf.j2")
    assert "Environment=GF_SERVER_HTTP_PORT=3001" in unit
    assert "Environment=GF_SECURITY_ADMIN_PASSWORD__FILE=/etc/grafana/admin.password" in unit
    sources = rendered("grafana.sources.j2")
    assert "URIs: https://apt.grafana.com\n" in sources
    assert "Signed-By: /etc/apt/keyrings/grafana.asc" in sources
    provider = yaml.safe_load(rendered("dashboards.yaml.j2"))["providers"][0]
    assert provider["options"]["path"] == variables["_grafana_dashboards_dir"]
    assert provider["allowUiUpdates"] is False


def _relabel(rules: list[dict], labels: dict[str, str]) -> dict[str, str] | None:  # type: ignore[type-arg]
    """Prometheus's metric relabelling as its documentation gives it, for the actions the
    renderer uses (replace, drop, labeldrop): source values joined by `;`, regexes anchored at
    both ends, `$1` the first group; None when the sample is dropped."""
    out = dict(labels)
    for rule in rules:
        action = rule.get("action", "replace")
        regex = re.compile(f"^(?:{rule.get('regex', '(.*)')})$")
        if action == "labeldrop":
            out = {k: v for k, v in out.items() if not regex.match(k)}
            continue
        value = ";".join(out.get(name, "") for name in rule["source_labels"])
        match = regex.match(value)
        if action == "drop":
            if match:
                return None
        elif action == "replace":
            if match:
                new = match.expand(rule.get("replacement", "$1").replace("$1", r"\1"))
                if new:
                    out[rule["target_label"]] = new
                else:
                    out.pop(rule["target_label"], None)
        else:
            raise AssertionError(f"the test knows no relabel action {action}")
    return out


def test_no_exporter_speaks_for_another_node() -> None:
    """A process that binds a node's exporter port while the exporter is down cannot write
    series under another node's name (no honor_labels), nor Slurm's; the heads' Slurm metrics
    still name the node they are about."""
    config = yaml.safe_load(
        render(Cluster(load_spec(ROOT / "examples" / "lab.yaml")))[
            "files/monitoring/prometheus.yml"
        ]
    )
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "node"]
    assert "honor_labels" not in job
    rules = job["metric_relabel_configs"]

    def scraped(target: str, its_pool: str, name: str, **exposed: str) -> dict[str, str] | None:
        # without honor_labels a clashing exposed label is kept as exported_<name>
        labels = {("exported_" + k if k in ("node", "pool") else k): v for k, v in exposed.items()}
        return _relabel(rules, {**labels, "__name__": name, "node": target, "pool": its_pool})

    about = scraped("head001", "head", "slurm_node_state", slurm_node="compute002", state="idle")
    assert about == {"__name__": "slurm_node_state", "node": "compute002", "state": "idle"}
    assert scraped("head001", "head", "slurm_controller_up") == {
        "__name__": "slurm_controller_up", "node": "head001", "pool": "head",
    }  # fmt: skip
    # a compute node's port: its own series stay its own, Slurm's are not taken from it
    lie = scraped("compute001", "compute", "node_load1", node="compute002", pool="head")
    assert lie is not None and lie["node"] == "compute001" and lie["pool"] == "compute"
    for name in ("slurm_node_state", "slurm_controller_up", "slurm_jobs"):
        assert scraped("compute001", "compute", name, slurm_node="compute002", state="down") is None


def test_prometheus_and_alertmanager_listen_on_the_loopback_only() -> None:
    """No address but the monitoring node's loopback: a job, another node, the admin network
    all reach them only through SSH (provision ssh --forward)."""
    templates = ROLES_DIR / "monitoring" / "templates"
    for name, port in (("prometheus", "prometheus"), ("alertmanager", "alertmanager")):
        unit = (templates / f"{name}.conf.j2").read_text()
        assert f"--web.listen-address=127.0.0.1:{{{{ monitoring_{port}_port }}}}" in unit, name
    flags = (templates / "alertmanager.conf.j2").read_text().split()
    assert "--cluster.listen-address=" in flags  # no gossip port either


def test_plan_says_who_reaches_ssh_and_the_monitoring(tmp_path: Path) -> None:
    """dgx-8's admin network is the management /24 itself: plan says jobs there reach SSH and
    Grafana's login, and that Prometheus and Alertmanager answer the head's loopback alone."""
    done = subprocess.run(
        [sys.executable, "-m", "provision", "plan", str(ROOT / "examples" / "dgx-8.yaml"),
         "--json", "--state-dir", str(tmp_path)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    reach = {r["service"]: r for r in json.loads(done.stdout)["who_reaches"]}
    assert set(reach) == {"ssh", "prometheus", "alertmanager", "grafana", "node exporter"}
    assert reach["ssh"]["who"] == (
        "the admin networks (10.20.0.0/24); they hold dgx[01-08], where users log in or jobs "
        "run (the admins' keys)"
    )
    for name, port in (("prometheus", "9090"), ("alertmanager", "9093")):
        assert (reach[name]["where"], reach[name]["port"]) == ("head01", port)
        assert reach[name]["who"].startswith(
            f"head01's loopback only: admins through SSH (provision ssh --forward {port} head01)"
        )
    assert reach["node exporter"]["who"] == "head01 only (it scrapes them)"
    lab = admin_reach(Cluster(load_spec(ROOT / "examples" / "lab.yaml")))
    assert lab[0].who == "the admin networks (10.77.0.1/32) (the admins' keys)"  # no node in it


@pytest.fixture(scope="module")
def amtool() -> str:
    found = shutil.which("amtool") or str(ROOT / ".venv" / "bin" / "amtool")
    assert Path(found).exists(), "amtool is missing: `make setup` unpacks it into .venv/bin"
    return found


def _with_relay_login(path: Path) -> Spec:
    """The example with a mail receiver that logs in to its relay, where its OS allows one."""
    spec = load_spec(path)
    mail = Receiver(
        name="mail",
        email=EmailReceiver.model_validate(
            {
                "to": "oncall@example.org",
                "sender": "alertmanager@example.org",
                "smarthost": "smtp.example.org:587",
                "username": "alerts",
                "password_file": "relay.password",  # beside the spec, as a user keeps it
            },
            context={"spec_dir": path.parent},
        ),
    )
    monitoring = spec.monitoring or Monitoring()
    if ALERTMANAGER[spec.os] >= PASSWORD_FILE_SINCE:
        monitoring = monitoring.model_copy(update={"receivers": [*monitoring.receivers, mail]})
    return spec.model_copy(update={"monitoring": monitoring})


# the monitoring role runs on Slurm clusters (Kubernetes ones have none of its files)
SLURM_EXAMPLES = [p for p in EXAMPLES if load_spec(p).scheduler == "slurm"]


@pytest.mark.parametrize("example", SLURM_EXAMPLES, ids=lambda p: p.stem)
def test_every_rendered_alertmanager_and_prometheus_file_passes_the_tools(
    example: Path, amtool: str, promtool: str, tmp_path: Path
) -> None:
    """amtool check-config and promtool check config on what every example renders, with a
    relay login where the OS's Alertmanager reads its password from a file. The tools here are
    Debian 12's (Alertmanager 0.25, Prometheus 2.42); what Ubuntu 22.04's 0.23 lacks is refused
    by the spec (spec/unbuilt.py ALERTMANAGER, broken spec 128)."""
    spec = _with_relay_login(example)
    files = render(Cluster(spec))
    for name, tool, args in (
        ("alertmanager.yml", amtool, ["check-config"]),
        ("prometheus.yml", promtool, ["check", "config", "--syntax-only"]),
    ):
        path = tmp_path / name
        path.write_text(files[f"files/monitoring/{name}"])
        done = subprocess.run([tool, *args, str(path)], capture_output=True, text=True, check=False)
        assert done.returncode == 0, (example.name, name, done.stdout + done.stderr)
    if ALERTMANAGER[spec.os] >= PASSWORD_FILE_SINCE:
        assert (
            "auth_password_file: /etc/prometheus/smtp-mail.password"
            in files["files/monitoring/alertmanager.yml"]
        )


def test_the_loopback_guard_admits_the_admins_and_the_monitoring_alone(tmp_path: Path) -> None:
    """Whoever logs in to the monitoring node reaches its loopback: only root, the login user,
    the admins, Prometheus and Grafana may connect to the two ports there (live in the lab)."""
    files = render(Cluster(load_spec(ROOT / "examples" / "dgx-8.yaml")))
    guard = files["files/monitoring/loopback-guard.nft"]
    users = '"root", "prometheus", "grafana", "ubuntu", "alice"'
    assert f'oif "lo" tcp dport {{ 9090, 9093 }} meta skuid {{ {users} }} accept' in guard
    assert 'oif "lo" tcp dport { 9090, 9093 } reject with tcp reset' in guard
    # the syntax, checked by nft with users this machine has (the node has the real ones)
    path = tmp_path / "guard.nft"
    path.write_text(re.sub(r"meta skuid \{[^}]*\}", 'meta skuid { "root" }', guard))
    done = subprocess.run(
        ["nft", "-c", "-f", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    lab = render(Cluster(load_spec(ROOT / "examples" / "lab.yaml")))[
        "files/monitoring/loopback-guard.nft"
    ]
    assert 'meta skuid { "root", "prometheus", "labadmin" } accept' in lab  # no Grafana


UNITS = ["prometheus", "prometheus-alertmanager"]


def _reload_runs(handler: dict[str, object], started: list[str]) -> bool:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    run = {"results": [{"item": unit, "changed": unit in started} for unit in UNITS]}
    templar = Templar(loader=DataLoader(), variables={"_monitoring_run": run})
    return bool(templar.evaluate_conditional(trust_as_template(str(handler["when"]))))


def test_no_reload_right_after_a_restart_or_a_start() -> None:
    """systemd's reload is a SIGHUP, which ends Prometheus or Alertmanager in the milliseconds
    after a start, before it handles the signal (a cold apply's Alertmanager died of it: its
    flags, a restart, and its receivers, a reload, changed together). Handlers run in their
    file's order: the reloads come first, and skip a unit the role has just started."""
    handlers = yaml.safe_load((ROLE / "handlers" / "main.yml").read_text())
    names = [h["name"] for h in handlers]
    for unit in ("Prometheus", "Alertmanager"):
        assert names.index(f"Reload {unit}") < names.index(f"Restart {unit}")
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    (run,) = [t for t in tasks if t.get("register") == "_monitoring_run"]
    assert run["ansible.builtin.systemd_service"]["state"] == "started" and run["loop"] == UNITS
    reload = {h["name"]: h for h in handlers if h["name"].startswith("Reload ")}
    for name, unit in (("Reload Prometheus", UNITS[0]), ("Reload Alertmanager", UNITS[1])):
        assert _reload_runs(reload[name], started=[])
        assert not _reload_runs(reload[name], started=[unit])
        other = [u for u in UNITS if u != unit]
        assert _reload_runs(reload[name], started=other)


# the expression as a play's Ansible evaluates it, with the collection's own tests (a process of
# its own: the collection loader is installed once a process)
_EVALUATE = """
import json, sys
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
path, expression, variables = json.loads(sys.stdin.read())
_AnsibleCollectionFinder(paths=[path])._install()
templar = Templar(loader=DataLoader(), variables=variables)
print(json.dumps(list(templar.template(trust_as_template(expression)))))
"""


def test_a_restart_is_for_a_unit_the_start_task_found_running() -> None:
    """The flags' restart handlers skip a unit the start task started from stopped (it read
    its flags as it started: a first converge), and restart one it found running, or both
    where the start task has not run."""
    import json
    import subprocess
    import sys

    from provision.assets import collections_path

    expression = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["_monitoring_restartable"]

    def restartable(found: dict[str, str] | None) -> list[str]:
        variables = {}
        if found is not None:  # unit -> ActiveState before the start task acted
            results = [
                {"item": u, "changed": found[u] != "active", "state": "started",
                 "status": {"ActiveState": found[u]}}
                for u in UNITS
            ]  # fmt: skip
            variables["_monitoring_run"] = {"results": results}
        done = subprocess.run(
            [sys.executable, "-c", _EVALUATE],
            input=json.dumps([str(collections_path()), expression, variables]),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        answer: list[str] = json.loads(done.stdout)
        return answer

    assert restartable({"prometheus": "inactive", "prometheus-alertmanager": "active"}) == [
        "prometheus-alertmanager"
    ]
    assert restartable({"prometheus": "active", "prometheus-alertmanager": "failed"}) == [
        "prometheus"
    ]
    assert restartable({u: "inactive" for u in UNITS}) == []
    assert restartable(None) == UNITS
    handlers = {h["name"]: h for h in yaml.safe_load((ROLE / "handlers" / "main.yml").read_text())}
    for name, unit in (("Restart Prometheus", UNITS[0]), ("Restart Alertmanager", UNITS[1])):
        assert handlers[name]["when"] == f"'{unit}' in _monitoring_restartable"

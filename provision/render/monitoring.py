"""Prometheus' and Alertmanager's configuration (files/monitoring/), from the spec.

Every target carries the node's name and pool as labels, so an alert names the node, not only
its address. The alert rules themselves are the monitoring role's own files, the same on every
cluster; what differs per cluster (how many GPUs each pool's nodes have) is a rendered rule file
of recorded constants here. The files are YAML that Prometheus and Alertmanager read; Ansible
copies them and never templates them.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from provision.cluster import Cluster
from provision.spec.models import EmailReceiver
from provision.spec.nodes import Node, login_user

RULES_DIR = "/etc/prometheus/rules"  # the monitoring role installs every rule file here
# seconds Alertmanager waits to batch a new group's alerts before the first notification
GROUP_WAIT = "10s"
SMTP_PASSWORD_DIR = "/etc/prometheus"  # beside alertmanager.yml, readable by its group only
GRAFANA_DATASOURCE_UID = "prometheus"  # the dashboards' panels name their data source by it


def monitoring_files(cluster: Cluster) -> dict[str, str]:
    """Relative path -> content; empty when the spec has no monitoring."""
    monitoring = cluster.spec.monitoring
    watcher = cluster.monitoring_node
    if monitoring is None or watcher is None:
        return {}
    header = f"# {cluster.header}\n"
    files = {
        "files/monitoring/prometheus.yml": header + _dump(_prometheus(cluster)),
        "files/monitoring/alertmanager.yml": header + _dump(_alertmanager(cluster)),
        "files/monitoring/cluster-rules.yml": header + _dump(_cluster_rules(cluster)),
    }
    if monitoring.grafana is not None:
        files["files/monitoring/grafana-datasources.yml"] = header + _dump(
            grafana_datasource(cluster)
        )
    files["files/monitoring/loopback-guard.nft"] = loopback_guard(cluster)
    return files


GUARD_TABLE = "provision_monitoring"


def loopback_guard(cluster: Cluster) -> str:
    """nftables for the monitoring node's own connections: Prometheus' and Alertmanager's
    ports on the loopback take them only from root, the admins (SSH forwards run as the admin
    who logged in), Prometheus itself and Grafana; anyone else logged in there (a user, a
    job) is refused. User names are resolved when nft loads the file: the monitoring role
    loads it once the packages have made their users."""
    monitoring = cluster.spec.monitoring
    watcher = cluster.monitoring_node
    assert monitoring is not None and watcher is not None
    users = ["root", "prometheus"]
    if monitoring.grafana is not None:
        users.append("grafana")
    users += [login_user(cluster.spec, watcher.provider)]
    users += [a.name for a in cluster.spec.security.admins]
    # quoted: a user called like an nft keyword (accept, drop) stays a name
    allowed = ", ".join(f'"{u}"' for u in dict.fromkeys(users))
    ports = f"{monitoring.prometheus_port}, {monitoring.alertmanager_port}"
    return "\n".join(
        [
            "#!/usr/sbin/nft -f",
            f"# {cluster.header}",
            "# Who may connect to Prometheus and Alertmanager on this node's loopback (the only",
            "# address they listen on): Alertmanager's API silences alerts.",
            f"table inet {GUARD_TABLE} {{}}",
            f"delete table inet {GUARD_TABLE}",
            f"table inet {GUARD_TABLE} {{",
            "  chain output {",
            "    type filter hook output priority filter; policy accept;",
            f'    oif "lo" tcp dport {{ {ports} }} meta skuid {{ {allowed} }} accept',
            f'    oif "lo" tcp dport {{ {ports} }} reject with tcp reset \\',
            '      comment "not an admin: no Prometheus or Alertmanager"',
            "  }",
            "}",
            "",
        ]
    )


def _dump(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=1000)


def _target(node: Node, port: int) -> str:
    return f"{node.reach}:{port}"


def _static(nodes: list[tuple[Node, str]], port: int) -> list[dict[str, Any]]:
    return [
        {"targets": [_target(node, port)], "labels": {"node": node.name, "pool": pool}}
        for node, pool in nodes
    ]


def _own(node: Node) -> dict[str, str]:
    return {"node": node.name, "pool": node.pool}


SLURM_SOURCE = "__tmp_slurm_source"


def _slurm_relabel(cluster: Cluster) -> list[dict[str, Any]]:
    heads = "|".join(re.escape(n.name) for n in cluster.head_nodes)
    return [
        {"source_labels": ["node"], "regex": heads, "target_label": SLURM_SOURCE,
         "replacement": "head"},
        {"source_labels": ["__name__", SLURM_SOURCE], "regex": "slurm_.*;", "action": "drop"},
        {"source_labels": ["__name__", "slurm_node"], "regex": "slurm_node_state;(.+)",
         "target_label": "pool", "replacement": ""},
        {"source_labels": ["__name__", "slurm_node"], "regex": "slurm_node_state;(.+)",
         "target_label": "node", "replacement": "$1"},
        {"regex": f"slurm_node|{SLURM_SOURCE}", "action": "labeldrop"},
    ]  # fmt: skip


def _prometheus(cluster: Cluster) -> dict[str, Any]:
    spec = cluster.spec
    monitoring = spec.monitoring
    watcher = cluster.monitoring_node
    assert monitoring is not None and watcher is not None
    lasting = [(n, v.name) for v in cluster.pools for n in v.nodes if not n.elastic]
    scrape = [
        {
            "job_name": "prometheus",
            "static_configs": [
                {"targets": [f"127.0.0.1:{monitoring.prometheus_port}"], "labels": _own(watcher)}
            ],
        },
        {
            "job_name": "alertmanager",
            "static_configs": [
                {"targets": [f"127.0.0.1:{monitoring.alertmanager_port}"], "labels": _own(watcher)}
            ],
        },
        {
            "job_name": "node",
            # no honor_labels: what an exporter says never replaces the target's node and pool
            # (a process that binds the port while the exporter is down could write series under
            # any node's name). The heads' Slurm metrics name the node they are about
            # (slurm_node="gpu001"): that becomes the node label for slurm_node_state from a head
            # alone, and the slurm_ series of any other node are dropped.
            "metric_relabel_configs": _slurm_relabel(cluster),
            "static_configs": _static(lasting, monitoring.node_exporter_port),
        },
    ]
    nvidia = spec.nvidia
    if nvidia.dcgm and nvidia.dcgm_exporter_url is not None:  # the dcgm role runs the exporter
        gpu = [
            (n, v.name) for v in cluster.pools if v.profile.gpu for n in v.nodes if not n.elastic
        ]
        if gpu:
            scrape.append(
                {"job_name": "dcgm", "static_configs": _static(gpu, nvidia.dcgm_exporter_port)}
            )
    return {
        "global": {
            "scrape_interval": monitoring.scrape_interval,
            "evaluation_interval": monitoring.scrape_interval,
            "external_labels": {"cluster": spec.name},
        },
        "rule_files": [f"{RULES_DIR}/*.yml"],
        "alerting": {
            "alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{monitoring.alertmanager_port}"]}]}
            ]
        },
        "scrape_configs": scrape,
    }


def _alertmanager(cluster: Cluster) -> dict[str, Any]:
    monitoring = cluster.spec.monitoring
    assert monitoring is not None
    receivers: list[dict[str, Any]] = [{"name": "none"}]  # alerts show in Alertmanager only
    routes = []
    for receiver in monitoring.receivers:
        if receiver.webhook is not None:
            configs = {"webhook_configs": [{"url": receiver.webhook, "send_resolved": True}]}
        else:
            assert receiver.email is not None
            configs = {"email_configs": [_email(receiver.name, receiver.email)]}
        receivers.append({"name": receiver.name, **configs})
        routes.append({"receiver": receiver.name, "continue": True})  # each gets every alert
    route: dict[str, Any] = {
        "receiver": "none",
        "group_by": ["alertname", "node"],
        "group_wait": GROUP_WAIT,
        "group_interval": "1m",
        "repeat_interval": "4h",
    }
    if routes:
        route["routes"] = routes
    return {"route": route, "receivers": receivers}


def smtp_password_path(receiver: str) -> str:
    """Where the monitoring role puts a mail receiver's relay password (the monitoring role's
    copy of the workstation's file; Alertmanager reads it, the configuration never holds it)."""
    return f"{SMTP_PASSWORD_DIR}/smtp-{receiver}.password"


def _email(name: str, email: EmailReceiver) -> dict[str, Any]:
    config: dict[str, Any] = {
        "to": email.to,
        "from": email.sender,
        "smarthost": email.smarthost,
        "require_tls": email.require_tls,
        "send_resolved": True,
    }
    if email.username is not None:
        config["auth_username"] = email.username
        config["auth_password_file"] = smtp_password_path(name)
    return config


def smtp_logins(cluster: Cluster) -> list[str]:
    """The receivers whose relay wants a login: their passwords travel as cluster secrets."""
    monitoring = cluster.spec.monitoring
    if monitoring is None:
        return []
    return [r.name for r in monitoring.receivers if r.email and r.email.username is not None]


def grafana_datasource(cluster: Cluster) -> dict[str, Any]:
    """Grafana's provisioned data source: the cluster's Prometheus, beside it on the same node.
    Its uid is the one every dashboard's panels name."""
    monitoring = cluster.spec.monitoring
    assert monitoring is not None
    return {
        "apiVersion": 1,
        "datasources": [
            {
                "name": "Prometheus",
                "uid": GRAFANA_DATASOURCE_UID,
                "type": "prometheus",
                "access": "proxy",
                "url": f"http://127.0.0.1:{monitoring.prometheus_port}",
                "isDefault": True,
                "editable": False,
                "jsonData": {"timeInterval": monitoring.scrape_interval},
            }
        ],
    }


def _cluster_rules(cluster: Cluster) -> dict[str, Any]:
    """Constants the role's rules and dashboards compare with: each pool's lasting nodes, the
    GPUs each node of a GPU pool has, and how often the health checks run."""
    rules: list[dict[str, Any]] = []
    for view in cluster.pools:
        lasting = sum(1 for n in view.nodes if not n.elastic)
        labels = {"pool": view.name}
        rules.append(
            {
                "record": "provision:pool_nodes_expected",
                "expr": f"vector({lasting})",
                "labels": labels,
            }
        )
        if view.profile.gpu is not None:
            rules.append(
                {
                    "record": "provision:pool_gpus_expected",
                    "expr": f"vector({view.profile.gpu.count})",
                    "labels": labels,
                }
            )
    health = cluster.spec.health
    if health is not None:  # how often the health checks run (NodeHealthChecksStale)
        rules.append(
            {"record": "provision:health_interval_seconds", "expr": f"vector({health.interval})"}
        )
    return {"groups": [{"name": "provision-cluster", "rules": rules}]}

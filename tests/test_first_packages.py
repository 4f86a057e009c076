"""A node's first converge installs the later roles' packages in one apt transaction
(playbooks/tasks/packages.yml): the roles it gathers them from are the ones site.yml runs on
that node, and each role adds what its own install task installs. Both are evaluated here by
Ansible's own templating; the transaction itself runs live in every lab test's cold apply
(tests/integration/test_lab.py checks that no role installed its packages apart there)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import PLAYBOOKS_DIR, ROLES_DIR, collection_plugin
from .test_homes import _role_template
from .test_nvidia_sources import _load, trust

FIRST = PLAYBOOKS_DIR / "tasks" / "packages.yml"
VARS = PLAYBOOKS_DIR / "vars" / "packages.yml"  # site.yml's and image.yml's
# each role's install task on Debian and Ubuntu, whose packages the role's packages.yml adds
INSTALL = {
    "munge": "Install munge",
    "slurm": "Install the Slurm packages, Open MPI and the OCI runtime this node needs "
    "(Debian, Ubuntu)",
    "node_exporter": "Install the node exporter",
    "monitoring": "Install Prometheus and Alertmanager",
    "rdma": "Install the RDMA stack ({{ rdma_stack }})",
    "ipoib": "Install {{ _ipoib_renderer }}",
}


def _template(expr: str, variables: dict[str, Any]) -> Any:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    values = {k: trust(v) for k, v in variables.items()}
    return Templar(loader=DataLoader(), variables=values).template(trust_as_template(expr))


def _on_debian(role: str, expr: str, variables: dict[str, Any]) -> Any:
    """A role's expression as the role sees it on Debian: its defaults and vars
    (_role_template) with its Debian family file's over them."""
    path = ROLES_DIR / role / "vars" / "Debian.yml"
    family = {k: trust(v) for k, v in _load(path).items()} if path.is_file() else {}
    return _role_template(role, expr, {**family, **variables})


def _site_roles(host: dict[str, Any]) -> set[str]:
    """The roles with a packages.yml that site.yml runs on this host after its first play: the
    plays' hosts patterns and the roles' conditions, evaluated."""
    plays = yaml.safe_load((PLAYBOOKS_DIR / "site.yml").read_text())
    ran: set[str] = set()
    for play in plays[1:]:
        patterns = str(play["hosts"]).split(":")
        if not ("all" in patterns or set(patterns) & set(host["group_names"])):
            continue
        entries = [(r["role"], r) for r in play.get("roles") or []]
        for task in play.get("tasks") or []:
            include = task.get("ansible.builtin.include_role") or task.get(
                "ansible.builtin.import_role"
            )
            if include and "tasks_from" not in include:
                entries.append((include["name"], task))
        for name, entry in entries:
            role = name.rsplit(".", 1)[-1]
            if role not in INSTALL:
                continue
            when = entry.get("when") or []
            conditions = when if isinstance(when, list) else [when]
            if all(_template("{{ " + c + " }}", host) for c in conditions):
                ran.add(role)
    return ran


def _hosts() -> list[dict[str, Any]]:
    hosts = []
    for group, watcher, fabric, scheduler, monitoring in itertools.product(
        ("head", "compute", "login", "storage"),
        (False, True),
        (False, True),
        ("slurm", "kubernetes"),
        (None, False, True),
    ):
        host: dict[str, Any] = {
            "group_names": [
                group,
                *(["monitoring"] if watcher else []),
                *(["fabric"] if fabric else []),
            ],
            "provision_scheduler": scheduler,
        }
        if fabric:  # its addresses on the fabric (ipoib), where the fabric has a subnet
            host["provision_fabric_addresses"] = ["192.168.0.1/24"]
        if monitoring is not None:
            host["provision_monitoring"] = monitoring
        hosts.append(host)
    return hosts


def test_the_roles_with_a_packages_list_are_those_of_the_first_transaction() -> None:
    having = {p.parent.parent.name for p in ROLES_DIR.glob("*/tasks/packages.yml")}
    assert having == set(INSTALL)


def _include() -> dict[str, Any]:
    first = yaml.safe_load((PLAYBOOKS_DIR / "site.yml").read_text())[0]
    (task,) = [t for t in first["tasks"] if t.get("ansible.builtin.include_tasks")]
    return task  # type: ignore[no-any-return]


@pytest.mark.parametrize("host", _hosts(), ids=lambda h: "-".join(map(str, h.values())))
def test_the_first_transaction_gathers_the_roles_site_yml_runs_on_the_node(
    host: dict[str, Any],
) -> None:
    gathered = _template(_load(VARS)["_site_later_roles"], host)
    assert len(gathered) == len(set(gathered))
    assert set(gathered) == _site_roles(host)


def test_the_transaction_installs_what_each_gathered_role_added_once() -> None:
    gather, install = yaml.safe_load(FIRST.read_text())
    assert gather["loop"] == "{{ _site_later_roles }}"
    assert gather["ansible.builtin.include_role"]["tasks_from"] == "packages.yml"
    # the module returns the list read after: the roles' install tasks read it, no task between
    module = install["gpu_provision.cluster.installed_packages"]
    assert module["install_recommends"] is False
    assert module["install"] == "{{ _site_first_packages }}"
    added = {
        "_munge_first_packages": ["munge"],
        "_slurm_first_packages": ["slurmd", "openmpi-bin", "runc"],
        "_node_exporter_first_packages": ["prometheus-node-exporter"],
        "_monitoring_first_packages": ["prometheus"],  # set, but not gathered on this node
    }
    host = {**added, "_site_later_roles": ["munge", "slurm", "node_exporter", "munge"]}
    assert "vars" not in gather  # the roles come from vars/packages.yml, as image.yml has them
    names = _template(install["vars"]["_site_first_packages"], host)
    assert names == ["munge", "slurmd", "openmpi-bin", "runc", "prometheus-node-exporter"]


def _added(role: str, variables: dict[str, Any]) -> list[str]:
    tasks = yaml.safe_load((ROLES_DIR / role / "tasks" / "packages.yml").read_text())
    (add,) = [t for t in tasks if "ansible.builtin.set_fact" in t]
    expr = add["ansible.builtin.set_fact"][f"_{role}_first_packages"]
    return list(_on_debian(role, expr, variables))


def _installed_by_role(role: str, variables: dict[str, Any]) -> list[str]:
    tasks = yaml.safe_load((ROLES_DIR / role / "tasks" / "main.yml").read_text())
    (task,) = [t for t in tasks if t.get("name") == INSTALL[role]]
    module = task.get("ansible.builtin.apt") or task.get("ansible.builtin.package")
    names = _on_debian(role, module["name"], variables)
    return [names] if isinstance(names, str) else list(names)


SLURM_NODES = {
    "compute, a runtime": {"inventory_hostname": "c1", "slurm_oci_runtime": "runc"},
    "compute": {"inventory_hostname": "c1"},
    "controller and accounting": {"inventory_hostname": "h1", "slurm_accounting": True},
    "second controller": {"inventory_hostname": "h2", "slurm_accounting": True},
    "login": {"inventory_hostname": "l1"},
}


@pytest.mark.parametrize("role", sorted(INSTALL))
@pytest.mark.parametrize("node", sorted(SLURM_NODES))
def test_each_role_adds_what_its_install_task_installs(role: str, node: str) -> None:
    variables = {
        "groups": {"head": ["h1", "h2"], "compute": ["c1"], "login": ["l1"]},
        "ansible_facts": {"distribution": "Debian", "os_family": "Debian"},
        **SLURM_NODES[node],
    }
    added = _added(role, variables)
    assert added and added == _installed_by_role(role, variables)


def test_a_pinned_slurm_is_left_to_the_role_but_open_mpi_comes_first() -> None:
    variables = {
        "groups": {"head": ["h1"], "compute": ["c1"], "login": []},
        "inventory_hostname": "c1",
        "slurm_version": "22.05",
        "slurm_oci_runtime": "runc",
    }
    added = _added("slurm", variables)
    assert "openmpi-bin" in added and "runc" in added
    assert not [p for p in added if p.startswith("slurm")]


def test_site_yml_runs_it_on_a_new_node_with_apt_in_an_untagged_run_after_the_firewall() -> None:
    first = yaml.safe_load((PLAYBOOKS_DIR / "site.yml").read_text())[0]
    assert [r["role"].rsplit(".", 1)[-1] for r in first["roles"]][-1] == "firewall"
    task = _include()
    assert first["tasks"][0] == task  # before anything else of the play's own
    assert Path(PLAYBOOKS_DIR / task["ansible.builtin.include_tasks"]) == FIRST
    cases = [
        ({"provision_new_nodes": ["n1"]}, True),
        ({"provision_new_nodes": ["n2"]}, False),
        ({}, False),
        ({"provision_new_nodes": ["n1"], "ansible_run_tags": ("slurm",)}, False),
        ({"provision_new_nodes": ["n1"], "ansible_skip_tags": ["monitoring"]}, False),
        ({"provision_new_nodes": ["n1"], "ansible_facts": {"pkg_mgr": "dnf"}}, False),
    ]
    for variables, runs in cases:
        host = {
            "inventory_hostname": "n1",
            "ansible_facts": {"pkg_mgr": "apt"},
            "ansible_run_tags": ("all",),  # a tuple, as Ansible gives it
            "ansible_skip_tags": [],
            **variables,
        }
        assert all(_template("{{ " + c + " }}", host) for c in task["when"]) is runs, variables


def test_the_firewalls_packages_come_with_chrony_where_it_runs_and_its_own_task_then_skips() -> (
    None
):
    first = yaml.safe_load((PLAYBOOKS_DIR / "site.yml").read_text())[0]
    common, firewall = first["roles"]
    assert firewall["role"].endswith(".firewall") and firewall["tags"] == ["firewall"]
    tasks = yaml.safe_load((ROLES_DIR / "firewall" / "tasks" / "main.yml").read_text())
    (own,) = [t for t in tasks if t.get("name") == "Install nftables"]
    assert own["ansible.builtin.package"]["name"] == "{{ _firewall_packages }}"
    packages = _load(ROLES_DIR / "firewall" / "vars" / "Debian.yml")["_firewall_packages"]
    # netbase's /etc/protocols: the rule set names protocols, nft cannot resolve them without
    assert packages == ["nftables", "netbase"]
    expr = common["vars"]["common_also_install"]
    cases = [  # the run's tags a tuple, as Ansible gives them
        ((("all",), []), packages),
        ((("firewall",), []), packages),
        ((("all",), ["firewall"]), []),
        ((("common", "storage"), []), []),  # the firewall does not run: nothing of its own
    ]
    assert _load(VARS)["_site_firewall_packages"] == packages
    for (run, skip), expected in cases:
        host = {"ansible_run_tags": run, "ansible_skip_tags": skip, **_load(VARS)}
        assert _template(expr, host) == expected, (run, skip)
    time = yaml.safe_load((ROLES_DIR / "common" / "tasks" / "time.yml").read_text())
    (chrony,) = [t for t in time if t.get("name") == "Refresh the apt cache and install chrony"]
    names = _template(chrony["vars"]["_common_first_packages"], {"common_also_install": packages})
    assert names == ["chrony", "nftables", "netbase"]
    assert chrony["gpu_provision.cluster.installed_packages"]["install"] == (
        "{{ _common_first_packages }}"
    )
    # the list the module returns has them: the firewall's task is skipped
    assert own["when"] == "_firewall_packages is not gpu_provision.cluster.installed(ansible_facts)"
    test = collection_plugin("test", "installed").installed
    assert test(packages, {"provision_packages": ["chrony", *packages]})
    assert not test(packages, {"provision_packages": ["chrony", "nftables"]})


def test_a_pools_node_image_gets_what_a_nodes_first_converge_installs_before_its_roles() -> None:
    """image.yml (a builder container per pool that boots from the network, boot.py): the same
    list site.yml's first play installs on a new node, from the same variables file, so that a
    node booted from the image finds each role's packages there."""
    play, gpu = yaml.safe_load((PLAYBOOKS_DIR / "image.yml").read_text())
    site = yaml.safe_load((PLAYBOOKS_DIR / "site.yml").read_text())
    first = site[0]
    assert play["vars_files"] == first["vars_files"] == ["vars/packages.yml"]
    base, later = play["tasks"]
    module = base["gpu_provision.cluster.installed_packages"]
    assert module["cache_valid_time"] > 0  # the layer keeps no lists: they are fetched first
    # common's list where the firewall runs (what site.yml gives it in a full run)
    common = _template(first["roles"][0]["vars"]["common_also_install"], {
        "ansible_run_tags": ("all",), "ansible_skip_tags": [], **_load(VARS)
    })  # fmt: skip
    assert _template(module["install"], _load(VARS)) == ["chrony", *common]
    assert later["ansible.builtin.include_tasks"] == _include()["ansible.builtin.include_tasks"]
    assert "when" not in later  # every builder is a new node
    # a GPU pool's image: the driver from the source site.yml's GPU play takes it from (its
    # repositories role first), the driver role's image entry point
    gpu_play = next(p for p in site if p["name"] == "GPU software")
    assert gpu["hosts"] == gpu_play["hosts"] == "gpu"
    roles = [t["ansible.builtin.import_role"] for t in gpu["tasks"]]
    assert roles == [
        gpu_play["tasks"][0]["ansible.builtin.import_role"],
        {"name": "gpu_provision.cluster.nvidia_driver", "tasks_from": "image.yml"},
    ]
    assert gpu_play["tasks"][1]["ansible.builtin.import_role"]["name"] == roles[1]["name"]

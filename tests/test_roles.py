"""Roles without nodes: argument specs agree with defaults, and the per-OS variables render
for every supported OS (the Rocky 9 path can only be rendered here: no Rocky archives)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from provision.assets import collections_path

from .conftest import PLAYBOOKS_DIR, ROLES_DIR, ROOT

ROLES = sorted(p for p in (ROLES_DIR).iterdir() if p.is_dir())
_yaml = YAML(typ="safe", pure=True)


def _load(path: Path) -> Any:
    return _yaml.load(path.read_text()) if path.exists() else {}


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_argument_specs_match_defaults(role: Path) -> None:
    """Over all the role's entry points (main, and a tasks file another play includes)."""
    defaults = _load(role / "defaults" / "main.yml") or {}
    entries = _load(role / "meta" / "argument_specs.yml")["argument_specs"]
    assert "main" in entries
    spec = {}
    for entry in entries.values():
        for name, option in entry["options"].items():
            assert spec.setdefault(name, option) == option, f"{name}: two declarations differ"
    assert set(spec) == set(defaults), "every default is declared, every option has a default"
    for name, option in spec.items():
        assert option.get("default") == defaults[name], name
        assert option.get("description"), name


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_variables_are_prefixed(role: Path) -> None:
    names = set(_load(role / "defaults" / "main.yml") or {})
    for vars_file in (role / "vars").glob("*.yml"):
        names |= {n.lstrip("_") for n in (_load(vars_file) or {})}
    assert all(n.startswith(f"{role.name}_") for n in names), sorted(names)


def _render(expressions: dict[str, str], variables: dict[str, Any]) -> dict[str, Any]:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    # role files are trusted templates when Ansible loads them; say so for ours
    templar = Templar(loader=DataLoader(), variables=variables)
    return {k: templar.template(trust_as_template(v)) for k, v in expressions.items()}


@pytest.mark.parametrize(
    ("family", "service", "conf", "nft", "ssh"),
    [
        ("Debian", "chrony", "/etc/chrony/chrony.conf", "/etc/nftables.conf", "ssh"),
        ("RedHat", "chronyd", "/etc/chrony.conf", "/etc/sysconfig/nftables.conf", "sshd"),
    ],
)
def test_os_family_paths(family: str, service: str, conf: str, nft: str, ssh: str) -> None:
    # the roles' first task loads vars/<family>.yml
    exprs = {
        **_load(ROLES_DIR / "common" / "vars" / f"{family}.yml"),
        **_load(ROLES_DIR / "firewall" / "vars" / f"{family}.yml"),
    }
    wanted = {
        k: exprs[k]
        for k in (
            "_common_chrony_service",
            "_common_chrony_conf",
            "_firewall_main_conf",
            "_common_ssh_service",
        )
    }
    got = _render(wanted, {"ansible_facts": {"os_family": family}})
    assert got == {
        "_common_chrony_service": service,
        "_common_chrony_conf": conf,
        "_firewall_main_conf": nft,
        "_common_ssh_service": ssh,
    }


def test_slurm_packages_per_os() -> None:
    vars_dir = ROLES_DIR / "slurm" / "vars"
    debian, redhat = _load(vars_dir / "Debian.yml"), _load(vars_dir / "RedHat.yml")
    assert set(debian) == set(redhat), "both OS families define the same variables"
    assert debian["_slurm_packages_controller"] == ["slurmctld", "slurm-client"]
    assert debian["_slurm_packages_compute"] == ["slurmd", "slurm-client"]
    assert "mariadb-server" in debian["_slurm_packages_dbd"]
    # Rocky 9: EPEL's package names, after enabling crb and epel-release
    assert redhat["_slurm_repo_tasks"] is True
    assert redhat["_slurm_packages_controller"] == ["slurm", "slurm-slurmctld"]
    assert redhat["_slurm_packages_compute"] == ["slurm", "slurm-slurmd"]
    assert redhat["_slurm_packages_dbd"][0] == "slurm-slurmdbd"
    assert redhat["_slurm_mariadb_socket"] == "/var/lib/mysql/mysql.sock"
    repos = _load(ROLES_DIR / "slurm" / "tasks" / "repos-redhat.yml")
    assert [
        t.get("community.general.dnf_config_manager", t.get("ansible.builtin.dnf")) for t in repos
    ] == [{"name": "crb", "state": "enabled"}, {"name": "epel-release", "state": "present"}]


def test_slurm_paths_come_from_the_rendered_conf(tmp_path: Path) -> None:
    from provision.cluster import Cluster
    from provision.render import render
    from provision.spec import load_spec

    conf = render(Cluster(load_spec(ROOT / "examples" / "dgx-superpod.yaml")))[
        "files/slurm/slurm.conf"
    ]
    exprs = _load(ROLES_DIR / "slurm" / "vars" / "main.yml")
    wanted = {k: exprs[k] for k in ("_slurm_state_save", "_slurm_spool", "_slurm_log_dir")}
    got = _render(wanted, {"_slurm_conf_text": conf})
    assert got == {
        "_slurm_state_save": "/var/spool/slurmctld",
        "_slurm_spool": "/var/spool/slurmd",
        "_slurm_log_dir": "/var/log/slurm",
    }


def test_playbooks_syntax(tmp_path: Path) -> None:
    from provision.cluster import Cluster
    from provision.render import render, write_render
    from provision.spec import load_spec

    write_render(render(Cluster(load_spec(ROOT / "examples" / "lab.yaml"))), tmp_path)
    playbook = Path(sys.executable).parent / "ansible-playbook"
    books = sorted(PLAYBOOKS_DIR.glob("*.yml"))
    assert books, f"no playbook in {PLAYBOOKS_DIR}"
    for book in books:
        r = subprocess.run(
            [
                str(playbook),
                "--syntax-check",
                "-i",
                str(tmp_path / "inventory" / "hosts.yml"),
                str(book),
            ],
            capture_output=True,
            text=True,
            check=False,
            env={
                "ANSIBLE_CONFIG": str(ROOT / "provision" / "run" / "ansible.cfg"),
                "ANSIBLE_COLLECTIONS_PATH": str(collections_path()),
                "PATH": "/usr/bin:/bin",
            },
        )
        assert r.returncode == 0, r.stdout + r.stderr


MADISON = (
    " slurm-client | 22.05.8-4+deb12u3 | http://deb.debian.org/debian bookworm/main amd64 "
    "Packages\n"
    " slurm-client | 22.05.8-4+deb12u1 | http://deb.debian.org/debian-security bookworm/main "
    "amd64 Packages\n"
)


@pytest.mark.parametrize(
    ("family", "offered", "pin", "version", "packages"),
    [
        # the newest the source offers that the pin names, on the Slurm packages only
        (
            "Debian",
            MADISON,
            "22.05",
            "22.05.8-4+deb12u3",
            ["slurmctld=22.05.8-4+deb12u3", "slurm-client=22.05.8-4+deb12u3", "mariadb-server"],
        ),
        ("Debian", MADISON, "22.05.8-4+deb12u1", "22.05.8-4+deb12u1", None),
        ("Debian", MADISON, "22.0", "", ["slurmctld", "slurm-client", "mariadb-server"]),
        ("Debian", MADISON, "23.11", "", None),
        ("Debian", "", "22.05", "", None),  # no Slurm in the source at all
        (
            "RedHat",
            "22.05.9-1.el9\n23.11.10-1.el9\n",
            "23.11",
            "23.11.10-1.el9",
            ["slurm-23.11.10-1.el9", "slurm-slurmctld-23.11.10-1.el9", "mariadb-server"],
        ),
    ],
)
def test_a_pinned_slurm_version_picks_from_what_the_source_offers(
    family: str, offered: str, pin: str, version: str, packages: list[str] | None
) -> None:
    vars_dir = ROLES_DIR / "slurm" / "vars"
    exprs = {**_load(vars_dir / "main.yml"), **_load(vars_dir / f"{family}.yml")}
    names = ["slurmctld", "slurm-client"] if family == "Debian" else ["slurm", "slurm-slurmctld"]
    from ansible.template import trust_as_template

    variables = {
        **{k: trust_as_template(v) if isinstance(v, str) else v for k, v in exprs.items()},
        "slurm_version": pin,
        "_slurm_offered_out": {"stdout_lines": offered.splitlines()},
        "_slurm_packages": [*names, "mariadb-server"],
    }
    wanted = {
        k: exprs[k] for k in ("_slurm_offered", "_slurm_pin_version", "_slurm_packages_pinned")
    }
    got = _render(wanted, variables)
    assert got["_slurm_pin_version"] == version
    assert got["_slurm_offered"] == [
        line.split("|")[1].strip() if "|" in line else line for line in offered.splitlines()
    ]
    if packages is not None:
        assert got["_slurm_packages_pinned"] == packages


@pytest.mark.parametrize(
    ("uids", "play", "expected"),
    [
        ({"head001": "64030", "head002": "64030"}, ["head001", "head002"], ["64030", "64030"]),
        ({"head001": "64030", "head002": "991"}, ["head001", "head002"], ["64030", "991"]),
        # a controller outside this run (--limit) is not asked; one without the user yet neither
        ({"head001": "64030", "head002": "991"}, ["head001"], ["64030"]),
        ({"head001": "64030", "head002": None}, ["head001", "head002"], ["64030"]),
    ],
)
def test_the_controllers_slurm_uids_are_compared(
    uids: dict[str, str | None], play: list[str], expected: list[str]
) -> None:
    expr = _load(ROLES_DIR / "slurm" / "vars" / "main.yml")["_slurm_controller_uids"]
    hostvars = {
        host: {
            "ansible_facts": {
                "getent_passwd": {"slurm": ["x", uid, uid, "", "/nonexistent", ""] if uid else None}
            }
        }
        for host, uid in uids.items()
    }
    variables = {
        "groups": {"head": ["head001", "head002"]},
        "slurm_controller_group": "head",
        "ansible_play_hosts": play,
        "hostvars": hostvars,
    }
    got = _render({"uids": expr}, variables)["uids"]
    assert got == expected


# The conventions of roles/README.md, each checked on every role.
LOAD_FAMILY = {
    "name": "Load the variables of this OS family",
    "ansible.builtin.include_vars": "{{ ansible_facts.os_family }}.yml",
}


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_os_family_values_live_in_family_files(role: Path) -> None:
    """No inline choice by OS family in vars/main.yml; per-family files come in pairs with the
    same names, loaded by one task in the role's own words, before the role's other tasks."""
    main = role / "vars" / "main.yml"
    assert "os_family" not in (main.read_text() if main.exists() else "")
    debian, redhat = _load(role / "vars" / "Debian.yml"), _load(role / "vars" / "RedHat.yml")
    assert set(debian or {}) == set(redhat or {})
    tasks = _load(role / "tasks" / "main.yml") or []
    if debian:
        names = [t.get("name") for t in tasks]
        first = next(t for t in tasks if t.get("ansible.builtin.setup") is None)
        assert first == LOAD_FAMILY, names[:3]
    else:
        assert LOAD_FAMILY not in tasks


def _asserts(role: Path) -> list[str]:
    found = []
    for path in (role / "tasks").glob("*.yml"):
        for task in _load(path) or []:
            that = (task.get("ansible.builtin.assert") or {}).get("that")
            found += [that] if isinstance(that, str) else list(that or [])
    return found


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_enumerations_are_argument_spec_choices(role: Path) -> None:
    """An input with a fixed set of values says so in argument_specs (choices), where Ansible
    checks it before the role runs, never in an assert task."""
    import re

    options = _load(role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    for that in _asserts(role):
        m = re.match(r"^\s*(\w+) in \[", that)
        assert not (m and m.group(1) in options), f"{that!r}: make it choices in argument_specs"


def test_conditional_roles_are_included_once_per_host() -> None:
    """A role under a condition is an include_role task: one check per host, not the condition
    copied onto each of its tasks (what `when:` on a `roles:` entry does)."""
    plays = _load(PLAYBOOKS_DIR / "site.yml")
    assert any(play.get("tasks") for play in plays), "site.yml includes no role under a condition"
    for play in plays:
        for entry in play.get("roles") or []:
            assert "when" not in entry, (play["name"], entry)
        for task in play.get("tasks") or []:
            if "when" in task and "ansible.builtin.include_tasks" in task:
                # the one task file of site.yml's own (a node's first packages), in every run
                # it may serve, which its condition narrows to untagged ones
                assert task["ansible.builtin.include_tasks"] == "tasks/packages.yml"
                assert task["tags"] == ["always"]
            elif "when" in task:
                include = task["ansible.builtin.include_role"]
                assert include["apply"]["tags"] == task["tags"], task["name"]


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_conditional_task_files_are_included_once(role: Path) -> None:
    paths = sorted((role / "tasks").glob("*.yml"))
    assert paths, f"{role.name}: no task file"
    for path in paths:
        for task in _load(path) or []:
            assert not ("ansible.builtin.import_tasks" in task and "when" in task), task["name"]


def test_the_heads_get_boto3_only_where_a_pool_bursts_into_aws(tmp_path: Path) -> None:
    """The burst role reads the rendered burst configuration: python3-boto3 goes on the heads
    of a cluster with an elastic AWS pool (its backend calls EC2 through the SDK), not on a
    lab-only one (the other backends use the standard library)."""
    from provision.cluster import Cluster
    from provision.render import render
    from provision.spec import load_spec

    exprs = _load(ROLES_DIR / "burst" / "vars" / "main.yml")
    tasks = _load(ROLES_DIR / "burst" / "tasks" / "main.yml")
    (boto,) = [
        t for t in tasks if t.get("ansible.builtin.package", {}).get("name") == "python3-boto3"
    ]
    assert "'aws' in _burst_backends" in boto["when"]
    for spec, unbuilt, backends in (
        (ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml", True, ["aws", "azure", "gcp"]),
        (ROOT / "examples" / "lab-burst.yaml", False, ["lab"]),
    ):
        config = tmp_path / f"{spec.stem}.json"
        config.write_text(
            render(Cluster(load_spec(spec, unbuilt=unbuilt)))["files/burst/burst.json"]
        )
        # the file as the role's lookup reads it
        got = _render(
            {"b": exprs["_burst_backends"]}, {"_burst_config": json.loads(config.read_text())}
        )
        assert got["b"] == backends, spec.name
    assert exprs["_burst_config"] == (
        "{{ lookup('ansible.builtin.file', burst_config_src) | from_json }}"
    )

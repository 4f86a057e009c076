"""The cluster's users and groups from the spec: rendered for the common role (every node, the
keys on the login nodes alone), the role's own expressions evaluated by Ansible's templating
(ID clashes with the node's accounts, who is locked out, whose keys sshd takes, the homes on a
shared /home), what plan says a change does, and verify's reading of getent as recorded on the
lab. The role runs live in tests/integration/test_lab.py (logins, jobs, a user locked out)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from provision.changes import users_change
from provision.cluster import Cluster
from provision.errors import SpecError
from provision.parsers.node import user_problems
from provision.render import render
from provision.render.firewall import Rule, admin_reach, pool_rules
from provision.render.inventory import group_vars
from provision.spec import load_spec

from .conftest import ROOT
from .test_homes import _pool_vars, _role_template

SUPERPOD = ROOT / "examples" / "dgx-superpod-ha.yaml"
LAB = ROOT / "examples" / "lab.yaml"
DATA = Path(__file__).parent / "data"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP1VuSgOfuxznqOLRCDS53kx4CzSij4wRTOOlvhE3ipP ana@x"
USERS = f"""
groups: [{{name: vision, gid: 3000}}]
users:
  - {{name: ana, uid: 2001, groups: [vision], ssh_keys: ["{KEY}"]}}
  - {{name: ben, uid: 2002}}
"""


def _lab_with_users(tmp_path: Path, extra: str = USERS) -> Cluster:
    spec = tmp_path / "lab.yaml"
    spec.write_text(LAB.read_text() + extra)
    return Cluster(load_spec(spec))


def test_every_node_gets_the_users_and_the_login_pools_alone_their_keys() -> None:
    cluster = Cluster(load_spec(SUPERPOD))
    out = group_vars(cluster)
    assert out["common_groups"] == [
        {"name": "vision", "gid": 3001},
        {"name": "speech", "gid": 3002},
    ]
    carol, dave = out["common_users"]
    assert (carol["name"], carol["uid"], carol["groups"]) == ("carol", 6001, ["vision"])
    assert dave["groups"] == ["vision", "speech"] and len(dave["ssh_keys"]) == 1
    pools = _pool_vars(cluster)
    assert cluster.user_doors == ["login"]
    assert [p for p, v in pools.items() if v.get("common_users_login")] == ["login"]
    # their homes are on the shared /home there, as the admins' are
    assert pools["login"]["common_homes_shared"] and pools["gpu"]["common_homes_shared"]
    reach = {r.service: r for r in admin_reach(cluster)}
    assert reach["ssh (users)"].where == "login[01-02]"
    assert (
        "from the user networks (10.20.0.0/16) and the admin networks" in reach["ssh (users)"].who
    )
    # their networks reach SSH on the login nodes alone
    rules = pool_rules(cluster)
    users = Rule("ssh from user networks", "tcp", "22", ("10.20.0.0/16",))
    assert [pool for pool, found in rules.items() if users in found] == ["login"]


def test_the_user_networks_need_users_and_a_bounded_size(tmp_path: Path) -> None:
    spec = tmp_path / "lab.yaml"
    lab = LAB.read_text().replace("  admin_cidrs:", "  user_cidrs: [10.20.0.0/16]\n  admin_cidrs:")
    spec.write_text(lab)
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    assert "security.user_cidrs: no users to log in from there" in str(caught.value)
    spec.write_text(lab.replace("10.20.0.0/16", "0.0.0.0/0") + USERS)
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    assert "security.user_cidrs: the user networks hold about a /1" in str(caught.value)


def test_without_a_login_pool_the_users_log_in_to_the_heads(tmp_path: Path) -> None:
    cluster = _lab_with_users(tmp_path)
    assert cluster.user_doors == ["head"]
    pools = _pool_vars(cluster)
    assert pools["head"].get("common_users_login") and not pools["compute"].get(
        "common_users_login"
    )
    plain = _pool_vars(Cluster(load_spec(LAB)))
    assert not any(v.get("common_users_login") for v in plain.values())


def _common(expr: str, **variables: Any) -> Any:
    return _role_template("common", expr, variables)


def test_the_role_refuses_an_id_an_account_of_the_node_holds() -> None:
    users = [{"name": "ana", "uid": 2001, "groups": [], "ssh_keys": []}]
    groups = [{"name": "vision", "gid": 3000}]
    facts = {
        "getent_passwd": {
            "ana": ["x", "2001", "2001", "", "/home/ana", "/bin/bash"],  # ana herself: fine
            "olduser": ["x", "2001", "100", "", "/home/olduser", "/bin/sh"],
        },
        "getent_group": {
            "ana": ["x", "2001", ""],
            "video": ["x", "3000", ""],
            "oldgrp": ["x", "2001", ""],
        },
    }
    clashes = _common(
        "{{ _common_uid_clashes }}",
        common_users=users,
        common_groups=groups,
        ansible_facts=facts,
    )
    assert clashes == [
        "olduser holds uid 2001 (ana's)",
        "group video holds gid 3000 (vision's)",
        "group oldgrp holds gid 2001 (ana's own group)",
    ]
    facts["getent_passwd"].pop("olduser")
    facts["getent_group"].pop("video")
    facts["getent_group"].pop("oldgrp")
    assert _common("{{ _common_uid_clashes }}", common_users=users, common_groups=groups,
                   ansible_facts=facts) == []  # fmt: skip


def test_the_role_locks_out_the_users_earlier_runs_made_that_the_spec_dropped() -> None:
    record = {"content": base64.b64encode(b"ana\nben\ncid\n").decode()}
    facts = {"getent_passwd": {"ana": [], "ben": []}}  # cid was deleted by hand: nothing to lock
    gone = _common(
        "{{ _common_users_gone }}",
        common_users=[{"name": "ana", "uid": 2001}],
        _common_users_read=record,
        ansible_facts=facts,
    )
    assert gone == ["ben"]
    first = _common(
        "{{ _common_users_gone }}",
        common_users=[{"name": "ana", "uid": 2001}],
        _common_users_read={"failed": True},  # no record yet: the first run
        ansible_facts=facts,
    )
    assert first == []


def test_sshd_takes_the_users_keys_on_the_login_nodes_alone() -> None:
    users = [
        {"name": "ana", "uid": 2001, "ssh_keys": ["ssh-ed25519 AAAA ana"]},
        {"name": "ben", "uid": 2002, "ssh_keys": []},  # no key: nothing to write
    ]
    door = _common("{{ _common_key_paths }}", common_users=users, common_users_login=True)
    elsewhere = _common("{{ _common_key_paths }}", common_users=users)
    assert "/etc/ssh/provision-keys/ana" in door and "/etc/ssh/provision-keys/ben" not in door
    assert not any("ana" in path for path in elsewhere)


def test_the_users_homes_are_made_on_a_shared_home_by_their_ids() -> None:
    homes = _common(
        "{{ _common_shared_homes }}",
        common_users=[{"name": "ana", "uid": 2001}],
        common_admin_users=[{"name": "root2", "uid": 1500}],
    )
    assert {"home": "/home/ana", "uid": 2001, "gid": 2001} in homes
    cluster = Cluster(load_spec(SUPERPOD))
    server = _pool_vars(cluster)["storage"]
    exports = server["nfs_server_exports"]
    made = _role_template(
        "nfs_server",
        "{{ _nfs_server_homes }}",
        {"nfs_server_exports": exports, **{k: v for k, v in group_vars(cluster).items()
                                           if k.startswith("common_")}},
    )  # fmt: skip
    assert {"path": "/srv/home/carol", "uid": 6001, "gid": 6001} in made


def _files(cluster: Cluster) -> dict[str, str]:
    return render(cluster)


def test_plan_says_who_comes_who_is_locked_out_and_what_changes(tmp_path: Path) -> None:
    old = _files(_lab_with_users(tmp_path))
    fewer = USERS.replace("  - {name: ben, uid: 2002}\n", "").replace(
        "groups: [vision]", "groups: []"
    )
    new = _files(_lab_with_users(tmp_path, fewer + "  - {name: cid, uid: 2003}\n"))
    change = users_change(old, new)
    assert change is not None
    assert change.added == ("cid",) and change.locked == ("ben",)
    assert change.changed == ("ana: groups vision -> -",)
    assert users_change(old, old) is None


def test_plan_prints_the_users_locked_out(tmp_path: Path) -> None:
    from .conftest import run_provision

    spec = tmp_path / "lab.yaml"
    spec.write_text(LAB.read_text() + USERS)
    state = tmp_path / "state"
    first = run_provision("render", str(spec), "--out", str(tmp_path / "out"),
                          "--state-dir", str(state))  # fmt: skip
    assert first.returncode == 0, first.stderr
    applied = state / "lab" / "applied"
    applied.parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "out").rename(applied)
    spec.write_text(LAB.read_text() + USERS.replace("  - {name: ben, uid: 2002}\n", ""))
    shown = run_provision("plan", str(spec), "--state-dir", str(state))
    assert shown.returncode == 0, shown.stderr
    assert "running cluster: users locked out: ben (gone from the spec" in shown.stdout


def _sections() -> list[str]:
    lines = [ln for ln in (DATA / "getent-users.txt").read_text().splitlines()
             if not ln.startswith("#")]  # fmt: skip
    return "\n".join(lines).split("\n---\n")


def test_verify_reads_the_users_as_getent_shows_them() -> None:
    passwd, group, locked = _sections()
    users = {"ana": (2001, ("vision",)), "ben": (2002, ())}
    assert user_problems(users, ["vision"], passwd, group) == []
    assert user_problems(users, ["vision"], locked, group) == [
        "ana missing",
        "ben is locked out (shell /usr/sbin/nologin)",
    ]
    moved = {"ana": (2005, ()), "ben": (2002, ("vision",))}
    assert user_problems(moved, ["vision"], passwd, group) == [
        "ana has uid 2001, not 2005",
        "ben not in group vision",
        "ana in group vision, which the spec does not give",
    ]


@pytest.mark.parametrize("example", ["lab.yaml", "dgx-superpod-ha.yaml"])
def test_examples_without_users_render_none(example: str) -> None:
    out = group_vars(Cluster(load_spec(ROOT / "examples" / example)))
    assert ("common_users" in out) == (example != "lab.yaml")


JOBS = ROOT / "docs" / "jobs"


def test_the_data_parallel_job_is_a_script_slurm_runs_as_written() -> None:
    """The docs' PyTorch DDP job: the batch script parses, asks for two nodes and runs the
    program beside it through srun; the program compiles and takes its rank from Slurm. (It ran
    on the lab through Slurm with PyTorch's CPU wheel: docs/users.md shows its output.)"""
    import subprocess

    script = JOBS / "ddp.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
    assert 'srun "${DDP_PYTHON:-python3}" "${SLURM_SUBMIT_DIR}/ddp.py"' in text
    program = JOBS / "ddp.py"
    source = program.read_text()
    compile(source, str(program), "exec")
    for name in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
        assert f'"{name}"' in source
    assert '"nccl" if gpu else "gloo"' in source

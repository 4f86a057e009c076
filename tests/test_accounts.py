"""Slurm accounts, QoS and fair share from the spec: the checks, slurm.conf's keys, what plan
says, and the slurm_accounts module's reading of sacctmgr (output recorded on the lab,
tests/data/sacctmgr/) and the commands it works out from it. The module runs live in
tests/integration/test_lab.py (limits, refusal at submit, a change and a removal)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from provision.changes import accounts_change
from provision.cluster import Cluster
from provision.errors import SpecError
from provision.render import render
from provision.render.inventory import group_vars
from provision.render.slurm import slurm_settings, wall_minutes
from provision.spec import load_spec

from .conftest import ROOT, collection_module

DATA = Path(__file__).parent / "data" / "sacctmgr"
LAB = ROOT / "examples" / "lab.yaml"
USERS = """
users:
  - {name: ana, uid: 2001}
  - {name: ben, uid: 2002}
"""
ACCOUNTS = """  qos:
    - {name: small, priority: 10, grp_tres: {node: 1}, max_wall: "1:00:00"}
    - {name: high, priority: 100, preempt: [normal], max_tres_per_user: {cpu: 4}}
  accounts:
    - {name: research, fairshare: 100}
    - {name: vision, parent: research, fairshare: 60, users: [ana], qos: [normal, small, high]}
    - {name: speech, parent: research, fairshare: 40, users: [ben, ana]}
"""


def _module() -> ModuleType:
    return collection_module("slurm_accounts")


def _cluster(tmp_path: Path, accounts: str = ACCOUNTS) -> Cluster:
    text = LAB.read_text().replace("  accounting: true\n", "  accounting: true\n" + accounts)
    spec = tmp_path / "lab.yaml"
    spec.write_text(text + USERS)
    return Cluster(load_spec(spec))


def _recorded() -> dict[str, Any]:
    m = _module()
    accounts, users = m.read_associations((DATA / "show-assoc.txt").read_text())
    return {
        "have_qos": m.read_qos((DATA / "show-qos.txt").read_text()),
        "have_accounts": accounts,
        "have_users": users,
        "defaults": m.read_defaults((DATA / "show-user.txt").read_text()),
    }


def _plan(cluster: Cluster, **have: Any) -> list[str]:
    out = group_vars(cluster)
    commands = _module().plan(
        cluster.spec.name, out["slurm_qos"], out["slurm_accounts"],
        out["slurm_accounts_root_users"], **have,
    )  # fmt: skip
    return [" ".join(c) for c in commands]


def test_sacctmgr_as_recorded_reads_back_as_the_spec_that_made_it(tmp_path: Path) -> None:
    """What slurmdbd held after the lab's apply: nothing left to do."""
    assert _plan(_cluster(tmp_path), **_recorded()) == []


def test_a_fresh_slurmdbd_gets_qos_first_then_parents_before_children_then_users(
    tmp_path: Path,
) -> None:
    m = _module()
    accounts, users = m.read_associations("root|||1|normal|\nroot|root||1|normal|\n")
    fresh = {
        "have_qos": m.read_qos("normal|0|||||\n"),
        "have_accounts": accounts,
        "have_users": users,
        "defaults": {"root": "root"},
    }
    assert _plan(_cluster(tmp_path), **fresh) == [
        "add qos small,high",
        "modify qos where name=small set Priority=10 GrpTRES=node=1 MaxWall=60",
        "modify qos where name=high set Priority=100 Preempt=normal MaxTRESPerUser=cpu=4",
        "add account research cluster=lab parent=root fairshare=100 qos=normal defaultqos=normal",
        "add account vision cluster=lab parent=research fairshare=60 qos=high,normal,small "
        "defaultqos=normal",
        "add account speech cluster=lab parent=research fairshare=40 qos=normal defaultqos=normal",
        # one command for the users that join one account
        "add user ana account=vision cluster=lab",
        "add user ben,ana account=speech cluster=lab",
        "add user nobody,labadmin account=root cluster=lab",
    ]


def test_a_change_and_a_removal_touch_only_what_moved(tmp_path: Path) -> None:
    fewer = (
        ACCOUNTS.replace(
            "    - {name: speech, parent: research, fairshare: 40, users: [ben, ana]}\n", ""
        )
        .replace("fairshare: 60", "fairshare: 50")
        .replace("grp_tres: {node: 1}", "grp_tres: {gres/gpu: 16}")
    )
    assert _plan(_cluster(tmp_path, fewer), **_recorded()) == [
        "modify qos where name=small set GrpTRES=gres/gpu=16,node=-1",
        "modify account where name=vision cluster=lab set fairshare=50",
        "delete user where name=ana,ben account=speech cluster=lab",
        "delete account where name=speech cluster=lab",
    ]
    # a QoS gone from the spec goes once no account names it; Slurm's normal stays
    no_high = fewer.replace(
        "    - {name: high, priority: 100, preempt: [normal], max_tres_per_user: {cpu: 4}}\n", ""
    ).replace("qos: [normal, small, high]", "qos: [normal, small]")
    planned = _plan(_cluster(tmp_path, no_high), **_recorded())
    assert planned[-1] == "delete qos where name=high"
    assert "modify account where name=vision cluster=lab set fairshare=50 qos=normal,small" in (
        planned
    )
    assert not any("name=normal" in line for line in planned)


def test_a_user_moved_to_another_first_account_gets_it_as_default(tmp_path: Path) -> None:
    swapped = ACCOUNTS.replace("users: [ben, ana]", "users: [ana, ben]").replace(
        "    - {name: vision, parent: research, fairshare: 60, users: [ana],",
        "    - {name: vision, parent: research, fairshare: 60, users: [],",
    )
    planned = _plan(_cluster(tmp_path, swapped), **_recorded())
    assert planned == [
        "modify user where name=ana set defaultaccount=speech",
        "delete user where name=ana account=vision cluster=lab",
    ]


def test_sacctmgr_limits_and_times_read_as_the_spec_writes_them() -> None:
    m = _module()
    high = m.read_qos((DATA / "show-qos-mem.txt").read_text())["high"]
    assert high["grp_tres"] == {"gres/gpu": 4, "mem": 2000, "node": 1}
    assert high["max_tres_per_user"] == {"cpu": 2}
    assert high["max_wall"] == 2880 == wall_minutes("2-00:00:00")
    assert m.minutes("01:00:00") == 60 == wall_minutes("1:00:00") == wall_minutes("60")
    assert m.minutes("") is None and m.tres("mem=2G") == {"mem": 2048}


def test_slurm_conf_enforces_associations_and_orders_jobs_by_fair_share(tmp_path: Path) -> None:
    keys = dict(slurm_settings(_cluster(tmp_path)))
    assert keys["AccountingStorageEnforce"] == "associations,limits,qos,safe"
    assert keys["PriorityType"] == "priority/multifactor"
    assert keys["PreemptType"] == "preempt/qos" and keys["PreemptMode"] == "REQUEUE"
    plain = dict(slurm_settings(Cluster(load_spec(LAB))))
    assert "AccountingStorageEnforce" not in plain and "PriorityType" not in plain
    no_preempt = dict(
        slurm_settings(_cluster(tmp_path, ACCOUNTS.replace("preempt: [normal], ", "")))
    )
    assert "PreemptType" not in no_preempt


def test_plan_says_what_slurmdbd_gets(tmp_path: Path) -> None:
    old = render(_cluster(tmp_path))
    speech = "    - {name: speech, parent: research, fairshare: 40, users: [ben, ana]}\n"
    new = render(_cluster(tmp_path, ACCOUNTS.replace("fairshare: 60", "fairshare: 50").replace(
        speech, "")))  # fmt: skip
    change = accounts_change(old, new)
    assert change is not None
    assert change.removed == ("account speech",)
    assert change.changed == ("account vision: fairshare 60 -> 50",)
    assert accounts_change(old, old) is None


@pytest.mark.parametrize(
    ("accounts", "where", "says"),
    [
        ("  qos: [{name: q}]\n", "slurm.qos", "QoS are given to accounts"),
        (
            "  accounts: [{name: a, parent: b}, {name: b, parent: a}]\n",
            "slurm.accounts[0].parent",
            "the accounts form a loop (a -> b -> a)",
        ),
        (
            "  qos: [{name: q, grp_tres: {gres/gpuu: 1}}]\n  accounts: [{name: a, qos: [q]}]\n",
            "slurm.qos[0].grp_tres['gres/gpuu']",
            "unknown TRES 'gres/gpuu'",
        ),
        (
            "  accounts: [{name: a, users: [zed]}]\n",
            "slurm.accounts[0].users[0]",
            "no user named 'zed' in users (there: ana, ben)",
        ),
        (
            "  accounts: [{name: a, qos: [fast]}]\n",
            "slurm.accounts[0].qos[0]",
            "no QoS named 'fast'",
        ),
        (
            "  accounts: [{name: a, default_qos: q}]\n  qos: [{name: q}]\n",
            "slurm.accounts[0].default_qos",
            "'q' is not one of the account's qos (normal)",
        ),
        ("  accounts: [{name: root}]\n", "slurm.accounts[0].name", "root is Slurm's"),
    ],
)
def test_bad_accounts_are_refused_at_their_key(
    tmp_path: Path, accounts: str, where: str, says: str
) -> None:
    """Each one line with the file, its line and the key (exit 2 at the command line)."""
    with pytest.raises(SpecError) as caught:
        _cluster(tmp_path, accounts)
    issues = caught.value.issues
    assert any(i.path == where and says in i.message and i.line == 9 for i in issues), issues


def test_accounts_need_accounting(tmp_path: Path) -> None:
    text = LAB.read_text().replace("  accounting: true\n", "  accounting: false\n" + ACCOUNTS)
    spec = tmp_path / "lab.yaml"
    spec.write_text(text + USERS)
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    assert "set slurm.accounting: true" in str(caught.value.issues[0])

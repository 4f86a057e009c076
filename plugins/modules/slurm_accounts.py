#!/usr/bin/python
"""Ansible module: Slurm's QoS, accounts and users' associations in slurmdbd, as given.

It reads what slurmdbd holds with `sacctmgr -nP show`, works out the sacctmgr commands that
make it the given state, and runs them in an order slurmdbd accepts: QoS made before anything
names them, parents before children, users' default accounts moved before an association goes,
children removed before parents, QoS removed last. What the spec does not name is removed: the
accounts' tree, the QoS (but `normal`, Slurm's default) and the users' associations (but those
of `root_users` with the root account, and root's). Check mode reports the commands without
running them.
"""

from __future__ import annotations

import re
from typing import Any

DOCUMENTATION = r"""
module: slurm_accounts
short_description: Keep Slurm's QoS, accounts and users' associations as given
description:
  - Reads slurmdbd through sacctmgr and adds, changes and removes QoS, accounts and user
    associations until they are as given. Runs on a node that can reach slurmdbd as an
    administrator (root on a controller).
options:
  cluster:
    description: The cluster's name in slurmdbd (ClusterName); added if slurmdbd lacks it.
    type: str
    required: true
  qos:
    description: >-
      QoS, each {name, priority, preempt: [names], grp_tres, max_tres_per_job,
      max_tres_per_user (each {tres: limit}), max_wall (minutes or null)}.
    type: list
    elements: dict
    default: []
  accounts:
    description: >-
      Accounts, each {name, parent (null: root), fairshare, users: [names], qos: [names],
      default_qos}; a user's first account is their default.
    type: list
    elements: dict
    default: []
  root_users:
    description: Users kept in the root account (the verify job's user, the admins).
    type: list
    elements: str
    default: []
  sacctmgr:
    description: The sacctmgr program.
    type: str
    default: sacctmgr
author: provision
"""

DEFAULT_QOS = "normal"
ROOT = "root"
_MEM = re.compile(r"^([0-9]+)([KMGTP]?)$")
_UNITS = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}
_TIME = re.compile(r"^(?:([0-9]+)-)?(?:([0-9]+):)?([0-9]+):([0-9]+)$")


def tres(text: str) -> dict[str, int]:
    """sacctmgr's TRES list (gres/gpu=4,mem=2000M,node=1) as {tres: limit}, mem in MB."""
    out: dict[str, int] = {}
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        if name == "mem":
            match = _MEM.match(value)
            out[name] = int(int(match[1]) * _UNITS[match[2]]) if match else int(value or 0)
        else:
            out[name] = int(value)
    return out


def minutes(text: str) -> int | None:
    """sacctmgr's time (2-00:00:00, 01:30:00, 45:00) in minutes; None when unset."""
    text = text.strip()
    if not text:
        return None
    match = _TIME.match(text)
    if match is None:
        return int(text)
    days, hours, mins, secs = (int(g or 0) for g in match.groups())
    if match[2] is None:  # MM:SS
        hours, mins, secs = 0, int(match[3]), int(match[4])
    return days * 1440 + hours * 60 + mins + (1 if secs else 0)


def _rows(text: str, width: int) -> list[list[str]]:
    return [(line.split("|") + [""] * width)[:width] for line in text.splitlines() if line.strip()]


def read_qos(text: str) -> dict[str, dict[str, Any]]:
    """`show qos format=Name,Priority,Preempt,GrpTRES,MaxTRES,MaxTRESPU,MaxWall`."""
    return {
        row[0]: {
            "priority": int(row[1] or 0),
            "preempt": sorted(filter(None, row[2].split(","))),
            "grp_tres": tres(row[3]),
            "max_tres_per_job": tres(row[4]),
            "max_tres_per_user": tres(row[5]),
            "max_wall": minutes(row[6]),
        }
        for row in _rows(text, 7)
    }


def read_associations(text: str) -> tuple[dict[str, dict[str, Any]], dict[tuple[str, str], Any]]:
    """`show assoc format=Account,User,ParentName,Share,QOS,DefaultQOS`: the accounts
    {name: {parent, fairshare, qos, default_qos}} and the users' {(user, account): {qos,
    default_qos}}."""
    accounts: dict[str, dict[str, Any]] = {}
    users: dict[tuple[str, str], Any] = {}
    for account, user, parent, share, qos, default in _rows(text, 6):
        entry = {"qos": sorted(filter(None, qos.split(","))), "default_qos": default or None}
        if user:
            users[(user, account)] = entry
        else:
            fairshare = int(share) if share.isdigit() else 1
            accounts[account] = {"parent": parent or None, "fairshare": fairshare, **entry}
    return accounts, users


def read_defaults(text: str) -> dict[str, str]:
    """`show user format=User,DefaultAccount`."""
    return {row[0]: row[1] for row in _rows(text, 2)}


def _tres_text(wanted: dict[str, int], have: dict[str, int]) -> str:
    """A TRES setting that makes `have` into `wanted` (-1 clears a limit)."""
    merged = {name: -1 for name in have} | wanted
    return ",".join(f"{name}={merged[name]}" for name in sorted(merged))


def _qos_settings(want: dict[str, Any], have: dict[str, Any] | None) -> list[str]:
    have = have or {
        "priority": 0, "preempt": [], "grp_tres": {}, "max_tres_per_job": {},
        "max_tres_per_user": {}, "max_wall": None,
    }  # fmt: skip
    out = []
    if int(want.get("priority") or 0) != have["priority"]:
        out.append(f"Priority={int(want.get('priority') or 0)}")
    if sorted(want.get("preempt") or []) != have["preempt"]:
        out.append(f"Preempt={','.join(sorted(want.get('preempt') or []))}")
    for field, key in (
        ("grp_tres", "GrpTRES"),
        ("max_tres_per_job", "MaxTRES"),
        ("max_tres_per_user", "MaxTRESPerUser"),
    ):
        wanted = {k: int(v) for k, v in (want.get(field) or {}).items()}
        if wanted != have[field]:
            out.append(f"{key}={_tres_text(wanted, have[field])}")
    wall = want.get("max_wall")
    if (int(wall) if wall is not None else None) != have["max_wall"]:
        out.append(f"MaxWall={int(wall) if wall is not None else -1}")
    return out


def _account_qos(account: dict[str, Any]) -> tuple[list[str], str]:
    qos = sorted(account.get("qos") or [DEFAULT_QOS])
    default = account.get("default_qos") or (DEFAULT_QOS if DEFAULT_QOS in qos else qos[0])
    return qos, default


def _depth(name: str, parents: dict[str, str | None]) -> int:
    depth, seen = 0, set()
    while parents.get(name) and name not in seen:
        seen.add(name)
        name = parents[name] or ""
        depth += 1
    return depth


def _grouped(pairs: list[tuple[Any, str]]) -> list[tuple[Any, str]]:
    """(key, name) pairs -> (key, "name1,name2") per key, in first-seen order: sacctmgr takes
    a list of names where it takes one, so one command serves all that share the rest."""
    out: dict[Any, list[str]] = {}
    for key, name in pairs:
        out.setdefault(key, []).append(name)
    return [(key, ",".join(names)) for key, names in out.items()]


def plan(
    cluster: str,
    qos: list[dict[str, Any]],
    accounts: list[dict[str, Any]],
    root_users: list[str],
    have_qos: dict[str, dict[str, Any]],
    have_accounts: dict[str, dict[str, Any]],
    have_users: dict[tuple[str, str], Any],
    defaults: dict[str, str],
) -> list[list[str]]:
    """The sacctmgr commands (argv after `sacctmgr -i`) that make slurmdbd as given, those
    that differ only in names made one."""
    cmds: list[list[str]] = []
    where = f"cluster={cluster}"
    # QoS: made first (without their preemption, which may name one made after), then set
    new_qos = ",".join(q["name"] for q in qos if q["name"] not in have_qos)
    if new_qos:
        cmds.append(["add", "qos", new_qos])
    settings = [(tuple(_qos_settings(q, have_qos.get(q["name"]))), q["name"]) for q in qos]
    for changes, names in _grouped([(k, n) for k, n in settings if k]):
        cmds.append(["modify", "qos", "where", f"name={names}", "set", *changes])
    # accounts: parents first
    parents = {a["name"]: a.get("parent") for a in accounts}
    added, modified = [], []
    for a in sorted(accounts, key=lambda a: _depth(a["name"], parents)):
        depth = _depth(a["name"], parents)
        parent = a.get("parent") or ROOT
        qos_list, default = _account_qos(a)
        fairshare = int(a.get("fairshare") or 1)
        have = have_accounts.get(a["name"])
        if have is None:
            key = (depth, parent, fairshare, ",".join(qos_list), default)
            added.append((key, a["name"]))
            continue
        changes = []
        if (have["parent"] or ROOT) != parent:
            changes.append(f"parent={parent}")
        if have["fairshare"] != fairshare:
            changes.append(f"fairshare={fairshare}")
        if have["qos"] != qos_list:
            changes.append(f"qos={','.join(qos_list)}")
        if have["default_qos"] != default:
            changes.append(f"defaultqos={default}")
        if changes:
            modified.append(((depth, *changes), a["name"]))
    for (_, parent, fairshare, qos_text, default), names in _grouped(added):
        cmds.append(
            ["add", "account", names, where, f"parent={parent}", f"fairshare={fairshare}",
             f"qos={qos_text}", f"defaultqos={default}"]
        )  # fmt: skip
    for (_, *changes), names in _grouped(modified):
        cmds.append(["modify", "account", "where", f"name={names}", where, "set", *changes])
    # users: their associations, each with its account's QoS, and their default account
    wanted: dict[tuple[str, str], tuple[list[str], str]] = {}
    first: dict[str, str] = {}
    for a in accounts:
        for user in a.get("users") or []:
            wanted[(user, a["name"])] = _account_qos(a)
            first.setdefault(user, a["name"])
    for user in root_users:
        if (user, ROOT) not in wanted:
            wanted[(user, ROOT)] = ([DEFAULT_QOS], DEFAULT_QOS)
            first.setdefault(user, ROOT)
    joins, moved = [], []
    for (user, account), (qos_list, default) in wanted.items():
        have = have_users.get((user, account))
        if have is None:  # it takes its account's QoS, as the commands above leave them
            joins.append((account, user))
        elif account != ROOT and (have["qos"], have["default_qos"]) != (qos_list, default):
            moved.append(((account, ",".join(qos_list), default), user))
    for account, names in _grouped(joins):
        cmds.append(["add", "user", names, f"account={account}", where])
    for (account, qos_text, default), names in _grouped(moved):
        cmds.append(
            ["modify", "user", "where", f"name={names}", f"account={account}", where, "set",
             f"qos={qos_text}", f"defaultqos={default}"]
        )  # fmt: skip
    # a new user's first association is their default; another's moves when their first does
    defaults_moved = [(a, u) for u, a in first.items() if defaults.get(u, a) != a]
    for account, names in _grouped(defaults_moved):
        cmds.append(["modify", "user", "where", f"name={names}", "set",
                     f"defaultaccount={account}"])  # fmt: skip
    # removed: the users' associations, then the accounts (children first), then the QoS
    kept_users = set(wanted) | {(ROOT, ROOT)}
    left = [(account, user) for user, account in sorted(have_users) if (user, account) not in
            kept_users]  # fmt: skip
    for account, names in _grouped(sorted(left)):
        cmds.append(["delete", "user", "where", f"name={names}", f"account={account}", where])
    have_parents = {name: a["parent"] for name, a in have_accounts.items()}
    gone = [name for name in have_accounts if name != ROOT and name not in parents]
    by_depth = [(-_depth(n, have_parents), n) for n in sorted(gone)]
    for _, names in _grouped(sorted(by_depth)):
        cmds.append(["delete", "account", "where", f"name={names}", where])
    names_kept = {q["name"] for q in qos}
    dropped = ",".join(n for n in sorted(have_qos) if n != DEFAULT_QOS and n not in names_kept)
    if dropped:
        cmds.append(["delete", "qos", "where", f"name={dropped}"])
    return cmds


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "cluster": {"type": "str", "required": True},
            "qos": {"type": "list", "elements": "dict", "default": []},
            "accounts": {"type": "list", "elements": "dict", "default": []},
            "root_users": {"type": "list", "elements": "str", "default": []},
            "sacctmgr": {"type": "str", "default": "sacctmgr"},
        },
        supports_check_mode=True,
    )
    p = module.params
    program = module.get_bin_path(p["sacctmgr"], required=True)

    def show(*args: str) -> str:
        rc, out, err = module.run_command([program, "-nP", "show", *args])
        if rc != 0:
            module.fail_json(msg=f"sacctmgr show {args[0]}: {err.strip() or out.strip()}")
        return str(out)

    cluster = p["cluster"]
    commands: list[list[str]] = []
    if cluster not in show("cluster", "format=Cluster").split():
        commands.append(["add", "cluster", cluster])
    have_qos = read_qos(
        show("qos", "format=Name,Priority,Preempt,GrpTRES,MaxTRES,MaxTRESPU,MaxWall")
    )
    have_accounts, have_users = read_associations(
        show("assoc", "where", f"cluster={cluster}",
             "format=Account,User,ParentName,Share,QOS,DefaultQOS")
    )  # fmt: skip
    defaults = read_defaults(show("user", "format=User,DefaultAccount"))
    commands += plan(
        cluster, p["qos"], p["accounts"], p["root_users"],
        have_qos, have_accounts, have_users, defaults,
    )  # fmt: skip
    shown = ["sacctmgr -i " + " ".join(c) for c in commands]
    if module.check_mode or not commands:
        module.exit_json(changed=bool(commands), commands=shown)
    for command, line in zip(commands, shown, strict=True):
        rc, out, err = module.run_command([program, "-i", *command])
        # sacctmgr says "Nothing new added" (rc 1 on some releases) for what is there already
        if rc != 0 and "Nothing new added" not in out + err:
            said = " ".join((err.strip() or out.strip()).split())
            if "Job(s) active" in said:  # removals come last: all else is done
                said += (
                    "; slurmdbd keeps an association while jobs run or wait under it: let "
                    "them end (or scancel them) and apply again"
                )
            module.fail_json(msg=f"{line}: {said}", commands=shown)
    module.exit_json(changed=True, commands=shown)


if __name__ == "__main__":
    main()

"""The Slurm accounts' and QoS' checks: they need accounting; every name they use exists; the
accounts form a tree; the limits name TRES that Slurm tracks."""

from __future__ import annotations

from provision.spec.checks.base import Problem
from provision.spec.models import TRES_NAMES, Spec

DEFAULT_QOS = "normal"  # slurmdbd makes it; the spec may give it limits, never remove it
ROOT_ACCOUNT = "root"


def check_accounts(spec: Spec) -> list[Problem]:
    slurm = spec.slurm
    if not (slurm.accounts or slurm.qos):
        return []
    key = "accounts" if slurm.accounts else "qos"
    if spec.scheduler != "slurm":
        return [(("slurm", key), "Slurm accounts and QoS need scheduler: slurm")]
    if not slurm.accounting:
        return [
            (
                ("slurm", key),
                "accounts and QoS live in slurmdbd: set slurm.accounting: true",
            )
        ]
    if not slurm.accounts:
        return [
            (
                ("slurm", "qos"),
                "QoS are given to accounts: add slurm.accounts (a user with no account is "
                "refused once there are any)",
            )
        ]
    problems: list[Problem] = []
    qos_names = [q.name for q in slurm.qos]
    known_qos = {DEFAULT_QOS, *qos_names}
    for i, qos in enumerate(slurm.qos):
        at = ("slurm", "qos", i)
        if qos.name in qos_names[:i]:
            problems.append(((*at, "name"), f"QoS '{qos.name}' is listed twice"))
        for j, other in enumerate(qos.preempt):
            if other == qos.name:
                problems.append(((*at, "preempt", j), "a QoS cannot preempt itself"))
            elif other not in known_qos:
                problems.append(((*at, "preempt", j), _unknown("QoS", other, known_qos)))
        for field in ("grp_tres", "max_tres_per_job", "max_tres_per_user"):
            for tres, value in getattr(qos, field).items():
                if tres not in TRES_NAMES:
                    problems.append(
                        (
                            (*at, field, tres),
                            f"unknown TRES '{tres}': limit {', '.join(TRES_NAMES)} "
                            "(mem in megabytes)",
                        )
                    )
                elif value < 0:
                    problems.append(((*at, field, tres), "a limit is 0 or more"))
    names = [a.name for a in slurm.accounts]
    users = {u.name for u in spec.users}
    for i, account in enumerate(slurm.accounts):
        at = ("slurm", "accounts", i)
        if account.name == ROOT_ACCOUNT:
            problems.append(((*at, "name"), "root is Slurm's own account: name yours otherwise"))
        elif account.name in names[:i]:
            problems.append(((*at, "name"), f"account '{account.name}' is listed twice"))
        if account.parent is not None and account.parent not in names:
            problems.append(((*at, "parent"), _unknown("account", account.parent, set(names))))
        for j, user in enumerate(account.users):
            # with a directory, a name the spec does not list is the directory's
            if user not in users and spec.identity is None:
                problems.append(((*at, "users", j), _unknown("user", user, users, "users")))
        for j, asked in enumerate(account.qos):
            if asked not in known_qos:
                problems.append(((*at, "qos", j), _unknown("QoS", asked, known_qos)))
        allowed = account.qos or [DEFAULT_QOS]
        if account.default_qos is not None and account.default_qos not in allowed:
            problems.append(
                (
                    (*at, "default_qos"),
                    f"'{account.default_qos}' is not one of the account's qos "
                    f"({', '.join(allowed)})",
                )
            )
    problems += _cycles(spec)
    return problems


def _cycles(spec: Spec) -> list[Problem]:
    """An account that is its own ancestor: the tree has a loop through it."""
    parents = {a.name: a.parent for a in spec.slurm.accounts}
    problems: list[Problem] = []
    for i, account in enumerate(spec.slurm.accounts):
        seen = [account.name]
        parent = account.parent
        while parent is not None and parent in parents and parent not in seen:
            seen.append(parent)
            parent = parents[parent]
        if parent == account.name:
            loop = " -> ".join([*seen, account.name])
            problems.append(
                (
                    ("slurm", "accounts", i, "parent"),
                    f"the accounts form a loop ({loop}): each needs a way up to the root",
                )
            )
    return problems


def _unknown(kind: str, name: str, known: set[str], where: str | None = None) -> str:
    there = ", ".join(sorted(known)) or "none"
    return f"no {kind} named '{name}'" + (f" in {where}" if where else "") + f" (there: {there})"

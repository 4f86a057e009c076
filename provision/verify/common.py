"""The checks of the common role on every node: name, /etc/hosts, time, the admins, the
users, and the directory SSSD reads (the sssd role)."""

from __future__ import annotations

import secrets

from provision.parsers import node as parsers
from provision.parsers.node import DIRECTORY_ONLINE
from provision.render.identity import DOMAIN as DIRECTORY_DOMAIN
from provision.spec.nodes import Node
from provision.verify.base import CheckResult, NodeCheck, VerifyContext
from provision.verify.remote import Remote

# where sshd reads the admins' keys: root's files, written by the common role (_common_keys_dir)
ADMIN_KEYS_DIR = "/etc/ssh/provision-keys"


def check_hostname(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    out = remote.run("hostname")
    got = out.stdout.strip()
    return [CheckResult("hostname", node.name, got == node.name, f"hostname is {got!r}")]


def check_hosts_file(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    out = remote.run("cat /etc/hosts")
    missing = parsers.missing_host_lines(ctx.rendered_hosts, out.stdout)
    evidence = (
        f"all {len(parsers.host_entries(ctx.rendered_hosts))} cluster entries present"
        if not missing
        else f"missing: {'; '.join(missing[:3])}"
    )
    return [CheckResult("/etc/hosts", node.name, not missing, evidence)]


def check_time_sync(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    service = "chronyd" if ctx.cluster.spec.os == "rocky9" else "chrony"
    out = remote.run(f"systemctl is-active {service}")
    state = out.stdout.strip() or out.stderr.strip()
    return [CheckResult("time sync", node.name, state == "active", f"{service} is {state}")]


def check_admin_users(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    """Each admin exists (with the spec's uid, where it pins one) and sshd's file of its keys
    (root's, in ADMIN_KEYS_DIR: the common role's) holds every key of the spec."""
    results = []
    for admin in ctx.cluster.spec.security.admins:
        check = f"admin {admin.name}"
        out = remote.run(
            f"getent passwd {admin.name} && cat {ADMIN_KEYS_DIR}/{admin.name}", sudo=True
        )
        if out.rc != 0:
            gone = f"user or {ADMIN_KEYS_DIR}/{admin.name} missing"
            results.append(CheckResult(check, node.name, False, gone))
            continue
        entry, _, keys = out.stdout.partition("\n")
        fields = entry.split(":")
        if admin.uid is not None and (len(fields) < 3 or fields[2] != str(admin.uid)):
            got = fields[2] if len(fields) >= 3 else "?"
            results.append(CheckResult(check, node.name, False, f"uid {got}, not {admin.uid}"))
            continue
        missing = parsers.missing_keys(list(admin.ssh_keys), keys)
        results.append(
            CheckResult(
                check,
                node.name,
                not missing,
                f"{len(admin.ssh_keys)} key(s) authorized"
                if not missing
                else f"{len(missing)} key(s) not authorized",
            )
        )
    return results


def check_users(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    """The spec's users on this node, one check: each at its uid, unlocked, in its groups."""
    spec = ctx.cluster.spec
    if not spec.users:
        return []
    users = {u.name: (u.uid, tuple(u.groups)) for u in spec.users}
    names = " ".join(users)
    groups = [g.name for g in spec.groups]
    passwd = remote.run(f"getent passwd {names}")
    group = remote.run(f"getent group {' '.join(groups)}") if groups else None
    problems = parsers.user_problems(users, groups, passwd.stdout, group.stdout if group else "")
    evidence = "; ".join(problems[:3]) or f"{len(users)} user(s) at their uids, in their groups"
    if len(problems) > 3:
        evidence += f" (and {len(problems) - 3} more)"
    return [CheckResult("users", node.name, not problems, evidence)]


def check_directory(ctx: VerifyContext, node: Node, remote: Remote) -> list[CheckResult]:
    """SSSD reaches the directory (identity) now, not from its cache, and finds the allowed
    groups in it."""
    identity = ctx.cluster.spec.identity
    if identity is None:
        return []
    groups = " ".join(identity.allowed_groups)
    # SIGUSR2 tells SSSD to try the directory again now, not at its next retry (it takes a
    # moment to reach its backend); a name no cache holds makes it ask, and its status then
    # says what it found. Offline, it is asked a few times over five seconds.
    probe = f"provision-probe-{secrets.token_hex(4)}"
    ask = f"sssctl domain-status -o {DIRECTORY_DOMAIN} 2>&1"
    out = remote.run(
        f"pkill -USR2 -x sssd; for try in 1 2 3 4 5; do sleep 1; "
        f"getent passwd {probe}-$try >/dev/null; {ask} | grep -qx '{DIRECTORY_ONLINE}' "
        f"&& break; done; {ask}; echo {_SPLIT}; getent -s sss group {groups}",
        sudo=True,
    )
    status, _, found = out.stdout.partition(_SPLIT)
    problems, seen = parsers.directory_problems(status, found, list(identity.allowed_groups))
    return [CheckResult("directory", node.name, not problems, "; ".join(problems) or seen)]


_SPLIT = "--provision--"


COMMON_CHECKS: list[NodeCheck] = [
    check_hostname,
    check_hosts_file,
    check_time_sync,
    check_admin_users,
    check_users,
    check_directory,
]

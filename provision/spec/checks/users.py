"""The users' checks: one name and one ID each, across users, groups and admins; groups that
exist; names the nodes' own accounts do not hold already."""

from __future__ import annotations

from provision.spec.checks.base import Problem
from provision.spec.exposure import WIDE, describe_size, public_addresses
from provision.spec.models import Spec

# Accounts and groups the nodes have before any user: the base system's (Debian's base-passwd,
# Rocky's setup), those the packages the roles install make (Slurm, MUNGE, chrony, Prometheus,
# DCGM, NFS, SSSD, containerd's), and the groups a login must not be put in by a name that
# means more (sudo, wheel, adm). A user or group of the spec by one of these names would take
# over the system's account, or be refused by useradd on some nodes only.
SYSTEM_NAMES = frozenset(
    {
        "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp",
        "proxy", "www-data", "backup", "list", "irc", "gnats", "nobody", "nogroup", "_apt",
        "adm", "tty", "disk", "kmem", "dialout", "fax", "voice", "cdrom", "floppy", "tape",
        "sudo", "audio", "dip", "operator", "src", "shadow", "utmp", "video", "sasl", "plugdev",
        "staff", "users", "input", "sgx", "kvm", "render", "crontab", "netdev", "messagebus",
        "sshd", "systemd-journal", "systemd-network", "systemd-resolve", "systemd-timesync",
        "systemd-coredump", "polkitd", "tss", "ssh", "wheel", "ftp", "halt", "shutdown",
        "lock", "mem", "dbus", "chrony", "_chrony", "slurm", "munge", "prometheus", "nvidia-dcgm",
        "statd", "_rpc", "rpc", "rpcuser", "sssd", "_sssd", "unbound", "ntp", "postfix", "uuidd",
        "systemd-oom", "systemd-bus-proxy", "libvirt", "docker", "etcd", "haproxy",
        "keepalived_script", "grafana", "mysql", "redis", "ldap", "openldap",
    }
)  # fmt: skip


def check_users(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    if spec.security.user_cidrs and not spec.users and spec.identity is None:
        problems.append(
            (
                ("security", "user_cidrs"),
                "no users to log in from there: add users or a directory (identity), or leave "
                "user_cidrs out",
            )
        )
    wide = public_addresses(spec.security.user_cidrs)
    if wide > WIDE:
        problems.append(
            (
                ("security", "user_cidrs"),
                f"the user networks hold {describe_size(wide)}: name the networks your users "
                "come from (at most a /8 of public addresses), or reach the login nodes "
                "through a VPN or bastion",
            )
        )
    admins = {a.name: a for a in spec.security.admins}
    groups = {g.name for g in spec.groups}
    gids: dict[int, str] = {}
    for i, group in enumerate(spec.groups):
        at = ("groups", i)
        if group.name in SYSTEM_NAMES:
            problems.append(((*at, "name"), _system(group.name, "group")))
        elif group.name in [g.name for g in spec.groups[:i]]:
            problems.append(((*at, "name"), f"group '{group.name}' is listed twice"))
        if group.gid in gids:
            problems.append(
                ((*at, "gid"), f"gid {group.gid} is also {gids[group.gid]}: each needs its own")
            )
        gids.setdefault(group.gid, f"group {group.name}'s")
    for i, admin in enumerate(spec.security.admins):
        if admin.uid is not None and admin.uid in gids:
            problems.append(
                (
                    ("security", "admins", i, "uid"),
                    f"uid {admin.uid} is {gids[admin.uid]} gid: an admin's own group takes "
                    "its uid as gid, so each needs its own number",
                )
            )
    # each user has a group of its own, by its name and at its uid (as the admins do)
    owners: dict[int, str] = {
        a.uid: f"admin {a.name}'s" for a in spec.security.admins if a.uid is not None
    }
    seen: set[str] = set()
    for i, user in enumerate(spec.users):
        at = ("users", i)
        if user.name in SYSTEM_NAMES or user.name == spec.ssh.user:
            what = "the login user provision uses" if user.name == spec.ssh.user else None
            problems.append(((*at, "name"), _system(user.name, "user", what)))
        elif user.name in seen:
            problems.append(((*at, "name"), f"user '{user.name}' is listed twice"))
        elif user.name in admins:
            problems.append(
                (
                    (*at, "name"),
                    f"'{user.name}' is an admin (security.admins): list them there alone",
                )
            )
        elif user.name in groups:
            problems.append(
                (
                    (*at, "name"),
                    f"'{user.name}' is also a group's name: a user's own group has the user's "
                    "name, so rename one",
                )
            )
        seen.add(user.name)
        if user.uid in owners:
            problems.append(((*at, "uid"), f"uid {user.uid} is {owners[user.uid]} too"))
        elif user.uid in gids:
            problems.append(
                (
                    (*at, "uid"),
                    f"uid {user.uid} is {gids[user.uid]} gid: a user's own group takes its "
                    "uid as gid, so each needs its own number",
                )
            )
        owners.setdefault(user.uid, f"user {user.name}'s")
        for j, name in enumerate(user.groups):
            if name not in groups:
                known = ", ".join(sorted(groups)) or "none"
                problems.append(
                    ((*at, "groups", j), f"no group named '{name}' in groups (there: {known})")
                )
    return problems


def _system(name: str, kind: str, what: str | None = None) -> str:
    return (
        f"'{name}' is {what or 'a system account the nodes have already'}: "
        f"give the {kind} another name"
    )

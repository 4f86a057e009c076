"""The security checks: admin networks, admins, their pinned IDs where /home is shared."""

from __future__ import annotations

import ipaddress

from provision.spec.checks.base import Problem
from provision.spec.exposure import WIDE, describe_size, public_addresses
from provision.spec.models import Spec
from provision.spec.storage import (
    shared_home_mounts,
)


def check_security(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    security = spec.security
    admin = public_addresses(security.admin_cidrs)
    if admin > WIDE and not security.allow_admin_from_anywhere:
        what = ", ".join(str(c) for c in security.admin_cidrs)
        whole = any(c.prefixlen == 0 for c in security.admin_cidrs)
        wide = [i for i, c in enumerate(security.admin_cidrs) if public_addresses([c]) > WIDE]
        problems.append(
            (
                ("security", "admin_cidrs", *wide[:1]),
                f"{'0.0.0.0/0' if whole else what} opens SSH to "
                f"{'the whole internet' if whole else describe_size(admin)}: name your admin "
                "networks, or set security.allow_admin_from_anywhere: true if you mean it",
            )
        )
    # each rule, and all rules together, may admit at most a /8 of the internet unless opted in
    admin_nets = list(security.admin_cidrs)
    so_far: list[ipaddress.IPv4Network] = []
    for i, rule in enumerate(security.firewall_rules):
        nets = [s for s in rule.sources if isinstance(s, ipaddress.IPv4Network)]
        if "admin" in rule.sources and security.allow_admin_from_anywhere:
            nets += admin_nets
        if rule.open_to_internet:
            continue
        so_far += nets
        alone, together = public_addresses(nets), public_addresses(so_far)
        if max(alone, together) > WIDE:
            size = (
                describe_size(alone)
                if alone > WIDE
                else (f"{describe_size(together)} with the rules before it")
            )
            problems.append(
                (
                    ("security", "firewall_rules", i, "sources"),
                    f"rule '{rule.name}' opens port {rule.port} to {size}: narrow its sources, "
                    "or set open_to_internet: true on it if you mean it",
                )
            )
            so_far = []
    if spec.ssh.port != 22 and any(p.provider == "lab" for p in spec.pools):
        problems.append(
            (
                ("ssh", "port"),
                "not supported yet: lab nodes' sshd listens on 22; leave ssh.port out for a lab",
            )
        )
    names = [a.name for a in spec.security.admins]
    for i, name in enumerate(names):
        if name in names[:i]:
            problems.append((("security", "admins", i, "name"), f"admin '{name}' is listed twice"))
    problems += _check_admin_homes(spec)
    pools = {p.name for p in spec.pools}
    for i, rule in enumerate(spec.security.firewall_rules):
        for j, pool in enumerate(rule.pools or []):
            if pool not in pools:
                problems.append(
                    (("security", "firewall_rules", i, "pools", j), f"no pool named '{pool}'")
                )
    return problems


def _check_admin_homes(spec: Spec) -> list[Problem]:
    """An admin whose home is on shared storage needs a uid pinned by the spec: the nodes'
    useradd would each pick their own, and the home's files one owner on one node only."""
    problems: list[Problem] = []
    shared = shared_home_mounts(spec)
    uids: dict[int, str] = {}
    for i, admin in enumerate(spec.security.admins):
        if admin.uid is not None:
            if admin.uid in uids:
                problems.append(
                    (
                        ("security", "admins", i, "uid"),
                        f"uid {admin.uid} is {uids[admin.uid]}'s too: each admin needs their own",
                    )
                )
            uids.setdefault(admin.uid, admin.name)
        elif shared:
            mount = shared[0]
            problems.append(
                (
                    ("security", "admins", i),
                    f"{admin.name}'s home is on shared storage ({mount.source} at {mount.path}): "
                    "set uid (1000-59999), the same on every node, so that its files have one "
                    "owner everywhere",
                )
            )
    return problems

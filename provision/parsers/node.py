"""Parsers of what any node says (/etc/hosts, authorized_keys, os-release, stat): pure
functions, tested on recorded output in tests/data/."""

from __future__ import annotations


def host_entries(hosts_text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(address, names) for every entry of an /etc/hosts file, comments dropped."""
    entries = []
    for raw in hosts_text.splitlines():
        line = raw.split("#", 1)[0].split()
        if len(line) >= 2:
            entries.append((line[0], tuple(line[1:])))
    return entries


def missing_host_lines(rendered: str, actual: str) -> list[str]:
    """Rendered entries that /etc/hosts on the node does not carry (same address, same names)."""
    have = set(host_entries(actual))
    return [
        f"{addr} {' '.join(names)}"
        for addr, names in host_entries(rendered)
        if (addr, names) not in have
    ]


def missing_keys(wanted: list[str], authorized_keys: str) -> list[str]:
    """Keys (type and base64, comment ignored) absent from an authorized_keys file."""
    have = set()
    for line in authorized_keys.splitlines():
        parts = line.split()
        # options may come first: find the key type
        for i, part in enumerate(parts[:-1]):
            if part.startswith(("ssh-", "ecdsa-", "sk-")):
                have.add((part, parts[i + 1]))
                break
    out = []
    for key in wanted:
        parts = key.split()
        if (parts[0], parts[1]) not in have:
            out.append(key)
    return out


def parse_os_release(text: str) -> tuple[str, str]:
    """(ID, VERSION_ID) from /etc/os-release."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"')
    return values.get("ID", "?"), values.get("VERSION_ID", "?")


_SPEC_OS = {
    "debian12": ("debian", "12"),
    "ubuntu22.04": ("ubuntu", "22.04"),
    "ubuntu24.04": ("ubuntu", "24.04"),
    "rocky9": ("rocky", "9"),
}


def os_matches(spec_os: str, os_id: str, version: str) -> bool:
    want_id, want_version = _SPEC_OS[spec_os]
    return os_id == want_id and (version == want_version or version.startswith(want_version + "."))


def parse_stat(text: str) -> tuple[str, str]:
    """`stat -c '%a %U:%G'` -> (mode, owner:group)."""
    parts = text.split()
    return (parts[0], parts[1]) if len(parts) >= 2 else ("?", "?")


def user_problems(
    users: dict[str, tuple[int, tuple[str, ...]]], groups: list[str], passwd: str, group: str
) -> list[str]:
    """What `getent passwd` and `getent group` show unlike the spec's users (name -> (uid,
    groups)) and groups: a user missing, at another uid or locked out, not in a group of
    theirs, or in one of the spec's groups the spec does not give them."""
    accounts = {}
    for line in passwd.splitlines():
        fields = line.split(":")
        if len(fields) >= 7:
            accounts[fields[0]] = (fields[2], fields[6])
    members = {}
    for line in group.splitlines():
        fields = line.split(":")
        if len(fields) >= 4:
            members[fields[0]] = set(filter(None, fields[3].split(",")))
    problems = []
    for name, (uid, theirs) in users.items():
        if name not in accounts:
            problems.append(f"{name} missing")
            continue
        got, shell = accounts[name]
        if got != str(uid):
            problems.append(f"{name} has uid {got}, not {uid}")
        if shell.endswith("nologin"):
            problems.append(f"{name} is locked out (shell {shell})")
        for wanted in theirs:
            if name not in members.get(wanted, set()):
                problems.append(f"{name} not in group {wanted}")
    for group_name in groups:
        for name in sorted(members.get(group_name, set()) & set(users)):
            if group_name not in users[name][1]:
                problems.append(f"{name} in group {group_name}, which the spec does not give")
    return problems


# what `sssctl domain-status -o` prints of a domain SSSD reaches, and of one it cannot
DIRECTORY_ONLINE = "Online status: Online"
DIRECTORY_OFFLINE = "Online status: Offline"


def directory_problems(status: str, groups: str, allowed: list[str]) -> tuple[list[str], str]:
    """What `sssctl domain-status -o` (after a lookup that only the directory can answer) and
    `getent -s sss group <allowed...>` show unlike a directory SSSD reads, with the allowed
    groups in it; and, when nothing is wrong, what was seen."""
    problems = []
    if DIRECTORY_OFFLINE in status:
        problems.append("the directory is down or unreachable: SSSD is offline (cached users only)")
    elif DIRECTORY_ONLINE not in status:
        shown = " ".join(status.split())[:120] or "nothing"
        problems.append(f"SSSD does not answer for the directory ({shown})")
    found = {}
    for line in groups.splitlines():
        fields = line.split(":")
        if len(fields) >= 4:
            found[fields[0]] = (fields[2], [m for m in fields[3].split(",") if m])
    for name in allowed:
        if name not in found:
            problems.append(f"group {name} is not in the directory")
    seen = ", ".join(
        f"{name} gid {gid} ({len(members)} member(s) by name)"
        for name, (gid, members) in sorted(found.items())
    )
    return problems, f"online; {seen}"

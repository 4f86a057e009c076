#!/usr/bin/python
"""Ansible module: the names of the packages installed on a node, as one short fact; on apt
nodes, the missing ones of a list installed first.

ansible.builtin.package_facts returns a dictionary of every package with its versions, 70 KB
of facts on a lab node, and Ansible copies and cleans a host's facts for every task it runs
there: that was a sixth of the controller's CPU in a run that changed nothing. The roles only
ask whether a name is installed (the `installed` test), so this returns the names alone.

On apt nodes it also says how old apt's package lists are, as ansible.builtin.apt's
`cache_valid_time` reads them, so that the refresh before installing can be left out without a
worker forked to find that out.

With `install`, on apt nodes, it first installs the names of that list that are missing, in one
`apt-get install` (refreshing the lists first where they are older than `cache_valid_time`), and
returns the list read after. ansible.builtin.apt does the same with more around it: it opens
apt's cache in Python before apt-get runs (again after a refresh) and runs `apt-mark manual`
after, about 0.4 CPU-seconds of a node's install that apt-get does not need (it marks what it
is asked to install as installed by hand itself); and a role's later `installed` test reads
the new list without a task run to read it again.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from typing import Any

DOCUMENTATION = r"""
module: installed_packages
short_description: The names of the installed packages (dpkg or rpm), as a fact
description:
  - Sets C(ansible_facts.provision_packages), the sorted names of the packages installed on the
    node, read once with dpkg-query (Debian, Ubuntu) or rpm (Rocky). Changes nothing.
  - The test C(gpu_provision.cluster.installed) reads it.
  - On nodes with apt, also sets C(ansible_facts.provision_apt_cache_age), the seconds since
    apt's package lists were last fetched, read as ansible.builtin.apt reads them for
    C(cache_valid_time) (a very large number where they never were).
  - With O(install), on apt nodes, first installs those of its names that are not installed
    (never upgrading one that is), in one C(apt-get install), keeping changed configuration
    files as ansible.builtin.apt does; changed when it installed something.
options:
  install:
    description: Package names that must be installed (apt nodes only); empty reads alone.
    type: list
    elements: str
    default: []
  install_recommends:
    description: Install what the packages only recommend, as apt-get does by default.
    type: bool
    default: true
  cache_valid_time:
    description: >-
      Before installing, refresh apt's lists where they are older than this (seconds), as
      ansible.builtin.apt's option of that name; 0 never refreshes them.
    type: int
    default: 0
author: provision
"""

# dpkg also lists packages removed with their configuration kept ("config-files"): not installed
DPKG = ["dpkg-query", "--show", "--showformat=${db:Status-Status} ${Package}\\n"]
RPM = ["rpm", "--query", "--all", "--queryformat=%{NAME}\\n"]

# where ansible.builtin.apt looks for the time of the last `apt-get update`, in this order
APT_STAMPS = ("/var/lib/apt/periodic/update-success-stamp", "/var/lib/apt/lists")
NEVER = 10**9  # seconds: lists never fetched are older than any cache_valid_time


def apt_cache_age(now: float, stamps: tuple[str, ...] = APT_STAMPS) -> int:
    """Seconds since apt's lists were fetched: the first stamp that exists, as the apt module's
    cache_valid_time reads it."""
    for stamp in stamps:
        if os.path.exists(stamp):
            return max(0, int(now - os.stat(stamp).st_mtime))
    return NEVER


def parse_dpkg(text: str) -> list[str]:
    names = set()
    for line in text.splitlines():
        status, _, name = line.partition(" ")
        if status == "installed" and name:
            names.add(name)
    return sorted(names)


# a Debian package name (Policy 5.6.1), with an architecture qualifier at most: nothing apt-get
# could read as an option or a version
NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?")
# what ansible.builtin.apt runs apt-get with: no question asked, changed configuration kept
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive", "DEBIAN_PRIORITY": "critical", "LC_ALL": "C"}
# apt-get's own wait for another apt (unattended upgrades), for both of its runs
LOCK_WAIT = ["-o", "DPkg::Lock::Timeout=60"]
APT_OPTIONS = [
    "-o", "Dpkg::Options::=--force-confdef",
    "-o", "Dpkg::Options::=--force-confold",
    *LOCK_WAIT,
]  # fmt: skip


def install_command(names: list[str], recommends: bool, check: bool) -> list[str]:
    command = ["apt-get", "install", "--yes", "--quiet", *APT_OPTIONS]
    if not recommends:
        command.append("--no-install-recommends")
    if check:
        command.append("--simulate")
    return [*command, "--", *names]


def refresh(module: Any, stamps: tuple[str, ...] = APT_STAMPS) -> None:
    """apt-get update; the lists' folder (and apt's daily stamp, where it keeps one) then says
    when they were fetched, as apt_cache_age reads it, even where nothing had changed."""
    rc, _out, err = module.run_command(
        ["apt-get", "update", "--quiet", *LOCK_WAIT], environ_update=APT_ENV
    )
    if rc != 0:
        module.fail_json(msg=f"apt-get update failed: {err.strip()[-500:]}", rc=rc)
    for stamp in stamps:
        if os.path.exists(stamp):
            os.utime(stamp)


def parse_rpm(text: str) -> list[str]:
    # gpg-pubkey entries are keys rpm imported, not packages a role installs
    return sorted({n.strip() for n in text.splitlines() if n.strip() and n != "gpg-pubkey"})


def read(module: Any, command: list[str], parse: Any) -> list[str]:
    rc, out, err = module.run_command(command)
    if rc != 0:
        module.fail_json(msg=f"{command[0]} failed: {err.strip()[-300:]}")
    names: list[str] = parse(out)
    return names


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "install": {"type": "list", "elements": "str", "default": []},
            "install_recommends": {"type": "bool", "default": True},
            "cache_valid_time": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    run(module)


def run(module: Any, which: Any = shutil.which, stamps: tuple[str, ...] = APT_STAMPS) -> None:
    """Read the list (install first where asked) and exit through the module."""
    wanted: list[str] = module.params["install"]
    facts: dict[str, int] = {}
    if which("dpkg-query"):
        command, parse = DPKG, parse_dpkg
        facts["provision_apt_cache_age"] = apt_cache_age(time.time(), stamps)
    elif which("rpm"):
        command, parse = RPM, parse_rpm
    else:
        module.fail_json(msg="neither dpkg-query nor rpm is on this node: no package list to read")
        return
    names = read(module, command, parse)
    bad = [name for name in wanted if not NAME.fullmatch(name)]
    if bad:
        module.fail_json(msg=f"install: not a package name: {bad[0]!r}")
    if wanted and command is not DPKG:
        module.fail_json(msg="install: apt nodes only (this node has rpm)")
    # the lists refreshed where old even with nothing to install: the later roles install from them
    age = module.params["cache_valid_time"]
    if wanted and age and facts["provision_apt_cache_age"] > age and not module.check_mode:
        refresh(module, stamps)
        facts["provision_apt_cache_age"] = 0
    missing = sorted(set(wanted) - set(names))
    if not missing:
        module.exit_json(
            changed=False,
            ansible_facts={"provision_packages": names, **facts},
            msg=f"{len(names)} packages installed",
        )
        return
    rc, out, err = module.run_command(
        install_command(missing, module.params["install_recommends"], module.check_mode),
        environ_update=APT_ENV,
    )
    if rc != 0:
        module.fail_json(
            msg=f"apt-get install {' '.join(missing)} failed: {err.strip()[-1000:]}",
            rc=rc,
            stdout=out[-2000:],
        )
    # a virtual name stays missing (apt-get installs a package that provides it): nothing changed
    # when the list is the same
    after = names if module.check_mode else read(module, command, parse)
    module.exit_json(
        changed=module.check_mode or after != names,
        installed=missing,
        ansible_facts={"provision_packages": after, **facts},
        msg=f"installed {', '.join(missing)}; {len(after)} packages installed",
    )


if __name__ == "__main__":
    main()

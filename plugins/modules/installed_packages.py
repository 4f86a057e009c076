#!/usr/bin/python
"""Ansible module: the names of the packages installed on a node, as one short fact.

ansible.builtin.package_facts returns a dictionary of every package with its versions, 70 KB
of facts on a lab node, and Ansible copies and cleans a host's facts for every task it runs
there: that was a sixth of the controller's CPU in a run that changed nothing. The roles only
ask whether a name is installed (the `installed` test), so this returns the names alone.

On apt nodes it also says how old apt's package lists are, as ansible.builtin.apt's
`cache_valid_time` reads them, so that the refresh before installing can be left out without a
worker forked to find that out.
"""

from __future__ import annotations

import os
import shutil
import time

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
options: {}
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


def parse_rpm(text: str) -> list[str]:
    # gpg-pubkey entries are keys rpm imported, not packages a role installs
    return sorted({n.strip() for n in text.splitlines() if n.strip() and n != "gpg-pubkey"})


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    facts: dict[str, object] = {}
    if shutil.which("dpkg-query"):
        command, parse = DPKG, parse_dpkg
        facts["provision_apt_cache_age"] = apt_cache_age(time.time())
    elif shutil.which("rpm"):
        command, parse = RPM, parse_rpm
    else:
        module.fail_json(msg="neither dpkg-query nor rpm is on this node: no package list to read")
        return
    rc, out, err = module.run_command(command)
    if rc != 0:
        module.fail_json(msg=f"{command[0]} failed: {err.strip()[-300:]}")
        return
    names = parse(out)
    module.exit_json(
        changed=False,
        ansible_facts={"provision_packages": names, **facts},
        msg=f"{len(names)} packages installed",
    )


if __name__ == "__main__":
    main()

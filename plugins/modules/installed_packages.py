#!/usr/bin/python
"""Ansible module: the names of the packages installed on a node, as one short fact.

ansible.builtin.package_facts returns a dictionary of every package with its versions, 70 KB
of facts on a lab node, and Ansible copies and cleans a host's facts for every task it runs
there: that was a sixth of the controller's CPU in a run that changed nothing. The roles only
ask whether a name is installed (the `installed` test), so this returns the names alone.
"""

from __future__ import annotations

import shutil

DOCUMENTATION = r"""
module: installed_packages
short_description: The names of the installed packages (dpkg or rpm), as a fact
description:
  - Sets C(ansible_facts.provision_packages), the sorted names of the packages installed on the
    node, read once with dpkg-query (Debian, Ubuntu) or rpm (Rocky). Changes nothing.
  - The test C(gpu_provision.cluster.installed) reads it.
options: {}
author: provision
"""

# dpkg also lists packages removed with their configuration kept ("config-files"): not installed
DPKG = ["dpkg-query", "--show", "--showformat=${db:Status-Status} ${Package}\\n"]
RPM = ["rpm", "--query", "--all", "--queryformat=%{NAME}\\n"]


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
    if shutil.which("dpkg-query"):
        command, parse = DPKG, parse_dpkg
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
        ansible_facts={"provision_packages": names},
        msg=f"{len(names)} packages installed",
    )


if __name__ == "__main__":
    main()

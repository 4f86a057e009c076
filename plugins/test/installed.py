"""Jinja test `installed`: are these packages installed, by the package list read this run?

    when: _monitoring_packages is not gpu_provision.cluster.installed(ansible_facts)

The play reads the installed packages' names once (gpu_provision.cluster.installed_packages, the
fact provision_packages) and each role's install task runs only for what is missing: one
package query per host instead of one per role. ansible.builtin.package_facts' `packages` counts
too. Without either (a role run on its own) nothing counts as installed, so the task runs as
before. Names only: a pinned version is the package manager's to compare, so leave pinned lists
out.
"""

from __future__ import annotations

from collections.abc import Collection

DOCUMENTATION = r"""
name: installed
short_description: Whether every named package is in the package facts
description:
  - True when each name is in C(ansible_facts.provision_packages) (the module
    gpu_provision.cluster.installed_packages) or, without it, a key of C(ansible_facts.packages)
    (ansible.builtin.package_facts); false when any is missing or when neither was read.
positional: facts
options:
  _input:
    description: A package name or a list of names.
    type: raw
    required: true
  facts:
    description: The host's C(ansible_facts).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Install munge
  ansible.builtin.package:
    name: munge
    state: present
  when: "'munge' is not gpu_provision.cluster.installed(ansible_facts)"
"""

RETURN = r"""
_value:
  description: Whether all are installed.
  type: bool
"""


def installed(names: object, facts: object) -> bool:
    if not isinstance(facts, dict):
        return False
    listed = facts.get("provision_packages")
    if isinstance(listed, list):
        packages: Collection[str] = frozenset(listed)
    elif isinstance(facts.get("packages"), dict):
        packages = facts["packages"]
    else:
        return False
    wanted = [names] if isinstance(names, str) else list(names)  # type: ignore[call-overload]
    return all(name in packages for name in wanted)


class TestModule:
    def tests(self) -> dict[str, object]:
        return {"installed": installed}

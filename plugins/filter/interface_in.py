"""Jinja filter `interface_in`: the host's interface on a network, and its address there.

    _vrrp: "{{ ansible_facts | gpu_provision.cluster.interface_in('10.77.0.5/24') }}"
    # {'interface': 'eth0', 'address': '10.77.0.11'}

A head with several networks (management, storage, a fabric's IPoIB) carries the API's virtual
address on the one whose network holds it; the default route may well be another.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
name: interface_in
short_description: The host's interface and IPv4 address on a network
description:
  - Looks through the gathered facts of every interface (the network subset) for an IPv4
    address, primary or secondary, inside the network given; fails naming the network when none is.
positional: network
options:
  _input:
    description: The host's C(ansible_facts), with the network subset.
    type: dict
    required: true
  network:
    description: A network, or an address with its prefix length (C(10.77.0.5/24)).
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Find the interface on the management network
  ansible.builtin.set_fact:
    _here: "{{ ansible_facts | gpu_provision.cluster.interface_in('10.77.0.5/24') }}"
"""

RETURN = r"""
_value:
  description: C(interface) and C(address), both strings.
  type: dict
"""


def interface_in(facts: dict[str, Any], network: str) -> dict[str, str]:
    net = ipaddress.ip_network(str(network), strict=False)
    for name in sorted(facts.get("interfaces", [])):
        info = facts.get(name.replace("-", "_")) or {}
        found = [info.get("ipv4") or {}, *list(info.get("ipv4_secondaries") or [])]
        for entry in found:
            address = entry.get("address")
            if address and ipaddress.ip_address(address) in net and name != "lo":
                return {"interface": name, "address": address}
    raise AnsibleFilterError(f"no interface of this host has an address in {net}")


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"interface_in": interface_in}

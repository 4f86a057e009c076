"""What the checks share: the problem type and small helpers."""

from __future__ import annotations

import ipaddress

from provision.spec.models import port_range
from provision.spec.nodes import Loc

Problem = tuple[Loc, str]


def is_address(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def first_per_loc(problems: list[Problem]) -> list[Problem]:
    seen: set[Loc] = set()
    out = []
    for loc, msg in problems:
        if loc not in seen:
            seen.add(loc)
            out.append((loc, msg))
    return out


def port_problem(at: Loc, value: object, ranges: bool) -> list[Problem]:
    try:
        text = port_range(str(value))  # str(True) is "True": not a port
    except ValueError as exc:
        return [(at, str(exc))]
    if not ranges and "-" in text:
        return [(at, f"{text!r} is a range: slurmd listens on one port, like 6818")]
    return []

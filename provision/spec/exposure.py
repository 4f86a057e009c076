"""How much of the internet an address set admits: the measure behind the exposure opt-ins."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

# Not reachable from the internet: private, shared, loopback, link-local, documentation,
# benchmarking, multicast and reserved space (RFC 6890). Disjoint, as the count needs.
NOT_PUBLIC = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
        "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15",
        "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
    )
)  # fmt: skip
# More public addresses than one /8 holds needs the spec's explicit opt-in.
WIDE = 2**24


def public_addresses(networks: Iterable[ipaddress.IPv4Network]) -> int:
    """Public addresses in the union of `networks` (overlaps counted once)."""
    total = 0
    for net in ipaddress.collapse_addresses(networks):
        hidden = sum(
            min(net.num_addresses, other.num_addresses)
            for other in NOT_PUBLIC
            if net.overlaps(other)
        )
        total += net.num_addresses - hidden
    return total


def describe_size(count: int) -> str:
    """2**24 -> 'a /8 (16,777,216 addresses)'; what a reader can compare."""
    prefix = 32 - (count.bit_length() - 1) if count else 32
    return f"about a /{prefix} ({count:,} public addresses)"

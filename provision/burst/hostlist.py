"""Slurm hostlists ('gpu[001-003,007],head001') with the standard library alone."""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]


def expand(text: str) -> list[str]:
    """'burst[001-003]' -> ['burst001', 'burst002', 'burst003'], in order, once each."""
    names: list[str] = []
    for part in _split_top(text.strip()):
        match = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", part)
        if match is None:
            if "[" in part or "]" in part:
                raise ValueError(f"not a hostlist: {text!r}")
            names.append(part)
            continue
        prefix, body, suffix = match.groups()
        for item in body.split(","):
            found = _RANGE.match(item)
            if found is None:
                raise ValueError(f"not a hostlist: {text!r}")
            low, high = found.group(1), found.group(2) or found.group(1)
            width = len(low)
            if int(high) < int(low) or int(high) - int(low) > 100_000:
                raise ValueError(f"not a hostlist: {text!r}")
            names += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(low), int(high) + 1)]
    return list(dict.fromkeys(names))


def compress(names: list[str]) -> str:
    """['burst001', 'burst002', 'x'] -> 'burst[001-002],x' (sorted; for logs and scontrol)."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in sorted(set(names)):
        match = re.fullmatch(r"(.*?)(\d+)", name)
        if match is None:
            plain.append(name)
            continue
        groups.setdefault((match.group(1), len(match.group(2))), []).append(int(match.group(2)))
    out = []
    for (prefix, width), numbers in sorted(groups.items()):
        runs: list[list[int]] = []
        for n in sorted(numbers):
            if runs and n == runs[-1][1] + 1:
                runs[-1][1] = n
            else:
                runs.append([n, n])
        if len(numbers) == 1:
            out.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        body = ",".join(
            f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in runs
        )
        out.append(f"{prefix}[{body}]")
    return ",".join(out + plain)

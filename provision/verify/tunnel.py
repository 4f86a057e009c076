"""The tunnel to remote networks: every remote node has shaken hands with the head lately.

A spoke keeps its session alive every 25 s and WireGuard renews it every two minutes while
packets flow, so a handshake older than three minutes (WireGuard's reject-after time) means the
node no longer reaches the head."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from provision.pki import TUNNEL_DIR
from provision.render.tunnel import INTERFACE, tunnel_layout
from provision.verify.base import CheckResult, VerifyContext
from provision.verify.remote import Remote

STALE_S = 180  # WireGuard's REJECT_AFTER_TIME: a session older than this carries nothing


def handshake_findings(
    output: str, now: int, names: dict[str, str], spokes: list[str], endpoint: str
) -> list[CheckResult]:
    """Findings from `wg show <if> latest-handshakes` (a public key and a Unix time per line,
    0 for never), the hub's clock, and each member's public key -> name."""
    seen: dict[str, int] = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[0] in names:
            seen[names[parts[0]]] = int(parts[1])
    results = []
    for spoke in spokes:
        at = seen.get(spoke)
        if at is None:
            ok, evidence = False, "not a peer of the head's tunnel: run apply"
        elif at == 0:
            ok, evidence = False, f"no handshake yet: it has not reached the head at {endpoint}"
        else:
            age = max(0, now - at)
            ok = age <= STALE_S
            evidence = f"last handshake {age} s ago" + (
                "" if ok else f" (over {STALE_S} s: it no longer reaches {endpoint})"
            )
        results.append(CheckResult("tunnel", spoke, ok, evidence))
    return results


def public_keys(secrets: Path, members: list[str]) -> dict[str, str]:
    """Public key -> member, from the state directory's key files."""
    out = {}
    for name in members:
        path = secrets / TUNNEL_DIR / f"{name}.pub"
        if path.exists():
            out[path.read_text().strip()] = name
    return out


def check_tunnel(ctx: VerifyContext, remotes: dict[str, Remote]) -> list[CheckResult]:
    """Each remote node's last handshake with each head (with two heads, the second's results
    name it: "far01 via head02")."""
    shape = tunnel_layout(ctx.cluster)
    if shape is None or not shape.spokes:
        return []
    spokes = [node.name for node in shape.spokes]
    names = public_keys(ctx.state.secrets, [*(h.name for h in shape.hubs), *spokes])
    results: list[CheckResult] = []
    for n, (head, endpoint) in enumerate(zip(shape.hubs, shape.endpoints, strict=True)):
        hub = remotes.get(head.name)
        if hub is None:
            continue  # the head's ssh check failed already
        out = hub.run(f"date +%s; wg show {INTERFACE} latest-handshakes", sudo=True)
        lines = out.stdout.splitlines()
        if out.rc != 0 or not lines or not lines[0].strip().isdigit():
            said = " ".join((out.stdout + out.stderr).split())[:200]
            results.append(CheckResult("tunnel", head.name, False, f"wg show failed: {said}"))
            continue
        found = handshake_findings("\n".join(lines[1:]), int(lines[0]), names, spokes, endpoint)
        if n:
            found = [replace(r, target=f"{r.target} via {head.name}") for r in found]
        results += found
    return results

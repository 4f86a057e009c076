"""Burst nodes in the cluster's WireGuard tunnel, on both ends.

The hub (the first head) knows every burst node of a remote pool by its public key from the
start (the tunnel role writes PEERS from the keys apply made for each node's name), but not its
address, which the cloud picks at launch. So resume gives the hub a node's peer with the address
the cloud answered (`wg set ... allowed-ips ADDRESS/32`) before the node boots far enough to
dial, and suspend takes it away. What is in the tunnel now is kept in UP_DIR, a file a node
holding its address: `wg-quick`'s reload (`wg syncconf`, when apply changes the hub's
configuration) would otherwise drop these peers, so the tunnel role's drop-in runs
`burst tunnel-restore` after every start and reload of the hub's interface.

The node's end: the join reads its private key and the hub's public key from the pool's tunnel
secret (JSON: {"hub": KEY, "keys": {NODE: KEY}}, base64 keys as `wg` writes them) and writes the
same spoke configuration the tunnel role writes on a lasting remote node (wg.conf.j2).
"""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provision.burst.backend import BurstError, one_line
from provision.burst.config import TUNNEL_INTERFACE

WG = "wg"
PEERS = Path(f"/etc/wireguard/{TUNNEL_INTERFACE}-burst.json")
UP_DIR = Path("/var/lib/provision/tunnel")
# the routing table (and firewall mark) of a spoke's own packets: the tunnel role's
# (roles/tunnel/vars/main.yml), the same on every spoke
SPOKE_TABLE = 51820
# the most each cloud's store takes in one secret: Secrets Manager's SecretBinary (65,536
# bytes), Secret Manager's payload (64 KiB), a Key Vault secret's value (25 KB, stored here as
# base64 text)
SECRET_LIMIT = {"aws": 65536, "gcp": 65536, "azure": 25 * 1024}
_KEY = re.compile(r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw480]=$")  # 32 bytes, base64


def _wg(*argv: str) -> None:
    done = subprocess.run(
        [WG, *argv], capture_output=True, text=True, timeout=30, check=False
    )  # fmt: skip
    if done.returncode != 0:
        raise BurstError(f"wg {argv[0]}: {one_line(Exception(done.stderr))}")


def is_key(text: str) -> bool:
    return bool(_KEY.match(text))


class Hub:
    """The hub's peers for burst nodes. peers: node -> public key (PEERS); run stands in for
    `wg` in tests."""

    def __init__(
        self,
        peers: dict[str, str] | None = None,
        up_dir: Path = UP_DIR,
        run: Callable[..., None] = _wg,
        interface: str = TUNNEL_INTERFACE,
    ) -> None:
        self._peers = peers
        self.up_dir, self.run, self.interface = up_dir, run, interface

    @property
    def peers(self) -> dict[str, str]:
        if self._peers is None:
            try:
                doc = json.loads(PEERS.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise BurstError(f"{PEERS}: {one_line(exc)} (the tunnel role writes it)") from None
            self._peers = {str(k): str(v) for k, v in doc.items()}
        return self._peers

    def _key(self, node: str) -> str:
        key = self.peers.get(node)
        if key is None or not is_key(key):
            raise BurstError(f"{node}: no tunnel key on the hub ({PEERS})")
        return key

    def add(self, addresses: dict[str, str]) -> dict[str, str]:
        """Each node's peer at its address; node -> error text for those that failed."""
        errors = {}
        self.up_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for node, address in sorted(addresses.items()):
            try:
                ipaddress.IPv4Address(address)
                key = self._key(node)
                (self.up_dir / node).write_text(f"{address}\n")
                self.run("set", self.interface, "peer", key, "allowed-ips", f"{address}/32")
            except (BurstError, OSError, ValueError) as exc:
                errors[node] = f"tunnel: {one_line(exc)}"
        return errors

    def remove(self, nodes: list[str]) -> dict[str, str]:
        """The peers of these nodes gone (those never added too: a suspend after a failed
        resume); node -> error text."""
        errors = {}
        for node in nodes:
            try:
                self.run("set", self.interface, "peer", self._key(node), "remove")
                (self.up_dir / node).unlink(missing_ok=True)
            except (BurstError, OSError) as exc:
                errors[node] = f"tunnel: {one_line(exc)}"
        return errors

    def up(self) -> dict[str, str]:
        """Node -> address of the burst nodes in the tunnel now."""
        if not self.up_dir.is_dir():
            return {}
        return {
            path.name: path.read_text().strip()
            for path in sorted(self.up_dir.iterdir())
            if self.peers.get(path.name) is not None
        }

    def restore(self) -> dict[str, str]:
        """Every peer in UP_DIR again (after the interface started or reloaded)."""
        return self.add(self.up())


def tunnel_secret_text(hub: str, keys: dict[str, str], backups: list[str] | None = None) -> bytes:
    """A pool's tunnel secret (what the node's end parses): the first head's public key (the
    hub), the other heads' in their order (the backups), and each node's private key, base64 as
    `wg` writes them."""
    doc: dict[str, object] = {"hub": hub, "keys": keys}
    if backups:
        doc["backups"] = backups
    return json.dumps(doc, sort_keys=True).encode()


def secret_size(cloud: str, nodes: list[str], heads: int = 1) -> int:
    """The bytes a pool's tunnel secret takes in the cloud's store (Key Vault's: base64)."""
    key = "A" * 43 + "="
    raw = len(tunnel_secret_text(key, dict.fromkeys(nodes, key), [key] * (heads - 1)))
    return 4 * ((raw + 2) // 3) if cloud == "azure" else raw


# --- the node's end -----------------------------------------------------------------------


def parse_tunnel_secret(data: bytes, node: str) -> tuple[str, str, list[str]]:
    """(this node's private key, the hub's public key, the other heads' public keys) from the
    pool's tunnel secret."""
    try:
        doc = json.loads(data)
        private, hub = doc["keys"][node], doc["hub"]
        backups = doc.get("backups", [])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise BurstError(f"the tunnel secret holds no key for {node}") from None
    keys = [private, hub, *backups] if isinstance(backups, list) else [None]
    if not all(isinstance(k, str) and is_key(k) for k in keys):
        raise BurstError("the tunnel secret's keys are not WireGuard keys")
    return private, hub, list(backups)


@dataclass(frozen=True)
class Backup:
    """Another head of the tunnel: its public key, where it listens, its address (all this
    spoke sends it through the tunnel: the first head carries the rest)."""

    key: str
    endpoint: str
    address: str


def spoke_config(
    private_key: str,
    hub_key: str,
    address: str,
    endpoint: str,
    routes: list[str],
    backups: list[Backup] | None = None,
) -> str:
    """A spoke's wg-quick configuration, as the tunnel role writes it (wg.conf.j2)."""
    lines = [
        "# The cluster's tunnel (spoke): this node's private key, its peers' public keys",
        "[Interface]",
        f"PrivateKey = {private_key}",
        f"# its own tunnel packets carry this mark; the rest looks in table {SPOKE_TABLE} first",
        f"FwMark = {SPOKE_TABLE}",
        "Table = off",
        *(
            f"PostUp = ip route replace {r} dev %i src {address} table {SPOKE_TABLE}"
            for r in routes
        ),
        f"PostUp = ip rule del priority 32000 2>/dev/null || true; ip rule add not fwmark "
        f"{SPOKE_TABLE} table {SPOKE_TABLE} priority 32000",
        "PostDown = ip rule del priority 32000",
        "",
        "[Peer]",
        "# the hub",
        f"PublicKey = {hub_key}",
        f"Endpoint = {endpoint}",
        f"AllowedIPs = {', '.join(routes)}",
        "PersistentKeepalive = 25",
    ]
    for n, backup in enumerate(backups or [], start=2):
        lines += [
            "",
            "[Peer]",
            f"# head {n}: its own address alone (the hub carries the rest)",
            f"PublicKey = {backup.key}",
            f"Endpoint = {backup.endpoint}",
            f"AllowedIPs = {backup.address}/32",
            "PersistentKeepalive = 25",
        ]
    return "\n".join(lines) + "\n"

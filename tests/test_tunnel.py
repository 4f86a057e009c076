"""The WireGuard tunnel to remote networks, rendered: who is hub, spoke or routed, what each
routes, the firewall's guard, and the keys apply makes. The tunnel itself runs live in
tests/integration/test_static_apply.py."""

from __future__ import annotations

import base64
import ipaddress
from pathlib import Path

from provision.cluster import Cluster
from provision.pki import TUNNEL_DIR, tunnel_keys, wg_public
from provision.render import render
from provision.render.tunnel import members, tunnel_host_vars
from provision.spec.loader import load_spec
from provision.verify.tunnel import handshake_findings, public_keys

from .conftest import ROOT

SPEC = """
name: t
os: debian12
network:
  management: {cidr: 10.40.0.0/24}
  remote:
    - {name: far, cidr: 10.41.0.0/24}
    - {name: aws, cidr: 10.42.0.0/16}
pools:
  - {name: head, role: head, profile: cpu-node, hosts: [{name: head01, address: 10.40.0.10}]}
  - {name: cpu, role: compute, profile: cpu-node, count: 2, first_address: 10.40.0.21}
  - name: far
    role: compute
    profile: cpu-node
    network: far
    hosts: [{name: far01, address: 10.41.0.5}, {name: far02, address: 10.41.0.6}]
  - {name: gpu, role: compute, profile: aws-p5.48xlarge, provider: aws, region: us-east-1,
     count: 2, network: aws}
security:
  admin_cidrs: [203.0.113.0/24]
"""


def _cluster(tmp_path: Path, text: str = SPEC) -> Cluster:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    return Cluster(load_spec(path))


def test_the_first_head_is_the_hub_and_each_remote_host_a_spoke(tmp_path: Path) -> None:
    found = tunnel_host_vars(_cluster(tmp_path))
    assert found["head01"] == {
        "tunnel_role": "hub",
        "tunnel_port": 51820,
        "tunnel_address": "10.40.0.10",
        "tunnel_routes": ["10.41.0.0/24", "10.42.0.0/16"],
        "tunnel_peers": [
            {"name": "far01", "address": "10.41.0.5"},
            {"name": "far02", "address": "10.41.0.6"},
        ],
        "tunnel_forward": True,
        "tunnel_burst_peers": [],
    }
    # the endpoint defaults to the head's management address; the other remote ranges go
    # through the hub too
    assert found["far02"] == {
        "tunnel_role": "spoke",
        "tunnel_address": "10.41.0.6",
        "tunnel_hubs": [
            {
                "name": "head01",
                "endpoint": "10.40.0.10:51820",
                "allowed_ips": ["10.40.0.0/24", "10.42.0.0/16"],
            }
        ],
        "tunnel_routes": ["10.40.0.0/24", "10.42.0.0/16"],
    }
    # the nodes of the management network reach the remote ranges through the hub
    assert found["cpu001"] == {
        "tunnel_role": "routed",
        "tunnel_via": "10.40.0.10",
        "tunnel_routes": ["10.41.0.0/24", "10.42.0.0/16"],
    }
    # a cloud node joins once it exists: its address is known then
    assert "gpu001" not in found
    assert members(_cluster(tmp_path)) == ["head01", "far01", "far02"]


def test_cloud_nodes_join_at_their_private_addresses(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    made = Cluster(
        cluster.spec,
        {"gpu001": ipaddress.IPv4Address("10.42.0.7")},
        {"gpu001": ipaddress.IPv4Address("198.51.100.7")},
    )
    found = tunnel_host_vars(made)
    assert found["gpu001"]["tunnel_address"] == "10.42.0.7"
    assert found["gpu001"]["tunnel_routes"] == ["10.40.0.0/24", "10.41.0.0/24"]
    assert {"name": "gpu001", "address": "10.42.0.7"} in found["head01"]["tunnel_peers"]
    assert members(made) == ["head01", "far01", "far02", "gpu001"]
    # the firewall's sets hold the private address: what arrives through the tunnel
    assert "10.42.0.7" in render(made)["files/nftables/address-sets.nft"]
    assert "198.51.100.7" not in render(made)["files/nftables/address-sets.nft"]


def test_the_endpoint_and_port_come_from_the_spec(tmp_path: Path) -> None:
    aws = "    - {name: aws, cidr: 10.42.0.0/16}\n"
    text = SPEC.replace(aws, aws + "  tunnel: {endpoint: vpn.example.org, port: 4500}\n")
    found = tunnel_host_vars(_cluster(tmp_path, text))
    assert found["far01"]["tunnel_hubs"][0]["endpoint"] == "vpn.example.org:4500"
    assert found["head01"]["tunnel_port"] == 4500


def test_the_firewall_takes_the_far_side_only_from_the_tunnel(tmp_path: Path) -> None:
    files = render(_cluster(tmp_path))
    guard = 'iifname != "wg-provision" ip saddr {{ {} }} drop'
    far = files["files/nftables/far.nft"]
    assert guard.format("10.40.0.0/24, 10.42.0.0/16") in far
    head = files["files/nftables/head.nft"]
    assert guard.format("10.41.0.0/24, 10.42.0.0/16") in head
    assert 'ip saddr 0.0.0.0/0 udp dport 51820 accept comment "wireguard tunnel' in head
    # the guard follows the connection-tracking lines: the hub's replies to a spoke's own
    # tunnel packets come from the management network, on the spoke's plain interface
    assert far.index("ct state established") < far.index("iifname")
    # a node of the management network has no guard and no tunnel port
    assert "iifname" not in files["files/nftables/cpu.nft"]
    assert "51820" not in files["files/nftables/cpu.nft"]


def test_no_remote_network_no_tunnel(tmp_path: Path) -> None:
    text = (Path(__file__).parents[1] / "examples" / "lab.yaml").read_text()
    cluster = _cluster(tmp_path, text)
    assert tunnel_host_vars(cluster) == {} and members(cluster) == []
    assert "iifname" not in render(cluster)["files/nftables/head.nft"]


def test_the_public_key_is_x25519s_as_wg_pubkey_makes_it() -> None:
    # RFC 7748, section 6.1: Alice's private and public keys
    private = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    public = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
    assert wg_public(base64.b64encode(private) + b"\n") == base64.b64encode(public).decode()


def test_keys_are_made_once_private_to_this_user(tmp_path: Path) -> None:
    assert tunnel_keys(tmp_path, []) == []
    assert not (tmp_path / TUNNEL_DIR).exists()
    assert tunnel_keys(tmp_path, ["head01", "far01"]) == ["head01", "far01"]
    keys = tmp_path / TUNNEL_DIR
    assert oct(keys.stat().st_mode & 0o777) == "0o700"
    first = (keys / "far01.key").read_bytes()
    assert len(base64.b64decode(first)) == 32
    for path in keys.iterdir():
        assert oct(path.stat().st_mode & 0o777) == "0o600", path
    assert (keys / "far01.pub").read_text() == wg_public(first) + "\n"
    # a second apply keeps them; a new member gets its own
    assert tunnel_keys(tmp_path, ["head01", "far01", "far02"]) == ["far02"]
    assert (keys / "far01.key").read_bytes() == first
    assert (keys / "far02.key").read_bytes() != first


def test_verify_reads_the_heads_handshakes() -> None:
    # `wg show wg-provision latest-handshakes`: a public key, a tab, a Unix time (0: never)
    output = "AAAA=\t1764662400\nBBBB=\t0\nCCCC=\t1764662000\nDDDD=\t1764662390\n"
    names = {"AAAA=": "far01", "BBBB=": "far02", "CCCC=": "far03", "DDDD=": "head01"}
    found = handshake_findings(
        output, 1764662430, names, ["far01", "far02", "far03", "far04"], "vpn.example.org:51820"
    )
    assert [(r.target, r.passed, r.evidence) for r in found] == [
        ("far01", True, "last handshake 30 s ago"),
        ("far02", False, "no handshake yet: it has not reached the head at vpn.example.org:51820"),
        (
            "far03",
            False,
            "last handshake 430 s ago (over 180 s: it no longer reaches vpn.example.org:51820)",
        ),
        ("far04", False, "not a peer of the head's tunnel: run apply"),
    ]
    assert all(r.check == "tunnel" for r in found)


def test_verify_names_members_by_their_key_files(tmp_path: Path) -> None:
    tunnel_keys(tmp_path, ["head01", "far01"])
    pub = (tmp_path / TUNNEL_DIR / "far01.pub").read_text().strip()
    assert public_keys(tmp_path, ["head01", "far01", "gone01"])[pub] == "far01"
    assert len(public_keys(tmp_path, ["head01", "far01", "gone01"])) == 2


# --- burst nodes: peers of the hub from resume to suspend ------------------------------------


def _burst_cluster() -> Cluster:
    return Cluster(
        load_spec(ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml", unbuilt=True)
    )


def test_burst_nodes_hold_keys_and_the_hub_knows_their_names_not_their_addresses() -> None:
    cluster = _burst_cluster()
    hub = tunnel_host_vars(cluster)["head01"]
    elastic = [n.name for v in cluster.pools if v.pool.elastic for n in v.nodes]
    assert elastic and hub["tunnel_burst_peers"] == elastic
    # no static peer for them: resume adds each one at the address its cloud gave it
    assert not {p["name"] for p in hub["tunnel_peers"]} & set(elastic)  # type: ignore[union-attr]
    assert set(elastic) <= set(members(cluster))
    assert not set(elastic) & set(tunnel_host_vars(cluster))  # no Ansible run on them


def _template(name: str, **values: object) -> str:
    """A tunnel role template rendered as Ansible does (trim_blocks), with its file lookups
    and to_json filter."""
    import json

    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(ROOT / "roles" / "tunnel" / "templates"),
        trim_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["to_json"] = json.dumps
    keys = values.pop("keys")
    env.globals["lookup"] = lambda _kind, path: keys[Path(path).name]  # type: ignore[index]
    return env.get_template(name).render(ansible_managed="managed", **values)


def test_a_burst_nodes_spoke_is_the_one_the_role_writes_on_a_lasting_node() -> None:
    """join writes a burst node's wg-quick file itself (no Ansible runs there): the same lines
    as wg.conf.j2 makes for a lasting spoke, comments aside; with two heads, a peer each."""
    from provision.burst.tunnel import SPOKE_TABLE, Backup, spoke_config

    private = base64.b64encode(bytes(range(32))).decode()
    hub = base64.b64encode(bytes(range(1, 33))).decode()
    second = base64.b64encode(bytes(range(2, 34))).decode()
    routes = ["10.20.0.0/16", "10.22.0.0/16"]
    role = _template(
        "wg.conf.j2",
        tunnel_role="spoke",
        tunnel_keys_dir="/keys",
        inventory_hostname="aws-h100-001",
        tunnel_hubs=[
            {"name": "head01", "endpoint": "vpn.example.org:51820", "allowed_ips": routes},
            {
                "name": "head02",
                "endpoint": "vpn2.example.org:51820",
                "allowed_ips": ["10.20.0.11/32"],
            },
        ],
        tunnel_routes=routes,
        tunnel_address="10.21.0.7",
        _tunnel_table=SPOKE_TABLE,
        keys={"aws-h100-001.key": private, "head01.pub": hub, "head02.pub": second},
    )
    ours = spoke_config(
        private,
        hub,
        "10.21.0.7",
        "vpn.example.org:51820",
        routes,
        [Backup(second, "vpn2.example.org:51820", "10.20.0.11")],
    )

    def lines(text: str) -> list[str]:
        return [line for line in text.splitlines() if line and not line.startswith("#")]

    assert lines(ours) == lines(role)
    assert f"PrivateKey = {private}" in lines(ours)
    assert "AllowedIPs = 10.20.0.11/32" in lines(ours)
    assert lines(ours).count("[Peer]") == 2


def test_the_hub_gets_each_burst_nodes_public_key_as_json() -> None:
    import json

    names = ["aws-h100-001", "aws-h100-002"]
    keys = {f"{n}.pub": base64.b64encode(n.encode().ljust(32, b"k")).decode() for n in names}
    text = _template(
        "burst-peers.json.j2", tunnel_burst_peers=names, tunnel_keys_dir="/keys", keys=keys
    )
    assert json.loads(text) == {n: keys[f"{n}.pub"] for n in names}


def test_the_hub_adds_and_removes_burst_peers_and_restores_them(tmp_path: Path) -> None:
    """What is in the tunnel is kept a file a node, so a restore (after `wg syncconf` dropped
    the runtime peers) puts back exactly those; a bad address or a node without a key is named
    and nothing is run for it."""
    from provision.burst.tunnel import Hub

    calls: list[tuple[str, ...]] = []
    k1, k2 = (base64.b64encode(bytes([n]) * 32).decode() for n in (1, 2))
    hub = Hub({"b1": k1, "b2": k2}, tmp_path / "up", lambda *argv: calls.append(argv))
    assert hub.add({"b1": "10.21.0.7", "b2": "10.21.0.8"}) == {}
    assert hub.up() == {"b1": "10.21.0.7", "b2": "10.21.0.8"}
    assert oct((tmp_path / "up").stat().st_mode & 0o777) == "0o700"
    assert hub.remove(["b2"]) == {}
    assert calls == [
        ("set", "wg-provision", "peer", k1, "allowed-ips", "10.21.0.7/32"),
        ("set", "wg-provision", "peer", k2, "allowed-ips", "10.21.0.8/32"),
        ("set", "wg-provision", "peer", k2, "remove"),
    ]
    calls.clear()
    assert hub.restore() == {}
    assert calls == [("set", "wg-provision", "peer", k1, "allowed-ips", "10.21.0.7/32")]
    calls.clear()
    assert hub.add({"b2": "10.21.0.999", "b3": "10.21.0.9"}) == {
        "b2": "tunnel: Octet 999 (> 255) not permitted in '10.21.0.999'",
        "b3": "tunnel: b3: no tunnel key on the hub (/etc/wireguard/wg-provision-burst.json)",
    }
    assert calls == [] and set(hub.up()) == {"b1"}


def test_a_tunnel_secret_without_this_nodes_key_is_refused() -> None:
    from provision.burst.backend import BurstError
    from provision.burst.tunnel import parse_tunnel_secret, tunnel_secret_text

    key = base64.b64encode(bytes(32)).decode()
    text = tunnel_secret_text(key, {"b1": key})
    assert parse_tunnel_secret(text, "b1") == (key, key, [])
    two = tunnel_secret_text(key, {"b1": key}, [key])
    assert parse_tunnel_secret(two, "b1") == (key, key, [key])
    for data, node, says in (
        (text, "b2", "holds no key for b2"),
        (b"not json", "b1", "holds no key for b1"),
        (tunnel_secret_text("short", {"b1": key}), "b1", "not WireGuard keys"),
        (tunnel_secret_text(key, {"b1": key}, ["short"]), "b1", "not WireGuard keys"),
    ):
        try:
            parse_tunnel_secret(data, node)
        except BurstError as exc:
            assert says in str(exc)
        else:
            raise AssertionError(f"{data!r} taken")


def test_a_pools_tunnel_secret_holds_its_nodes_keys_from_apply(tmp_path: Path) -> None:
    """What a cloud's stack puts in a remote elastic pool's secret: the keys apply made for
    the hub and each node's name (none until every one is made: a preview plans no value)."""
    from provision.burst.tunnel import parse_tunnel_secret
    from provision.providers.cloud.joining import tunnel_keys_value

    cluster = _burst_cluster()
    view = next(v for v in cluster.pools if v.pool.elastic and v.pool.provider == "aws")
    keys = tmp_path / TUNNEL_DIR
    assert tunnel_keys_value(cluster, view, keys) is None
    tunnel_keys(tmp_path, members(cluster))
    value = tunnel_keys_value(cluster, view, keys)
    assert value is not None
    for node in view.nodes:
        private, hub, backups = parse_tunnel_secret(value, node.name)
        assert backups == []
        assert private == (keys / f"{node.name}.key").read_text().strip()
        assert hub == (keys / "head01.pub").read_text().strip()
    assert b"head01.key" not in value and (keys / "head01.key").read_text().strip() not in (
        value.decode()
    )


TWO_HEADS = SPEC.replace(
    "hosts: [{name: head01, address: 10.40.0.10}]}",
    "hosts: [{name: head01, address: 10.40.0.10}, {name: head02, address: 10.40.0.11}]}",
).replace(
    "security:\n",
    "slurm:\n  config: {StateSaveLocation: /shared/slurm/state}\n"
    "storage:\n  mounts:\n"
    "    - {source: 'filer.example.org:/export/slurm', path: /shared/slurm, pools: [head]}\n"
    "security:\n",
)


def test_with_two_heads_each_is_a_hub_and_a_spoke_dials_both(tmp_path: Path) -> None:
    """Both heads take every spoke as a peer and route the remote ranges into their own tunnel
    (the second head's slurmctld reaches the remote nodes whether the first is up or not); a
    spoke sends the cluster's ranges to the first and the second head's own address to the
    second (the most specific allowed range wins); the management network's other nodes keep
    going through the first, which alone forwards."""
    text = TWO_HEADS.replace(
        "    - {name: aws, cidr: 10.42.0.0/16}\n",
        "    - {name: aws, cidr: 10.42.0.0/16}\n"
        "  tunnel: {endpoints: [vpn1.example.org, vpn2.example.org]}\n",
    )
    cluster = _cluster(tmp_path, text)
    found = tunnel_host_vars(cluster)
    first, second = found["head01"], found["head02"]
    assert first["tunnel_role"] == second["tunnel_role"] == "hub"
    assert first["tunnel_peers"] == second["tunnel_peers"]
    assert first["tunnel_routes"] == second["tunnel_routes"] == ["10.41.0.0/24", "10.42.0.0/16"]
    assert (first["tunnel_forward"], second["tunnel_forward"]) == (True, False)
    assert second["tunnel_address"] == "10.40.0.11"
    assert found["far01"]["tunnel_hubs"] == [
        {
            "name": "head01",
            "endpoint": "vpn1.example.org:51820",
            "allowed_ips": ["10.40.0.0/24", "10.42.0.0/16"],
        },
        {"name": "head02", "endpoint": "vpn2.example.org:51820", "allowed_ips": ["10.40.0.11/32"]},
    ]
    assert found["cpu001"]["tunnel_via"] == "10.40.0.10"
    assert "head02" not in [n for n, v in found.items() if v["tunnel_role"] == "routed"]
    assert members(cluster)[:2] == ["head01", "head02"]
    # both heads listen (their firewall), and the rendered wg.conf of each spoke names both
    files = render(cluster)
    assert 'comment "wireguard tunnel from remote nodes"' in files["files/nftables/head.nft"]
    # without endpoints: each head's management address
    plain = tunnel_host_vars(_cluster(tmp_path, TWO_HEADS))["far01"]["tunnel_hubs"]
    assert [h["endpoint"] for h in plain] == ["10.40.0.10:51820", "10.40.0.11:51820"]


def test_two_heads_need_an_endpoint_each(tmp_path: Path) -> None:
    import pytest

    from provision.errors import SpecError

    aws = "    - {name: aws, cidr: 10.42.0.0/16}\n"
    for tunnel, says in (
        ("{endpoint: vpn.example.org}", "network.tunnel.endpoint: 2 heads: each is a hub"),
        ("{endpoints: [vpn1.example.org]}", "1 endpoints for 2 head(s): one per head"),
    ):
        with pytest.raises(SpecError) as caught:
            _cluster(tmp_path, TWO_HEADS.replace(aws, aws + f"  tunnel: {tunnel}\n"))
        assert says in str(caught.value), caught.value
    with pytest.raises(SpecError) as caught:
        _cluster(
            tmp_path, SPEC.replace(aws, aws + "  tunnel: {endpoints: [a.example, b.example]}\n")
        )
    assert "(one head: network.tunnel.endpoint)" in str(caught.value)


def test_verify_asks_each_head_for_its_handshakes(tmp_path: Path) -> None:
    """Two heads: each one's `wg show` is read, its findings named by the spoke (and, for the
    second, by the head): a spoke that reached the first head but never the second is found."""
    from provision.state import State
    from provision.verify.base import VerifyContext
    from provision.verify.remote import Output
    from provision.verify.tunnel import check_tunnel

    cluster = _cluster(tmp_path, TWO_HEADS)
    state = State(tmp_path / "state", "t")
    state.ensure()
    tunnel_keys(state.secrets, members(cluster))
    key = {
        n: (state.secrets / TUNNEL_DIR / f"{n}.pub").read_text().strip() for n in ("far01", "far02")
    }

    class Head:
        def __init__(self, seen: dict[str, int]) -> None:
            self.seen = seen

        def run(self, command: str, sudo: bool = False) -> Output:
            assert sudo and "wg show wg-provision latest-handshakes" in command
            lines = [f"{key[n]}\t{at}" for n, at in self.seen.items()]
            return Output(0, "\n".join(["1000", *lines]) + "\n", "")

    remotes = {
        "head01": Head({"far01": 990, "far02": 995}),
        "head02": Head({"far01": 990, "far02": 0}),
    }
    ctx = VerifyContext(cluster, state, "")
    found = {(r.target, r.passed) for r in check_tunnel(ctx, remotes)}  # type: ignore[arg-type]
    assert found == {
        ("far01", True),
        ("far02", True),
        ("far01 via head02", True),
        ("far02 via head02", False),
    }

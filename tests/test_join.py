"""A burst node's own join (provision/burst/join.py) and the user data that starts it
(render/userdata.py): against moto's Secrets Manager and EC2 in server mode with the real boto3,
and against HTTP fakes of each cloud's metadata service, GCP's Secret Manager and Azure's Key
Vault, laid out as each cloud documents them. The node's files are a folder here and systemctl
and nft are recorded; the live boot path (cloud-init in a lab container) is
tests/integration/test_burst.py's. A spot node's watch for its cloud's reclaim notice against the
same metadata fakes, its scontrol a stand-in."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from provision.burst import join as joining
from provision.burst.__main__ import main as burst_main
from provision.burst.aws import AwsBackend
from provision.burst.backend import BurstError
from provision.burst.config import TAG_NODE, munge_secret, parse_config, tunnel_secret
from provision.burst.join import JoinConfig, Metadata, parse_join_config
from provision.cluster import Cluster
from provision.render import render
from provision.render.userdata import join_config, user_data
from provision.spec import load_spec

from .conftest import ROOT
from .fakeec2 import FakeEC2

SPEC = ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml"
KEY = secrets.token_bytes(1024)
HUB_KEY = base64.b64encode(secrets.token_bytes(32)).decode()


def _wg_key(node: str) -> str:
    """A made-up WireGuard private key of a node (the same for a name in one run)."""
    return base64.b64encode(hashlib.sha256(f"{HUB_KEY}{node}".encode()).digest()).decode()


def _tunnel_keys(*nodes: str) -> str:
    """A remote pool's tunnel secret, as apply writes it (providers/cloud/joining.py)."""
    return json.dumps({"hub": HUB_KEY, "keys": {n: _wg_key(n) for n in nodes}})


class Answers(ThreadingHTTPServer):
    """A metadata service (or a secret store) answering path -> (status, text), with every
    request it got: (method, path, headers by their names in lower case)."""

    def __init__(self) -> None:
        self.answers: dict[str, list[tuple[int, str]]] = {}
        self.got: list[tuple[str, str, dict[str, str]]] = []
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def on(self, path: str, *answers: tuple[int, str]) -> None:
        """Answer path with these in turn, the last one from then on."""
        self.answers[path] = list(answers)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    def _handle(self) -> None:
        assert isinstance(self.server, Answers)
        self.server.got.append(
            (self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
        )
        queue = self.server.answers.get(self.path) or [(404, "")]
        status, text = queue.pop(0) if len(queue) > 1 else queue[0]
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = _handle

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answers() -> Iterator[Answers]:
    server = Answers()
    yield server
    server.shutdown()
    server.server_close()


class Node:
    """What the join does to the node: its files under root, its systemctl and nft calls."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: list[tuple[str, ...]] = []
        (root / "etc").mkdir(parents=True)
        (root / "etc" / "hosts").write_text("127.0.0.1 localhost\n10.9.9.9 head01 # stale\n")

    def command(self, *argv: str) -> None:
        self.calls.append(argv)

    def nft(self, script: str) -> None:
        self.calls.append(("nft", script))

    def join(self, config: JoinConfig, metadata: Metadata, lines: list[str], **kw: Any) -> str:
        return joining.join(
            config,
            metadata,
            lines.append,
            root=self.root,
            run=self.command,
            nft=self.nft,
            key_owner="root",
            **kw,
        )


def _cluster() -> Cluster:
    return Cluster(load_spec(SPEC, unbuilt=True))


def _pool_config(cloud: str) -> JoinConfig:
    cluster = _cluster()
    view = next(v for v in cluster.pools if v.pool.provider == cloud and v.pool.elastic)
    return join_config(cluster, view)


NODE_ADDRESS = "10.21.0.7"


def _aws_imds(answers: Answers, node: str, tag_after: int = 0) -> None:
    answers.on("/latest/api/token", (200, "session-token"))
    answers.on("/latest/meta-data/local-ipv4", (200, NODE_ADDRESS))
    tag = f"/latest/meta-data/tags/instance/{TAG_NODE}"
    answers.on(tag, *([(404, "")] * tag_after), (200, node))


def _joined(node: Node, name: str, config: JoinConfig, lines: list[str]) -> None:
    """The node as a join leaves it: the key, the names, slurmd's options, and the order."""
    key = node.root / "etc" / "munge" / "munge.key"
    assert key.read_bytes() == KEY
    assert oct(key.stat().st_mode & 0o777) == "0o400"
    hosts = (node.root / "etc" / "hosts").read_text()
    ((head, address),) = config.controllers
    assert hosts == f"127.0.0.1 localhost\n{address} {head}\n"
    assert (node.root / "etc" / "hostname").read_text() == f"{name}\n"
    assert (node.root / "etc" / "default" / "slurmd").read_text() == (
        f'SLURMD_OPTIONS="--conf-server {address}:6817 -N {name}"\n'
    )
    tunnel = [] if not config.tunnel_endpoint else [
        "systemctl enable wg-quick@wg-provision",
        "systemctl restart wg-quick@wg-provision",
    ]  # fmt: skip
    kinds = ["nft" if c[0] == "nft" else " ".join(c) for c in node.calls]
    assert kinds == [  # the guard comes first
        "nft",
        *tunnel,
        f"hostname {name}",
        "systemctl enable munge",
        "systemctl restart munge",
        "systemctl enable slurmd",
        "systemctl restart slurmd",
    ]
    assert [line.split(":")[0] for line in lines] == [
        "join metadata",
        "join name",
        "join munge key",
        *(["join tunnel"] if tunnel else []),
        "join names",
        "join slurmd",
        "join spot",
    ]
    assert "not a spot instance: nothing to watch" in lines[-1]  # on-demand: no watch
    said = "\n".join(lines)
    assert KEY.hex() not in said and base64.b64encode(KEY).decode() not in said
    if tunnel:
        conf = node.root / "etc" / "wireguard" / "wg-provision.conf"
        assert oct(conf.stat().st_mode & 0o777) == "0o600"
        text = conf.read_text()
        assert f"PrivateKey = {_wg_key(name)}\n" in text
        assert f"PublicKey = {HUB_KEY}\n" in text
        assert f"Endpoint = {config.tunnel_endpoint}\n" in text
        assert f"AllowedIPs = {', '.join(config.tunnel_routes)}\n" in text
        assert f"dev %i src {NODE_ADDRESS} table 51820" in text
        assert _wg_key(name) not in said


# --- the user data ----------------------------------------------------------------------------


def test_each_clouds_user_data_runs_the_join_and_holds_no_secret() -> None:
    cluster = _cluster()
    for view in (v for v in cluster.pools if v.pool.elastic):
        config = join_config(cluster, view)
        text = user_data(config)
        assert text.startswith("#cloud-config\n"), view.name
        doc = yaml.safe_load(text)
        (written,) = doc["write_files"]
        assert written["path"] == "/etc/provision/join.json"
        assert parse_join_config(written["content"]) == config
        assert doc["runcmd"] == [
            [
                "env",
                "PYTHONPATH=/opt/provision/gpu-provision.whl",
                "python3",
                "-m",
                "provision.burst",
                "join",
            ]
        ]
        assert config.cloud == view.pool.provider
        assert (config.controllers, config.port) == ((("head01", "10.20.0.10"),), 6817)
        assert munge_secret("burst") in config.secret
    aws = _pool_config("aws")
    assert (aws.secret, aws.region) == ("burst-munge-key", "us-east-1")
    azure = _pool_config("azure")
    assert (
        azure.secret.startswith("https://pvburst") and ".vault.azure.net/secrets/" in azure.secret
    )


def test_a_join_config_with_an_unknown_key_or_cloud_is_refused(tmp_path: Path) -> None:
    good = json.loads(_pool_config("aws").to_json())
    for bad, says in (
        ({**good, "munge_key": "x"}, "unknown keys: munge_key"),
        ({**good, "cloud": "lab"}, "not aws, gcp or azure"),
        ({**good, "controllers": []}, "controllers: not a list of"),
        ({**good, "controllers": [["head01"]]}, "controllers: not a list of"),
        ({**good, "controllers": [["head01", ""]]}, "controllers: not a list of"),
    ):
        path = tmp_path / "join.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=says):
            parse_join_config(path.read_text())
    (tmp_path / "broken.json").write_text("{")
    assert burst_main(["join", str(tmp_path / "broken.json")]) == 2


def test_the_metadata_guard_is_a_valid_nftables_table_for_root_alone() -> None:
    script = joining.metadata_guard()
    assert "ip daddr 169.254.169.254 meta skuid != 0 counter reject" in script
    assert "ip6 daddr fd00:ec2::254 meta skuid != 0 counter reject" in script
    # before any DNAT of the node's own output (at -100), which would hide the address
    assert "hook output priority mangle;" in script
    # the table is replaced whole: a second run leaves one
    assert script.index("delete table inet provision_metadata") < script.index("chain output")
    # nft itself takes it (make setup installs nftables; -c checks without changing anything)
    checked = subprocess.run(["nft", "-c", "-f", "-"], input=script, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


# --- AWS: moto's EC2 and Secrets Manager, the real boto3 ---------------------------------------


@pytest.fixture(scope="module")
def moto() -> Iterator[FakeEC2]:
    pytest.importorskip("boto3")
    pytest.importorskip("moto")
    with FakeEC2() as fake:
        yield fake


def _aws_env(moto: FakeEC2, monkeypatch: pytest.MonkeyPatch) -> Any:
    import boto3

    for key, value in moto.env().items():
        monkeypatch.setenv(key, value)
    return boto3.client("secretsmanager", region_name="us-east-1", endpoint_url=moto.url)


def test_an_aws_node_made_by_resume_joins_with_the_user_data_moto_gives_back(
    moto: FakeEC2, answers: Answers, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The pool's launch template carries the user data the render makes; a resume makes the
    instances from it; what moto gives back as an instance's user data is that text, with no
    key in it; the join it runs reads the name from the instance's tag (after the burst
    program tagged it) and the key from Secrets Manager."""
    secrets_manager = _aws_env(moto, monkeypatch)
    secrets_manager.create_secret(Name=munge_secret("burst"), SecretBinary=KEY)
    secrets_manager.create_secret(
        Name=tunnel_secret("burst", "awsh100"), SecretBinary=_tunnel_keys("aws-h100-001").encode()
    )
    config = _pool_config("aws")
    text = user_data(config)
    moto.launch_template("burst-awsh100", "p5.48xlarge")
    ec2 = moto.client()
    ec2.create_launch_template_version(
        LaunchTemplateName="burst-awsh100",
        SourceVersion="1",
        LaunchTemplateData={"UserData": base64.b64encode(text.encode()).decode()},
    )
    burst = parse_config(render(_cluster())["files/burst/burst.json"])
    monkeypatch.setattr("provision.burst.slurm.set_addresses", lambda addresses: None)
    assert AwsBackend(burst.pools["awsh100"], ec2).start(["aws-h100-001"]) == {}
    (instance,) = [
        i
        for r in ec2.describe_instances()["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] == "running"
    ]
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    given = ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
    data = base64.b64decode(given["UserData"]["Value"])
    assert data == text.encode()
    assert KEY not in data and base64.b64encode(KEY) not in data and KEY.hex().encode() not in data
    assert _wg_key("aws-h100-001").encode() not in data
    on_node = parse_join_config(yaml.safe_load(data)["write_files"][0]["content"])

    _aws_imds(answers, tags[TAG_NODE], tag_after=2)  # the tag comes a moment after launch
    node, lines = Node(tmp_path), []
    monkeypatch.setattr(joining.time, "sleep", lambda s: None)
    assert node.join(on_node, Metadata("aws", answers.url), lines) == "aws-h100-001"
    _joined(node, "aws-h100-001", on_node, lines)
    # IMDSv2: a session token first, then every read carries it
    assert answers.got[0][:2] == ("PUT", "/latest/api/token")
    assert all(h.get("x-aws-ec2-metadata-token") == "session-token" for _, _, h in answers.got[1:])


def test_an_aws_node_without_its_secret_never_starts_slurmd(
    moto: FakeEC2, answers: Answers, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _aws_env(moto, monkeypatch)
    config = JoinConfig(**{**json.loads(_pool_config("aws").to_json()), "secret": "not-there"})
    _aws_imds(answers, "aws-h100-002")
    node, lines = Node(tmp_path), []
    with pytest.raises(BurstError, match=r"^munge key: Secrets Manager: .*ResourceNotFound"):
        node.join(config, Metadata("aws", answers.url), lines)
    assert not (tmp_path / "etc" / "munge" / "munge.key").exists()
    assert node.calls[0][0] == "nft" and len(node.calls) == 1  # guarded; no munge, no slurmd
    assert not (tmp_path / "etc" / "default" / "slurmd").exists()


def test_an_aws_node_whose_tag_never_comes_says_so(
    answers: Answers, monkeypatch: pytest.MonkeyPatch
) -> None:
    _aws_imds(answers, "unused", tag_after=10**6)
    clock = iter(range(0, 10**6, 30))
    monkeypatch.setattr(joining.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(joining.time, "sleep", lambda s: None)
    with pytest.raises(BurstError, match=f"no tag {TAG_NODE} on this instance after 180s"):
        Metadata("aws", answers.url).name()


def test_a_secret_too_short_for_munge_is_refused(
    moto: FakeEC2, answers: Answers, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets_manager = _aws_env(moto, monkeypatch)
    secrets_manager.create_secret(Name="short-key", SecretBinary=b"0123456789")
    config = JoinConfig(**{**json.loads(_pool_config("aws").to_json()), "secret": "short-key"})
    with pytest.raises(BurstError, match="the secret holds 10 bytes, not a munge key"):
        joining.fetch_key(config, Metadata("aws", answers.url))


# --- GCP and Azure: their metadata services and secret stores, as HTTP fakes -------------------


def test_a_gcp_node_reads_its_name_and_its_service_accounts_secret(
    answers: Answers, tmp_path: Path
) -> None:
    """Compute Engine's metadata server (Metadata-Flavor: Google) names the instance, which
    bulkInsert named as its node, and its project; Secret Manager's `access` of the latest
    version answers the payload base64-encoded."""
    config = _pool_config("gcp")
    answers.on("/instance/name", (200, "gcp-h100-003"))
    answers.on("/project/project-id", (200, "lab-project"))
    token = {"access_token": "ya29.token", "expires_in": 3599, "token_type": "Bearer"}
    answers.on("/instance/service-accounts/default/token", (200, json.dumps(token)))
    path = "/v1/projects/lab-project/secrets/burst-munge-key/versions/latest:access"
    version = "projects/1/secrets/burst-munge-key/versions/1"
    payload = {"name": version, "payload": {"data": base64.b64encode(KEY).decode()}}
    answers.on(path, (200, json.dumps(payload)))
    answers.on("/instance/network-interfaces/0/ip", (200, NODE_ADDRESS))
    keys = base64.b64encode(_tunnel_keys("gcp-h100-003").encode()).decode()
    answers.on(
        "/v1/projects/lab-project/secrets/burst-gcph100-tunnel-keys/versions/latest:access",
        (200, json.dumps({"payload": {"data": keys}})),
    )
    node, lines = Node(tmp_path), []
    metadata = Metadata("gcp", answers.url)
    key = joining.fetch_key(config, metadata, gcp_api=f"{answers.url}/v1")
    assert key == KEY
    assert node.join(config, metadata, lines, gcp_api=f"{answers.url}/v1") == "gcp-h100-003"
    _joined(node, "gcp-h100-003", config, lines)
    metadata_reads = [h for _, p, h in answers.got if not p.startswith("/v1/")]
    assert metadata_reads and all(h.get("metadata-flavor") == "Google" for h in metadata_reads)
    secret_reads = [h for _, p, h in answers.got if p == path]
    assert secret_reads and all(h["authorization"] == "Bearer ya29.token" for h in secret_reads)


def test_an_azure_node_reads_its_name_and_its_identitys_key_vault_secret(
    answers: Answers, tmp_path: Path
) -> None:
    """Azure's instance metadata service (Metadata: true) names the VM, which the burst program
    named as its node; its token for the user-assigned identity (client_id) has the vaults'
    audience; Key Vault's GET of the secret answers its value."""
    vault = f"{answers.url}/secrets/burst-munge-key"
    keys = f"{answers.url}/secrets/burst-azh100-tunnel-keys"
    given = json.loads(_pool_config("azure").to_json())
    assert given["tunnel_secret"].endswith(".vault.azure.net/secrets/burst-azh100-tunnel-keys")
    config = parse_join_config(
        json.dumps({**given, "secret": vault, "identity": "cid-1", "tunnel_secret": keys})
    )
    answers.on("/metadata/instance/compute/name?api-version=2021-02-01&format=text", (200, "az-1"))
    token = (
        "/metadata/identity/oauth2/token?api-version=2018-02-01"
        "&resource=https%3A%2F%2Fvault.azure.net&client_id=cid-1"
    )
    answers.on(token, (200, json.dumps({"access_token": "eyJ0", "expires_in": "3599"})))
    answers.on(
        "/secrets/burst-munge-key?api-version=7.4",
        (200, json.dumps({"value": base64.b64encode(KEY).decode(), "id": vault})),
    )
    answers.on(
        "/metadata/instance/network/interface/0/ipv4/ipAddress/0/privateIpAddress"
        "?api-version=2021-02-01&format=text",
        (200, NODE_ADDRESS),
    )
    answers.on(
        "/secrets/burst-azh100-tunnel-keys?api-version=7.4",
        (200, json.dumps({"value": base64.b64encode(_tunnel_keys("az-1").encode()).decode()})),
    )
    answers.on(  # a regular VM: no spot notice watch
        "/metadata/instance/compute/priority?api-version=2021-02-01&format=text", (200, "Regular")
    )
    node, lines = Node(tmp_path), []
    assert node.join(config, Metadata("azure", answers.url), lines) == "az-1"
    _joined(node, "az-1", config, lines)
    imds = [h for _, p, h in answers.got if p.startswith("/metadata/")]
    assert len(imds) == 5 and all(h.get("metadata") == "true" for h in imds)
    reads = [h for _, p, h in answers.got if p.startswith("/secrets/")]
    assert len(reads) == 2 and all(h["authorization"] == "Bearer eyJ0" for h in reads)


def test_a_node_of_an_ha_pair_knows_both_controllers_primary_first(
    answers: Answers, tmp_path: Path
) -> None:
    """Two heads: each is in /etc/hosts (the stale line of the first replaced), and slurmd asks
    the primary, then the backup, for its configuration (`--conf-server A,B`)."""
    pair = (("head01", "10.20.0.10"), ("head02", "10.20.0.11"))
    untunneled = {"tunnel_endpoint": "", "tunnel_routes": [], "tunnel_secret": ""}
    given = {**json.loads(_pool_config("gcp").to_json()), **untunneled}
    config = parse_join_config(json.dumps({**given, "controllers": pair}))
    assert parse_join_config(config.to_json()) == config
    answers.on("/instance/name", (200, "gcp-h100-001"))
    answers.on("/project/project-id", (200, "lab-project"))
    answers.on("/instance/service-accounts/default/token", (200, '{"access_token": "t"}'))
    path = "/v1/projects/lab-project/secrets/burst-munge-key/versions/latest:access"
    answers.on(path, (200, json.dumps({"payload": {"data": base64.b64encode(KEY).decode()}})))
    node, lines = Node(tmp_path), []
    node.join(config, Metadata("gcp", answers.url), lines, gcp_api=f"{answers.url}/v1")
    hosts = (node.root / "etc" / "hosts").read_text()
    assert hosts == "127.0.0.1 localhost\n10.20.0.10 head01\n10.20.0.11 head02\n"
    assert (node.root / "etc" / "default" / "slurmd").read_text() == (
        'SLURMD_OPTIONS="--conf-server 10.20.0.10:6817,10.20.0.11:6817 -N gcp-h100-001"\n'
    )
    assert "join names: ok" in lines[3] and lines[3].endswith(
        "head01 at 10.20.0.10, head02 at 10.20.0.11"
    )


def test_a_remote_node_of_an_ha_pair_dials_both_heads(answers: Answers, tmp_path: Path) -> None:
    """Two heads and a remote pool: the tunnel secret holds both heads' public keys, the join
    configuration each one's endpoint; the node's wg-quick file has a peer for each, the first
    carrying the cluster's ranges and the second its own address alone. A secret that names
    fewer heads than the configuration stops the join before munge and slurmd."""
    pair = (("head01", "10.20.0.10"), ("head02", "10.20.0.11"))
    given = json.loads(_pool_config("gcp").to_json())
    doc = {**given, "controllers": pair, "tunnel_backups": ["vpn2.example.org:51820"]}
    config = parse_join_config(json.dumps(doc))
    assert parse_join_config(config.to_json()) == config
    with pytest.raises(ValueError, match="one per controller after the first"):
        parse_join_config(json.dumps({**doc, "tunnel_backups": ["a:1", "b:2"]}))
    second = base64.b64encode(secrets.token_bytes(32)).decode()
    answers.on("/instance/name", (200, "gcp-h100-001"))
    answers.on("/project/project-id", (200, "lab-project"))
    answers.on("/instance/service-accounts/default/token", (200, '{"access_token": "t"}'))
    path = "/v1/projects/lab-project/secrets/burst-munge-key/versions/latest:access"
    answers.on(path, (200, json.dumps({"payload": {"data": base64.b64encode(KEY).decode()}})))
    answers.on("/instance/network-interfaces/0/ip", (200, NODE_ADDRESS))
    tunnel = "/v1/projects/lab-project/secrets/burst-gcph100-tunnel-keys/versions/latest:access"
    secret = json.loads(_tunnel_keys("gcp-h100-001"))
    for backups in ([second], []):
        text = json.dumps({**secret, "backups": backups}).encode()
        answers.on(
            tunnel, (200, json.dumps({"payload": {"data": base64.b64encode(text).decode()}}))
        )
        node, lines = Node(tmp_path / str(len(backups))), []
        api = f"{answers.url}/v1"
        if not backups:
            with pytest.raises(BurstError, match="names 0 other heads, the join 1"):
                node.join(config, Metadata("gcp", answers.url), lines, gcp_api=api)
            assert not (node.root / "etc" / "default" / "slurmd").exists()
            continue
        node.join(config, Metadata("gcp", answers.url), lines, gcp_api=api)
        conf = (node.root / "etc" / "wireguard" / "wg-provision.conf").read_text()
        peers = conf.split("[Peer]")[1:]
        assert len(peers) == 2
        assert f"PublicKey = {HUB_KEY}" in peers[0] and "10.20.0.11/32" not in peers[0]
        assert f"Endpoint = {config.tunnel_endpoint}" in peers[0]
        assert f"PublicKey = {second}" in peers[1]
        assert "Endpoint = vpn2.example.org:51820" in peers[1]
        assert "AllowedIPs = 10.20.0.11/32" in peers[1]
        assert any(line.endswith("and vpn2.example.org:51820") for line in lines), lines


def test_a_refusing_secret_store_is_named_with_its_status(answers: Answers) -> None:
    config = _pool_config("gcp")
    answers.on("/project/project-id", (200, "lab-project"))
    answers.on("/instance/service-accounts/default/token", (200, '{"access_token": "t"}'))
    with pytest.raises(BurstError, match=r"^the secret store refused: HTTP 404"):
        joining.fetch_key(config, Metadata("gcp", answers.url), gcp_api=f"{answers.url}/v1")


def test_an_answer_without_the_secret_is_named_by_its_store(answers: Answers) -> None:
    config = _pool_config("gcp")
    answers.on("/project/project-id", (200, "lab-project"))
    answers.on("/instance/service-accounts/default/token", (200, '{"access_token": "t"}'))
    path = "/v1/projects/lab-project/secrets/burst-munge-key/versions/latest:access"
    answers.on(path, (200, '{"name": "v1"}'))
    with pytest.raises(BurstError, match=r"^Secret Manager: the answer holds no secret value$"):
        joining.fetch_key(config, Metadata("gcp", answers.url), gcp_api=f"{answers.url}/v1")


def test_a_refused_identity_is_asked_again_until_its_grant_arrives(answers: Answers) -> None:
    """Azure applies a new role assignment within minutes, IAM a new policy within seconds:
    a 403 is asked again (here twice, then the grant is there); one that lasts past the wait
    ends with it; a missing secret (404) was never asked twice."""
    vault = f"{answers.url}/secrets/burst-munge-key"
    config = JoinConfig(**{**json.loads(_pool_config("azure").to_json()), "secret": vault})
    token = (
        "/metadata/identity/oauth2/token?api-version=2018-02-01"
        "&resource=https%3A%2F%2Fvault.azure.net"
    )
    answers.on(token, (200, json.dumps({"access_token": "eyJ0", "expires_in": "3599"})))
    secret = "/secrets/burst-munge-key?api-version=7.4"
    denied = (403, json.dumps({"error": {"code": "Forbidden", "message": "not yet"}}))
    value = (200, json.dumps({"value": base64.b64encode(KEY).decode()}))
    answers.on(secret, denied, denied, value)
    metadata = Metadata("azure", answers.url)
    assert joining.fetch_key(config, metadata, poll_s=0) == KEY
    assert [p for _, p, _ in answers.got].count(secret) == 3
    answers.on(secret, denied)
    with pytest.raises(BurstError, match=r"^the secret store refused: HTTP 403: not yet"):
        joining.fetch_key(config, metadata, denied_wait_s=0, poll_s=0)
    answers.got.clear()
    answers.on(secret, (404, json.dumps({"error": {"code": "SecretNotFound", "message": "no"}})))
    with pytest.raises(BurstError, match=r"HTTP 404"):
        joining.fetch_key(config, metadata, poll_s=0)
    assert [p for _, p, _ in answers.got].count(secret) == 1


# --- a spot node's watch for its cloud's reclaim notice (provision/burst/notice.py) -----------


def test_a_spot_node_starts_its_watch_and_marks_itself_down_on_ec2s_notice(
    answers: Answers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EC2's metadata says the instance is spot: the join starts the watch as a transient unit
    (the wheel on its path). The watch looks at spot/instance-action every poll: nothing (404)
    until EC2 posts the notice, then the node marks itself DOWN with EC2's words, a reason the
    reconciler's cooldown takes back; an expired session token is made anew."""
    from provision.burst import notice, slurm

    _aws_imds(answers, "aws-h100-003")
    answers.on("/latest/meta-data/instance-life-cycle", (200, "spot"))
    node = Node(tmp_path / "root")
    monkeypatch.setenv("PYTHONPATH", "/opt/provision/gpu-provision.whl")
    config = _pool_config("aws")
    metadata = Metadata("aws", answers.url)
    # the key's and the tunnel's fetch are the other tests'
    monkeypatch.setattr(joining, "fetch_key", lambda *a: KEY)
    monkeypatch.setattr(joining, "fetch_secret", lambda *a: _tunnel_keys("aws-h100-003").encode())
    lines: list[str] = []
    node.join(config, metadata, lines)
    assert node.calls[-1] == (
        "systemd-run",
        "--unit=provision-spot-notice",
        "--property=Restart=on-failure",
        "--property=RestartSec=5",
        "--setenv=PYTHONPATH=/opt/provision/gpu-provision.whl",
        "python3",
        "-m",
        "provision.burst",
        "notice",
    )
    assert lines[-1].startswith("join spot: ok") and "provision-spot-notice" in lines[-1]

    action = json.dumps({"action": "terminate", "time": "2026-12-04T21:40:00Z"})
    answers.on(
        "/latest/meta-data/spot/instance-action", (404, ""), (404, ""), (401, ""), (200, action)
    )
    marked: list[tuple[str, str]] = []
    slept: list[float] = []
    said: list[str] = []
    why = notice.watch(
        metadata,
        "aws-h100-003",
        said.append,
        mark=lambda n, w: marked.append((n, w)),
        sleep=slept.append,
    )
    assert why == "EC2 will terminate the instance at 2026-12-04T21:40:00Z"
    assert marked == [("aws-h100-003", why)] and slept == [5, 5]
    tokens = [p for m, p, _ in answers.got if m == "PUT"]
    assert len(tokens) == 2  # the first session's, and one more after the 401
    # the reason the node gives itself, through root's scontrol (slurmd's cached configuration)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "scontrol.txt"
    (bin_dir / "scontrol").write_text(
        f'#!/bin/sh\necho "$SLURM_CONF $*" >> {record}\n', encoding="utf-8"
    )
    (bin_dir / "scontrol").chmod(0o755)
    cached = tmp_path / "conf-cache" / "slurm.conf"
    cached.parent.mkdir()
    cached.write_text("ClusterName=burst\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(notice, "CONF_CACHES", (tmp_path / "nowhere", cached))
    notice.mark_self_down("aws-h100-003", why)
    conf, rest = record.read_text().split(" ", 1)
    assert conf == str(cached)
    assert rest.strip() == (
        "update NodeName=aws-h100-003 State=DOWN Reason=burst: spot notice "
        "(EC2 will terminate the instance at 2026-12-04T21:40:00Z)"
    )
    assert rest.split("Reason=", 1)[1].startswith(slurm.COOLDOWN_REASONS)


def test_a_gcp_spot_vm_watches_instance_preempted(answers: Answers) -> None:
    """Compute Engine's metadata: scheduling/preemptible TRUE; the watch waits on
    instance/preempted (wait_for_change) until it turns TRUE; a look that fails is said and
    made again."""
    from provision.burst import notice

    answers.on("/instance/scheduling/preemptible", (200, "TRUE"))
    path = f"/instance/preempted?wait_for_change=true&timeout_sec={notice.GCP_WAIT_S}"
    answers.on(path, (200, "FALSE"), (503, ""), (200, "TRUE"))
    metadata = Metadata("gcp", answers.url)
    assert metadata.spot()
    marked: list[tuple[str, str]] = []
    said: list[str] = []
    why = notice.watch(
        metadata, "gcp-h100-001", said.append, mark=lambda n, w: marked.append((n, w)),
        sleep=lambda s: None,
    )  # fmt: skip
    assert why == "Compute Engine is preempting the VM"
    assert marked == [("gcp-h100-001", why)]
    assert any("HTTP 503" in line and "looking again" in line for line in said)
    assert all(h.get("metadata-flavor") == "Google" for _, p, h in answers.got if "preempt" in p)
    # an on-demand VM: no watch
    answers.on("/instance/scheduling/preemptible", (200, "FALSE"))
    assert not metadata.spot()


def test_an_azure_spot_vm_watches_its_scheduled_events(answers: Answers) -> None:
    """Azure's metadata: compute/priority Spot; the watch reads Scheduled Events (Metadata:
    true) until a Preempt event names this VM (another VM's, or another kind of event, is not
    this one's notice); a look that fails is said and made again."""
    from provision.burst import notice

    priority = "/metadata/instance/compute/priority?api-version=2021-02-01&format=text"
    answers.on(priority, (200, "Spot"))
    events = "/metadata/scheduledevents?api-version=2020-07-01"

    def doc(*found: dict[str, object]) -> tuple[int, str]:
        return 200, json.dumps({"DocumentIncarnation": len(found), "Events": list(found)})

    freeze = {"EventType": "Freeze", "Resources": ["az-h100-001"], "NotBefore": ""}
    other = {"EventType": "Preempt", "Resources": ["az-h100-002"], "NotBefore": ""}
    mine = {
        "EventId": "A123",
        "EventType": "Preempt",
        "ResourceType": "VirtualMachine",
        "Resources": ["az-h100-001"],
        "EventStatus": "Scheduled",
        "NotBefore": "Fri, 04 Dec 2026 23:50:00 GMT",
    }
    answers.on(events, doc(), (500, ""), doc(freeze, other), doc(freeze, mine))
    metadata = Metadata("azure", answers.url)
    assert metadata.spot()
    marked: list[tuple[str, str]] = []
    said: list[str] = []
    slept: list[float] = []
    why = notice.watch(
        metadata, "az-h100-001", said.append, mark=lambda n, w: marked.append((n, w)),
        sleep=slept.append,
    )  # fmt: skip
    assert why == "Azure evicts the spot VM at Fri, 04 Dec 2026 23:50:00 GMT"
    assert marked == [("az-h100-001", why)]
    assert any("HTTP 500" in line and "looking again" in line for line in said)
    assert len(slept) == 3  # it polls (Scheduled Events answers at once)
    assert all(h.get("metadata") == "true" for _, p, h in answers.got if "scheduled" in p)
    answers.on(priority, (200, "Regular"))
    assert not metadata.spot()

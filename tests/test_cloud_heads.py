"""Heads in a cloud: a cluster wholly in one cloud, its network the management network. The
cloud's parts run under Pulumi's mocks with the clouds' documented rules (tests/cloud_rules.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import yaml

from provision.render import render

from .conftest import ROOT
from .conftest import run_provision as provision
from .test_cloud import build

DATA = ROOT / "tests" / "data" / "cloud"
SLURM = DATA / "slurm-aws.yaml"


def test_pools_beyond_the_heads_cloud_are_not_supported_yet(tmp_path: Path) -> None:
    text = SLURM.read_text().replace(
        "security:",
        "  - {name: onprem, role: compute, profile: cpu-node, count: 1,\n"
        "     first_address: 10.40.1.1}\nsecurity:",
    )
    path = tmp_path / "mixed.yaml"
    path.write_text(text)
    result = provision("validate", str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"{path}:15: pools[3].provider: not supported yet: with the heads on aws, a pool on "
        "static (the tunnel's hub is a head, and a cloud head's public address is not known "
        "before its instance exists); put every pool on aws, or the heads on premises"
    )


def test_plan_says_the_heads_are_in_the_cloud(tmp_path: Path) -> None:
    result = provision("plan", str(SLURM), "--state-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "aws: the heads are here: its network is the cluster's management network" in text
    assert "WireGuard" not in text


def test_burst_nodes_in_the_heads_cloud_join_its_private_address() -> None:
    """A Slurm cluster wholly in AWS: the elastic pool's user data names the head instance's
    private address (the stack's), and the heads admit the pool's range before its nodes
    exist (they are on the management network, which is the cloud's)."""
    rec, cluster, outputs = build(SLURM, munge_key=b"k" * 32)
    assert outputs["aws"]["head001"]["public"]  # Ansible's way in
    (template,) = [m for m in rec.of("launchTemplate:LaunchTemplate") if m.inputs.get("userData")]
    text = base64.b64decode(template.inputs["userData"]).decode()
    assert "k" * 32 not in text
    config = json.loads(yaml.safe_load(text)["write_files"][0]["content"])
    assert config["controllers"] == [["head001", outputs["aws"]["head001"]["private"]]]
    assert config["tunnel_endpoint"] == ""  # no tunnel: the same network
    sets = render(cluster)["files/nftables/sets.nft"]
    assert "10.40.0.0/16," in sets.split("set cluster_nodes")[1].split("set head_nodes")[0]

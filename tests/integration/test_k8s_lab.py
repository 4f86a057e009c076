"""examples/lab-k8s.yaml through `provision apply`, as a user runs it on a workstation with no
way to the Kubernetes package repository (as here): everything before the packages is built
and running (containerd on every node, a three-member etcd with TLS, the API's virtual address
on 8443 behind keepalived and haproxy), apply stops at the packages naming the repository, and
verify's checks from this machine hold (the API's ports reachable, the kubelet's and etcd's
closed) while its kubectl checks say what is missing.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import ROOT
from ..conftest import run_provision as provision

NAME = "k8stest"
NET = "10.82.0."
REPOSITORY = "https://pkgs.k8s.io/core:/stable:/v1.33/deb/"


@pytest.fixture(scope="module")
def lab(lab_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    work = tmp_path_factory.mktemp("k8s")
    spec = work / "lab-k8s.yaml"
    spec.write_text(
        (ROOT / "examples" / "lab-k8s.yaml")
        .read_text()
        .replace("name: lab-k8s", f"name: {NAME}")
        .replace("10.81.0.", NET)
    )
    provision("destroy", str(spec), "--yes", cwd=work)  # a crashed earlier run's leftovers
    yield spec, work
    provision("destroy", str(spec), "--yes", cwd=work)


def _on(spec: Path, work: Path, node: str, command: str) -> str:
    r = provision("ssh", "-f", str(spec), node, "--", command, cwd=work)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_apply_stops_at_the_packages_with_everything_before_running(
    lab: tuple[Path, Path],
) -> None:
    spec, work = lab
    r = provision("apply", str(spec), cwd=work)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr
    # the last line names the nodes and why: the repository it could not reach
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: apply failed on: cp001, cp002, cp003, worker001, worker002 ("), (
        last
    )
    assert f"cannot reach the Kubernetes package repository {REPOSITORY}" in last, last
    # containerd answers on every node; etcd's three members are healthy, over TLS
    for node in ("cp001", "worker002"):
        assert "Server:" in _on(spec, work, node, "ctr version")
    pki = "/etc/etcd/pki"
    health = _on(
        spec, work, "cp002",
        f"ETCDCTL_API=3 etcdctl --cacert {pki}/ca.crt --cert {pki}/apiserver-etcd-client.crt "
        f"--key {pki}/apiserver-etcd-client.key --endpoints https://127.0.0.1:2379 "
        "endpoint health --cluster -w json",
    )  # fmt: skip
    members = json.loads(health)
    assert len(members) == 3 and all(m["health"] for m in members), health
    # the API's virtual address answers from this machine (an admin address) on 8443
    with socket.create_connection((f"{NET}10", 8443), timeout=5):
        pass


def test_verify_checks_the_ports_and_says_kubectl_is_missing(lab: tuple[Path, Path]) -> None:
    spec, work = lab
    r = provision("verify", str(spec), "--json", cwd=work)
    assert r.returncode == 1, r.stderr
    results = [json.loads(line) for line in r.stdout.splitlines()]
    by_check: dict[str, list[dict[str, object]]] = {}
    for result in results:
        by_check.setdefault(str(result["check"]), []).append(result)
    # from this machine: each head's API ports reachable, the kubelet and etcd closed everywhere
    api = by_check["kubernetes API from workstation"]
    assert [a["target"] for a in api] == ["cp001", "cp002", "cp003"]
    assert all(a["passed"] for a in api), api
    closed = by_check["kubelet and etcd from workstation"]
    assert len(closed) == 5 and all(c["passed"] for c in closed), closed
    # etcd listens on the heads: the firewall, not an empty port, keeps this machine out
    assert all("2379 filtered" in str(c["evidence"]) for c in closed[:3]), closed
    # no kubectl on the heads: the API check fails and says so
    (kube,) = by_check["kubernetes API"]
    assert not kube["passed"] and "kubectl get nodes" in str(kube["evidence"]), kube

"""Repository signing keys: a key file is trusted only if it holds exactly the expected key.

Real keys made here by gpg, read back by `gpg --show-keys --with-colons` as the roles do, and
judged by the roles' own assert expressions (read from their task files)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import ROLES_DIR


def _gpg(home: Path, *args: str, data: bytes | None = None) -> str:
    done = subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", *args],
        input=data,
        capture_output=True,
        check=True,
    )
    return done.stdout.decode()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("gnupg")
    os.chmod(home, 0o700)
    out: dict[str, Any] = {}
    for name in ("vendor", "intruder"):
        _gpg(
            home,
            "--passphrase",
            "",
            "--quick-gen-key",
            f"{name} <{name}@example.org>",
            "ed25519",
            "sign",
            "never",
        )
        listing = _gpg(home, "--with-colons", "--list-keys", f"{name}@example.org")
        out[name] = next(
            line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")
        )
        out[f"{name}.asc"] = _gpg(home, "--armor", "--export", f"{name}@example.org").encode()

    def show(*names: str) -> str:
        blob = b"".join(out[f"{n}.asc"] for n in names)
        return _gpg(home, "--show-keys", "--with-colons", data=blob)

    out["show"] = show
    return out


def _assertion(role: str, tasks: str, name_part: str) -> str:
    for task in yaml.safe_load((ROLES_DIR / role / "tasks" / tasks).read_text()):
        if name_part in task["name"]:
            return str(task["ansible.builtin.assert"]["that"])
    raise AssertionError(f"no task '{name_part}' in {role}/tasks/{tasks}")


def _holds(expression: str, variables: dict[str, Any]) -> bool:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    templar = Templar(loader=DataLoader(), variables=variables)
    return bool(templar.template(trust_as_template("{{ " + expression + " }}")))


@pytest.mark.skipif(
    subprocess.run(["which", "gpg"], capture_output=True).returncode != 0,
    reason="gpg makes the keys",
)
def test_a_key_file_is_trusted_only_with_exactly_the_expected_key(keys: dict[str, Any]) -> None:
    nvidia = _assertion("nvidia_repos", "apt.yml", "fingerprint NVIDIA publishes")
    doca = _assertion("rdma", "doca-key.yml", "exactly the one the spec names")
    grafana = _assertion("grafana", "main.yml", "fingerprint Grafana publishes")
    kubernetes = _assertion("kubernetes_packages", "main.yml", "the Kubernetes project publishes")
    vendor, intruder = keys["vendor"], keys["intruder"]
    cases = {
        ("vendor",): True,
        ("intruder",): False,
        ("vendor", "intruder"): False,  # the right key plus any other: refused
        ("intruder", "vendor"): False,
    }
    for names, trusted in cases.items():
        shown = keys["show"](*names)
        item = {"stdout": shown, "item": {"fingerprint": vendor}}
        assert _holds(nvidia, {"item": item}) is trusted, names
        assert (
            _holds(
                grafana,
                {"_grafana_key_info": {"stdout": shown}, "_grafana_key_fingerprint": vendor},
            )
            is trusted
        ), names
        assert (
            _holds(doca, {"_rdma_doca_key": {"stdout": shown}, "rdma_doca_key_fingerprint": vendor})
            is trusted
        ), names
        assert (
            _holds(
                kubernetes,
                {
                    "_kubernetes_packages_key_info": {"stdout": shown},
                    "_kubernetes_packages_key_fingerprint": vendor,
                },
            )
            is trusted
        ), names
    # a key whose last 64 bits match is still another key
    assert (
        _holds(
            doca,
            {
                "_rdma_doca_key": {"stdout": keys["show"]("vendor")},
                "rdma_doca_key_fingerprint": "0" * 24 + vendor[24:],
            },
        )
        is False
    )
    assert intruder != vendor

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from provision.burst import slurm
from provision.spec import Spec, load_spec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
# the package's Ansible collection: roles, playbooks, the nvidia_gpu_facts module
COLLECTION = ROOT  # the repository's root is the collection's


def collection_module(name: str) -> ModuleType:
    """One of the collection's Ansible modules (plugins/modules/<name>.py), imported."""
    return collection_plugin("modules", name)


def collection_plugin(kind: str, name: str) -> ModuleType:
    """One of the collection's plugins (plugins/<kind>/<name>.py), imported."""
    spec = importlib.util.spec_from_file_location(
        name, COLLECTION / "plugins" / kind / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROLES_DIR = COLLECTION / "roles"
PLAYBOOKS_DIR = COLLECTION / "playbooks"
# Specs of features not built yet (spec/unbuilt.py refuses them): the parts written so far
# are rendered and tested from these, loaded with load_spec(path, unbuilt=True)
UNBUILT = sorted((ROOT / "tests" / "data" / "unbuilt").glob("*.yaml"))


def load_any(path: Path) -> Spec:
    """An example, or an unbuilt feature's spec with its refusals lifted."""
    return load_spec(path, unbuilt=path.parent.name == "unbuilt")


def pytest_configure(config: pytest.Config) -> None:
    """The user's own state directory (where the state of the examples this package carries
    goes) is one of the test run's, never this user's: set before any test starts a process."""
    if not os.environ.get("PROVISION_TEST_STATE_HOME"):
        home = tempfile.mkdtemp(prefix="provision-test-state-")
        os.environ["PROVISION_TEST_STATE_HOME"] = home
        os.environ["XDG_STATE_HOME"] = home


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        help="rewrite tests/golden/ and inventories/ from the renderer instead of comparing",
    )


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-goldens"))


def run_provision(
    *args: str, cwd: Path | None = None, stdin: str | None = None, timeout: float = 1200
) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it: a real process, its exit code and its output."""
    return subprocess.run(
        [sys.executable, "-m", "provision", *args],
        cwd=cwd or ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_golden(golden: Path, got: str, update: bool) -> None:
    """`got` must equal the golden file; with --update-goldens it becomes the golden file."""
    if update:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(got)
    assert golden.exists(), "make goldens"
    assert got == golden.read_text(), "after a deliberate change: make goldens"


def load_rendered(text: str) -> object:
    """A rendered inventory or group_vars file as Ansible reads it (`!unsafe` strings as data)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.constructor import SafeConstructor

    class Loader(SafeConstructor):
        pass

    Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))
    yaml = YAML(typ="safe", pure=True)
    yaml.Constructor = Loader
    return yaml.load(text)


def unwrap_unsafe(value: object) -> object:
    """ansible-inventory's JSON marks unsafe strings {'__ansible_unsafe': s}: take s back."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: unwrap_unsafe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap_unsafe(v) for v in value]
    return value


@pytest.fixture
def scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A recording scontrol: each call's arguments, one line; `show node` prints the file
    `states` in tmp_path, `ping` the file `ping`."""
    calls = tmp_path / "scontrol-calls"
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" >> {calls}\n'
        f'[ "$1" = show ] && cat {tmp_path / "states"} 2>/dev/null\n'
        f'[ "$1" = ping ] && cat {tmp_path / "ping"} 2>/dev/null\n'
        "exit 0\n"
    )
    script.chmod(0o755)
    monkeypatch.setattr(slurm, "SCONTROL", str(script))
    return calls


class _KeyOfAnyNode(dict[str, str]):
    """A hub's peers: a made-up public key for any node's name (the same for a name)."""

    def get(self, node: str, default: object = None) -> str:  # type: ignore[override]
        return base64.b64encode(hashlib.sha256(node.encode()).digest()).decode()


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The burst programs' end of the tunnel with a recording `wg` (its calls in hub.calls)
    and its state in tmp_path/tunnel."""
    from provision.burst import programs
    from provision.burst.tunnel import Hub

    calls: list[tuple[str, ...]] = []
    fake = Hub(_KeyOfAnyNode(), tmp_path / "tunnel", lambda *argv: calls.append(argv))
    fake.calls = calls  # type: ignore[attr-defined]
    monkeypatch.setattr(programs, "hub", lambda: fake)
    return fake


def third_party_imports(wheel: Path, module: str) -> list[str]:
    """The top-level modules outside the standard library that importing `module` from the
    wheel loads (an isolated interpreter; the import machinery's own left out)."""
    probe = (
        f"import sys; sys.path.insert(0, sys.argv[1]); import {module}; "
        "top = {m.split('.')[0] for m in sys.modules}; "
        "print(' '.join(sorted(top - set(sys.stdlib_module_names) - {'provision', '__main__'})))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe, str(wheel)], capture_output=True, text=True, check=True
    )
    return [m for m in done.stdout.split() if not m.startswith("_")]


# an elastic lab pool of two nodes, for a spec's `pools:` (examples/lab-ha.yaml's HA pair
# bursting: tests/test_burst.py renders it, tests/integration/test_ha.py runs it)
BURST_POOL = """  - name: burst
    role: compute
    profile: lab-container
    provider: lab
    count: 2
    elastic: true
"""


def with_burst_pool(example: str) -> str:
    """A spec's text with BURST_POOL right after its compute pool's lines."""
    lines = example.splitlines(keepends=True)
    at = lines.index("  - name: compute\n") + 1
    while at < len(lines) and lines[at].startswith("    "):
        at += 1
    return "".join([*lines[:at], BURST_POOL, *lines[at:]])


def rsa_key() -> tuple[Any, bytes]:
    """A new RSA 2048 key and its private half as unencrypted PKCS#8 PEM (a service account's
    key, an OIDC issuer's key)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key, pem

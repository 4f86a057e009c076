"""The CLI as a user runs it: real processes, real exit codes, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT
from .conftest import run_provision as provision

BAD = Path(__file__).parent / "data" / "bad_specs"


def test_validate_ok() -> None:
    r = provision("validate", "examples/dgx-superpod.yaml")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1
    assert "cluster 'superpod': slurm on ubuntu22.04, 37 nodes" in r.stdout
    assert "272 GPUs" in r.stdout


def test_validate_default_is_the_lab() -> None:
    r = provision("validate")
    assert r.returncode == 0
    assert "cluster 'lab'" in r.stdout


@pytest.mark.parametrize(
    "name",
    ["02-typo-key.yaml", "03-duplicate-key.yaml", "32-yaml-syntax.yaml", "12-admin-world.yaml"],
)
def test_validate_bad_exits_2_without_traceback(name: str) -> None:
    r = provision("validate", str(BAD / name))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr + r.stdout
    assert r.stderr.startswith(f"{BAD / name}:")
    assert r.stdout == ""


def test_missing_spec_exits_2() -> None:
    r = provision("validate", "nope.yaml")
    assert (r.returncode, r.stderr.strip()) == (2, "nope.yaml: file not found")


def test_unknown_verb_exits_2() -> None:
    assert provision("frobnicate").returncode == 2


def test_render_to_out_and_default_state_dir(tmp_path: Path) -> None:
    r = provision("render", str(ROOT / "examples" / "lab.yaml"), "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "b" / "files" / "slurm" / "slurm.conf").exists()
    r = provision("render", str(ROOT / "examples" / "lab.yaml"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # a spec this package carries: the state is the user's own ($XDG_STATE_HOME, the test
    # run's), not under the working directory
    own = Path(os.environ["XDG_STATE_HOME"]) / "provision"
    assert (own / "lab" / "build" / "inventory" / "hosts.yml").exists()
    assert not (tmp_path / ".provision").exists()
    again = provision("render", str(ROOT / "examples" / "lab.yaml"), cwd=ROOT)
    assert "(0 changed)" in again.stdout


def test_plan_prints_power_cost_and_diff(tmp_path: Path) -> None:
    r = provision("plan", "examples/hybrid-cloud.yaml", "--state-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    # 1.1 kW head + 4 x 2.8 kW L40S + 6 x 10.2 kW H100 in three clouds
    assert "Peak power" in r.stdout and "73.50" in r.stdout
    assert "483.22" in r.stdout  # USD per hour: 2 x (55.04 + 88.25 + 98.32)
    r = provision("plan", "examples/lab.yaml", "--diff", "--state-dir", str(tmp_path))
    assert "+++ build/files/slurm/slurm.conf" in r.stdout


def test_schema_is_json() -> None:
    r = provision("schema")
    assert r.returncode == 0
    assert json.loads(r.stdout)["title"] == "Spec"


def test_apply_unreachable_static_host_stops_at_preflight(tmp_path: Path) -> None:
    """Hosts that refuse SSH: preflight names them, exit 1, no Ansible run, no apply recorded.
    (A host lost in the middle of the Ansible run is tests/integration/test_lab.py's case.)"""
    spec = tmp_path / "c.yaml"
    spec.write_text(
        "name: unreach\nos: debian12\nnetwork: {management: {cidr: 127.0.0.0/24}}\n"
        "pools:\n"
        "  - {name: head, role: head, profile: cpu-node,\n"
        "     hosts: [{name: h1, address: 127.0.0.2}]}\n"
        "  - {name: cpu, role: compute, profile: cpu-node,\n"
        "     hosts: [{name: c1, address: 127.0.0.3}]}\n"
        "security: {admin_cidrs: [127.0.0.1/32]}\nssh: {port: 1}\n"
    )
    r = provision("apply", str(spec), "--state-dir", str(tmp_path / "state"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert r.stderr == "error: preflight failed on: c1, h1; nothing was changed on any node\n"
    assert "preflight FAIL ssh h1: 127.0.0.2:1:" in r.stdout
    assert r.stdout.count("preflight FAIL ssh") == 2  # once per host, not repeated
    state = tmp_path / "state" / "unreach"
    assert not (state / "applied").exists()
    assert not any((state / "logs").iterdir())  # Ansible never started
    assert (state / "build" / "inventory" / "hosts.yml").exists()


def test_verify_before_apply_is_a_usage_error(tmp_path: Path) -> None:
    r = provision("verify", "examples/dgx-superpod.yaml", "--state-dir", str(tmp_path))
    assert r.returncode == 2
    assert "run apply first" in r.stderr


def test_destroy_static_forgets_state_only(tmp_path: Path) -> None:
    provision("render", "examples/dgx-superpod.yaml", "--state-dir", str(tmp_path))
    assert (tmp_path / "superpod").exists()
    r = provision("destroy", "examples/dgx-superpod.yaml", "--state-dir", str(tmp_path), "--yes")
    assert r.returncode == 0, r.stderr
    assert "static hosts are left as they are" in r.stdout
    assert not (tmp_path / "superpod").exists()


def test_destroy_asks_first(tmp_path: Path) -> None:
    provision("render", "examples/dgx-superpod.yaml", "--state-dir", str(tmp_path))
    r = provision(
        "destroy", "examples/dgx-superpod.yaml", "--state-dir", str(tmp_path), stdin="n\n"
    )
    assert r.returncode == 1
    assert (tmp_path / "superpod").exists()


def test_destroy_without_an_answer_changes_nothing(tmp_path: Path) -> None:
    provision("render", "examples/dgx-superpod.yaml", "--state-dir", str(tmp_path))
    r = provision("destroy", "examples/dgx-superpod.yaml", "--state-dir", str(tmp_path), stdin="")
    assert r.returncode == 1
    assert "aborted: nothing was changed" in r.stderr
    assert "internal error" not in r.stderr
    assert (tmp_path / "superpod").exists()


FAKE_SSH = """#!/bin/sh
# stands for ssh: records its words, one per line, then answers as a node would
printf '%s\\n' "$@" > "$(dirname "$0")/argv"
echo "from the node"
echo "on stderr" >&2
exit 7
"""


def _ssh(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "ssh").write_text(FAKE_SSH)
    (bindir / "ssh").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "provision", "ssh",
                           "--state-dir", str(tmp_path / "state"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip


def test_ssh_runs_the_command_with_the_clusters_key_and_passes_its_exit_code(
    tmp_path: Path,
) -> None:
    keys = tmp_path / "state" / "lab" / "keys"
    keys.mkdir(parents=True)
    (keys / "id_ed25519").write_text("a key\n")
    r = _ssh(tmp_path, "compute002", "-f", "examples/lab.yaml", "--", "sinfo", "-h", "-N")
    assert r.returncode == 7, r.stderr
    assert r.stdout == "from the node\n" and r.stderr == "on stderr\n"
    argv = (tmp_path / "bin" / "argv").read_text().splitlines()
    known = tmp_path / "state" / "lab" / "known_hosts"
    assert argv[argv.index("--") :] == ["--", "10.77.0.13", "sinfo", "-h", "-N"]
    assert f"UserKnownHostsFile={known.resolve()}" in argv
    assert "StrictHostKeyChecking=accept-new" in argv
    assert argv[argv.index("-i") + 1] == str((keys / "id_ed25519").resolve())
    assert argv[argv.index("-l") + 1] == "root" and argv[argv.index("-p") + 1] == "22"


def test_ssh_without_a_command_opens_a_shell(tmp_path: Path) -> None:
    r = _ssh(tmp_path, "head001", "-f", "examples/lab.yaml")
    assert r.returncode == 7, r.stderr
    argv = (tmp_path / "bin" / "argv").read_text().splitlines()
    assert argv[-2:] == ["--", "10.77.0.11"] and "-i" not in argv  # no key made yet


def test_ssh_to_an_unknown_node_or_one_without_an_address_is_exit_2(tmp_path: Path) -> None:
    r = _ssh(tmp_path, "head999", "-f", "examples/lab.yaml")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "no node named 'head999' (the nodes: compute[001-002],head001)" in r.stderr
    r = _ssh(tmp_path, "aws-h100-001", "-f", "examples/hybrid-cloud.yaml", "--", "true")
    assert r.returncode == 2, r.stderr
    assert "aws-h100-001 has no known address yet: run apply" in r.stderr
    assert not (tmp_path / "bin" / "argv").exists()


def test_ssh_forward_reaches_a_nodes_loopback_port() -> None:
    from provision.errors import UsageError
    from provision.head import forward_options

    assert forward_options(["9090"], with_command=False) == [
        "-o", "ExitOnForwardFailure=yes", "-L", "127.0.0.1:9090:127.0.0.1:9090", "-N",
    ]  # fmt: skip
    assert forward_options(["19093:9093"], with_command=True) == [
        "-o", "ExitOnForwardFailure=yes", "-L", "127.0.0.1:19093:127.0.0.1:9093",
    ]  # fmt: skip
    for bad in ("0", "70000", "a:9090", "9090:", "1:2:3", "9090 -oProxyCommand=x"):
        with pytest.raises(UsageError, match="--forward"):
            forward_options([bad], with_command=False)

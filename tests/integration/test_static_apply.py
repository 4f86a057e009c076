"""`provision apply` for the static provider, for real: SSH, Ansible, the common role, verify,
and a second apply that changes nothing."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from ..conftest import PLAYBOOKS_DIR
from ..conftest import run_provision as provision
from .conftest import OPERATOR


def test_apply_static_hosts(static_hosts: dict[str, str], ssh_key: Path, tmp_path: Path) -> None:
    admin_key = tmp_path / "admin"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(admin_key)], check=True
    )
    admin_pub = admin_key.with_suffix(".pub").read_text().strip()
    spec = tmp_path / "static.yaml"
    spec.write_text(f"""
name: stat
os: debian12
slurm:
  config:  # these "existing hosts" are containers: no writable cgroups (see examples/lab.yaml)
    ProctrackType: proctrack/linuxproc
    TaskPlugin: task/affinity
    JobAcctGatherType: jobacct_gather/linux
network:
  management: {{cidr: 10.78.0.0/24, domain: test.internal}}
  # st-cpu1's own network, which reaches the head only through NAT: the tunnel joins them
  remote: [{{name: far, cidr: 10.84.0.0/24}}]
  tunnel: {{sources: [10.78.0.1/32]}}  # where the NAT sends st-cpu1's packets from
pools:
  - {{name: head, role: head, profile: small, hosts: [{{name: st-head, address: 10.78.0.11}}]}}
  # on the site's network: it reaches st-cpu1 through the head
  - {{name: near, role: compute, profile: small, hosts: [{{name: st-cpu0, address: 10.78.0.12}}]}}
  - name: cpu
    role: compute
    profile: small
    network: far
    hosts: [{{name: st-cpu1, address: 10.84.0.12}}]
profiles:  # what these container "hosts" really have, so slurmd's registration is valid
  small:
    description: a small existing host
    providers: [static]
    cpu: {{model: any, sockets: 1, cores_per_socket: 1, threads_per_core: 1}}
    memory_gib: 1
    max_power_w: 50
security:
  admin_cidrs: [10.78.0.1/32, 10.84.0.1/32]  # this machine, on either network
  admins:
    - name: alice
      ssh_keys: ["{admin_pub}"]
# as most sites log in: not root, with sudo (Ansible, verify, drain and resume go through it)
ssh: {{user: {OPERATOR}, private_key_file: {ssh_key}}}
""")
    first = provision("apply", str(spec), cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    # 7 checks per node, sinfo per compute node, hold, srun per pool, 8 port checks, the tunnel
    assert "verify: 37 passed, 0 failed" in first.stdout
    assert "PASS tunnel st-cpu1: last handshake " in first.stdout
    assert "PASS srun st-cpu0: job" in first.stdout and "PASS srun st-cpu1: job" in first.stdout
    assert "PASS time sync st-cpu1: chrony is active" in first.stdout

    print("\n".join(line for line in first.stdout.splitlines() if "port" in line))
    _through_the_tunnel_only(ssh_key, tmp_path / ".provision" / "stat")
    # st-cpu0, on the site's network, sends st-cpu1's range to the head. (Its packets are not
    # followed further: this machine's bridge netfilter masquerades what one podman network
    # sends to another address through a container, so st-cpu1 would see this machine.)
    assert _on(ssh_key, "10.78.0.12", "ip route get 10.84.0.12").stdout.split()[2] == "10.78.0.11"

    # an operator's drain and resume through sudo, as the login user is not root
    drained = provision("drain", "st-cpu0", "-f", str(spec), "--reason", "new DIMM", cwd=tmp_path)
    assert drained.returncode == 0, drained.stdout + drained.stderr
    shown = _on(ssh_key, "10.78.0.11", "sinfo -h -n st-cpu0 -o '%T|%E'").stdout.strip()
    assert shown == "drained|new DIMM", shown
    resumed = provision("resume", "st-cpu0", "-f", str(spec), cwd=tmp_path)
    assert resumed.returncode == 0 and "jobs may start there again" in resumed.stdout, (
        resumed.stdout + resumed.stderr
    )
    # idle again once slurmctld has heard from it (a resumed node may show idle* until then)
    deadline = time.monotonic() + 120
    while (shown := _on(ssh_key, "10.78.0.11", "sinfo -h -n st-cpu0 -o %T").stdout.strip()) != (
        "idle"
    ) and time.monotonic() < deadline:
        time.sleep(2)
    assert shown == "idle", shown

    second = provision("apply", str(spec), "--full", cwd=tmp_path)  # the roles, idempotent
    assert second.returncode == 0, second.stdout + second.stderr
    assert "apply: done (0 change(s))" in second.stdout
    third = provision("apply", str(spec), cwd=tmp_path)  # nothing changed: probed, skipped
    assert "as the last apply left them" in third.stdout, third.stdout
    assert "ansible:" not in third.stdout

    # The admin user logs in with its own key and has sudo; nobody gets in with a password.
    login = subprocess.run(
        [
            "ssh",
            "-i",
            str(admin_key),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "alice@10.84.0.12",
            "sudo -n id -u; hostname",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert login.stdout.split() == ["0", "st-cpu1"], login.stderr
    _keys_outside_the_homes(ssh_key, admin_key, tmp_path)

    # Compute nodes take their time from the head pool, which serves the management network.
    sources = subprocess.run(
        [
            "ssh",
            "-i",
            str(ssh_key),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "root@10.84.0.12",
            "chronyc sources",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "st-head" in sources.stdout

    # Run logs keep Ansible's settings, not the user's environment (which may hold credentials).
    state = tmp_path / ".provision" / "stat"
    for command in (state / "logs").glob("*/command"):
        env = json.loads(command.read_text())["env"]
        assert all(k.startswith("ANSIBLE_") or k == "PATH" for k in env), sorted(env)
    assert (state / "applied" / "files" / "hosts").exists()
    assert oct((state / "logs").stat().st_mode & 0o777) == "0o700"

    # verify on demand, and it notices drift: a node whose hosts file lost the cluster entries
    subprocess.run(
        [
            "ssh",
            "-i",
            str(ssh_key),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "root@10.84.0.12",
            "sed -i '/provision cluster/,/provision cluster/d' /etc/hosts",
        ],
        check=True,
    )
    drift = provision("verify", str(spec), cwd=tmp_path)
    assert drift.returncode == 1
    assert "FAIL /etc/hosts st-cpu1: missing: 10.78.0.11 st-head.test.internal st-head" in (
        drift.stdout
    )
    healed = provision("apply", str(spec), cwd=tmp_path)
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert "verify: 37 passed, 0 failed" in healed.stdout, healed.stdout


def _login(key: Path, user: str, address: str) -> subprocess.CompletedProcess[str]:
    """A new SSH session (no shared connection), which sshd authenticates afresh."""
    return subprocess.run(
        ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "ControlMaster=no", "-o",
         "ControlPath=none", "-o", "StrictHostKeyChecking=no", "-o",
         "UserKnownHostsFile=/dev/null", f"{user}@{address}", "id -un"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def _keys_outside_the_homes(ssh_key: Path, admin_key: Path, tmp_path: Path) -> None:
    """The keys sshd takes are root's files in /etc/ssh, not in the homes: with the homes' .ssh
    hidden (as a shared /home mounted over them hides them), the admin and the login user still
    get in; a key put in an admin's home is not one sshd takes (the spec's keys alone)."""
    node = "10.84.0.12"
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    show = "sshd -T -C user={},host=h,addr=10.0.0.1 | grep ^authorizedkeysfile"
    assert _on(ssh_key, node, show.format("alice")).stdout.strip() == (
        "authorizedkeysfile /etc/ssh/provision-keys/%u"
    )
    assert _on(ssh_key, node, show.format(OPERATOR)).stdout.strip() == (
        "authorizedkeysfile .ssh/authorized_keys /etc/ssh/provision-keys/%u "
        "/etc/ssh/provision-login-keys/%u"
    )
    hide = f"mv /home/{OPERATOR}/.ssh /home/{OPERATOR}/.ssh.hidden"
    plant = (
        "install -d -m 700 -o alice -g alice /home/alice/.ssh && install -m 600 -o alice "
        "-g alice /dev/stdin /home/alice/.ssh/authorized_keys"
    )
    assert _on(ssh_key, node, hide).returncode == 0
    try:
        planted = subprocess.run(
            ["ssh", "-i", str(ssh_key), "-o", "StrictHostKeyChecking=no", "-o",
             "UserKnownHostsFile=/dev/null", f"root@{node}", plant],
            input=other.with_suffix(".pub").read_text(), capture_output=True, text=True,
            check=False, timeout=60,
        )  # fmt: skip
        assert planted.returncode == 0, planted.stderr
        assert _login(ssh_key, OPERATOR, node).stdout.strip() == OPERATOR
        assert _login(admin_key, "alice", node).stdout.strip() == "alice"
        refused = _login(other, "alice", node)
        assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused
    finally:
        _on(
            ssh_key, node,
            f"rm -rf /home/alice/.ssh; mv /home/{OPERATOR}/.ssh.hidden /home/{OPERATOR}/.ssh",
        )  # fmt: skip


def _on(key: Path, address: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no", "-o",
         "UserKnownHostsFile=/dev/null", f"root@{address}", command],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def _through_the_tunnel_only(key: Path, state: Path) -> None:
    """st-cpu1 (10.84.0.12) and st-head talk through WireGuard; without the route into the
    tunnel the head still reaches st-cpu1 through the NAT, and st-cpu1's slurmd answers it not."""
    head, node = "10.78.0.11", "10.84.0.12"
    probe = f"timeout 3 bash -c '</dev/tcp/{node}/6818'; echo $?"
    assert _on(key, head, f"ip route get {node}").stdout.split()[2] == "wg-provision"
    handshakes = _on(key, head, "wg show wg-provision latest-handshakes").stdout.split()
    assert len(handshakes) == 2 and int(handshakes[1]) > 0, handshakes
    assert _on(key, head, probe).stdout.strip() == "0"  # open, through the tunnel
    # the tunnel's keys: 0600 on the workstation and on the node
    for path in (state / "secrets" / "wireguard").glob("*.key"):
        assert oct(path.stat().st_mode & 0o777) == "0o600", path
    conf = "stat -c %a /etc/wireguard/wg-provision.conf"
    assert _on(key, node, conf).stdout.strip() == "600"
    # the head's route into the tunnel gone, it reaches st-cpu1 through the NAT, and is dropped
    down = _on(key, head, f"ip route del 10.84.0.0/24 dev wg-provision; ip route get {node}")
    assert " dev eth0 " in down.stdout, down.stdout + down.stderr
    try:
        assert _on(key, head, probe).stdout.strip() == "124"  # dropped: not from the tunnel
    finally:
        _on(key, head, "ip route replace 10.84.0.0/24 dev wg-provision src 10.78.0.11")
    assert _on(key, head, probe).stdout.strip() == "0"


def test_rendered_playbook_paths_exist() -> None:
    from provision.assets import playbook

    assert playbook("site.yml") == PLAYBOOKS_DIR / "site.yml" and playbook("site.yml").exists()

"""A shared /home on a root-squashing NFS export, for real: two VMs with their own kernels (the
lab's containers have no NFS client or server of their own), the head serving /srv/home with the
kernel's NFS server (storage.nfs_server: kernel; nfs-ganesha, the default, runs live in
Molecule's storage scenario), and every node mounting it as /home with the kernel's NFS client.
The login user is not root and its own home is under /home, as on most sites: the mount hides
its keys, and root cannot write there.

`provision apply --tags common,storage` runs the roles up to and including the shared storage and
the homes on it (the users, sshd, the NFS server, the mounts), the part of site.yml that root
squash and the mount's order reach; the Slurm and GPU roles after it are the lab tests'.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import run_provision as provision
from .conftest import OPERATOR
from .vms import VM, bridge, build_disk

NODES = {"sq-head": "10.91.0.11", "sq-cpu0": "10.91.0.12"}


@pytest.fixture
def vms(lab_image: str, ssh_key: Path, tmp_path: Path) -> Iterator[dict[str, VM]]:
    if subprocess.run(["which", "qemu-system-x86_64"], capture_output=True).returncode != 0:
        pytest.fail("needs qemu-system-x86 (scripts/setup.sh installs it)")
    work = tmp_path / "vms"
    work.mkdir()
    disk = build_disk(lab_image, work, ssh_key.with_suffix(".pub"), OPERATOR)
    with bridge("provision-vm0", "10.91.0.1/24") as br:
        machines = {name: VM(name, address, disk, br, work) for name, address in NODES.items()}
        try:
            for vm in machines.values():
                vm.start()
            for vm in machines.values():
                print(f"{vm.name}: SSH after {vm.wait_for_ssh(ssh_key):.0f} s")
            yield machines
        finally:
            for vm in machines.values():
                vm.stop()


def test_a_root_squashed_home_on_nfs(vms: dict[str, VM], ssh_key: Path, tmp_path: Path) -> None:
    admin_key = tmp_path / "alice"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(admin_key)], check=True
    )
    spec = tmp_path / "squash.yaml"
    spec.write_text(f"""
name: squash
os: debian12
network:
  management: {{cidr: 10.91.0.0/24, domain: test.internal}}
pools:
  - {{name: head, role: head, profile: vm, hosts: [{{name: sq-head, address: 10.91.0.11}}]}}
  - {{name: cpu, role: compute, profile: vm, hosts: [{{name: sq-cpu0, address: 10.91.0.12}}]}}
profiles:
  vm:
    description: a one-CPU virtual machine
    providers: [static]
    cpu: {{model: any, sockets: 1, cores_per_socket: 1, threads_per_core: 1}}
    memory_gib: 1
    max_power_w: 50
storage:
  nfs_server: kernel
  exports:
    # squash: root, the default (root on a client is nobody here)
    - {{pool: head, path: /srv/home, clients: [{{pools: [head, cpu]}}]}}
  mounts:
    - {{source: "sq-head:/srv/home", path: /home, options: "rw,hard,_netdev"}}
security:
  admin_cidrs: [10.91.0.1/32]
  admins:
    - name: alice
      uid: 5001
      ssh_keys: ["{admin_key.with_suffix(".pub").read_text().strip()}"]
ssh: {{user: {OPERATOR}, private_key_file: {ssh_key}}}
""")
    first = provision("apply", str(spec), "--tags", "common,storage", cwd=tmp_path, timeout=1500)
    assert first.returncode == 0, first.stdout + first.stderr

    head, cpu = vms["sq-head"], vms["sq-cpu0"]
    # the compute node: the kernel's NFS client, under the server's root squash
    mounted = cpu.ssh(ssh_key, "root", "findmnt -n -o FSTYPE,SOURCE /home").stdout.split()
    assert mounted == ["nfs4", "sq-head:/srv/home"], mounted
    refused = cpu.ssh(ssh_key, "root", "touch /home/by-root")
    assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused
    # the server binds its own directory there, never an NFS mount of itself
    bound = head.ssh(ssh_key, "root", "findmnt -n -o FSTYPE,SOURCE /home").stdout.split()
    assert bound == ["ext4", "/dev/vda[/srv/home]"], bound
    # the kernel's server, NFSv4 alone, exporting to the two nodes with root squash
    served = head.ssh(ssh_key, "root", "cat /proc/fs/nfsd/versions; exportfs -v")
    assert "-3" in served.stdout.split() and "+4.2" in served.stdout.split(), served
    assert "root_squash" in served.stdout and "no_root_squash" not in served.stdout, served
    for vm in (head, cpu):
        # the login user's keys were under the home the mount hides: it still logs in
        again = vm.ssh(ssh_key, OPERATOR, "id -un; sudo -n id -u; pwd")
        assert again.stdout.split() == [OPERATOR, "0", f"/home/{OPERATOR}"], (vm.name, again)
        # the admin logs in with its own key, at home on the share, by its pinned uid
        alice = vm.ssh(admin_key, "alice", f"id -u; cd && pwd && echo {vm.name} > from-$(hostname)")
        assert alice.returncode == 0 and alice.stdout.split() == ["5001", "/home/alice"], alice
    # one home for both nodes, made on the server by its owner's uid (0700)
    made = head.ssh(ssh_key, "root", "stat -c '%u %a' /srv/home/alice; cat /srv/home/alice/from-*")
    assert made.stdout.split() == ["5001", "700", "sq-cpu0", "sq-head"], made

    second = provision("apply", str(spec), "--tags", "common,storage", cwd=tmp_path, timeout=1500)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "apply: done (0 change(s))" in second.stdout, second.stdout

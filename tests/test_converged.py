"""What a converge left on each node, its drift probe (run by a real shell against real files,
with a stand-in systemctl) and the fingerprint that decides whether a node may be skipped."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import yaml

from provision import converged
from provision.converged import Left
from provision.state import State


def _sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _probe(
    left: Left, tmp_path: Path, running: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    systemctl = bindir / "systemctl"
    # `systemctl is-active --quiet -- NAME`: 0 for the running ones
    cases = "|".join(running) or "__none__"
    systemctl.write_text(f'#!/bin/sh\ncase "$4" in {cases}) exit 0;; esac\nexit 3\n')
    systemctl.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    return subprocess.run(
        ["sh", "-c", left.probe()], env=env, capture_output=True, text=True, check=False
    )


def test_probe_passes_while_files_and_services_are_as_left(tmp_path: Path) -> None:
    conf = tmp_path / "chrony.conf"
    conf.write_text("pool 10.77.0.1 iburst\n")
    odd = tmp_path / 'it\'s a "name" with $(spaces).conf'  # quoted, never run
    odd.write_text("x\n")
    left = Left({str(conf): _sha1(conf), str(odd): _sha1(odd)}, ["chrony", "munge"])
    r = _probe(left, tmp_path, running=("chrony", "munge"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == ""


def test_probe_names_a_changed_or_missing_file(tmp_path: Path) -> None:
    conf, gone = tmp_path / "slurm.conf", tmp_path / "gres.conf"
    conf.write_text("ClusterName=lab\n")
    gone.write_text("\n")
    left = Left({str(conf): _sha1(conf), str(gone): _sha1(gone)}, [])
    conf.write_text("ClusterName=lab\n# a hand edit\n")
    gone.unlink()
    r = _probe(left, tmp_path)
    assert r.returncode == 1
    assert f"{conf}: FAILED" in r.stdout and str(gone) in r.stdout


def test_probe_names_a_stopped_service(tmp_path: Path) -> None:
    r = _probe(Left({}, ["slurmd", "munge"]), tmp_path, running=("munge",))
    assert r.returncode == 1
    assert r.stdout.strip() == "slurmd: not running"


def test_an_empty_record_probes_true(tmp_path: Path) -> None:
    assert _probe(Left(), tmp_path).returncode == 0


def _ok(host: str, action: str, **res: object) -> dict[str, object]:
    return {
        "event": "runner_on_ok",
        "event_data": {"host": host, "resolved_action": action, "res": res},
    }


def test_what_a_run_left_comes_from_its_results() -> None:
    events = [
        _ok("h1", "ansible.builtin.template", dest="/etc/chrony.conf", checksum="a" * 40),
        _ok(
            "h1",
            "ansible.builtin.copy",
            results=[
                {"dest": "/etc/slurm/slurm.conf", "checksum": "b" * 40},
                {"skipped": True, "dest": "/etc/slurm/gres.conf"},
            ],
        ),
        _ok("h1", "ansible.builtin.copy", censored="hidden", dest="/etc/munge/munge.key"),
        _ok("h1", "ansible.builtin.systemd_service", name="munge", state="started"),
        _ok("h1", "ansible.builtin.systemd_service", name="munge", state="started"),
        _ok("h1", "ansible.builtin.systemd_service", name="slurmd", enabled=True),  # not started
        _ok("h2", "ansible.builtin.file", path="/etc/slurm", state="directory"),  # not read
        {"event": "runner_on_skipped", "event_data": {"host": "h2"}},
    ]
    left = converged.from_events(events)
    assert left["h1"].files == {"/etc/chrony.conf": "a" * 40, "/etc/slurm/slurm.conf": "b" * 40}
    assert left["h1"].services == ["munge"]
    assert "h2" not in left


INVENTORY = """all:
  vars:
    ansible_user: root
  children:
    head:
      hosts:
        head001: {ansible_host: 10.0.0.1}
    compute:
      hosts:
        cpu001: {ansible_host: 10.0.0.2}
        cpu002: {ansible_host: 10.0.0.3}
        gpu001: {ansible_host: 10.0.0.4}
    tunnel:
      hosts:
        cpu001: {tunnel_role: routed}
    pool_head:
      vars: {provision_pool: head}
      hosts: {head001: }
    pool_cpu:
      vars: {provision_pool: cpu, mounts_filesystems: []}
      hosts: {cpu001: , cpu002: }
    pool_gpu:
      vars: {provision_pool: gpu}
      hosts: {gpu001: }
"""
RENDER = {
    "inventory/hosts.yml": INVENTORY,
    "inventory/group_vars/all.yml": "provision_cluster: lab\n",
    "files/slurm/slurm.conf": "A=1\n",
    "files/nftables/address-sets.nft": "set compute {}\n",
    "files/nftables/cpu.nft": "tcp dport 22 accept\n",
    "files/nftables/gpu.nft": "tcp dport 22 accept\n",
    "files/health/cpu.json": "{}\n",
    "files/nccl/gpu.conf": "NCCL_DEBUG=WARN\n",
}


def _changed(before: converged.Prints, after: converged.Prints) -> list[str]:
    return sorted(h for h in before.nodes if before.nodes[h] != after.nodes.get(h))


def test_each_nodes_fingerprint_follows_what_its_pool_and_every_node_are_given(
    tmp_path: Path,
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "munge.key").write_bytes(b"k" * 32)
    first = converged.prints(RENDER, secrets)
    assert first.pool_of == {"head001": "head", "cpu001": "cpu", "cpu002": "cpu", "gpu001": "gpu"}
    assert converged.prints(dict(RENDER), secrets) == first
    assert first.nodes["cpu001"] == first.nodes["cpu002"] != first.nodes["gpu001"]
    everyone = sorted(first.nodes)

    def after(**files: str) -> list[str]:
        return _changed(first, converged.prints({**RENDER, **files}, secrets))

    # one pool's variables, its nodes' host variables, its own files: that pool's nodes
    cpu_mounts = INVENTORY.replace("mounts_filesystems: []", "mounts_filesystems: [/scratch]")
    assert after(**{"inventory/hosts.yml": cpu_mounts}) == ["cpu001", "cpu002"]
    routed = INVENTORY.replace("tunnel_role: routed", "tunnel_role: hub")
    assert after(**{"inventory/hosts.yml": routed}) == ["cpu001", "cpu002"]
    assert after(**{"files/nftables/gpu.nft": "tcp dport 2222 accept\n"}) == ["gpu001"]
    assert after(**{"files/health/cpu.json": '{"gpus": 0}\n'}) == ["cpu001", "cpu002"]
    assert after(**{"files/nccl/gpu.conf": "NCCL_DEBUG=INFO\n"}) == ["gpu001"]
    # what every node is given: every node
    assert after(**{"files/slurm/slurm.conf": "A=2\n"}) == everyone
    assert after(**{"files/nftables/address-sets.nft": "set compute { 10.0.0.5 }\n"}) == everyone
    assert after(**{"inventory/group_vars/all.yml": "provision_cluster: lab2\n"}) == everyone
    moved = INVENTORY.replace("10.0.0.4", "10.0.0.9")  # an address: the hosts file, the sets
    assert after(**{"inventory/hosts.yml": moved}) == everyone
    user = INVENTORY.replace("ansible_user: root", "ansible_user: admin")
    assert after(**{"inventory/hosts.yml": user}) == everyone
    grown = INVENTORY.replace("hosts: {cpu001: , cpu002: }", "hosts: {cpu001: , cpu002: , x: }")
    assert after(**{"inventory/hosts.yml": grown}) == everyone
    # a file the render did not have before: every node's unless named for a pool
    assert after(**{"files/slurm/plugstack.conf": "x\n"}) == everyone
    assert after(**{"files/health/gpu.json": "{}\n"}) == ["gpu001"]

    (secrets / "munge.key").write_bytes(b"j" * 32)
    second = converged.prints(RENDER, secrets)
    assert _changed(first, second) == everyone
    assert "k" * 32 not in repr(first)
    # a key in a subdirectory (the tunnel's) counts as much: rotated, the nodes converge again
    (secrets / "wireguard").mkdir()
    (secrets / "wireguard" / "cpu1.key").write_bytes(b"w" * 45)
    third = converged.prints(RENDER, secrets)
    assert _changed(second, third) == everyone
    (secrets / "wireguard" / "cpu1.key").write_bytes(b"v" * 45)
    assert _changed(third, converged.prints(RENDER, secrets)) == everyone


def test_an_inventory_it_cannot_split_makes_every_change_everyones(tmp_path: Path) -> None:
    nested = INVENTORY.replace("    pool_gpu:\n", "    pool_gpu:\n      children: {}\n")
    render = {**RENDER, "inventory/hosts.yml": nested}
    first = converged.prints(render, tmp_path)
    cpu_mounts = nested.replace("mounts_filesystems: []", "mounts_filesystems: [/scratch]")
    changed = converged.prints({**render, "inventory/hosts.yml": cpu_mounts}, tmp_path)
    assert _changed(first, changed) == ["cpu001", "cpu002", "gpu001", "head001"]
    health = converged.prints({**render, "files/health/cpu.json": "[]\n"}, tmp_path)
    assert _changed(first, health) == ["cpu001", "cpu002", "gpu001", "head001"]


def test_the_pools_files_are_the_ones_the_roles_read_by_a_pool_or_node_name() -> None:
    """converged.POOL_FILES and HOST_FILES are what the roles' defaults, variables, tasks and
    the playbooks name with provision_pool or inventory_hostname under provision_files_dir,
    no more and no fewer: a role that read a pool's file under another name would not see
    that pool's changes."""
    import jinja2

    root = Path(__file__).resolve().parents[1]
    named: dict[str, set[str]] = {"pool": set(), "host": set()}
    env = jinja2.Environment(undefined=jinja2.ChainableUndefined)
    marks = {"provision_files_dir": "files", "provision_pool": "\x00pool", "inventory_hostname":
             "\x00host"}  # fmt: skip
    paths = [*root.glob("roles/*/*/*.yml"), *root.glob("playbooks/*.yml")]
    for path in paths:
        for line in path.read_text().splitlines():
            if "provision_files_dir" not in line or "{{" not in line:
                continue
            value = line.split(":", 1)[1].strip().strip('"') if ":" in line else line
            text = env.from_string(value).render(**marks)
            for kind in named:
                if f"\x00{kind}" in text:
                    named[kind].add(text.replace(f"\x00{kind}", "{}"))
    assert named["pool"] == set(converged.POOL_FILES)
    assert named["host"] == set(converged.HOST_FILES)


def test_the_roles_read_other_nodes_variables_only_within_their_pool() -> None:
    """A node's fingerprint holds its own pool's variables and no other pool's: a role that
    read another node's variables (hostvars[...]) would converge with stale values when that
    node's pool changed alone. The one place they are read: keepalived's peers, the heads."""
    root = Path(__file__).resolve().parents[1]
    readers = sorted(
        str(p.relative_to(root))
        for p in [*root.glob("roles/**/*"), *root.glob("playbooks/**/*")]
        if p.is_file() and "hostvars[" in p.read_text(errors="replace")
    )
    assert readers == ["roles/api_endpoint/templates/keepalived.conf.j2"]
    # its peers are the play's hosts, and the play's are the heads (one pool)
    assert "{% for head in _api_endpoint_heads " in (root / readers[0]).read_text()
    peers = (root / "roles/api_endpoint/vars/main.yml").read_text()
    assert '_api_endpoint_heads: "{{ ansible_play_hosts_all }}"' in peers
    plays = yaml.safe_load((root / "playbooks/site.yml").read_text())
    assert [p["hosts"] for p in plays if "api_endpoint" in str(p.get("tasks"))] == ["head"]


def test_a_record_skips_only_its_hosts_and_only_for_their_fingerprint(tmp_path: Path) -> None:
    state = State(tmp_path, "lab")
    state.ensure()
    assert converged.load(state) is None
    now = converged.prints(RENDER, tmp_path / "none")
    left = Left({"/etc/a": "c" * 40}, ["munge"])
    ran = {"head001": left, "cpu001": Left(), "cpu002": Left(), "gone": Left()}
    converged.save(state, converged.after(None, now, ran))
    record = converged.load(state)
    assert record is not None and record.hosts["head001"] == left
    assert sorted(record.hosts) == ["cpu001", "cpu002", "head001"]  # not in the render: not kept
    assert converged.unchanged(record, now, ["head001", "gpu001"]) == {"head001": left}
    left_, why = converged.skippable(state, now, ["head001", "cpu001", "cpu002", "gpu001"], False)
    assert sorted(left_) == ["cpu001", "cpu002", "head001"]
    assert why == "new since the last converge: gpu001"
    assert converged.skippable(state, now, ["head001"], True) == (
        {}, "elastic pools: their images are made in the converge",
    )  # fmt: skip

    # one pool changed: its nodes converge; after that converge the others are kept as left
    cpu = INVENTORY.replace("mounts_filesystems: []", "mounts_filesystems: [/scratch]")
    later = converged.prints({**RENDER, "inventory/hosts.yml": cpu}, tmp_path / "none")
    left_, why = converged.skippable(state, later, ["head001", "cpu001", "cpu002"], False)
    assert list(left_) == ["head001"]
    assert why == "pool cpu: the pool's variables changed since the last converge: cpu[001-002]"
    kept = converged.after(record, later, {"cpu001": Left({"/etc/fstab": "d" * 40}, [])})
    assert sorted(kept.hosts) == ["cpu001", "head001"]  # cpu002 not converged: not kept
    assert kept.hosts["head001"] == left and kept.prints["cpu001"] == later.nodes["cpu001"]

    # what every node is given changed: every node converges, and says why
    moved = {**RENDER, "files/slurm/slurm.conf": "A=2\n"}
    left_, why = converged.skippable(
        state, converged.prints(moved, tmp_path / "none"), ["head001"], False
    )
    assert (left_, why) == ({}, "what every node is given changed since the last converge "
                             "(files/slurm/slurm.conf)")  # fmt: skip

    converged.forget(state)
    assert converged.load(state) is None
    (state.dir / converged.RECORD).write_text("{not json")
    assert converged.load(state) is None  # a broken record converges every node
    old = '{"fingerprint": "f1", "hosts": {"head001": {"files": {}, "services": []}}}'
    (state.dir / converged.RECORD).write_text(old)
    assert converged.load(state) is None  # so does one of the single fingerprint before


def test_a_hosts_failure_is_the_one_that_stopped_it() -> None:
    """A failure its block rescued is followed by the rescue's own (a message naming what to
    do): the host's result, and apply's last line, show that one."""
    from provision.run.ansible import RunResult, count_event

    result = RunResult(rc=2, status="failed")
    fetch = {"task": "Fetch the signing key", "res": {"msg": "Request failed: <urlopen error>"}}
    say = {"task": "Say which repository", "res": {"msg": "cp001 cannot reach https://repo/"}}
    for data in (fetch, say):
        count_event(result, {"event": "runner_on_failed", "event_data": {"host": "cp001", **data}})
    count_event(
        result,
        {
            "event": "runner_on_failed",
            "event_data": {"host": "cp002", "ignore_errors": True, **say},
        },
    )
    assert result.hosts["cp001"].failure == "Say which repository: cp001 cannot reach https://repo/"
    assert "cp002" not in result.hosts


def test_a_hosts_result_names_the_tasks_that_changed_something() -> None:
    """The record of an apply says which tasks changed each host, in order, with their role;
    an ok that changed nothing and a failure are not among them."""
    from provision.run.ansible import RunResult, count_event

    result = RunResult(rc=0, status="successful")
    events = [
        ("runner_on_ok", {"task": "Write chrony.conf", "role": "chrony", "res": {"changed": True}}),
        ("runner_on_ok", {"task": "Start chrony", "role": "chrony", "res": {"changed": False}}),
        ("runner_on_failed", {"task": "Probe", "res": {"msg": "no"}, "ignore_errors": True}),
        ("runner_on_ok", {"task": "Restart chrony", "res": {"changed": True}}),
    ]
    for kind, data in events:
        count_event(result, {"event": kind, "event_data": {"host": "cp001", **data}})
    assert result.hosts["cp001"].changed_tasks == ["chrony : Write chrony.conf", "Restart chrony"]


def test_on_an_example_a_mount_of_some_pools_converges_those_pools_and_mig_everyone(
    tmp_path: Path,
) -> None:
    """dgx-superpod-ha as rendered: new options for the scratch mount of the gpu and mig
    pools reach those pools' fingerprints alone; a new MIG layout is in slurm.conf, so it
    reaches every node's."""
    from provision.cluster import Cluster
    from provision.render import render
    from provision.spec import load_spec

    examples = Path(__file__).resolve().parents[1] / "examples"
    text = (examples / "dgx-superpod-ha.yaml").read_text()
    ca = "directory-ca.pem"
    (tmp_path / ca).write_bytes((examples / ca).read_bytes())

    def prints(spec_text: str) -> converged.Prints:
        path = tmp_path / "cluster.yaml"
        path.write_text(spec_text)
        return converged.prints(render(Cluster(load_spec(path))), tmp_path / "none")

    first = prints(text)
    scratch = "path: /scratch, pools: [gpu, mig]"
    assert scratch in text
    mounted = prints(text.replace(scratch, scratch + ', options: "_netdev,noatime"'))
    assert sorted({first.pool_of[h] for h in _changed(first, mounted)}) == ["gpu", "mig"]
    mig = "mig: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]"
    assert mig in text
    layout = prints(text.replace(mig, "mig: [2g.20gb, 2g.20gb, 2g.20gb]"))
    assert _changed(first, layout) == sorted(first.nodes)

"""What a converge left on each node, its drift probe (run by a real shell against real files,
with a stand-in systemctl) and the fingerprint that decides whether a node may be skipped."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from provision import converged, roleinputs
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
        _ok(
            "h1",
            "gpu_provision.cluster.files",
            paths=[
                {"path": "/etc/nftables.conf", "changed": False, "checksum": "c" * 40},
                {"path": "/etc/nftables.d", "changed": False},  # a directory: not probed
            ],
        ),
        _ok("h1", "gpu_provision.cluster.files", censored="hidden", paths=[{"path": "/s"}]),
        _ok("h1", "ansible.builtin.copy", censored="hidden", dest="/etc/munge/munge.key"),
        _ok("h1", "ansible.builtin.systemd_service", name="munge", state="started"),
        _ok("h1", "ansible.builtin.systemd_service", name="munge", state="started"),
        _ok("h1", "ansible.builtin.systemd_service", name="slurmd", enabled=True),  # not started
        _ok("h2", "ansible.builtin.file", path="/etc/slurm", state="directory"),  # not read
        {"event": "runner_on_skipped", "event_data": {"host": "h2"}},
    ]
    left = converged.from_events(events)
    assert left["h1"].files == {
        "/etc/chrony.conf": "a" * 40,
        "/etc/slurm/slurm.conf": "b" * 40,
        "/etc/nftables.conf": "c" * 40,
    }
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
    gpu:
      hosts: {gpu001: }
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
    "inventory/group_vars/all.yml": "provision_cluster: lab\nprovision_scheduler: slurm\n",
    "files/hosts": "10.0.0.1 head001\n",
    "files/slurm/slurm.conf": "A=1\n",
    "files/nftables/address-sets.nft": "set compute {}\n",
    "files/nftables/cpu.nft": "tcp dport 22 accept\n",
    "files/nftables/gpu.nft": "tcp dport 22 accept\n",
    "files/health/cpu.json": "{}\n",
    "files/nccl/gpu.conf": "NCCL_DEBUG=WARN\n",
}
HOSTS = ["cpu001", "cpu002", "gpu001", "head001"]
Runs = dict[str, "tuple[str, ...] | None"]


def _recorded(state: State, render: dict[str, str], secrets: Path) -> converged.Prints:
    """A record of every node converged with this render."""
    now = converged.prints(render, secrets)
    converged.save(state, converged.after(None, now, {h: Left() for h in now.hosts}))
    return now


def _runs(state: State, render: dict[str, str], secrets: Path) -> Runs:
    """What a plain apply would run on each node: (): nothing, None: every role."""
    return converged.decide(state, converged.prints(render, secrets), HOSTS, False).roles


def _only(runs: Runs) -> dict[str, tuple[str, ...] | None]:
    return {h: r for h, r in runs.items() if r != ()}


def test_each_change_runs_the_roles_it_reaches_on_the_nodes_it_reaches(tmp_path: Path) -> None:
    """A pool's file or variable: that role on that pool's nodes; what every node is given
    (the hosts file, the firewall's address sets, slurm.conf, a cluster-wide variable, a
    secret): the roles that read it, on every node they run on; a node's own variables or
    groups: every role there; a change no role claims: everything everywhere."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "munge.key").write_bytes(b"k" * 32)
    state = State(tmp_path, "lab")
    state.ensure()
    first = _recorded(state, RENDER, secrets)
    assert first.pool_of == {"head001": "head", "cpu001": "cpu", "cpu002": "cpu", "gpu001": "gpu"}
    assert converged.prints(dict(RENDER), secrets) == first
    assert first.pools["cpu"] != first.pools["gpu"]
    assert "nvidia_driver" in first.pools["gpu"] and "nvidia_driver" not in first.pools["cpu"]
    assert _runs(state, RENDER, secrets) == dict.fromkeys(HOSTS, ())

    def runs(**files: str) -> dict[str, tuple[str, ...] | None]:
        return _only(_runs(state, {**RENDER, **files}, secrets))

    inventory = "inventory/hosts.yml"
    mounts = INVENTORY.replace("mounts_filesystems: []", "mounts_filesystems: [/scratch]")
    assert runs(**{inventory: mounts}) == dict.fromkeys(["cpu001", "cpu002"], ("mounts",))
    assert runs(**{"files/nftables/gpu.nft": "tcp dport 2222 accept\n"}) == {
        "gpu001": ("firewall",)
    }
    assert runs(**{"files/health/cpu.json": '{"gpus": 0}\n'}) == {
        "cpu001": ("health",),
        "cpu002": ("health",),
    }
    assert runs(**{"files/nccl/gpu.conf": "NCCL_DEBUG=INFO\n"}) == {"gpu001": ("nccl",)}
    # what every node is given: on every node, the roles that read it alone
    assert runs(**{"files/hosts": "10.0.0.1 head001 h\n"}) == dict.fromkeys(HOSTS, ("common",))
    sets = {"files/nftables/address-sets.nft": "set compute { 10.0.0.5 }\n"}
    assert runs(**sets) == dict.fromkeys(HOSTS, ("firewall",))
    assert runs(**{"files/slurm/slurm.conf": "A=2\n"}) == dict.fromkeys(HOSTS, ("slurm",))
    renamed = {
        "inventory/group_vars/all.yml": "provision_cluster: lab2\nprovision_scheduler: slurm\n"
    }
    assert set(runs(**renamed)) == set(HOSTS)
    assert all(r and "common" in r and "slurm" in r and "firewall" not in r
               for r in runs(**renamed).values())  # fmt: skip
    # a node's own variables (or address): every role there, and the roles that read the
    # inventory's groups (or their pool's host variables) elsewhere
    routed = runs(**{inventory: INVENTORY.replace("tunnel_role: routed", "tunnel_role: hub")})
    assert routed["cpu001"] is None and "gpu001" not in routed and "head001" not in routed
    moved = runs(**{inventory: INVENTORY.replace("10.0.0.4", "10.0.0.9")})
    assert moved["gpu001"] is None and "slurm" in (moved["head001"] or ())
    # how Ansible reaches every node: every role, everywhere
    user = INVENTORY.replace("ansible_user: root", "ansible_user: admin")
    assert runs(**{inventory: user}) == dict.fromkeys(HOSTS)
    # a file no role claims: everything, everywhere
    assert runs(**{"files/unknown/x.conf": "x\n"}) == dict.fromkeys(HOSTS)

    (secrets / "munge.key").write_bytes(b"j" * 32)
    munge = _only(_runs(state, RENDER, secrets))
    assert munge == {h: ("munge",) for h in HOSTS}
    assert "k" * 32 not in repr(first) and "j" * 32 not in repr(converged.prints(RENDER, secrets))
    # a key in a subdirectory (the tunnel's): the tunnel's role, everywhere it runs
    (secrets / "munge.key").write_bytes(b"k" * 32)
    (secrets / "wireguard").mkdir()
    (secrets / "wireguard" / "cpu1.key").write_bytes(b"w" * 45)
    assert _only(_runs(state, RENDER, secrets)) == {h: ("tunnel",) for h in HOSTS}
    (secrets / "other.key").write_bytes(b"o")  # a secret no role claims: everything
    assert _only(_runs(state, RENDER, secrets)) == dict.fromkeys(HOSTS)


def test_a_change_to_one_role_runs_that_role_alone(tmp_path: Path, monkeypatch: Any) -> None:
    """The role's files are in its fingerprint (in a checkout as in a wheel): an edited role
    runs alone, where it runs."""
    state = State(tmp_path, "lab")
    state.ensure()
    _recorded(state, RENDER, tmp_path / "none")
    catalog = roleinputs.catalog()
    edited = {**catalog, "nccl": dataclasses.replace(catalog["nccl"], digest="edited")}
    monkeypatch.setattr(roleinputs, "catalog", lambda: edited)
    decision = converged.decide(state, converged.prints(RENDER, tmp_path / "none"), HOSTS, False)
    assert _only(decision.roles) == {"gpu001": ("nccl",)}
    assert decision.why == (
        "gpu001: nccl (the role's files) changed since the last converge: that role alone runs"
    )


def test_an_inventory_it_cannot_split_makes_every_change_everyones(tmp_path: Path) -> None:
    nested = INVENTORY.replace("    pool_gpu:\n", "    pool_gpu:\n      children: {}\n")
    render = {**RENDER, "inventory/hosts.yml": nested}
    state = State(tmp_path, "lab")
    state.ensure()
    _recorded(state, render, tmp_path)
    cpu_mounts = nested.replace("mounts_filesystems: []", "mounts_filesystems: [/scratch]")
    assert _only(_runs(state, {**render, "inventory/hosts.yml": cpu_mounts}, tmp_path)) == (
        dict.fromkeys(HOSTS)
    )


def test_the_catalog_finds_what_the_roles_read() -> None:
    """What each role reads by path comes from the roles' own text: the files named for a
    pool or a node, the folders, the secrets; every file any example renders is some role's."""
    catalog = roleinputs.catalog()
    assert catalog["firewall"].files == (
        "files/nftables/address-sets.nft",
        "files/nftables/{pool}.nft",
    )
    assert catalog["nccl"].files == ("files/nccl/{pool}.conf",)
    assert catalog["etcd"].files == ("files/kubernetes/etcd/{host}.env",)
    assert catalog["slurm"].files == ("files/slurm",)
    assert catalog["tunnel"].secrets == ("wireguard",)
    assert catalog["monitoring"].secrets == ("smtp-*.password",)
    assert catalog["munge"].secrets == ("munge.key",)
    assert [r for r in catalog if catalog[r].wheel] == ["burst", "health", "node_exporter"]
    assert catalog["kubernetes_node"].hosts == ("head", "compute:login")
    # apply runs a role alone by its name: every role carries it as a tag in site.yml
    root = Path(__file__).resolve().parents[1]
    site = roleinputs._site(root)
    assert sorted(site) == sorted(catalog)
    assert [name for name, (tags, _, _) in site.items() if name not in tags] == []
    # a role reads no other role's rendered file or secret by that role's variable
    own = {
        name: roleinputs.words(
            "\n".join(
                p.read_text()
                for r in {name, *_drawn(root, name)}
                for p in (root / "roles" / r).rglob("*")
                if p.is_file() and "molecule" not in p.parts
            )
        )
        for name in catalog
    }
    for other in root.glob("roles/*/defaults/main.yml"):
        paths = {
            k
            for k, v in (yaml.safe_load(other.read_text()) or {}).items()
            if "provision_files_dir" in str(v) or "provision_secrets_dir" in str(v)
        }
        for name in catalog:
            if other.parts[-3] not in {name, *_drawn(root, name)}:
                assert not paths & own[name], (name, other.parts[-3], paths & own[name])


def _drawn(root: Path, role: str) -> set[str]:
    """The roles a role includes (their files are its own)."""
    text = "\n".join(p.read_text() for p in (root / "roles" / role).rglob("*.yml"))
    return {m.split(".")[-1] for m in re.findall(r"include_role:\s*\n\s*name:\s*(\S+)", text)}


@pytest.mark.parametrize("example", ["lab.yaml", "dgx-superpod-ha.yaml", "lab-k8s.yaml"])
def test_every_rendered_file_of_an_example_is_read_by_some_role(
    example: str, tmp_path: Path
) -> None:
    rendered = _render_example(example, tmp_path)
    catalog = roleinputs.catalog().values()
    unread = [
        name
        for name in rendered
        if name.startswith("files/") and not any(r.claims_file(name) for r in catalog)
    ]
    assert unread == []


def test_the_roles_read_other_nodes_variables_only_within_their_pool() -> None:
    """A role's parts hold its own pool's host variables and no other pool's: a role that
    read another pool's node's variables (hostvars[...]) would converge with stale values when
    that node's changed alone. The one place they are read: keepalived's peers, the heads."""
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
    assert converged.PEERS_PART in converged.prints(
        {**RENDER, "inventory/hosts.yml": INVENTORY.replace("head:\n", "head:\n", 1)}, root / "x"
    ).pools["head"].get("api_endpoint", {converged.PEERS_PART: ""})


def test_a_record_keeps_what_the_roles_that_did_not_run_left(tmp_path: Path) -> None:
    state = State(tmp_path, "lab")
    state.ensure()
    assert converged.load(state) is None
    none = tmp_path / "none"
    now = converged.prints(RENDER, none)
    left = Left({"/etc/a": "c" * 40}, ["munge"])
    ran = {"head001": left, "cpu001": Left(), "cpu002": Left(), "gone": Left()}
    converged.save(state, converged.after(None, now, ran))
    record = converged.load(state)
    assert record is not None and record.hosts["head001"] == left
    assert sorted(record.hosts) == ["cpu001", "cpu002", "head001"]  # not in the render: not kept
    decision = converged.decide(state, now, HOSTS, False)
    assert sorted(decision.left) == ["cpu001", "cpu002", "head001"]
    assert decision.roles["gpu001"] is None
    assert decision.why == "new since the last converge: gpu001"
    assert converged.decide(state, now, ["head001"], True) == converged.Decision(
        {}, {"head001": None}, "elastic pools: their images are made in the converge"
    )

    # one role changed on every node: what the other roles left is kept, and the new files
    slurm = {**RENDER, "files/slurm/slurm.conf": "A=2\n"}
    later = converged.prints(slurm, none)
    decision = converged.decide(state, later, ["head001", "cpu001"], False)
    assert decision.roles == {"head001": ("slurm",), "cpu001": ("slurm",)}
    assert decision.why == (
        "cpu001,head001: slurm (files/slurm/slurm.conf) changed since the last converge: that "
        "role alone runs"
    )
    newer = Left({"/etc/slurm/slurm.conf": "d" * 40}, ["slurmctld"])
    kept = converged.after(record, later, {"head001": newer}, some=["head001"])
    assert kept.hosts["head001"] == Left(
        {"/etc/a": "c" * 40, "/etc/slurm/slurm.conf": "d" * 40}, ["munge", "slurmctld"]
    )
    assert sorted(kept.hosts) == ["head001"]  # the others were not converged for slurm.conf
    converged.save(state, kept)
    assert converged.decide(state, later, ["head001"], False).roles == {"head001": ()}

    # what every node is given changed: every node converges, and says why
    (none / "x").mkdir(parents=True)
    (none / "x" / "other").write_bytes(b"o")
    decision = converged.decide(state, converged.prints(slurm, none), ["head001"], False)
    assert (decision.roles, decision.why) == (
        {"head001": None},
        "what every node is given changed since the last converge (secret x/other)",
    )

    converged.forget(state)
    assert converged.load(state) is None
    (state.dir / converged.RECORD).write_text("{not json")
    assert converged.load(state) is None  # a broken record converges every node
    host = '{"print": "p", "files": {}, "services": []}'
    old = f'{{"shared": {{}}, "pools": {{}}, "hosts": {{"head001": {host}}}}}'
    (state.dir / converged.RECORD).write_text(old)
    assert converged.load(state) is None  # so does one of a fingerprint per node, before


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


def _render_example(
    name: str, tmp_path: Path, change: tuple[str, str] = ("", "")
) -> dict[str, str]:
    from provision.cluster import Cluster
    from provision.render import render
    from provision.spec import load_spec

    examples = Path(__file__).resolve().parents[1] / "examples"
    text = (examples / name).read_text()
    assert change[0] in text
    ca = "directory-ca.pem"
    (tmp_path / ca).write_bytes((examples / ca).read_bytes())
    path = tmp_path / "cluster.yaml"
    path.write_text(text.replace(*change))
    return render(Cluster(load_spec(path)))


def test_on_an_example_a_mount_of_some_pools_runs_mounts_there_and_mig_everyones_slurm(
    tmp_path: Path,
) -> None:
    """dgx-superpod-ha as rendered: new options for the scratch mount of the gpu and mig
    pools run the mounts role on those pools alone; a new MIG layout runs the MIG role on the
    MIG pool, and is in slurm.conf, so it runs Slurm's role on every node."""
    state = State(tmp_path, "x")
    state.ensure()
    none = tmp_path / "none"
    first = _recorded(state, _render_example("dgx-superpod-ha.yaml", tmp_path), none)
    hosts = sorted(first.hosts)

    def runs(old: str, new: str) -> dict[str, tuple[str, ...] | None]:
        rendered = _render_example("dgx-superpod-ha.yaml", tmp_path, (old, new))
        return _only(converged.decide(state, converged.prints(rendered, none), hosts, False).roles)

    scratch = "path: /scratch, pools: [gpu, mig]"
    mounted = runs(scratch, scratch + ', options: "_netdev,noatime"')
    assert {first.pool_of[h] for h in mounted} == {"gpu", "mig"}
    assert set(mounted.values()) == {("mounts",)}
    mig = "mig: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]"
    layout = runs(mig, "mig: [2g.20gb, 2g.20gb, 2g.20gb]")
    slurm_nodes = [h for h in hosts if "slurm" in first.pools[first.pool_of[h]]]
    assert sorted(layout) == slurm_nodes
    assert all("slurm" in (r or ()) for r in layout.values())
    assert {first.pool_of[h] for h, r in layout.items() if "nvidia_mig" in (r or ())} == {"mig"}


def test_on_the_lab_a_new_compute_node_runs_on_the_others_what_names_every_node(
    tmp_path: Path,
) -> None:
    """lab.yaml with a third compute node: it runs every role; the others run the roles that
    read what names every node (the hosts file, the address sets, slurm.conf, Prometheus'
    targets) and those that read the inventory's groups, and no other."""
    state = State(tmp_path, "lab")
    state.ensure()
    none = tmp_path / "none"
    first = _recorded(state, _render_example("lab.yaml", tmp_path), none)
    old = sorted(first.hosts)
    grown = _render_example("lab.yaml", tmp_path, ("count: 2", "count: 3"))
    now = converged.prints(grown, none)
    decision = converged.decide(state, now, sorted(now.hosts), False)
    added = sorted(set(now.hosts) - set(old))
    assert len(added) == 1 and decision.roles[added[0]] is None
    for host in old:
        roles = set(decision.roles[host] or ())
        assert {"common", "firewall", "slurm"} <= roles, (host, roles)
        assert not roles & {"munge", "mounts", "sssd", "tunnel"}, (host, roles)
    head = next(h for h in old if first.pool_of[h] == "head")
    assert "monitoring" in (decision.roles[head] or ())


def test_a_new_pool_image_runs_the_boot_servers_netboot_role_and_nothing_else(
    tmp_path: Path,
) -> None:
    """metal-lab.yaml converged with its compute pool's image: the same image again runs
    nothing; a new one (new packages) runs the netboot role on the boot server alone, so that
    it serves it even though nothing else of the head changed. plan takes the images as the
    last converge recorded them."""
    state = State(tmp_path, "metal")
    state.ensure()
    none = tmp_path / "none"
    rendered = _render_example("metal-lab.yaml", tmp_path)
    served = converged.given_digests({"netboot_images": {"cpu": "/cache/netboot/aaaa"}}, "head")
    first = converged.prints(rendered, none, served)
    converged.save(state, converged.after(None, first, {h: Left() for h in first.hosts}))
    hosts = sorted(first.hosts)
    assert converged.recorded_given(state) == served
    same = converged.prints(rendered, none, converged.recorded_given(state))
    assert _only(converged.decide(state, same, hosts, False).roles) == {}
    made = converged.given_digests({"netboot_images": {"cpu": "/cache/netboot/bbbb"}}, "head")
    decision = converged.decide(state, converged.prints(rendered, none, made), hosts, False)
    assert _only(decision.roles) == {"head001": ("netboot",)}
    assert "netboot (var netboot_images)" in decision.why
    # without the images (an apply that made none: no pool boots from the network) no role has
    # the part
    bare = converged.prints(rendered, none)
    assert not any(
        "var netboot_images" in parts for r in bare.pools.values() for parts in r.values()
    )


def test_apply_runs_each_set_of_roles_once_the_servers_first_and_records_them_all(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Nodes that need different roles run one set after another (the heads' first, by those
    roles' tags; every role where one needs all, without tags); the record after them holds
    every run's results, and what the roles that did not run left."""
    import json

    from provision import lifecycle
    from provision.cluster import Cluster
    from provision.head import Handle
    from provision.run.ansible import RunResult
    from provision.spec import load_spec

    spec_path = Path(__file__).resolve().parents[1] / "examples" / "lab.yaml"
    cluster = Cluster(load_spec(spec_path))
    state = State(tmp_path, "lab")
    state.ensure()
    none = tmp_path / "none"
    rendered = _render_example("lab.yaml", tmp_path)
    before = converged.prints(rendered, none)
    left = Left({"/etc/chrony/chrony.conf": "a" * 40}, ["chrony"])
    converged.save(state, converged.after(None, before, dict.fromkeys(before.hosts, left)))
    roles: dict[str, tuple[str, ...] | None] = {
        "head001": ("slurm",), "compute001": None, "compute002": ("slurm",),
    }  # fmt: skip
    runs = lifecycle._runs(cluster, roles, everything=False)
    assert runs == [(["head001", "compute002"], ("slurm",)), (["compute001"], None)]
    assert lifecycle._runs(cluster, dict.fromkeys(roles), everything=True) == [(None, None)]
    assert lifecycle._runs(cluster, {**roles, "head001": ()}, everything=False) == [
        (["compute001"], None), (["compute002"], ("slurm",)),
    ]  # fmt: skip

    plays: list[tuple[list[str] | None, str | None]] = []

    def play(_key, run, limit, _extra, _builds=None, tags=None):  # type: ignore[no-untyped-def]
        plays.append((limit, tags))
        log_dir = tmp_path / f"log{len(plays)}"
        (log_dir / "job_events").mkdir(parents=True)
        for n, host in enumerate(limit or []):
            event = {
                "event": "runner_on_ok",
                "event_data": {
                    "host": host,
                    "resolved_action": "ansible.builtin.template",
                    "res": {"dest": f"/etc/{tags or 'all'}.conf", "checksum": "b" * 40},
                },
            }
            (log_dir / "job_events" / f"{n}.json").write_text(json.dumps(event))
        return lifecycle._ran(run, RunResult(0, "successful", log_dir=log_dir))

    monkeypatch.setattr(lifecycle, "_play", play)
    run = lifecycle._Run(
        Handle(spec_path, cluster.spec, cluster, state),
        lambda _m: None,
        lifecycle.ApplyReport(),
        lifecycle.Leaving(),
        lifecycle.Scope(),
        [n.name for n in cluster.lasting_nodes],
    )
    later = converged.prints({**rendered, "files/slurm/slurm.conf": "changed\n"}, none)
    lifecycle._converge_and_record(cluster, None, run, {}, runs, later)
    assert plays == [(["head001", "compute002"], "slurm"), (["compute001"], None)]
    record = converged.load(state)
    assert record is not None
    assert record.hosts["head001"].files == {
        "/etc/chrony/chrony.conf": "a" * 40,
        "/etc/slurm.conf": "b" * 40,
    }  # what the other roles left is kept
    assert record.hosts["compute001"].files == {"/etc/all.conf": "b" * 40}
    assert converged.decide(state, later, sorted(later.hosts), False).roles == dict.fromkeys(
        later.hosts, ()
    )

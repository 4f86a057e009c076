"""plan: nodes per provider, groups, file changes against the last apply, power and cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision.cluster import Cluster
from provision.plan import HOURS_PER_MONTH, make_plan
from provision.render import render, write_render
from provision.spec import load_spec
from provision.state import State

from .conftest import ROOT, load_any, run_provision


def test_superpod_power() -> None:
    cluster = Cluster(load_spec(ROOT / "examples" / "dgx-superpod.yaml"))
    plan = make_plan(cluster, State(Path("/nonexistent"), "superpod"))
    by_pool = {p.pool: p for p in plan.power}
    assert by_pool["gpu"].nodes == 32
    assert by_pool["gpu"].kw == pytest.approx(32 * 10.2)
    assert by_pool["mig"].kw == pytest.approx(2 * 10.2)
    assert plan.total_kw == pytest.approx(34 * 10.2 + 3 * 1.1)
    assert plan.cost == []
    assert plan.first_apply
    assert plan.groups["compute"] == "gpu[001-032],mig[001-002]"
    assert plan.providers[0].provider == "static"
    assert len(plan.providers[0].existing) == 37


def test_cloud_cost() -> None:
    cluster = Cluster(load_any(ROOT / "tests" / "data" / "unbuilt" / "cloud-burst.yaml"))
    plan = make_plan(cluster, State(Path("/nonexistent"), "burst"))
    cost = {c.pool: c for c in plan.cost}
    assert set(cost) == {"awsh100", "gcph100", "azh100"}
    assert cost["awsh100"].instance_type == "p5.48xlarge"
    assert cost["awsh100"].usd_per_hour == pytest.approx(16 * 55.04)
    assert cost["azh100"].usd_per_month == pytest.approx(8 * 98.32 * HOURS_PER_MONTH)
    assert all(c.elastic for c in cost.values())
    providers = {p.provider: p for p in plan.providers}
    assert len(providers["aws"].on_demand) == 16 and not providers["aws"].create
    assert plan.lasting_kw == pytest.approx(1.1 + 4 * 2.8)


def test_changes_against_last_apply(tmp_path: Path) -> None:
    spec_path = ROOT / "examples" / "lab.yaml"
    cluster = Cluster(load_spec(spec_path))
    state = State(tmp_path, "lab")
    write_render(render(cluster), state.applied)
    assert make_plan(cluster, state).changes == []

    grown = tmp_path / "lab3.yaml"
    grown.write_text(spec_path.read_text().replace("count: 2", "count: 3"))
    plan = make_plan(Cluster(load_spec(grown)), state)
    changed = {c.path: c for c in plan.changes}
    assert changed["files/slurm/slurm.conf"].kind == "changed"
    assert "+NodeName=compute[001-003]" in changed["files/slurm/slurm.conf"].diff
    assert "-NodeName=compute[001-002]" in changed["files/slurm/slurm.conf"].diff
    assert "+10.77.0.14 compute003.lab.internal compute003" in changed["files/hosts"].diff
    assert "files/nftables/head.nft" not in changed  # rules refer to sets, not addresses
    assert plan.unchanged > 0


def test_plan_names_every_rule_open_to_the_internet(tmp_path: Path) -> None:
    from ruamel.yaml import YAML

    from .conftest import run_provision

    yaml = YAML(typ="rt")
    doc = yaml.load((ROOT / "examples" / "hybrid-cloud.yaml").read_text())
    doc["security"]["firewall_rules"] = [
        {
            "name": "web",
            "port": 443,
            "sources": ["0.0.0.0/0"],
            "open_to_internet": True,
            "pools": ["head", "awsh100"],
        },
        {"name": "lab", "port": 8888, "sources": ["10.0.0.0/8"]},
    ]
    spec = tmp_path / "burst.yaml"
    with spec.open("w") as fh:
        yaml.dump(doc, fh)
    plan = make_plan(Cluster(load_spec(spec)), State(tmp_path, "burst"))
    exposed = {(o.pool, o.where, o.rule.service, o.rule.ports) for o in plan.exposed}
    # the admin network (203.0.113.0/24) is documentation space: private, not listed
    assert exposed == {
        ("head", "nftables", "web", "443"),
        ("awsh100", "AWS security group", "web", "443"),
        # WireGuard answers only its peers' keys: the head listens to any address by default
        ("head", "nftables", "wireguard tunnel from remote nodes", "51820"),
    }
    done = run_provision("plan", str(spec), "--state-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "Open to the internet" in done.stdout
    assert "AWS security group" in done.stdout and "3,702,258,688" in done.stdout


def test_plan_says_what_changes_on_the_running_cluster(tmp_path: Path) -> None:
    spec_path = ROOT / "examples" / "lab.yaml"
    state = State(tmp_path / "state", "lab")
    write_render(render(Cluster(load_spec(spec_path))), state.applied)
    grown = tmp_path / "lab.yaml"
    grown.write_text(spec_path.read_text().replace("count: 2", "count: 3"))
    r = run_provision("plan", str(grown), "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "running cluster: nodes joining: compute003" in r.stdout
    assert (
        "running cluster: slurm: restart slurmctld on head001 and slurmd on compute[001-003]"
        in r.stdout
    )
    assert "  nodes added to slurm.conf: compute003 (needs a restart)" in r.stdout
    r = run_provision(
        "plan", str(grown), "--json", "--state-dir", str(tmp_path / "state"), cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["cluster"] == "lab" and doc["first_apply"] is False
    assert doc["running_cluster"]["nodes_added"] == ["compute003"]
    assert doc["running_cluster"]["slurm"]["action"] == "restart"
    assert {"path": "files/slurm/slurm.conf", "change": "changed"} in doc["files"]
    assert doc["providers"][0]["provider"] == "lab"
    # before any apply: nothing runs, and JSON says so
    r = run_provision(
        "plan", str(grown), "--json", "--state-dir", str(tmp_path / "x"), cwd=tmp_path
    )
    assert json.loads(r.stdout)["running_cluster"] is None


def _applied_then(tmp_path: Path, spec_path: Path, old: str, new: str) -> tuple[Cluster, State]:
    """A state whose last apply rendered spec_path; the cluster of the spec with old -> new."""
    state = State(tmp_path / "state", load_spec(spec_path).name)
    write_render(render(Cluster(load_spec(spec_path))), state.applied)
    changed = tmp_path / spec_path.name
    changed.write_text(spec_path.read_text().replace(old, new))
    return Cluster(load_spec(changed)), state


def test_plan_lists_the_jobs_on_nodes_that_leave(tmp_path: Path) -> None:
    from rich.console import Console

    from provision.plan import ask_leaving_jobs, plan_json
    from provision.views import print_plan

    cluster, state = _applied_then(tmp_path, ROOT / "examples" / "lab.yaml", "count: 2", "count: 1")
    plan = make_plan(cluster, state)
    asked: list[list[str]] = []
    ask_leaving_jobs(plan, lambda nodes: asked.append(nodes) or ["41 alice compute002"])
    assert asked == [["compute002"]]
    console = Console(record=True, width=200)
    print_plan(plan, cluster, console)
    text = console.export_text()
    assert "running cluster: nodes leaving: compute002" in text
    assert "  jobs on them now: 1\n    41 alice compute002\n" in text
    doc = plan_json(plan, cluster)["running_cluster"]
    assert doc["jobs_on_nodes_removed"] == ["41 alice compute002"]

    def unreachable(nodes: list[str]) -> list[str]:
        raise OSError("No route to host")

    ask_leaving_jobs(plan, unreachable)
    console = Console(record=True, width=200)
    print_plan(plan, cluster, console)
    assert "jobs on them: unknown (the head did not answer: No route to host)" in (
        console.export_text()
    )


def test_plan_says_which_gpu_nodes_a_driver_change_reboots(tmp_path: Path) -> None:
    from rich.console import Console

    from provision.plan import plan_json
    from provision.views import print_plan

    dgx = ROOT / "examples" / "dgx-8.yaml"
    cluster, state = _applied_then(
        tmp_path,
        dgx,
        'software:\n  nvidia_driver: "550"',
        'nvidia:\n  reboot: true\nsoftware:\n  nvidia_driver: "560"',
    )
    plan = make_plan(cluster, state)
    console = Console(record=True, width=300)
    print_plan(plan, cluster, console)
    text = console.export_text()
    assert "running cluster: NVIDIA driver changes on dgx[01-08]: rebooted (nvidia.reboot)" in text
    assert "  nvidia_driver_version: 550 -> 560\n" in text
    assert "running cluster: slurm: no change to the daemons" in text
    assert plan_json(plan, cluster)["running_cluster"]["nvidia_driver"] == {
        "why": ["nvidia_driver_version: 550 -> 560"],
        "nodes": [f"dgx0{i}" for i in range(1, 9)],
        "reboot": True,
    }


def test_plan_says_which_nodes_apply_would_probe_and_skip(tmp_path: Path) -> None:
    from provision import converged
    from provision.plan import plan_json

    spec_path = ROOT / "examples" / "lab.yaml"
    cluster = Cluster(load_spec(spec_path))
    state = State(tmp_path, "lab")
    state.ensure()
    plan = make_plan(cluster, state)
    assert plan.probed == [] and "no converge recorded" in plan.converge_why
    stamp = converged.prints(render(cluster), state.secrets)
    hosts = {"head001": converged.Left(), "compute001": converged.Left()}
    converged.save(state, converged.after(None, stamp, hosts))
    plan = make_plan(cluster, state)
    assert plan.probed == ["compute001", "head001"]
    assert plan.converge_why == "new since the last converge: compute002"
    converged.save(state, converged.after(None, stamp, {**hosts, "compute002": converged.Left()}))
    # a change to one pool's files converges that pool's nodes alone: a port opened on the
    # compute pool (its nftables rules)
    jupyter = tmp_path / "jupyter.yaml"
    jupyter.write_text(
        spec_path.read_text().replace(
            "security:\n",
            "security:\n  firewall_rules: [{name: jupyter, port: 8888, sources: [admin], "
            "pools: [compute]}]\n",
        )
    )
    plan = make_plan(Cluster(load_spec(jupyter)), state)
    assert plan.probed == ["head001"]
    assert plan.converge_why == (
        "compute[001-002]: firewall (files/nftables/compute.nft) changed since the last "
        "converge: that role alone runs"
    )
    assert plan.roles == {"compute001": ["firewall"], "compute002": ["firewall"]}
    # a new node: every role there; on the others, the roles that read what names it
    grown = tmp_path / "lab3.yaml"
    grown.write_text(spec_path.read_text().replace("count: 2", "count: 3"))
    plan = make_plan(Cluster(load_spec(grown)), state)
    assert plan.probed == [] and plan.roles["compute003"] is None
    assert "new since the last converge: compute003" in plan.converge_why
    assert "slurm" in (plan.roles["compute001"] or []), plan.converge_why
    doc = plan_json(plan, Cluster(load_spec(grown)))
    assert doc["converge"]["roles"]["compute003"] == "all"


def test_plan_says_how_a_kubernetes_release_moves(tmp_path: Path) -> None:
    from rich.console import Console

    from provision.plan import plan_json
    from provision.views import print_plan

    spec = ROOT / "examples" / "lab-k8s.yaml"
    older = tmp_path / "older" / "lab-k8s.yaml"
    older.parent.mkdir()
    older.write_text(spec.read_text().replace('version: "1.33.5"', 'version: "1.32.9"'))
    cluster, state = _applied_then(tmp_path, older, '"1.32.9"', '"1.33.5"')
    plan = make_plan(cluster, state)
    console = Console(record=True, width=400)
    print_plan(plan, cluster, console)
    text = console.export_text()
    assert (
        "running cluster: Kubernetes 1.32.9 -> 1.33.5: the control plane first, on "
        "cp[001-003] one at a time (kubeadm upgrade apply on the first, upgrade node on the "
        "others, then each drained, its kubelet moved and uncordoned); then worker[001-002]"
    ) in text
    assert "then worker[001-002]: each drained, upgraded and given back" in text
    # a Kubernetes cluster has no Slurm daemons to speak of
    assert "slurm:" not in text
    assert plan_json(plan, cluster)["running_cluster"]["kubernetes_upgrade"] == {
        "from": "1.32.9",
        "to": "1.33.5",
        "heads": ["cp001", "cp002", "cp003"],
        "workers": ["worker001", "worker002"],
    }


@pytest.mark.parametrize(
    ("before", "after", "message"),
    [
        (
            "1.31.4",
            "1.33.5",
            "the cluster runs 1.31.4: kubeadm upgrades one minor release at a time, apply a "
            "1.32 release first, then 1.33.5",
        ),
        ("1.33.5", "1.32.9", "the cluster runs 1.33.5: kubeadm cannot go back to 1.32.9"),
    ],
)
def test_plan_and_apply_refuse_a_release_kubeadm_cannot_reach(
    tmp_path: Path, before: str, after: str, message: str
) -> None:
    spec = ROOT / "examples" / "lab-k8s.yaml"
    older = tmp_path / "older" / "lab-k8s.yaml"
    older.parent.mkdir()
    older.write_text(spec.read_text().replace('version: "1.33.5"', f'version: "{before}"'))
    _applied_then(tmp_path, older, f'"{before}"', f'"{after}"')
    changed = tmp_path / "lab-k8s.yaml"
    for command in ("plan", "apply"):
        r = run_provision(
            command, str(changed), "--state-dir", str(tmp_path / "state"), cwd=tmp_path
        )
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr == f"{changed}:16: kubernetes.version: {message}" + (
            " (restore etcd from a backup taken at that release instead)\n"
            if "back" in message
            else "\n"
        ), r.stderr


def test_heads_joining_a_running_kubernetes_control_plane_are_refused(tmp_path: Path) -> None:
    spec = ROOT / "examples" / "lab-k8s.yaml"
    _applied_then(tmp_path, spec, "    count: 3\n", "    count: 4\n")
    changed = tmp_path / "lab-k8s.yaml"
    r = run_provision("apply", str(changed), "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == (
        f"{changed}:25: pools[0]: not supported yet: heads joining or leaving a running "
        "Kubernetes control plane (cp[001-003] -> cp[001-004]): the API servers' certificates "
        "and the external etcd's members would not follow; keep the heads as they are\n"
    )
    # workers may come and go
    _applied_then(tmp_path, spec, "    count: 2\n", "    count: 3\n")
    r = run_provision("plan", str(changed), "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "running cluster: nodes joining: worker003" in r.stdout

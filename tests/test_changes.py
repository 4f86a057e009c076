"""What a new render changes on a running cluster: nodes that join or leave, and whether the
Slurm daemons re-read their configuration or restart (provision/changes.py)."""

from __future__ import annotations

from pathlib import Path

from provision.changes import (
    InventoryNode,
    SlurmChange,
    changes,
    inventory_nodes,
    slurm_change,
)
from provision.cluster import Cluster
from provision.render import render
from provision.spec import load_spec

from .conftest import ROOT

LAB = ROOT / "examples" / "lab.yaml"
CONF = "files/slurm/slurm.conf"


def _render(tmp_path: Path, old: str = "", new: str = "", name: str = "lab.yaml") -> dict[str, str]:
    spec = tmp_path / name
    spec.write_text(LAB.read_text().replace(old, new) if old else LAB.read_text())
    return render(Cluster(load_spec(spec)))


def test_the_same_render_changes_nothing(tmp_path: Path) -> None:
    files = _render(tmp_path)
    assert slurm_change(files, files).action == "none"
    assert changes(files, files).to_json() == {
        "nodes_added": [],
        "nodes_removed": [],
        "slurm": {"action": "none", "why": []},
    }


def test_a_first_apply_starts_the_daemons(tmp_path: Path) -> None:
    files = _render(tmp_path)
    found = changes({}, files)
    assert found.slurm.action == "new"
    assert found.added == () and found.removed == ()  # nothing runs yet to join


def test_a_timer_or_scheduler_key_is_a_reconfigure(tmp_path: Path) -> None:
    old = _render(tmp_path)
    new = _render(
        tmp_path,
        "    TaskPlugin: task/affinity\n",
        "    TaskPlugin: task/affinity\n    SchedulerParameters: bf_continue\n",
        "new.yaml",
    )
    found = slurm_change(old, new)
    assert found == SlurmChange("reconfigure", ("SchedulerParameters: (unset) -> bf_continue",))
    # a node's weight or features: also re-read
    weighted = {**new, CONF: new[CONF].replace("Weight=1 ", "Weight=7 ")}
    assert slurm_change(new, weighted).action == "reconfigure"
    assert slurm_change(new, weighted).why == ("Weight of compute[001-002]",)


def test_plugins_and_node_sets_need_a_restart(tmp_path: Path) -> None:
    old = _render(tmp_path)
    plugin = _render(tmp_path, "task/affinity\n", "task/none\n", "plugin.yaml")
    found = slurm_change(old, plugin)
    assert found.action == "restart"
    assert found.why == ("TaskPlugin: task/affinity -> task/none (needs a restart)",)
    bigger = _render(tmp_path, "count: 2", "count: 4", "bigger.yaml")
    grown = changes(old, bigger)
    assert grown.added == ("compute003", "compute004") and grown.removed == ()
    assert grown.slurm.action == "restart"
    assert "nodes added to slurm.conf: compute[003-004] (needs a restart)" in grown.slurm.why
    assert "partition compute changed" in grown.slurm.why
    shrunk = changes(bigger, old)
    assert shrunk.removed == ("compute003", "compute004") and shrunk.added == ()
    assert shrunk.nodes["compute003"] == InventoryNode("compute", "compute", "lab")


def test_a_changed_gres_or_cgroup_file_restarts_slurmd(tmp_path: Path) -> None:
    old = _render(tmp_path)
    new = {**old, "files/slurm/gres.conf": old["files/slurm/gres.conf"] + "# changed\n"}
    assert slurm_change(old, new) == SlurmChange(
        "restart", ("gres.conf changed (slurmd reads it at start)",)
    )


def test_inventory_nodes_with_their_pools(tmp_path: Path) -> None:
    files = _render(tmp_path)
    assert inventory_nodes(files["inventory/hosts.yml"]) == {
        "head001": InventoryNode("head", "head", "lab"),
        "compute001": InventoryNode("compute", "compute", "lab"),
        "compute002": InventoryNode("compute", "compute", "lab"),
    }

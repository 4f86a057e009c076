"""What a new render changes on a running cluster: nodes that join or leave, and whether the
Slurm daemons re-read their configuration or restart (provision/changes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.changes import (
    DriverChange,
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
        "nvidia_driver": None,
        "storage": None,
        "kubernetes_upgrade": None,
        "users": None,
        "slurm_accounts": None,
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


DGX = ROOT / "examples" / "dgx-8.yaml"


def _dgx(tmp_path: Path, old: str = "", new: str = "", name: str = "dgx.yaml") -> dict[str, str]:
    spec = tmp_path / name
    spec.write_text(DGX.read_text().replace(old, new) if old else DGX.read_text())
    return render(Cluster(load_spec(spec)))


def test_a_driver_change_reaches_the_gpu_nodes_and_says_whether_they_reboot(
    tmp_path: Path,
) -> None:
    old = _dgx(tmp_path)
    assert changes(old, old).driver is None
    assert inventory_nodes(old["inventory/hosts.yml"])["dgx01"].gpu
    assert not inventory_nodes(old["inventory/hosts.yml"])["head01"].gpu
    newer = _dgx(tmp_path, 'nvidia_driver: "550"', 'nvidia_driver: "560"', "newer.yaml")
    found = changes(old, newer).driver
    assert found == DriverChange(
        ("nvidia_driver_version: 550 -> 560",),
        tuple(f"dgx0{i}" for i in range(1, 9)),
        False,
    )
    assert changes(old, newer).slurm.action == "none"  # the driver is no Slurm change
    rebooting = _dgx(
        tmp_path,
        'software:\n  nvidia_driver: "550"',
        'nvidia:\n  reboot: true\nsoftware:\n  nvidia_driver: "560"',
        "reboot.yaml",
    )
    assert changes(old, rebooting).driver.reboot  # type: ignore[union-attr]
    # nodes new to the cluster are no change of a running node
    fewer = _dgx(tmp_path, "count: 8", "count: 6", "fewer.yaml")
    grown = _dgx(tmp_path, 'nvidia_driver: "550"', 'nvidia_driver: "560"', "grown.yaml")
    assert changes(fewer, grown).driver.nodes == tuple(  # type: ignore[union-attr]
        f"dgx0{i}" for i in range(1, 7)
    )


def test_a_new_slurm_version_restarts_the_daemons(tmp_path: Path) -> None:
    old = _render(tmp_path)
    pinned = _render(tmp_path, "security:", 'software:\n  slurm: "22.05"\nsecurity:', "pin.yaml")
    assert slurm_change(old, pinned) == SlurmChange(
        "restart",
        ("software.slurm: the source's newest -> 22.05 (the packages change: a restart)",),
    )
    assert slurm_change(pinned, pinned).action == "none"


def test_a_rendered_inventory_is_parsed_once_however_often_it_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """plan reads the old and new inventories in several places, apply and the fingerprints
    again: each text is parsed once, and each caller gets the nodes in a dict of its own."""
    import yaml

    from provision import changes

    text = render(Cluster(load_spec(ROOT / "examples" / "lab.yaml")))["inventory/hosts.yml"]
    text += "# read here alone\n"  # a text no other test has parsed
    parsed = []
    real = yaml.load
    monkeypatch.setattr(yaml, "load", lambda *a, **k: parsed.append(1) or real(*a, **k))
    first = changes.inventory_nodes(text)
    first.pop("head001")
    again = changes.inventory_nodes(text)
    assert sorted(again) == ["compute001", "compute002", "head001"]
    assert changes.inventory_document(text) is changes.inventory_document(text)
    assert len(parsed) == 1

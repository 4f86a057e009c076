"""The spec's storage in a lab: which podman volume stands for which served directory, and on
which nodes it is mounted (provision/providers/lab/storage.py). Live: tests/integration/test_ha.py
(a file written on a compute node read on both heads)."""

from __future__ import annotations

from pathlib import Path

from provision.cluster import Cluster
from provision.providers.lab.storage import Volume, lab_volumes, volume_name
from provision.spec import load_spec

from .conftest import ROOT


def test_the_ha_example_shares_home_everywhere_and_the_state_on_the_heads() -> None:
    cluster = Cluster(load_spec(ROOT / "examples" / "lab-ha.yaml"))
    home = Volume(
        volume_name("lab-ha", "filer.lab.internal:/export/home"),
        "filer.lab.internal:/export/home",
        "/home",
    )
    state = Volume(
        volume_name("lab-ha", "filer.lab.internal:/export/slurm"),
        "filer.lab.internal:/export/slurm",
        "/shared/slurm",
    )
    assert lab_volumes(cluster) == {
        "head001": [home, state],
        "head002": [home, state],
        "compute001": [home],
        "compute002": [home],
    }


def _volumes(tmp_path: Path, export: str) -> dict[str, list[Volume]]:
    """The lab example with one export of head001's /srv/data (as given), which the compute
    pool mounts at /data."""
    spec = tmp_path / "lab.yaml"
    storage = (
        f"storage:\n  exports:\n{export}"
        '  mounts:\n    - {source: "head001:/srv/data", path: /data, pools: [compute]}\n'
    )
    spec.write_text(
        (ROOT / "examples" / "lab.yaml").read_text().replace("security:", storage + "security:")
    )
    return lab_volumes(Cluster(load_spec(spec)))


def test_each_node_of_an_export_pool_serves_its_own_and_a_mount_uses_that_one(
    tmp_path: Path,
) -> None:
    found = _volumes(tmp_path, "    - {pool: head, path: /srv/data}\n")
    served = volume_name("lab", "head001:/srv/data")
    assert found == {
        "head001": [Volume(served, "head001:/srv/data", "/srv/data")],
        "compute001": [Volume(served, "head001:/srv/data", "/data")],
        "compute002": [Volume(served, "head001:/srv/data", "/data")],
    }


def test_volume_names_are_podman_names_and_distinct() -> None:
    a = volume_name("lab", "filer.example.org:/export/home")
    b = volume_name("lab", "filer.example.org:/export/home/")
    assert a.startswith("provision-lab-filer-example-org-export-home-") and a != b
    assert all(c.isalnum() or c == "-" for c in a)


def test_a_client_admitted_read_only_mounts_the_volume_read_only(tmp_path: Path) -> None:
    found = _volumes(
        tmp_path,
        "    - pool: head\n      path: /srv/data\n"
        "      clients: [{pools: [compute], access: ro}]\n",
    )
    served = volume_name("lab", "head001:/srv/data")
    assert found["head001"] == [Volume(served, "head001:/srv/data", "/srv/data")]
    assert found["compute001"] == [Volume(served, "head001:/srv/data", "/data", readonly=True)]

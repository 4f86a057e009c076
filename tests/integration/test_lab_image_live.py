"""The lab image as built, for real: current with the sources its nodes use."""

from __future__ import annotations

from provision.providers.lab import podman


def test_the_image_is_current_with_its_nodes_sources(lab_image: str) -> None:
    """It was upgraded from the nodes' own sources (the updates and security suites too) when it
    was built: by the package lists it was built with, apt finds nothing left to upgrade. Built
    from the release alone, a node's first install upgraded Python 3.11 and OpenSSL, on every
    node."""
    sources = podman.text("run", "--rm", lab_image, "cat", "/etc/apt/sources.list.d/debian.sources")
    assert "bookworm-updates" in sources
    lists = podman.text("run", "--rm", lab_image, "ls", "/var/lib/apt/lists")
    # the updates suite's lists were read, not the release's alone
    assert "bookworm-updates" in lists, lists
    planned = podman.text("run", "--rm", lab_image, "apt-get", "-s", "upgrade")
    assert "0 upgraded" in planned, planned
    assert not [line for line in planned.splitlines() if line.startswith("Inst ")], planned

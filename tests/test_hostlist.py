"""Hostlist compression as slurm.conf needs it (python-hostlist underneath)."""

from __future__ import annotations

import hostlist
import pytest

from provision.cluster import compress


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["gpu001"], "gpu001"),
        (["head"], "head"),
        (["gpu001", "gpu002", "gpu003"], "gpu[001-003]"),
        (["gpu001", "gpu003"], "gpu[001,003]"),
        (["gpu003", "gpu001", "gpu002"], "gpu[001-003]"),  # order does not matter
        (["gpu001", "gpu002", "gpu005", "gpu006"], "gpu[001-002,005-006]"),
        (["n9", "n10", "n11"], "n[9-11]"),  # widths grow without padding
        (["n09", "n10", "n100"], "n[09-10,100]"),  # a padded run stops at a new width
        (["aws-h100-001", "aws-h100-002"], "aws-h100-[001-002]"),  # digits inside the prefix
        (["rack1-gpu01", "rack1-gpu02", "rack2-gpu01"], "rack1-gpu[01-02],rack2-gpu01"),
        (["a1", "b1"], "a1,b1"),
    ],
)
def test_compress(names: list[str], expected: str) -> None:
    assert compress(names) == expected


@pytest.mark.parametrize("count", [1, 2, 99, 100, 1000, 10000])
def test_round_trip(count: int) -> None:
    names = [f"gpu{i:05d}" for i in range(1, count + 1)]
    text = compress(names)
    assert hostlist.expand_hostlist(text) == names
    assert len(text) <= len("gpu[00001-10000]")

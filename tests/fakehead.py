"""A running cluster's first head as the verbs that talk to one reach it (provision.head.Head):
the spec's nodes, and every command recorded and answered by a stand-in for SSH."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from provision.cluster import Cluster
from provision.spec import Spec, load_spec


class FakeHead:
    def __init__(self, spec_path: Path, answer: Callable[[str, float], str]) -> None:
        self.spec_path = spec_path
        self.spec: Spec = load_spec(spec_path)
        self.cluster = Cluster(self.spec)
        self.answer = answer
        self.asked: list[str] = []

    def on_head(self, command: str, timeout: float = 60) -> str:
        self.asked.append(command)
        return self.answer(command, timeout)

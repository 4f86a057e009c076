"""What a long verb tells whoever runs it, as it goes: one callback takes every report. A line
of text (str) is a message to show as it is; the others are a run of Ansible beginning, one of
its events, and its end. The library never prints: the CLI renders these (provision/views.py),
a test or a program may just collect them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from provision.run.ansible import RunResult


@dataclass(frozen=True)
class PlayStarted:
    playbook: str
    hosts: list[str]


@dataclass(frozen=True)
class PlayEvent:
    """One of ansible-runner's events (a task started, a host's outcome)."""

    event: dict[str, Any]


@dataclass(frozen=True)
class PlayEnded:
    result: RunResult


Report = str | PlayStarted | PlayEvent | PlayEnded
Reporter = Callable[[Report], None]


def quiet(_: Report) -> None:
    """A reporter that keeps nothing."""

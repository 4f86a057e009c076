"""Errors the CLI maps to exit codes: SpecError -> 2 (invalid input), OperationError -> 1."""

from __future__ import annotations

import re
from dataclasses import dataclass

# What no value shown or written as one line may hold: line breaks of every kind, other control
# characters, and a byte-order mark. The spec refuses them; output escapes them.
NOT_ONE_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff]")


@dataclass(frozen=True)
class Issue:
    """One problem in an input file, located by line and key path."""

    file: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        text = f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"
        # one problem, one line, whatever a file name or a value held
        return NOT_ONE_LINE.sub(lambda m: repr(m.group())[1:-1], text)


class ProvisionError(Exception):
    """Base of the errors the CLI reports without a traceback."""

    exit_code = 1


class SpecError(ProvisionError):
    """The spec (or another input file) is invalid: every issue found, one line each."""

    exit_code = 2

    def __init__(self, issues: list[Issue]) -> None:
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))


class UsageError(ProvisionError):
    """A command was asked for something it cannot do with this input."""

    exit_code = 2


class OperationError(ProvisionError):
    """A live operation (Ansible run, provider call, verify check) failed."""

    exit_code = 1

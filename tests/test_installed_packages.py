"""installed_packages with `install` (plugins/modules/installed_packages.py): the missing names
installed in one apt-get run, the lists refreshed first where old, the list read after
returned. Here with a module whose commands are answered from a table; the module runs live
in every lab test's cold apply (the common role's chrony and nftables, the first transaction),
and its apt-get command line runs against this machine's apt below."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import collection_module

MODULE: Any = collection_module("installed_packages")
BEFORE = "installed chrony\ninstalled nftables\nconfig-files munge\n"
AFTER = BEFORE + "installed munge\ninstalled libmunge2\n"


class Exit(Exception):
    pass


class Module:
    """What run() needs of AnsibleModule; each command answered in turn from `answers`."""

    def __init__(self, answers: list[tuple[int, str, str]], check: bool = False, **params: Any):
        self.params = {"install": [], "install_recommends": True, "cache_valid_time": 0, **params}
        self.check_mode = check
        self.answers = answers
        self.commands: list[list[str]] = []
        self.result: dict[str, Any] = {}

    def run_command(self, command: list[str], environ_update: Any = None) -> tuple[int, str, str]:
        self.commands.append(command)
        if command[0] == "apt-get":
            assert environ_update["DEBIAN_FRONTEND"] == "noninteractive"
        return self.answers.pop(0)

    def exit_json(self, **result: Any) -> None:
        self.result = result
        raise Exit

    def fail_json(self, **result: Any) -> None:
        self.result = {"failed": True, **result}
        raise Exit


def _run(module: Module, stamps: tuple[str, ...]) -> dict[str, Any]:
    with pytest.raises(Exit):
        MODULE.run(module, which=lambda name: name == "dpkg-query", stamps=stamps)
    return module.result


@pytest.fixture
def old_lists(tmp_path: Path) -> tuple[str, ...]:
    lists = tmp_path / "lists"
    lists.mkdir()
    os.utime(lists, (1000, 1000))
    return (str(tmp_path / "update-success-stamp"), str(lists))


def test_the_missing_names_are_installed_in_one_run_after_a_refresh(
    old_lists: tuple[str, ...],
) -> None:
    module = Module(
        [(0, BEFORE, ""), (0, "Hit:1 ...", ""), (0, "Setting up munge", ""), (0, AFTER, "")],
        install=["chrony", "munge"],
        install_recommends=False,
        cache_valid_time=3600,
    )
    result = _run(module, old_lists)
    read, update, install, read_again = module.commands
    assert read[0] == "dpkg-query" and read_again == read
    assert update[:2] == ["apt-get", "update"]
    # only munge: chrony is installed, and is never upgraded by being named
    assert install[:2] == ["apt-get", "install"] and install[-2:] == ["--", "munge"]
    assert "--no-install-recommends" in install and "--simulate" not in install
    assert "Dpkg::Options::=--force-confold" in install
    assert result["changed"] is True and result["installed"] == ["munge"]
    facts = result["ansible_facts"]
    assert facts["provision_packages"] == ["chrony", "libmunge2", "munge", "nftables"]
    assert facts["provision_apt_cache_age"] == 0
    # the refresh is written where the next run reads its age, though no list changed
    assert MODULE.apt_cache_age(os.stat(old_lists[1]).st_mtime + 5, old_lists) == 5


def test_nothing_missing_runs_no_apt_but_old_lists_are_refreshed(
    old_lists: tuple[str, ...],
) -> None:
    module = Module([(0, BEFORE, ""), (0, "", "")], install=["chrony"], cache_valid_time=3600)
    result = _run(module, old_lists)
    assert [c[:2] for c in module.commands] == [module.commands[0][:2], ["apt-get", "update"]]
    assert result["changed"] is False
    fresh = Module([(0, BEFORE, "")], install=["chrony"], cache_valid_time=10**10)
    assert _run(fresh, old_lists)["changed"] is False and len(fresh.commands) == 1
    # reading alone (the play's first task) never refreshes, whatever the lists' age
    alone = Module([(0, BEFORE, "")], cache_valid_time=1)
    assert _run(alone, old_lists)["ansible_facts"]["provision_packages"] == ["chrony", "nftables"]
    assert len(alone.commands) == 1


def test_check_mode_simulates_and_changes_nothing(old_lists: tuple[str, ...]) -> None:
    module = Module([(0, BEFORE, ""), (0, "Inst munge", "")], check=True, install=["munge"],
                    cache_valid_time=1)  # fmt: skip
    result = _run(module, old_lists)
    assert len(module.commands) == 2 and "--simulate" in module.commands[1]
    assert result["changed"] is True
    assert result["ansible_facts"]["provision_packages"] == ["chrony", "nftables"]


def test_a_virtual_name_installed_again_changes_nothing(old_lists: tuple[str, ...]) -> None:
    # apt-get installs a package providing the name; the list read after is the list before
    module = Module(
        [(0, BEFORE, ""), (0, "", ""), (0, BEFORE, "")], install=["mail-transport-agent"]
    )
    assert _run(module, old_lists)["changed"] is False


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        ([(0, BEFORE, ""), (100, "", "E: Unable to locate package munge")],
         "apt-get install munge failed: E: Unable to locate package munge"),
        ([(2, "", "dpkg-query: error")], "dpkg-query failed: dpkg-query: error"),
    ],
)  # fmt: skip
def test_a_failed_command_fails_the_task_with_its_error(
    old_lists: tuple[str, ...], answers: list[tuple[int, str, str]], message: str
) -> None:
    result = _run(Module(answers, install=["munge"]), old_lists)
    assert result["failed"] and result["msg"] == message


def test_a_failed_refresh_installs_nothing(old_lists: tuple[str, ...]) -> None:
    module = Module(
        [(0, BEFORE, ""), (100, "", "E: Some index files failed to download")],
        install=["munge"], cache_valid_time=3600,
    )  # fmt: skip
    result = _run(module, old_lists)
    assert result["failed"] and "apt-get update failed: E: Some index" in result["msg"]
    assert len(module.commands) == 2


@pytest.mark.parametrize("name", ["-o", "--allow-unauthenticated", "munge=0.5", "a b", "Munge", ""])
def test_what_is_not_a_package_name_is_refused_before_apt_runs(
    old_lists: tuple[str, ...], name: str
) -> None:
    module = Module([(0, BEFORE, "")], install=["munge", name])
    result = _run(module, old_lists)
    assert result["failed"] and result["msg"] == f"install: not a package name: {name!r}"
    assert len(module.commands) == 1


def test_install_is_for_apt_nodes() -> None:
    module = Module([(0, "munge\n", "")], install=["munge"])
    with pytest.raises(Exit):
        MODULE.run(module, which=lambda name: name == "rpm")
    assert module.result["msg"] == "install: apt nodes only (this node has rpm)"


@pytest.mark.skipif(not shutil.which("apt-get"), reason="no apt-get on this machine")
def test_apt_get_reads_the_command_line() -> None:
    """This machine's apt-get takes the module's command line (simulated, as any user)."""
    command = MODULE.install_command(["apt"], recommends=False, check=True)
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          env={**os.environ, **MODULE.APT_ENV})  # fmt: skip
    assert done.returncode == 0, done.stderr
    # whether apt would be upgraded here or not: the options taken, the plan made
    assert "apt is already the newest version" in done.stdout or "\nInst apt " in done.stdout

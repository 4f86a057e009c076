"""The GPU play's task lists as each supported OS would run them, without the OS: every role of
the site playbook's "GPU software" play walked in order with the OS's facts (Ubuntu 22.04 and
24.04, Debian 12, Rocky 9) on a DGX H100-like node, each task's `when` decided and its arguments
rendered through Ansible's own templating, include_tasks, import_tasks and include_role
followed. What the node would answer (registered results, loop items drawn from them) is left as
the node's.

It stands where check mode cannot run: there are no Ubuntu or Rocky archives here, and NVIDIA's
repositories are out of reach. An undefined variable, a family file missing a name, or a
condition that no longer renders on one OS fails here; the lists are compared with
tests/golden/nvidia-tasks/ (`make goldens` after a deliberate change)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from .conftest import PLAYBOOKS_DIR, ROLES_DIR, ROOT, assert_golden
from .test_nvidia_sources import _variables, trust

GOLDEN = ROOT / "tests" / "golden" / "nvidia-tasks"
_yaml = YAML(typ="safe", pure=True)
# each OS's own kernel, as its facts name it
KERNELS = {
    "ubuntu22.04": "5.15.0-122-generic",
    "ubuntu24.04": "6.8.0-45-generic",
    "debian12": "6.1.0-27-amd64",
    "rocky9": "5.14.0-503.14.1.el9_5.x86_64",
}
OSES = list(KERNELS)
# what the play's facts module says of a DGX H100 node (the roles read ansible_facts.nvidia_*)
GPU_FACTS = {
    "nvidia_hardware": True,
    "nvidia_in_container": False,
    "nvidia_gpu_count": 8,
    "nvidia_nvswitch_count": 4,
    "nvidia_loaded_driver": "",
    "nvidia_summary": "8 NVIDIA GPUs, 4 NVSwitches, no driver loaded",
}
# and the rendered group_vars
NODE = {
    "inventory_hostname": "dgx01",
    "group_names": ["compute", "gpu", "fabric"],
    "ansible_play_hosts_all": ["dgx01"],
    "provision_nvswitch": True,
    "provision_mig_layout": [],
    "nccl_tests_sha256": "0" * 64,
}
# the keys of a task that say how it runs, not what it does
_TASK_KEYS = {
    "name", "when", "register", "loop", "loop_control", "notify", "changed_when",
    "failed_when", "tags", "environment", "args", "vars", "become", "check_mode", "no_log",
    "ignore_errors", "block", "rescue", "always", "delegate_to", "run_once", "until",
    "retries", "delay", "listen",
}  # fmt: skip
# the arguments worth a line: what is installed, written, fetched, run or started
_SHOWN = ("name", "dest", "path", "url", "key", "argv", "cmd", "state", "src")


def _registered(role: Path) -> set[str]:
    names: set[str] = set()

    def walk(tasks: list[dict[str, Any]]) -> None:
        for task in tasks or []:
            if "register" in task:
                names.add(task["register"])
            facts = task.get("ansible.builtin.set_fact")
            if isinstance(facts, dict):  # drawn from what the node answered
                names.update(facts)
            for key in ("block", "rescue", "always"):
                walk(task.get(key) or [])

    for path in (role / "tasks").glob("*.yml"):
        walk(_yaml.load(path.read_text()) or [])
    return names


class Walk:
    def __init__(self, os_name: str) -> None:
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar

        self.variables = _variables(os_name, "nvidia") | NODE
        facts = self.variables["ansible_facts"]
        self.variables["ansible_facts"] = {**facts, **GPU_FACTS, "kernel": KERNELS[os_name]}
        self.templar = Templar(loader=DataLoader(), variables=self.variables)
        self.lines: list[str] = []
        self.node_answers: set[str] = set()

    def render(self, value: Any, extra: dict[str, Any] | None = None) -> Any:
        templar = self.templar
        if extra:
            templar = templar.copy_with_new_env(available_variables=self.variables | extra)
        return templar.template(trust(value))

    def from_node(self, value: Any, depth: int = 0) -> bool:
        """Whether the value needs the node's answers: a registered result, a fact set from
        one, the services the node runs, or a variable defined from any of them."""
        text = str(value)
        if "ansible_facts.services" in text or any(
            re.search(rf"\b{re.escape(n)}\b", text) for n in self.node_answers
        ):
            return True
        if depth > 5:
            return False
        names = set(re.findall(r"\b_?[a-z][a-z0-9_]*\b", text)) & set(self.variables)
        return any(
            "{{" in str(self.variables[n]) or "{%" in str(self.variables[n])
            for n in names
            if self.from_node(self.variables[n], depth + 1)
        )

    def decide(self, when: Any, extra: dict[str, Any] | None = None) -> bool | None:
        """True or False where the OS and the spec decide; None where the node's answer does."""
        if when is None:
            return True
        conditions = when if isinstance(when, list) else [when]
        known = [c for c in conditions if not self.from_node(c)]
        if not all(bool(self.render("{{ " + str(c) + " }}", extra)) for c in known):
            return False  # Ansible ands a list: one false condition skips the task
        return None if len(known) < len(conditions) else True

    def role(self, name: str, file: str = "main", extra: dict[str, Any] | None = None) -> None:
        role = ROLES_DIR / name
        self.node_answers |= _registered(role)
        for layer in ("defaults/main.yml", "vars/main.yml"):
            loaded = _yaml.load((role / layer).read_text()) if (role / layer).exists() else {}
            for key, value in (loaded or {}).items():
                self.variables.setdefault(key, value)
        tasks = _yaml.load((role / "tasks" / f"{file}.yml").read_text()) or []
        self.tasks(name, tasks, extra or {})

    def tasks(self, role: str, tasks: list[dict[str, Any]], extra: dict[str, Any]) -> None:
        for task in tasks:
            decided = self.decide(task.get("when"), extra)
            if decided is False:
                continue
            mark = "" if decided else " (if the node says so)"
            name = task["name"]
            if not self.from_node(name):
                name = self.render(name, extra)
            if "block" in task:
                self.lines.append(f"{role}: {name}{mark}")
                self.tasks(role, task["block"], extra)
                continue
            module = next(k for k in task if k not in _TASK_KEYS)
            args = task[module]
            short = module.rsplit(".", 1)[-1]
            if short in ("include_tasks", "import_tasks"):
                file = args["file"] if isinstance(args, dict) else args
                rendered = str(self.render(file, extra))
                self.role(role, rendered.removesuffix(".yml"), extra)
                continue
            if short == "include_role":
                inner = {**extra, **self.render(task.get("vars") or {}, extra)}
                self.role(args["name"].rsplit(".", 1)[-1], args.get("tasks_from", "main"), inner)
                continue
            if short in ("include_vars", "meta", "debug", "assert", "nvidia_gpu_facts"):
                if short == "assert" and decided and "loop" not in task:
                    # the role's own checks of its settings pass on this OS
                    that = args["that"]
                    for condition in that if isinstance(that, list) else [that]:
                        if not self.from_node(condition):
                            ok = self.render("{{ " + str(condition) + " }}", extra)
                            assert ok, (role, condition)
                continue
            items: list[Any] = [None]
            if "loop" in task and not self.from_node(task["loop"]):
                items = list(self.render(task["loop"], extra))
            shown = []
            for item in items:
                values = extra | ({"item": item} if item is not None else {})
                if isinstance(args, str):
                    node = self.from_node(args) or ("item" in args and item is None)
                    shown.append("(from the node)" if node else str(self.render(args, values)))
                for key in _SHOWN:
                    if not isinstance(args, dict) or key not in args:
                        continue
                    value = args[key]
                    if self.from_node(value) or ("item" in str(value) and item is None):
                        shown.append(f"{key}=(from the node)")
                    else:
                        shown.append(f"{key}={self.render(value, values)}")
            self.lines.append(f"{role}: {name} [{short}]{mark} " + "; ".join(shown))


def gpu_play_tasks(os_name: str) -> str:
    plays = _yaml.load((PLAYBOOKS_DIR / "site.yml").read_text())
    play = next(p for p in plays if p["name"] == "GPU software")
    walk = Walk(os_name)
    for entry in play["tasks"]:
        include = entry.get("ansible.builtin.import_role") or entry["ansible.builtin.include_role"]
        if walk.decide(entry.get("when")) is False:
            walk.lines.append(f"-- {entry['name']}: not on this node")
            continue
        walk.lines.append(f"-- {entry['name']}")
        walk.role(include["name"].rsplit(".", 1)[-1])
    return f"# {os_name}, source nvidia, a DGX H100-like node\n" + "\n".join(walk.lines) + "\n"


@pytest.mark.parametrize("os_name", OSES)
def test_the_gpu_play_renders_on_every_os_as_golden(os_name: str, update_goldens: bool) -> None:
    assert_golden(GOLDEN / f"{os_name}.txt", gpu_play_tasks(os_name), update_goldens)


def test_the_walk_follows_each_os_path() -> None:
    """What differs between the OSes is there: Rocky's EPEL and kernel-devel for DKMS and its
    versionlock, Ubuntu's and Debian's holds, the kernel headers, the fabric manager's NSCQ."""
    rocky, ubuntu = gpu_play_tasks("rocky9"), gpu_play_tasks("ubuntu22.04")
    assert "nvidia_driver: EPEL, where dkms comes from (modules built on the node) [dnf]" in rocky
    assert "name=['kernel-devel-5.14.0-503.14.1.el9_5.x86_64'" in rocky  # the running kernel's
    assert "Lock the driver's packages" in rocky and "Hold the driver's packages" not in rocky
    assert "Hold the driver's packages [dpkg_selections]" in ubuntu and "EPEL" not in ubuntu
    assert "name=['linux-headers-5.15.0-122-generic']" in ubuntu
    debian = gpu_play_tasks("debian12")
    assert "name=['linux-headers-6.1.0-27-amd64', 'linux-headers-amd64']" in debian
    assert "Unlock the version they replaced (dnf)" not in debian  # a list of conditions: and
    assert "libnvidia-nscq-550=550.90.07-1" in ubuntu and "libnvidia-nscq-550-550.90.07-1" in rocky
    assert "Apply the layout now" not in ubuntu  # no MIG on this node: the removal path
    assert "Look for the boot service of an earlier layout [stat]" in ubuntu

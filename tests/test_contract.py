"""The renderer and the roles agree on every variable: render/contract.py names each one the
renderer emits, each has a reader that uses it, and no role reads a provision_* variable that
nothing provides. Fields whose feature is not built are refused (spec/unbuilt.py)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from provision.cluster import Cluster
from provision.render import render
from provision.render.contract import FABRIC, NVIDIA, ROCE, SOFTWARE, VARIABLES, emitted
from provision.spec import Spec, load_spec
from provision.spec.models import NvidiaSettings, RoceSettings, Software

from .conftest import EXAMPLES, PLAYBOOKS_DIR, ROLES_DIR, ROOT, UNBUILT, load_any, load_rendered

EVERY_FIELD = ROOT / "tests" / "data" / "untrusted" / "every-field.yaml"
SPECS = [*EXAMPLES, *UNBUILT, EVERY_FIELD]
# what sets a variable and so is not a use of it: a key of defaults, argument_specs, vars
_DEFINITION = re.compile(r"^\s*(- )?(?P<name>[a-z_][a-z0-9_]*):")


@cache
def _emitted() -> dict[str, set[str]]:
    """scope -> the variable names the renderer wrote, over every spec."""
    found: dict[str, set[str]] = {"all": set(), "pool": set(), "host": set(), "connection": set()}
    for path in SPECS:
        spec = _every_field() if path == EVERY_FIELD else load_any(path)
        files = render(Cluster(spec))
        inventory = load_rendered(files["inventory/hosts.yml"])
        assert isinstance(inventory, dict)
        found["connection"] |= set(inventory["all"].get("vars") or {})
        for name, group in inventory["all"]["children"].items():
            if name.startswith("pool_"):
                found["pool"] |= set((group or {}).get("vars") or {})
            for hostvars in ((group or {}).get("hosts") or {}).values():
                found["host"] |= set(hostvars or {})
        group_vars = load_rendered(files["inventory/group_vars/all.yml"])
        assert isinstance(group_vars, dict)
        found["all"] |= set(group_vars)
    return found


def _every_field() -> Spec:
    return load_spec(EVERY_FIELD, unbuilt=True)


def _reader_files(reader: str) -> list[Path]:
    if reader.startswith("playbooks/"):
        return [PLAYBOOKS_DIR / f"{reader.removeprefix('playbooks/')}.yml"]
    role = ROLES_DIR / reader
    assert role.is_dir(), f"contract names role {reader}, which does not exist"
    return [p for p in sorted(role.rglob("*")) if p.is_file()]


def _uses(path: Path, name: str) -> bool:
    """`name` is read in `path`: named anywhere but as the key that defines it."""
    word = re.compile(rf"\b{name}\b")
    for line in path.read_text(errors="replace").splitlines():
        definition = _DEFINITION.match(line)
        rest = line[definition.end() :] if definition and definition["name"] == name else line
        if word.search(rest):
            return True
    return False


def test_every_emitted_variable_is_in_the_contract_at_its_scope() -> None:
    assert any(_emitted().values()), "no spec renders a variable"
    for scope, names in _emitted().items():
        for name in names:
            assert name in VARIABLES, f"{name} is rendered but not in render/contract.py"
            assert VARIABLES[name].scope == scope, f"{name}: rendered at {scope}"


def _passed_by_apply(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    spec_path: Path = ROOT / "examples" / "lab.yaml",
) -> set[str]:
    """The extra variables apply gives the roles, for the lab spec (health checks on: the
    wheel is passed) or another, as its converge phase decides them (a network boot pool's
    image named, not built)."""
    from provision import boot, lifecycle
    from provision.head import Handle
    from provision.state import State

    def images(cluster: Cluster, state: State, say: object) -> dict[str, str]:
        return {p.name: "/images/made" for p in cluster.spec.pools if p.boot == "network"}

    monkeypatch.setattr(boot, "images", images)
    spec = load_spec(spec_path, unbuilt=True)
    assert spec.health is not None  # else provision_wheel is not passed for it
    cluster = Cluster(spec)
    monkeypatch.setattr(lifecycle, "build_wheel", lambda directory: directory / "provision.whl")
    state = State(tmp_path, spec.name)
    run = lifecycle._Run(
        Handle(spec_path, spec, cluster, state),
        lambda _m: None,
        lifecycle.ApplyReport(),
        lifecycle.Leaving(),
        lifecycle.Scope(),
        [n.name for n in cluster.lasting_nodes],
    )
    made = lifecycle._Made(cluster, render(cluster), tmp_path / "secrets")
    extra, _new, _action = lifecycle._converge_vars(made, {}, {}, False, run)
    return set(extra)


def test_every_contract_variable_is_rendered_or_passed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No dead entries: each is written by some spec, or passed by apply; and apply passes no
    variable the contract does not name."""
    emitted_names = set().union(*_emitted().values())
    assert VARIABLES, "the contract names no variable"
    extra = {v.name for v in VARIABLES.values() if v.scope == "extra"}
    # every-field.yaml has a pool that boots from the network: its image is passed
    passed = _passed_by_apply(monkeypatch, tmp_path / "lab")
    passed |= _passed_by_apply(monkeypatch, tmp_path / "every", EVERY_FIELD)
    assert passed == extra
    for variable in VARIABLES.values():
        if variable.scope != "extra":
            assert variable.name in emitted_names, f"no spec renders {variable.name}"


@pytest.mark.parametrize("name", sorted(VARIABLES))
def test_every_reader_uses_its_variable(name: str) -> None:
    variable = VARIABLES[name]
    # Ansible's own (connection) variables have no reader here; every other has one
    assert variable.readers or name.startswith("ansible_"), f"{name}: no reader named"
    for reader in variable.readers:
        files = _reader_files(reader)
        assert any(_uses(f, name) for f in files), f"{reader} does not read {name}"


def test_no_role_reads_a_provision_variable_nobody_provides() -> None:
    # a role's files/ are copied as they are and its tests/ are no Ansible (the monitoring
    # role's alert rules and their tests name metrics, not variables)
    roles = [
        p
        for p in sorted(ROLES_DIR.rglob("*"))
        if p.suffix in (".yml", ".j2")
        and not {"files", "tests"} & set(p.relative_to(ROLES_DIR).parts)
    ]
    places = [
        *roles,
        *sorted((PLAYBOOKS_DIR).glob("*.yml")),
        *sorted((ROOT / "molecule").rglob("*.yml")),
    ]
    # a fact the collection's own modules set (installed_packages) is read as ansible_facts.NAME
    modules = "".join(p.read_text() for p in (ROOT / "plugins" / "modules").glob("*.py"))
    unknown = set()
    for path in places:
        text = path.read_text()
        for name in re.findall(r"(?<!ansible_facts\.)\bprovision_[a-z0-9_]+\b", text):
            if name not in VARIABLES:
                unknown.add(f"{path.relative_to(ROOT)}: {name}")
        for name in re.findall(r"\bansible_facts\.(provision_[a-z0-9_]+)\b", text):
            if f'"{name}"' not in modules:
                unknown.add(f"{path.relative_to(ROOT)}: ansible_facts.{name}")
    assert not unknown, sorted(unknown)


def test_every_software_and_nvidia_field_reaches_a_role() -> None:
    assert set(Software.model_fields) == set(SOFTWARE)
    assert set(NvidiaSettings.model_fields) == set(NVIDIA)
    assert set(RoceSettings.model_fields) == set(ROCE)
    assert set(FABRIC.values()) <= set(VARIABLES)


def test_the_renderer_refuses_a_variable_outside_the_contract() -> None:
    with pytest.raises(AssertionError, match=r"provision_gpus.*render/contract\.py"):
        emitted({"provision_pool": "gpu", "provision_gpus": 8}, "pool")
    with pytest.raises(AssertionError, match="provision_pool"):
        emitted({"provision_pool": "gpu"}, "all")  # right name, wrong scope

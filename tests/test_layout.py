"""The package's layers, in the order a cluster is made: no module imports from a layer above
its own (spec knows nothing of render, render nothing of providers, and so on up to the CLI)."""

from __future__ import annotations

import ast
from pathlib import Path

from .conftest import ROOT

PACKAGE = ROOT / "provision"
# lowest first; a module may import from its own layer and the ones before it
LAYERS: list[set[str]] = [
    {"errors", "assets", "state", "secrets", "burst", "parsers", "health", "roleinputs"},
    {"spec"},
    {"cluster", "sshkeys", "pki"},
    {"render", "changes", "converged"},
    {"providers"},
    {"run"},
    {"preflight", "verify", "head"},
    {"lifecycle", "plan", "power", "boot", "bursting", "drain", "rolling"},
    {"cli", "views", "__main__"},
]


def _layer(unit: str) -> int:
    for i, units in enumerate(LAYERS):
        if unit in units:
            return i
    raise AssertionError(f"provision.{unit} is in no layer of tests/test_layout.py: add it")


def _imports(path: Path, every: bool = False) -> list[tuple[int, str]]:
    """The modules a file imports (by absolute name), with their lines: the package's own, or
    with `every` all of them."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, n) for n in names if every or n.split(".")[0] == "provision"]
    return found


def upward_imports(package: Path) -> list[str]:
    """Every import in `package` (the provision folder) of a layer above the importer's."""
    upward = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        if parts == ("__init__.py",):
            continue  # the version
        mine = _layer(parts[0].removesuffix(".py"))
        for line, name in _imports(path):
            names = name.split(".")
            if len(names) > 1 and _layer(names[1]) > mine:
                upward.append(f"{path.relative_to(package.parent)}:{line}: imports {name}")
    return upward


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = upward_imports(PACKAGE)
    assert not upward, "\n".join(upward)


def test_every_top_level_part_of_the_package_has_a_layer() -> None:
    parts = {
        p.name.removesuffix(".py")
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py")
        or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert parts == set().union(*LAYERS)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    package = tmp_path / "provision"
    (package / "spec").mkdir(parents=True)
    (package / "spec" / "models.py").write_text("import os\nfrom provision.errors import X\n")
    assert upward_imports(package) == []
    (package / "spec" / "models.py").write_text("from provision.render import render\n")
    assert upward_imports(package) == ["provision/spec/models.py:1: imports provision.render"]


# the verbs and what shows them reach every provider through providers/ (a table of kinds and
# the Provider interface): none of them names one
NAMES_NO_PROVIDER = ("lifecycle.py", "cli.py", "views.py")
# what prints: the CLI and its views, and the programs the nodes run (each a __main__.py of its
# own: burst, health); the rest of the package reports through callbacks
PRINTS = ("cli.py", "views.py")


def provider_names_in(path: Path) -> list[str]:
    """Every string constant of a module that is a provider's name, with its line."""
    from provision.spec.models import PROVIDER_ORDER

    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.name}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in PROVIDER_ORDER
    ]


def test_the_verbs_name_no_provider() -> None:
    found = [hit for name in NAMES_NO_PROVIDER for hit in provider_names_in(PACKAGE / name)]
    assert not found, "\n".join(found)


def test_the_provider_check_sees_a_name(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('def f(kind: str) -> bool:\n    return kind == "lab"\n')
    assert provider_names_in(module) == ["m.py:2: 'lab'"]


def test_only_the_cli_prints() -> None:
    printing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if path.name == "__main__.py":
            continue
        if path.name in PRINTS and len(parts) == 1:
            continue
        for line, name in _imports(path, every=True):
            if name.split(".")[0] == "rich":
                printing.append(f"{path.relative_to(PACKAGE.parent)}:{line}: imports {name}")
        tree = ast.parse(path.read_text())
        printing += [
            f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: print()"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "print"
        ]
    assert not printing, "\n".join(printing)

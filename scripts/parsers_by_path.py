"""Load one of provision's standard-library parser modules by its path, so the check scripts
run on a bare host with nothing but python3 (no venv, no provision package installed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load(name: str) -> ModuleType:
    """provision/parsers/<name>.py as the module `name`."""
    path = ROOT / "provision" / "parsers" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file loads
    spec.loader.exec_module(module)
    return module

"""What the package carries beside its code, found through importlib.resources: the same from a
wheel, an editable install or a checkout, never through a repository root.

- the Ansible collection gpu_provision.cluster (roles, playbooks, the nvidia_gpu_facts module),
  where ansible_collections/ is the directory Ansible's collections path names;
- the renderer's Jinja templates; Ansible's settings for every run; the example specs.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

COLLECTION = "gpu_provision.cluster"


def package_dir() -> Path:
    """The installed package's directory (wheels and editable installs are plain directories)."""
    root = files("provision")
    if not isinstance(root, Path):  # a zip import: the roles must be real files for Ansible
        raise RuntimeError(f"provision is imported from {root}, not a directory: install it")
    return root


def collections_path() -> Path:
    """The directory holding ansible_collections/: Ansible's collections path for our roles."""
    return package_dir()


def collection_dir() -> Path:
    namespace, name = COLLECTION.split(".")
    return package_dir() / "ansible_collections" / namespace / name


def playbook(name: str) -> Path:
    return collection_dir() / "playbooks" / name


def templates_dir() -> Path:
    return package_dir() / "render" / "templates"


def ansible_cfg() -> Path:
    return package_dir() / "run" / "ansible.cfg"


def example(name: str) -> Path:
    return package_dir() / "examples" / name

"""What the package carries beside its code: the Ansible collection gpu_provision.cluster (the
roles, the playbooks, the nvidia_gpu_facts module), the renderer's Jinja templates, Ansible's
settings for every run and the example specs.

The repository's root is the collection's root (galaxy.yml, roles/, playbooks/, plugins/) and
the templates are its templates/. A wheel carries them inside the package, where its build maps
them (pyproject.toml): provision/ansible_collections/gpu_provision/cluster/ and
provision/render/templates/. A checkout (an editable install, the tests) has them at the root
beside the package; its .collections/ holds the link Ansible's collections path needs there.
"""

from __future__ import annotations

import hashlib
from importlib.resources import files
from pathlib import Path

COLLECTION = "gpu_provision.cluster"
# what the collection is made of (the rest of the repository is not part of it)
COLLECTION_PARTS = ("galaxy.yml", "meta", "playbooks", "plugins", "roles")


def package_dir() -> Path:
    """The installed package's directory (wheels and editable installs are plain directories)."""
    root = files("provision")
    if not isinstance(root, Path):  # a zip import: the roles must be real files for Ansible
        raise RuntimeError(f"provision is imported from {root}, not a directory: install it")
    return root


def _installed() -> bool:
    """A wheel's install: the collection inside the package, as the build put it there."""
    return (package_dir() / "ansible_collections").is_dir()


def _checkout() -> Path:
    root = package_dir().parent
    if not (root / "galaxy.yml").is_file():
        raise RuntimeError(
            f"{package_dir()} carries no Ansible collection and {root} is no checkout of this "
            "project (no galaxy.yml): reinstall provision"
        )
    return root


def collections_path() -> Path:
    """The directory holding ansible_collections/: Ansible's collections path for our roles."""
    return package_dir() if _installed() else _checkout() / ".collections"


def collection_dir() -> Path:
    namespace, name = COLLECTION.split(".")
    return package_dir() / "ansible_collections" / namespace / name if _installed() else _checkout()


def collection_files() -> list[Path]:
    """Every file of the collection, sorted (what an image built by its roles depends on)."""
    root = collection_dir()
    found = []
    for part in COLLECTION_PARTS:
        path = root / part
        found += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return [p for p in found if "__pycache__" not in p.parts]


def hash_collection(h: hashlib._Hash) -> None:
    """Feed `h` every file of the collection, by its path in it (what an image built by its
    roles follows from: a change to them makes it again)."""
    root = collection_dir()
    for path in collection_files():
        h.update(f"{path.relative_to(root)}\n".encode() + path.read_bytes())


def playbook(name: str) -> Path:
    return collection_dir() / "playbooks" / name


def templates_dir() -> Path:
    return package_dir() / "render" / "templates" if _installed() else _checkout() / "templates"


def ansible_cfg() -> Path:
    return package_dir() / "run" / "ansible.cfg"


def example(name: str) -> Path:
    return package_dir() / "examples" / name

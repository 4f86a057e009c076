"""What a user gets without the checkout: the wheel runs validate and render from an empty
directory, and the Ansible collection builds, installs and lints in a playbook of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from provision.assets import COLLECTION_PARTS

from .conftest import COLLECTION, ROOT

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    (built,) = out.glob("gpu_provision-*.whl")
    return built


def test_the_wheel_carries_every_file_of_the_package(wheel: Path) -> None:
    def tracked(*paths: str) -> list[str]:
        return subprocess.run(
            ["git", "ls-files", *paths], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout.split()

    if not tracked("provision"):
        pytest.skip("not a git checkout")
    inside = set(zipfile.ZipFile(wheel).namelist())
    # the collection's parts and the templates are the repository's, mapped into the package
    collection = "provision/ansible_collections/gpu_provision/cluster/"
    wanted = [p for p in tracked("provision") if not Path(p).is_symlink()]
    wanted += [collection + p for p in tracked(*COLLECTION_PARTS, "README.md", "CHANGELOG.md")]
    wanted += ["provision/render/" + p for p in tracked("templates")]
    missing = [p for p in wanted if p not in inside]
    assert not missing, missing
    for needed in (
        "provision/ansible_collections/gpu_provision/cluster/playbooks/site.yml",
        "provision/render/templates/slurm.conf.j2",
        "provision/run/ansible.cfg",
        "provision/examples/lab.yaml",
        "provision/providers/lab/containers.conf",
    ):
        assert needed in inside


def test_the_installed_wheel_validates_and_renders_from_an_empty_directory(
    wheel: Path, tmp_path: Path
) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    # the installed copy comes first; the checkout is nowhere on the path
    env = {**os.environ, "PYTHONPATH": str(target), "PATH": f"{BIN}:/usr/bin:/bin"}

    def provision(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "provision", *args],
            cwd=empty,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )

    where = subprocess.run(
        [sys.executable, "-c", "import provision; print(provision.__file__)"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(target)), where.stdout
    r = provision("validate")
    assert r.returncode == 0, r.stderr
    assert "valid: cluster 'lab'" in r.stdout and str(target) in r.stdout
    r = provision("render", "--out", "build")
    assert r.returncode == 0, r.stderr
    assert (empty / "build" / "files" / "slurm" / "slurm.conf").is_file()
    # the playbook apply runs parses against that render, from the installed collection
    site = target / "provision" / "run" / "ansible.cfg"
    check = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "--syntax-check",
            "-i",
            "build/inventory/hosts.yml",
            "gpu_provision.cluster.site",
        ],
        cwd=empty,
        capture_output=True,
        text=True,
        check=False,
        env={
            "PATH": f"{BIN}:/usr/bin:/bin",
            "ANSIBLE_CONFIG": str(site),
            "ANSIBLE_COLLECTIONS_PATH": str(target / "provision"),
            "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
        },
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert sorted(p.name for p in empty.iterdir()) == ["build"]  # nothing else written there


PLAYBOOK = """---
- name: GPU nodes from the collection
  hosts: gpu
  become: true
  roles:
    - role: gpu_provision.cluster.nvidia_repos
    - role: gpu_provision.cluster.nvidia_driver
      vars:
        nvidia_driver_version: "550"

- name: Slurm
  hosts: head:compute
  become: true
  roles:
    - role: gpu_provision.cluster.munge
    - role: gpu_provision.cluster.slurm

- name: Everything, as provision apply runs it
  ansible.builtin.import_playbook: gpu_provision.cluster.site
"""


def test_the_collection_builds_installs_and_a_playbook_using_it_is_lint_clean(
    tmp_path: Path,
) -> None:
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
    }

    def tool(*args: str, cwd: Path = tmp_path) -> subprocess.CompletedProcess[str]:
        # in tmp_path by default: away from the checkout's ansible.cfg, which finds the
        # collection at the checkout's root and would make the install a no-op
        done = subprocess.run([str(BIN / args[0]), *args[1:]], cwd=cwd, env=env,
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    tool("ansible-galaxy", "collection", "build", "--output-path", str(tmp_path), str(COLLECTION))
    (tarball,) = tmp_path.glob("gpu_provision-cluster-*.tar.gz")
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    # the collection's parts and nothing else of the repository (galaxy.yml's build_ignore):
    # no Python package, tests, docs or tooling
    top = {name.split("/")[0] for name in names}
    assert top == {*COLLECTION_PARTS, "README.md", "CHANGELOG.md", "requirements.yml",
                   "MANIFEST.json", "FILES.json"} - {"galaxy.yml"}  # fmt: skip
    assert "roles/slurm/tasks/main.yml" in names and "playbooks/site.yml" in names
    assert "plugins/modules/nvidia_gpu_facts.py" in names and "MANIFEST.json" in names
    installed = tmp_path / "collections"
    tool("ansible-galaxy", "collection", "install", "--no-deps", "-p", str(installed), str(tarball))
    assert (installed / "ansible_collections" / "gpu_provision" / "cluster" / "roles").is_dir()
    project = tmp_path / "project"
    project.mkdir()
    (project / "site.yml").write_text(PLAYBOOK)
    (project / "ansible.cfg").write_text(f"[defaults]\ncollections_path = {installed}\n")
    tool("ansible-lint", "--offline", "--profile", "production", "site.yml", cwd=project)
    # and ansible finds its roles and module by their full names
    tool("ansible-playbook", "--syntax-check", "-i", "localhost,", "site.yml", cwd=project)

"""Containers in jobs: Enroot on the GPU nodes and Pyxis on every Slurm node (nvidia.enroot),
and Slurm's own OCI containers (slurm.oci_runtime). Nothing here can reach NVIDIA's releases,
so Enroot and Pyxis are rendered and checked: the rendered enroot.conf and plugstack.conf, the
roles' own expressions for each OS through Ansible's templating (which package files, from
where, against which checksums), the roles' checksum guards, and the spec's refusals.
ansible-lint and the roles' argument specs check the roles. Slurm's OCI containers run live on
the lab (tests/integration/test_lab.py); here, the rendered oci.conf for runc and crun."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from provision.cluster import Cluster
from provision.errors import SpecError
from provision.render import PYXIS_PLUGIN, render
from provision.render.inventory import group_vars
from provision.render.slurm import OCI_REFUSAL
from provision.spec import load_spec

from .conftest import ROLES_DIR, ROOT
from .test_homes import _role_template
from .test_nvidia_sources import trust

EVERY = ROOT / "tests" / "data" / "untrusted" / "every-field.yaml"
SUPERPOD = ROOT / "examples" / "dgx-superpod-ha.yaml"
SUMS = """  enroot: true
  enroot_sha256: 1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a
  enroot_caps_sha256: 2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b
  pyxis_sha256: 3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c
"""


def _superpod(tmp_path: Path, nvidia: str = SUMS) -> Cluster:
    """The SuperPOD example (Ubuntu) with Enroot and Pyxis: test checksums, not the releases'."""
    text = SUPERPOD.read_text()
    assert "\nnvidia:\n" in text
    spec = tmp_path / "pod.yaml"
    spec.write_text(text.replace("\nnvidia:\n", "\nnvidia:\n" + nvidia, 1))
    ca = "directory-ca.pem"  # the example's directory's, beside it
    (tmp_path / ca).write_bytes((SUPERPOD.parent / ca).read_bytes())
    return Cluster(load_spec(spec))


def test_the_rendered_enroot_conf_and_plugstack_conf(tmp_path: Path) -> None:
    files = render(_superpod(tmp_path, SUMS + "  enroot_scratch: /raid/enroot\n"))
    conf = files["files/enroot/enroot.conf"]
    settings = dict(
        line.split(" ", 1) for line in conf.splitlines() if line and not line.startswith("#")
    )
    assert settings["ENROOT_DATA_PATH"] == "/raid/enroot/data/user-$(id -u)"
    assert settings["ENROOT_CACHE_PATH"] == "/raid/enroot/cache/group-$(id -g)"
    assert settings["ENROOT_RUNTIME_PATH"] == "/run/enroot/user-$(id -u)"
    plugstack = [ln for ln in files["files/slurm/plugstack.conf"].splitlines() if ln[:1] != "#"]
    assert plugstack == [f"required {PYXIS_PLUGIN}"]
    # the pyxis role installs the plugin where the file names it
    assert _role_template("pyxis", "{{ _pyxis_plugin }}", {}) == PYXIS_PLUGIN
    # neither file without enroot
    plain = render(Cluster(load_spec(SUPERPOD)))
    assert "files/enroot/enroot.conf" not in plain and "files/slurm/plugstack.conf" not in plain


def test_the_spec_reaches_the_roles(tmp_path: Path) -> None:
    out = group_vars(_superpod(tmp_path))
    assert out["provision_enroot"] is True
    assert out["enroot_sha256"].startswith("1a1a") and out["pyxis_sha256"].startswith("3c3c")
    site = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
    slurm = next(play for play in site if play.get("name") == "Slurm")
    tasks = {t["name"]: t for t in slurm["tasks"]}
    # Enroot where the tasks of jobs run on GPUs; Pyxis on every node of the Slurm play
    assert "inventory_hostname in groups['gpu'] | default([])" in tasks["Role enroot"]["when"]
    assert "groups" not in str(tasks["Role pyxis"]["when"])


@pytest.mark.parametrize(
    ("family", "files"),
    [
        ("Debian", ["enroot_3.5.0-1_amd64.deb", "enroot+caps_3.5.0-1_amd64.deb"]),
        ("RedHat", ["enroot-3.5.0-1.el8.x86_64.rpm", "enroot+caps-3.5.0-1.el8.x86_64.rpm"]),
    ],
)
def test_each_os_fetches_its_own_packages_against_their_checksums(
    family: str, files: list[str]
) -> None:
    os_vars = yaml.safe_load((ROLES_DIR / "enroot" / "vars" / f"{family}.yml").read_text())
    given = {"enroot_sha256": "a" * 64, "enroot_caps_sha256": "b" * 64}
    given |= {k: trust(v) for k, v in os_vars.items()}  # the role's own text: templated
    downloads = _role_template("enroot", "{{ _enroot_downloads }}", given)
    assert downloads == [
        {"file": files[0], "sha256": "a" * 64},
        {"file": files[1], "sha256": "b" * 64},
    ]
    github = _role_template("enroot", "{{ _enroot_base_url }}", given)
    assert github == "https://github.com/NVIDIA/enroot/releases/download/v3.5.0"
    mirror = _role_template(
        "enroot",
        "{{ _enroot_base_url }}",
        given | {"enroot_source": "mirror", "enroot_mirror_url": "https://m.example.org/nv"},
    )
    assert mirror == "https://m.example.org/nv/enroot"
    pyxis = yaml.safe_load((ROLES_DIR / "pyxis" / "vars" / f"{family}.yml").read_text())
    assert pyxis["_pyxis_headers"] in ("libslurm-dev", "slurm-devel")


def test_the_roles_fetch_nothing_without_its_checksum() -> None:
    for role, names in (
        ("enroot", ("enroot_sha256", "enroot_caps_sha256")),
        ("pyxis", ("pyxis_sha256",)),
    ):
        tasks = yaml.safe_load((ROLES_DIR / role / "tasks" / "main.yml").read_text())
        guard = next(
            t
            for t in tasks
            if t["name"] == "Fetch nothing that has no checksum to check it against"
        )
        that = guard["ansible.builtin.assert"]["that"]
        for name in names:
            assert f"{name} is match('^[0-9a-f]{{64}}$')" in str(that)
        fetches = [t for t in tasks if "ansible.builtin.get_url" in t]
        assert fetches and all(
            "sha256:" in t["ansible.builtin.get_url"]["checksum"] for t in fetches
        )
        assert tasks.index(guard) < tasks.index(fetches[0])


@pytest.mark.parametrize(
    ("nvidia", "where", "says"),
    [
        ("  enroot: true\n", "nvidia.enroot_sha256", "give the SHA-256 of the enroot package"),
        (
            SUMS + "  container_toolkit: false\n",
            "nvidia.container_toolkit",
            "needs the NVIDIA Container Toolkit",
        ),
    ],
)
def test_the_spec_refuses_what_cannot_be_installed_or_work(
    tmp_path: Path, nvidia: str, where: str, says: str
) -> None:
    with pytest.raises(SpecError) as caught:
        _superpod(tmp_path, nvidia)
    assert any(i.path == where and says in i.message for i in caught.value.issues), caught.value


def test_enroot_needs_slurm_and_gpus(tmp_path: Path) -> None:
    lab = (ROOT / "examples" / "lab.yaml").read_text()
    spec = tmp_path / "lab.yaml"
    spec.write_text(lab + "nvidia:\n" + SUMS)
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    assert "nvidia.enroot: no pool has GPUs: Enroot goes on the GPU nodes" in str(caught.value)


def _oci_conf(text: str) -> dict[str, str]:
    """oci.conf's settings as Slurm reads them: Key="value" lines, # comments."""
    settings = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, value = line.split("=", 1)
        assert value[0] == value[-1] == '"' and '"' not in value[1:-1], line
        settings[key] = value[1:-1]
    return settings


@pytest.mark.parametrize(
    ("runtime", "run"),
    [
        ("runc", "runc --rootless=true --root=%b run %n.%u.%j.%s.%t -b %b"),
        ("crun", "crun --rootless=true --root=%b run --bundle %b %n.%u.%j.%s.%t"),
    ],
)
def test_oci_conf_runs_the_runtime_rootless_with_its_state_in_the_steps_own_bundle(
    tmp_path: Path, runtime: str, run: str
) -> None:
    lab = (ROOT / "examples" / "lab.yaml").read_text()
    assert "  oci_runtime: runc\n" in lab  # the lab has Slurm's containers (make demo)
    spec = tmp_path / "lab.yaml"
    spec.write_text(lab.replace("oci_runtime: runc", f"oci_runtime: {runtime}"))
    cluster = Cluster(load_spec(spec))
    settings = _oci_conf(render(cluster)["files/slurm/oci.conf"])
    name = "%n.%u.%j.%s.%t"
    # the task's command is the runtime itself (exec: signals reach it, and Slurm's process
    # tracking keeps it); slurmstepd asks after the container as root once it removed the
    # step's directory: only where the directory is (the runtime would make it again, root's)
    state = f"{runtime} --rootless=true --root=%b"
    assert settings == {
        "RunTimeQuery": f"if test -d %b; then {state} state {name}; else echo {{}}; fi",
        "RunTimeKill": f"test -d %b && {state} kill -a {name}",
        "RunTimeDelete": f"test -d %b && {{ {state} delete --force {name}; rmdir %b; }}",
        "RunTimeRun": f"exec {run}",
    }
    # only the patterns Slurm 21.08 to 23.11 all know (an unknown one stops slurmstepd)
    for command in settings.values():
        assert set(re.findall(r"%(.)", command)) <= set("nujstb")
    assert group_vars(cluster)["slurm_oci_runtime"] == runtime


def test_without_a_runtime_oci_conf_refuses_a_container_step(tmp_path: Path) -> None:
    """Slurm without an oci.conf runs a --container step on the node itself (seen on the lab's
    Slurm 22.05): the file is there all the same, and its task command refuses the step."""
    lab = (ROOT / "examples" / "lab.yaml").read_text()
    spec = tmp_path / "lab.yaml"
    spec.write_text(lab.replace("  oci_runtime: runc\n", ""))
    plain = Cluster(load_spec(spec))
    settings = _oci_conf(render(plain)["files/slurm/oci.conf"])
    assert settings["RunTimeRun"] == f"echo '{OCI_REFUSAL}' >&2; exit 1"
    assert "'" not in OCI_REFUSAL and "slurm.oci_runtime" in OCI_REFUSAL
    assert (settings["RunTimeQuery"], settings["RunTimeKill"]) == ("echo {}", "true")
    # and nothing for the role to install
    assert "slurm_oci_runtime" not in group_vars(plain)
    assert _role_template("slurm", "{{ slurm_oci_runtime }}", {}) == ""


def test_the_slurm_role_installs_the_runtime_on_compute_nodes_and_restarts_nothing() -> None:
    tasks = yaml.safe_load((ROLES_DIR / "slurm" / "tasks" / "main.yml").read_text())
    by_name = {t["name"]: t for t in tasks}
    # with the Slurm packages: Debian's in one apt transaction with Open MPI, without recommends
    deb = by_name[
        "Install the Slurm packages, Open MPI and the OCI runtime this node needs (Debian, Ubuntu)"
    ]
    assert "_slurm_packages_oci" in deb["ansible.builtin.apt"]["name"]
    assert deb["ansible.builtin.apt"]["install_recommends"] is False
    assert "_slurm_packages_one_go is not" in str(deb["when"])
    rpm = by_name["Install the Slurm packages and the OCI runtime this node needs (Rocky)"]
    assert "_slurm_packages_oci" in rpm["ansible.builtin.dnf"]["name"]
    runtime = {"slurm_oci_runtime": "runc", "_slurm_is_compute": True}
    assert _role_template("slurm", "{{ _slurm_packages_oci }}", runtime) == ["runc"]
    for other in ({**runtime, "_slurm_is_compute": False}, {**runtime, "slurm_oci_runtime": ""}):
        assert _role_template("slurm", "{{ _slurm_packages_oci }}", other) == []
    everything = {**runtime, "_slurm_packages": ["slurmd"], "_slurm_packages_mpi": ["openmpi-bin"]}
    one_go = _role_template("slurm", "{{ _slurm_packages_one_go }}", everything)
    assert one_go == ["slurmd", "openmpi-bin", "runc"]
    conf = by_name["Install oci.conf and the MPI all-reduce program"]
    items = {item["path"]: item for item in conf["gpu_provision.cluster.files"]["paths"]}
    # on every Slurm node, with a runtime or without (an entry without `when` is always made)
    oci = items["{{ _slurm_conf_dir }}/oci.conf"]
    assert "when" not in oci and oci["source"] == "{{ slurm_files_dir }}/oci.conf"
    assert "when" not in conf
    # each step's slurmstepd reads oci.conf: a change needs no daemon restarted
    assert "notify" not in conf


def test_the_slurm_role_links_the_name_the_pmix_plugin_opens_instead_of_libpmix_dev() -> None:
    """Slurm's PMIx plugin opens pmix2/lib/libpmix.so under the architecture's library folder
    (Debian's build), a name only libpmix-dev has: the role links it to libpmix2's soname
    instead (the MPI all-reduce over `srun --mpi=pmix` runs live in verify on every lab)."""
    debian = yaml.safe_load((ROLES_DIR / "slurm" / "vars" / "Debian.yml").read_text())
    assert "libpmix-dev" not in debian["_slurm_packages_mpi"]
    tasks = yaml.safe_load((ROLES_DIR / "slurm" / "tasks" / "main.yml").read_text())
    name = "Create the Slurm directories and the PMIx library's link"
    (made,) = [t for t in tasks if t["name"] == name]
    (link,) = [i for i in made["gpu_provision.cluster.files"]["paths"] if "src" in i]
    assert link["src"] == "libpmix.so.2"
    folder = {"_slurm_pmix_lib_dir": trust(debian["_slurm_pmix_lib_dir"])}
    for arch, triplet in (("x86_64", "x86_64-linux-gnu"), ("aarch64", "aarch64-linux-gnu")):
        facts = {**folder, "ansible_facts": {"architecture": arch}}
        path = _role_template("slurm", link["path"], facts)
        assert path == f"/usr/lib/{triplet}/pmix2/lib/libpmix.so"
        assert _role_template("slurm", link["when"], facts) is True
    # none made on Rocky (EPEL's Slurm is not run live here)
    rocky = yaml.safe_load((ROLES_DIR / "slurm" / "vars" / "RedHat.yml").read_text())
    assert rocky["_slurm_pmix_lib_dir"] == ""
    assert _role_template("slurm", link["when"], {"_slurm_pmix_lib_dir": ""}) is False
    assert link["state"] == "link"

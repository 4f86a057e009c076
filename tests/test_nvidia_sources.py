"""What the NVIDIA roles would configure and install on every supported OS, from each package
source: repository files, signing keys with their fingerprints, and the exact package names
and pins. Rendered through the roles' own defaults, variables and templates by Ansible's
templating (these repositories and OSes cannot be reached here), compared with
tests/golden/nvidia-sources/ (`make goldens` after a deliberate change)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from .conftest import PLAYBOOKS_DIR, ROLES_DIR, ROOT, assert_golden, collection_plugin

ROLES = ROLES_DIR
GOLDEN = ROOT / "tests" / "golden" / "nvidia-sources"
_yaml = YAML(typ="safe", pure=True)

FACTS = {
    "ubuntu22.04": {
        "distribution": "Ubuntu",
        "distribution_version": "22.04",
        "distribution_major_version": "22",
        "os_family": "Debian",
    },
    "ubuntu24.04": {
        "distribution": "Ubuntu",
        "distribution_version": "24.04",
        "distribution_major_version": "24",
        "os_family": "Debian",
    },
    "debian12": {
        "distribution": "Debian",
        "distribution_version": "12.8",
        "distribution_major_version": "12",
        "os_family": "Debian",
    },
    "rocky9": {
        "distribution": "Rocky",
        "distribution_version": "9.5",
        "distribution_major_version": "9",
        "os_family": "RedHat",
    },
}
# What the spec pins (software:) and says (nvidia:), as the rendered group_vars carry it
PINS = {
    "nvidia_driver_version": "550.90.07",
    "cuda_version": "12.4",
    "cudnn_version": "9.1",
    "nccl_version": "2.21.5",
    "dcgm_version": "3.3.7",
    "nvidia_container_toolkit_version": "1.16.2",
}
CASES = [(os_name, source) for os_name in FACTS for source in ("nvidia", "mirror")] + [
    ("debian12", "distro"),
    ("ubuntu22.04", "distro"),
]
MIRROR = "https://mirror.example.org/nvidia"
# Parts that exist only in NVIDIA's repositories (the spec refuses them with source distro)
NVIDIA_ONLY = ("cuda repository", "keys", "fabric manager", "dcgm", "container toolkit")

# (label, role, expression) rendered for every case
REPORT = [
    ("cuda repository", "nvidia_repos", "{{ _nvidia_repos_cuda }}"),
    (
        "keys",
        "nvidia_repos",
        "{{ _nvidia_repos_keys | map(attribute='url') | zip("
        "_nvidia_repos_keys | map(attribute='fingerprint')) | map('join', ' fingerprint ') "
        "}}",
    ),
    (
        "driver packages",
        "nvidia_driver",
        "{{ (_nvidia_driver_packages + "
        "(_nvidia_driver_dnf_exact if ansible_facts.os_family == 'RedHat' else [])) }}",
    ),
    # the name modinfo knows it by (Debian's own packages: nvidia-current)
    ("kernel module", "nvidia_driver", "{{ _nvidia_driver_module }}"),
    ("fabric manager", "nvidia_fabricmanager", "{{ _nvidia_fabricmanager_packages }}"),
    (
        "cuda",
        "cuda",
        "{{ _cuda_packages | join(', ') }} (CUDA_HOME {{ _cuda_home }}, "
        "modules in {{ _cuda_modulefiles }})",
    ),
    (
        "cudnn",
        "cudnn",
        "{{ (_cudnn_packages if not _cudnn_wheel | bool else ['pip: ' ~ _cudnn_wheel_name]) }}",
    ),
    (
        "nccl",
        "nccl",
        "{{ (_nccl_packages if not _nccl_wheel | bool else ['pip: ' ~ _nccl_wheel_name]) }}",
    ),
    ("dcgm", "dcgm", "{{ _dcgm_package }}"),
    ("container toolkit", "nvidia_container_toolkit", "{{ _nvidia_container_toolkit_package }}"),
    ("nccl-tests", "nccl_tests", "{{ _nccl_tests_url }} (CUDA_HOME {{ _nccl_tests_cuda_home }})"),
]


def _load(path: Path) -> dict[str, Any]:
    return (_yaml.load(path.read_text()) or {}) if path.exists() else {}


def trust(value: Any) -> Any:
    """Role files are trusted templates when Ansible loads them: say so for ours."""
    from ansible.template import trust_as_template

    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [trust(v) for v in value]
    if isinstance(value, dict):
        return {k: trust(v) for k, v in value.items()}
    return value


def _variables(os_name: str, source: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    family = FACTS[os_name]["os_family"]
    for role in sorted(p for p in ROLES.iterdir() if p.is_dir()):
        merged |= _load(role / "defaults" / "main.yml")
        merged |= _load(role / "vars" / "main.yml")
        merged |= _load(role / "vars" / f"{family}.yml")  # as the role's first task loads it

    out = {k: trust(v) for k, v in merged.items()}
    out |= PINS
    out |= {
        "ansible_facts": {
            **FACTS[os_name],
            "architecture": "x86_64",
            "kernel": "6.8.0-45-generic",
            "nvidia_hardware": True,
        },
        "ansible_managed": "Ansible managed",
        "provision_nvidia_source": source,
    }
    if source == "mirror":
        out["provision_nvidia_mirror_url"] = MIRROR
    if source == "distro":
        out |= {
            "nvidia_driver_modules": "dkms",
            "nvidia_driver_version": "535",
            "cuda_version": "11.8",
            "nvidia_repos_container_toolkit": False,
        }
    return out


def render_case(os_name: str, source: str) -> str:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = _variables(os_name, source)
    templar = Templar(loader=DataLoader(), variables=variables)
    lines = [f"# {os_name}, source {source}: rendered through the roles' variables and templates"]
    for label, _role, expr in REPORT:
        if source == "distro" and label in NVIDIA_ONLY:
            continue
        value = templar.template(trust_as_template(expr))
        value = "\n".join(value) if isinstance(value, list) else str(value).strip()
        lines.append(f"\n## {label}\n{value}")
    family = FACTS[os_name]["os_family"]
    if source != "distro":
        name = "nvidia.sources.j2" if family == "Debian" else "nvidia.repo.j2"
        text = (ROLES / "nvidia_repos" / "templates" / name).read_text()
        lines.append(
            f"\n## repository file ({name[:-3]})\n"
            + templar.template(trust_as_template(text)).strip()
        )
    if family == "Debian":
        text = (ROLES / "nvidia_driver" / "templates" / "nvidia-driver.pref.j2").read_text()
        lines.append(
            "\n## apt pin (/etc/apt/preferences.d/nvidia-driver)\n"
            + templar.template(trust_as_template(text)).strip()
        )
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("os_name", "source"), CASES, ids=[f"{o}-{s}" for o, s in CASES])
def test_sources_render_as_golden(os_name: str, source: str, update_goldens: bool) -> None:
    got = render_case(os_name, source)
    assert_golden(GOLDEN / f"{os_name}-{source}.txt", got, update_goldens)


def test_mirror_keeps_nvidia_layout_below_its_base() -> None:
    nvidia, mirror = render_case("ubuntu22.04", "nvidia"), render_case("ubuntu22.04", "mirror")
    assert "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64" in nvidia
    assert f"{MIRROR}/cuda/ubuntu2204/x86_64/3bf863cc.pub" in mirror
    assert f"{MIRROR}/libnvidia-container/stable/deb/$(ARCH)/" in mirror
    assert "developer.download.nvidia.com" not in mirror and "github" not in mirror


def test_container_toolkit_key_and_checks_are_nvidias() -> None:
    """NVIDIA publishes the toolkit's key at its site's root (not below stable/), and its .repo
    checks the signed metadata (repo_gpgcheck=1) but not the packages (gpgcheck=0), which a
    subkey signs: with gpgcheck=1 dnf refuses every package."""
    site = "https://nvidia.github.io/libnvidia-container"
    for os_name in ("ubuntu22.04", "rocky9"):
        text = render_case(os_name, "nvidia")
        assert f"{site}/gpgkey fingerprint C95B321B61E88C1809C4F759DDCAE044F796ECB0" in text
        assert f"{site}/stable/gpgkey" not in text
    assert f"{MIRROR}/libnvidia-container/gpgkey" in render_case("ubuntu22.04", "mirror")
    repo = render_case("rocky9", "nvidia").split("[nvidia-container-toolkit]")[1]
    assert "\ngpgcheck=0\nrepo_gpgcheck=1\n" in repo
    assert f"baseurl={site}/stable/rpm/$basearch" in repo and f"gpgkey={site}/gpgkey" in repo
    cuda = render_case("rocky9", "nvidia").split("[nvidia-cuda]")[1].split("[")[0]
    assert "gpgcheck=1" in cuda  # the CUDA repository's packages are signed by its key


def test_every_case_pins_what_the_spec_pins() -> None:
    assert {source for _os, source in CASES} >= {"distro", "nvidia"}, CASES
    for os_name, source in CASES:
        text = render_case(os_name, source)
        if source == "distro":
            assert "pip: nvidia-nccl-cu11==2.21.5" in text and "Pin: version 535.*" in text
            continue
        assert "550.90.07" in text.split("## fabric manager")[1].split("##")[0], os_name
        assert "2.21.5-1+cuda12.4" in text and "3.3.7" in text and "1.16.2-1" in text, os_name


def test_an_unpinned_driver_takes_the_sources_newest() -> None:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    for os_name, wanted in (
        ("debian12", ["nvidia-kernel-open-dkms", "cuda-drivers"]),
        ("rocky9", ["@nvidia-driver:open-dkms"]),
    ):
        variables = _variables(os_name, "nvidia") | {"nvidia_driver_version": ""}
        templar = Templar(loader=DataLoader(), variables=variables)
        assert templar.template(trust_as_template("{{ _nvidia_driver_packages }}")) == wanted


def test_cuda_versions_live_side_by_side() -> None:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = _variables("ubuntu24.04", "nvidia") | {"cuda_extra_versions": ["12.6", "12.4"]}
    templar = Templar(loader=DataLoader(), variables=variables)
    got = templar.template(trust_as_template("{{ [_cuda_homes, _cuda_home, _cuda_packages] }}"))
    assert got == [
        {"12.4": "/usr/local/cuda-12.4", "12.6": "/usr/local/cuda-12.6"},
        "/usr/local/cuda-12.4",
        ["cuda-toolkit-12-4", "cuda-toolkit-12-6"],
    ]


def test_role_defaults_agree_with_the_spec_defaults() -> None:
    """A role run without the rendered group_vars behaves as a spec that leaves nvidia: out."""
    import re

    from provision.spec.models import NvidiaSettings

    spec = NvidiaSettings()
    texts = [p.read_text() for p in ROLES.glob("*/defaults/main.yml")]
    texts.append((PLAYBOOKS_DIR / "site.yml").read_text())
    seen = 0
    for text in texts:
        for field, default in re.findall(r"provision_nvidia_(\w+) \| default\(([^)]*)\)", text):
            # roles spell "unset" as the empty string
            assert (_yaml.load(default) or None) == (getattr(spec, field) or None), field
            seen += 1
    assert seen >= 10
    driver = _load(ROLES / "nvidia_driver" / "defaults" / "main.yml")
    assert (driver["nvidia_driver_modules"], driver["nvidia_driver_reboot"]) == (
        spec.driver_modules,
        spec.reboot,
    )
    dcgm = _load(ROLES / "dcgm" / "defaults" / "main.yml")
    assert dcgm["dcgm_exporter_port"] == spec.dcgm_exporter_port


@pytest.mark.parametrize(
    ("source", "os_name", "kernel", "flavour"),
    [
        ("nvidia", "ubuntu22.04", "5.15.0-122-generic", "generic"),
        ("distro", "ubuntu22.04", "6.8.0-45-generic", "generic-hwe-22.04"),
        ("nvidia", "ubuntu24.04", "6.8.0-45-generic", "generic"),
        ("nvidia", "ubuntu24.04", "6.11.0-19-generic", "generic-hwe-24.04"),
        ("nvidia", "ubuntu22.04", "6.8.0-1015-aws", "aws"),
        ("nvidia", "ubuntu24.04", "6.8.0-1021-azure", "azure"),
        ("nvidia", "ubuntu22.04", "6.8.0-1019-gcp", "gcp"),
        ("nvidia", "ubuntu24.04", "6.8.0-1017-nvidia", "nvidia"),
        ("nvidia", "ubuntu24.04", "6.8.0-45-generic-64k", "generic-64k"),
    ],
)
def test_ubuntu_precompiled_modules_come_from_ubuntu_for_the_running_kernel(
    source: str, os_name: str, kernel: str, flavour: str
) -> None:
    """Ubuntu's signed modules are built per kernel: those of the running kernel (so nvidia.ko
    loads now) and its flavour's (so they follow its upgrades), never -generic on an -aws,
    -azure, -gcp, -nvidia or HWE kernel, where they would land for another kernel."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = _variables(os_name, source) | {
        "nvidia_driver_modules": "precompiled",
        "nvidia_driver_version": "550",
    }
    variables["ansible_facts"] = {**variables["ansible_facts"], "kernel": kernel}
    templar = Templar(loader=DataLoader(), variables=variables)
    assert templar.template(trust_as_template("{{ _nvidia_driver_packages }}")) == [
        f"linux-modules-nvidia-550-server-open-{kernel}",
        f"linux-modules-nvidia-550-server-open-{flavour}",
        "nvidia-headless-no-dkms-550-server-open",
        "nvidia-utils-550-server",
    ]


def _template(expr: str, **facts: Any) -> Any:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = _variables("debian12", "nvidia")
    variables["ansible_facts"] = {**variables["ansible_facts"], **facts}
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template(expr))


def test_arm64_paths_come_from_the_architecture() -> None:
    kernel = "6.1.0-27-arm64"
    assert _template("{{ _nvidia_driver_headers }}") == [
        "linux-headers-6.8.0-45-generic",  # the facts' running kernel
        "linux-headers-amd64",
    ]
    assert _template("{{ _nvidia_driver_headers }}", architecture="aarch64", kernel=kernel) == [
        f"linux-headers-{kernel}",
        "linux-headers-arm64",
    ]
    mpi = "{{ _nccl_tests_mpi_home }}"
    assert _template(mpi).strip() == "/usr/lib/x86_64-linux-gnu/openmpi"
    assert _template(mpi, architecture="aarch64").strip() == "/usr/lib/aarch64-linux-gnu/openmpi"


def test_nccl_tests_build_again_when_cuda_or_nccl_change() -> None:
    """Its build directory (and so the build's `creates:`) names both versions."""
    build = _template("{{ _nccl_tests_build }}").strip()
    assert build == f"build-cuda{PINS['cuda_version']}-nccl{PINS['nccl_version']}"
    tasks = (ROLES / "nccl_tests" / "tasks" / "build.yml").read_text()
    assert 'creates: "{{ _nccl_tests_src }}/{{ _nccl_tests_build }}/all_reduce_perf"' in tasks
    make = _template("{{ _nccl_tests_make }}")
    assert f"BUILDDIR={build}" in make


@pytest.mark.parametrize("source", ["nvidia", "distro"])
def test_nccl_tests_finds_nccl_from_the_wheel_through_an_nccl_home(source: str) -> None:
    """NCCL's wheel has nccl.h and libnccl.so.2 off the compiler's paths and no libnccl.so: the
    build gets NCCL_HOME, a directory of links to them; NVIDIA's packages need none."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = _variables("debian12", source) | {"nccl_tests_source": source}
    templar = Templar(loader=DataLoader(), variables=variables)
    make = templar.template(trust_as_template("{{ _nccl_tests_make }}"))
    homes = [a for a in make if a.startswith("NCCL_HOME=")]
    assert homes == (["NCCL_HOME=/opt/nccl-tests/nccl-home"] if source == "distro" else [])
    tasks = _yaml.load((ROLES / "nccl_tests" / "tasks" / "build.yml").read_text())
    (links,) = [t for t in tasks if t["name"] == "The wheel's headers and library in it"]
    assert {"src": "lib/libnccl.so.2", "dest": "lib/libnccl.so"} in links["loop"]
    names = [t["name"] for t in tasks]
    assert names.index("The wheel's headers and library in it") < names.index(
        "Build against the installed CUDA, NCCL and MPI"
    )


def test_cdi_spec_is_made_again_when_the_driver_or_the_devices_change(tmp_path: Path) -> None:
    """The role's script, run by bash with stand-ins for ldconfig, nvidia-smi and nvidia-ctk: a
    new driver, or a new MIG layout (new instances in `nvidia-smi -L`), makes the spec again."""
    import os
    import subprocess

    tasks = _yaml.load((ROLES / "nvidia_container_toolkit" / "tasks" / "main.yml").read_text())
    (task,) = [t for t in tasks if t["name"].startswith("Describe the GPUs")]
    script = task["ansible.builtin.shell"]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    lib = tmp_path / "libcuda.so.1"
    listing = tmp_path / "nvidia-smi-L"
    listing.write_text("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0d3c1d2e)\n")
    (bindir / "ldconfig").write_text(f"#!/bin/sh\necho '\tlibcuda.so.1 (libc6,x86-64) => {lib}'\n")
    (bindir / "nvidia-smi").write_text(f"#!/bin/sh\ncat {listing}\n")
    (bindir / "nvidia-ctk").write_text(
        '#!/bin/sh\nfor a; do case "$a" in --output=*) echo made >> "${a#--output=}";; esac; done\n'
    )
    for tool in bindir.iterdir():
        tool.chmod(0o755)
    cdi = tmp_path / "cdi" / "nvidia.yaml"
    cdi.parent.mkdir()
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "CDI": str(cdi)}

    def run(driver: str) -> str:
        target = tmp_path / f"libcuda.so.{driver}"
        target.touch()
        lib.unlink(missing_ok=True)
        lib.symlink_to(target)
        r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert run("550.90.07") == "generated"
    assert run("550.90.07") == ""  # the same driver: left alone (changed_when reads "generated")
    assert run("570.86.15") == "generated"
    listing.write_text(
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0d3c1d2e)\n"
        "  MIG 1g.10gb     Device  0: (UUID: MIG-8c7a2a4f)\n"
    )
    assert run("570.86.15") == "generated"  # a MIG layout: new devices
    assert run("570.86.15") == ""
    assert cdi.read_text() == "made\nmade\nmade\n"
    assert (tmp_path / "cdi" / "nvidia.yaml.made-for").read_text().split()[0].endswith("570.86.15")


def test_installed_counts_only_packages_the_facts_name() -> None:
    installed = collection_plugin("test", "installed").TestModule().tests()["installed"]
    facts = {"packages": {"munge": [{"version": "0.5.15"}], "chrony": [{"version": "4.3"}]}}
    assert installed("munge", facts) and installed(["munge", "chrony"], facts)
    assert not installed(["munge", "slurmd"], facts)
    assert not installed("munge", {})  # no package facts read: install as ever
    # the names alone (installed_packages), which win over package_facts' dictionary
    names = {"provision_packages": ["chrony", "munge"], **facts}
    assert installed(["munge", "chrony"], names) and not installed("slurmd", names)
    assert not installed("munge", {"provision_packages": [], **facts})


@pytest.mark.parametrize("kubernetes", [False, True])
def test_the_dcgm_exporter_names_the_pod_using_a_gpu_on_kubernetes(kubernetes: bool) -> None:
    """Under Kubernetes the host's exporter maps each GPU to its pod (--kubernetes, through the
    kubelet's pod-resources socket, root's only): it runs as root, sandboxed, instead of as a
    dynamic user; one exporter per node, no second one as a DaemonSet on the same port."""
    unit = (ROLES / "dcgm" / "templates" / "dcgm-exporter.service.j2").read_text()
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = {"dcgm_exporter_port": 9400, "dcgm_exporter_kubernetes": kubernetes}
    text = Templar(loader=DataLoader(), variables=variables).template(
        trust_as_template(unit.replace("{{ ansible_managed }}", "managed"))
    )
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert exec_start.endswith(" --kubernetes") is kubernetes
    assert ("DynamicUser=true" in text) is not kubernetes
    assert ("ProtectSystem=strict" in text) is kubernetes


def test_kubernetes_gpu_clusters_with_an_exporter_map_gpus_to_pods(tmp_path: Path) -> None:
    from provision.cluster import Cluster
    from provision.render import render
    from provision.spec import load_spec

    spec = ROOT / "examples" / "k8s.yaml"
    files = render(Cluster(load_spec(spec)))
    assert "dcgm_exporter_kubernetes: true" in files["inventory/group_vars/all.yml"]
    # without an exporter, or on Slurm, nothing to map
    text = spec.read_text()
    start = text.index("nvidia:\n")
    without = tmp_path / "k8s.yaml"
    without.write_text(text[:start] + text[text.index("security:") :])
    files = render(Cluster(load_spec(without)))
    assert "dcgm_exporter_kubernetes" not in files["inventory/group_vars/all.yml"]
    slurm = render(Cluster(load_spec(ROOT / "examples" / "dgx-superpod.yaml")))
    assert "dcgm_exporter_kubernetes" not in slurm["inventory/group_vars/all.yml"]


UBUNTU_PERSISTENCED = """[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target
StopWhenUnneeded=true
Before=systemd-backlight@backlight:nvidia_0.service

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced
"""


@pytest.mark.parametrize("packaged", ["ubuntu", "nvidia"])
def test_the_persistence_daemon_runs_with_persistence_on(packaged: str) -> None:
    """Ubuntu's unit (nvidia-compute-utils-N) turns persistence off and stops when unneeded:
    the drop-in replaces its own command line with persistence on and keeps it up; a unit that
    already runs with persistence on keeps its command line."""
    import base64

    unit = (
        UBUNTU_PERSISTENCED
        if packaged == "ubuntu"
        else "[Service]\nType=forking\nExecStart=/usr/bin/nvidia-persistenced --verbose\n"
    )
    content = base64.b64encode(unit.encode()).decode()
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = _variables("ubuntu22.04", "nvidia") | {"_nvidia_driver_unit": {"content": content}}
    templar = Templar(loader=DataLoader(), variables=variables)
    dropin = templar.template(trust_as_template("{{ _nvidia_driver_persistenced_dropin }}"))
    lines = dropin.splitlines()
    assert "Before=slurmd.service" in lines
    if packaged == "ubuntu":
        assert lines[-3:] == [
            "[Service]",
            "ExecStart=",
            "ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced"
            " --persistence-mode --verbose",
        ]
        assert "StopWhenUnneeded=false" in lines
    else:
        assert "[Service]" not in dropin and "StopWhenUnneeded" not in dropin
    assert "--no-persistence-mode" not in dropin


@pytest.mark.parametrize(
    ("cudnn", "cuda", "matches", "misses"),
    [
        ("9.1", "12.4", ["9.1.0.70-1", "9.1.1.17-1"], ["9.10.2.21-1", "9.11.0.98-1", "9.2.0.82-1"]),
        ("9.1.0.70", "12.4", ["9.1.0.70-1"], ["9.1.0.700-1", "9.1.1.17-1"]),
    ],
)
def test_version_patterns_stay_on_the_pinned_versions(
    cudnn: str, cuda: str, matches: list[str], misses: list[str]
) -> None:
    """apt and dnf match these patterns as shell globs over the versions a repository offers
    (fnmatch): cuDNN 9.1 must never take 9.10 or 9.11, and NCCL must take the build for the
    toolkit's CUDA minor, not the newest of its major."""
    import fnmatch

    variables = _variables("ubuntu22.04", "nvidia") | {"cudnn_version": cudnn, "cuda_version": cuda}
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    templar = Templar(loader=DataLoader(), variables=variables)
    packages = templar.template(trust_as_template("{{ _cudnn_packages_apt }}"))
    pattern = packages[0].split("=", 1)[1]
    assert [v for v in matches + misses if fnmatch.fnmatchcase(v, pattern)] == matches
    nccl = templar.template(trust_as_template("{{ _nccl_packages }}"))
    assert nccl[0] == "libnccl2=2.21.5-1+cuda12.4"
    offered = ["2.21.5-1+cuda12.4", "2.21.5-1+cuda12.5", "2.21.5-1+cuda11.0"]
    assert [v for v in offered if fnmatch.fnmatchcase(v, nccl[0].split("=", 1)[1])] == [
        "2.21.5-1+cuda12.4"
    ]


def _task_names(role: str, file: str = "main.yml") -> list[str]:
    return [t["name"] for t in _yaml.load((ROLES / role / "tasks" / file).read_text())]


def test_rocky_builds_modules_with_dkms_from_epel_and_the_running_kernels_headers() -> None:
    """NVIDIA's RHEL 9 guide: CRB and EPEL (dkms) and the running kernel's kernel-devel and
    kernel-headers before a -dkms or -open stream; the versionlock plugin before the lock, which
    holds the -libs and kernel module packages too (and is renewed after an upgrade)."""
    names = _task_names("nvidia_driver", "dnf.yml")
    order = [
        "CodeReady Builder, which EPEL builds on (modules built on the node)",
        "EPEL, where dkms comes from (modules built on the node)",
        "The running kernel's headers and build files, and dkms",
        "Install the driver (the module stream pins the branch)",
        "The versionlock plugin, which the lock needs",
        "Unlock the versions the install replaced",
        "Lock the driver's packages, its libraries and its kernel modules",
    ]
    assert names == order
    kernel = "5.14.0-427.13.1.el9_4.x86_64"
    for flavour, builds in (("open", True), ("dkms", True), ("precompiled", False)):
        variables = _variables("rocky9", "nvidia") | {"nvidia_driver_modules": flavour}
        variables["ansible_facts"] = {**variables["ansible_facts"], "kernel": kernel}
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar, trust_as_template

        templar = Templar(loader=DataLoader(), variables=variables)
        got = templar.template(
            trust_as_template("{{ [_nvidia_driver_builds | bool, _nvidia_driver_build_packages] }}")
        )
        assert got == [builds, [f"kernel-devel-{kernel}", f"kernel-headers-{kernel}", "dkms"]]
    locked = _template("{{ _nvidia_driver_dnf_locked }}")
    import fnmatch

    rocky = [  # what the 550-open stream installs on Rocky 9, each held by a pattern
        "nvidia-driver",
        "nvidia-driver-libs",
        "nvidia-driver-cuda",
        "nvidia-driver-cuda-libs",
        "nvidia-driver-NVML",
        "kmod-nvidia-open-dkms",
        "nvidia-kmod-common",
        "nvidia-persistenced",
        "nvidia-modprobe",
    ]
    assert [p for p in rocky if not any(fnmatch.fnmatchcase(p, g) for g in locked)] == []


@pytest.mark.parametrize("os_name", ["ubuntu22.04", "rocky9"])
def test_nvswitch_nodes_get_nscq_of_the_drivers_version_held_with_it(os_name: str) -> None:
    text = render_case(os_name, "nvidia").split("## fabric manager\n")[1].split("\n\n")[0]
    sep = "=" if os_name.startswith("ubuntu") else "-"
    assert f"libnvidia-nscq-550{sep}550.90.07-1" in text.splitlines()
    names = _task_names("nvidia_fabricmanager")
    assert names.index("Hold them with the driver (apt)") > names.index(
        "Install the fabric manager and NSCQ of the driver's exact version (apt)"
    )
    assert names.index("Lock them with the driver (dnf)") > names.index(
        "The versionlock plugin, which the lock needs (dnf)"
    )


def test_mig_is_applied_in_the_role_with_dcgm_stopped_before_it_starts_again() -> None:
    """The MIG guide: daemons holding the driver stop before MIG changes. The layout is applied
    by the role's own tasks (no handler at the play's end, after DCGM started), between stopping
    and starting DCGM's services, and the role runs before DCGM's in the play."""
    assert not (ROLES / "nvidia_mig" / "handlers").exists()
    apply = _task_names("nvidia_mig", "apply.yml")
    assert apply == [
        "Read which services run",
        "Stop what holds the GPUs",
        "Apply the layout (or turn MIG off)",
        "Start them again (the host engine before its exporter)",
    ]
    holders = _load(ROLES / "nvidia_mig" / "vars" / "main.yml")["_nvidia_mig_holders"]
    assert set(holders) == {"nvidia-dcgm.service", "dcgm-exporter.service"}
    play = next(
        p
        for p in _yaml.load((PLAYBOOKS_DIR / "site.yml").read_text())
        if p["name"] == "GPU software"
    )
    roles = [t["name"] for t in play["tasks"]]
    assert roles.index("Role nvidia_mig") < roles.index("Role dcgm")
    mig = play["tasks"][roles.index("Role nvidia_mig")]
    assert "when" not in mig  # every GPU node: an empty layout takes an earlier one away
    services = {
        "nvidia-dcgm.service": {"state": "running"},
        "dcgm-exporter.service": {"state": "running"},
        "slurmd.service": {"state": "running"},
    }
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = _variables("ubuntu22.04", "nvidia")
    variables["ansible_facts"] = {**variables["ansible_facts"], "services": services}
    got = Templar(loader=DataLoader(), variables=variables).template(
        trust_as_template("{{ _nvidia_mig_running }}")
    )
    assert got == ["dcgm-exporter.service", "nvidia-dcgm.service"]


@pytest.mark.parametrize(
    ("layout", "modes", "current", "resets", "made"),
    [
        ("1g.10gb,1g.10gb", ["-mig 1"], "Disabled", ["0", "1"], ["mig -cgi 1g.10gb,1g.10gb -C"]),
        ("1g.10gb", ["-mig 1"], "Enabled", [], ["mig -cgi 1g.10gb -C"]),
        ("", ["-mig 0"], "Enabled", ["0", "1"], []),
    ],
)
def test_the_mig_script_turns_mig_on_or_off_and_makes_the_layout(
    tmp_path: Path, layout: str, modes: list[str], current: str, resets: list[str], made: list[str]
) -> None:
    """The boot script, run by bash with a stand-in nvidia-smi that records what it is asked:
    an empty layout turns MIG off (reset where the mode is still on) and makes no instance."""
    import os
    import subprocess

    log = tmp_path / "calls"
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'case "$*" in --query-gpu=*) '
        f'echo "0, {current}, {current}"; echo "1, {current}, {current}";; esac\n'
    )
    smi.chmod(0o755)
    (tmp_path / "layout").write_text(f"{layout}\n")
    env = {
        **os.environ,
        "PATH": f"{smi.parent}:{os.environ['PATH']}",
        "NVIDIA_MIG_LAYOUT": str(tmp_path / "layout"),
        "NVIDIA_MIG_STAMP": str(tmp_path / "stamp"),
    }
    script = str(ROLES / "nvidia_mig" / "files" / "nvidia-mig-apply")
    r = subprocess.run(["bash", script], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    assert [c for c in calls if c.startswith("-mig")] == modes
    assert [c.split()[-1] for c in calls if c.startswith("--gpu-reset")] == resets
    assert [c for c in calls if c.startswith("mig -cgi")] == made
    assert calls.index("mig -dgi") < calls.index(modes[0])  # instances gone before the mode
    again = subprocess.run(["bash", script], env=env, capture_output=True, text=True)
    assert "already applied" in again.stdout and len(log.read_text().splitlines()) == len(calls)


@pytest.mark.parametrize(
    ("os_name", "source", "modules", "wanted"),
    [
        (
            "debian12",
            "distro",
            "dkms",
            [
                "nvidia-kernel-dkms",
                "firmware-nvidia-gsp",
                "nvidia-smi",
                "libnvidia-ml1",
                "libcuda1",
                "nvidia-persistenced",
            ],
        ),
        (
            "ubuntu24.04",
            "nvidia",
            "precompiled",
            [
                "linux-modules-nvidia-550-server-open-6.8.0-51-generic",
                "linux-modules-nvidia-550-server-open-generic",
                "nvidia-headless-no-dkms-550-server-open",
                "nvidia-utils-550-server",
            ],
        ),
    ],
)
def test_a_node_image_gets_the_modules_for_its_own_kernel(
    os_name: str, source: str, modules: str, wanted: list[str]
) -> None:
    """In a builder container (tasks/image.yml) there is no GPU, and the running kernel is the
    building machine's: the image still gets the kernel modules the spec asks for, built or
    chosen for the kernel in the image's /lib/modules, with that kernel's headers."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = _variables(os_name, source) | {
        "nvidia_driver_modules": modules,
        "_nvidia_driver_image_kernel": "6.8.0-51-generic"
        if "ubuntu" in os_name
        else "6.1.0-57-amd64",
    }
    if modules == "precompiled":
        variables["nvidia_driver_version"] = "550"
    variables["ansible_facts"] = {
        **variables["ansible_facts"],
        "kernel": "6.18.44-builder",  # the machine the builder runs on
        "nvidia_hardware": False,
    }
    templar = Templar(loader=DataLoader(), variables=variables)
    assert templar.template(trust_as_template("{{ _nvidia_driver_packages }}")) == wanted
    kernel = variables["_nvidia_driver_image_kernel"]
    headers = [f"linux-headers-{kernel}"] + (
        ["linux-headers-amd64"] if os_name == "debian12" else []
    )
    assert templar.template(trust_as_template("{{ _nvidia_driver_headers }}")) == headers
    assert templar.template(trust_as_template("{{ _nvidia_driver_gpus | bool }}")) is True
    # the same node booted from the image, without a GPU on its bus: the userspace alone
    del variables["_nvidia_driver_image_kernel"]
    templar = Templar(loader=DataLoader(), variables=variables)
    assert templar.template(trust_as_template("{{ _nvidia_driver_flavour }}")) == "userspace"


def _reboot_tasks(**facts: Any) -> tuple[bool, bool, str]:
    """Whether the driver role's reboot task and its "reboot due" line run on a node new to
    the cluster (one the reboot may take) whose module failed to load, and the line's text,
    each `when` and the message through Ansible's templating."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    tasks = {
        t["name"]: t
        for t in _yaml.load((ROLES / "nvidia_driver" / "tasks" / "services.yml").read_text())
    }
    variables = _variables("debian12", "distro")
    variables["ansible_facts"] = {
        **variables["ansible_facts"],
        "nvidia_loaded_driver": "535.183.01",
        **facts,
    }
    variables |= {
        "inventory_hostname": "gpu001",
        "nvidia_driver_reboot": True,
        "provision_drained": ["gpu001"],
        "_nvidia_driver_modinfo": {"stdout": "535.216.01"},
        "_nvidia_driver_reboot_due": True,
    }
    templar = Templar(loader=DataLoader(), variables=variables)

    def runs(name: str) -> bool:
        return all(
            templar.template(trust_as_template("{{ " + str(c) + " }}")) in (True, "True")
            for c in tasks[name]["when"]
        )

    said = templar.template(
        trust_as_template(tasks["Say that a reboot is due"]["ansible.builtin.debug"]["msg"])
    )
    return runs("Reboot into the new module"), runs("Say that a reboot is due"), said


def test_a_node_booted_from_its_pools_image_is_never_rebooted_by_the_role() -> None:
    """A reboot brings a diskless node back as the image the boot server serves, unconverged
    and with a new host key: the role leaves it to apply's boot (a rolling apply boots drained
    batches into a new image) and says why. A node with its own disk reboots into the module."""
    reboot, said, _ = _reboot_tasks(cmdline={"BOOT_IMAGE": "/vmlinuz", "root": "/dev/sda1"})
    assert (reboot, said) == (True, False)
    cmdline = {"boot": "live", "provision.image": "0c0c0c0c0c0c0c0c", "initrd": "initrd.img"}
    reboot, said, line = _reboot_tasks(cmdline=cmdline)
    assert (reboot, said) == (False, True)
    assert line.startswith("gpu001: NVIDIA module 535.216.01 installed, 535.183.01 loaded: it ")
    assert "runs from its pool's image" in line and "apply --batch N" in line, line

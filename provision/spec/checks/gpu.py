"""The GPU pools' checks: drivers and their sources, MIG, the GPU generations."""

from __future__ import annotations

import re

from provision.spec.checks.base import Problem
from provision.spec.models import Spec
from provision.spec.nodes import Loc
from provision.spec.profiles import load_profiles

# Debian and Ubuntu package NVIDIA drivers; Rocky has no distribution NVIDIA packages.
_DISTRO_NVIDIA_OS = ("debian12", "ubuntu22.04", "ubuntu24.04")
# What Debian 12's non-free does not carry: the NVIDIA-only parts.
_NVIDIA_ONLY = ("dcgm", "container_toolkit")


def _mig_slices(profile: str, gpu_memory_gib: int) -> tuple[int, int]:
    """Compute slices (of 7) and memory slices (of 8) a MIG profile takes: 3g.40gb on an
    80 GB GPU takes 3 and 4."""
    compute, memory = profile.split(".")
    return int(compute[:-1]), max(1, round(int(memory[:-2]) * 8 / gpu_memory_gib))


def check_gpu(spec: Spec) -> list[Problem]:
    problems: list[Problem] = []
    nvidia = spec.nvidia
    at: Loc = ("nvidia",)
    if nvidia.source == "mirror" and not nvidia.mirror_url:
        problems.append(
            (
                (*at, "source"),
                "source 'mirror' needs 'mirror_url': the mirror's "
                "base URL, with NVIDIA's repository paths below it",
            )
        )
    if nvidia.mirror_url and nvidia.source != "mirror":
        problems.append(
            (
                (*at, "mirror_url"),
                f"'mirror_url' is only used with source 'mirror' "
                f"(source is '{nvidia.source}'): remove it or set source: mirror",
            )
        )
    if (nvidia.dcgm_exporter_url is None) != (nvidia.dcgm_exporter_sha256 is None):
        problems.append(
            (
                (*at, "dcgm_exporter_sha256"),
                "give 'dcgm_exporter_url' and "
                "'dcgm_exporter_sha256' together: nothing is installed unverified",
            )
        )
    profiles = load_profiles(spec.profiles)
    gpu_pools = [
        p for p in spec.pools if (prof := profiles.get(p.profile)) is not None and prof.gpu
    ]
    problems += _check_enroot(spec, bool(gpu_pools))
    if nvidia.source == "distro" and gpu_pools:
        if spec.os not in _DISTRO_NVIDIA_OS:
            problems.append(
                (
                    (*at, "source"),
                    f"{spec.os} has no distribution NVIDIA packages: "
                    "use source 'nvidia' or 'mirror'",
                )
            )
        for part in _NVIDIA_ONLY:
            if getattr(nvidia, part):
                problems.append(
                    (
                        (*at, part),
                        f"{part} comes only from NVIDIA's repositories; "
                        f"with source 'distro' set {part}: false, or use source "
                        "'nvidia' or 'mirror'",
                    )
                )
        if spec.os == "debian12" and nvidia.driver_modules != "dkms":
            problems.append(
                (
                    (*at, "driver_modules"),
                    "Debian 12 packages only the proprietary "
                    "DKMS modules at the driver's version: set driver_modules: dkms",
                )
            )
        for pool in gpu_pools:
            gpu = profiles[pool.profile].gpu
            if gpu is not None and gpu.nvswitch:
                problems.append(
                    (
                        (*at, "source"),
                        f"pool '{pool.name}' has NVSwitch, whose "
                        "fabric manager comes only from NVIDIA's repositories: use "
                        "source 'nvidia' or 'mirror'",
                    )
                )
                break
    if nvidia.driver_modules == "precompiled" and spec.os == "debian12":
        problems.append(
            (
                (*at, "driver_modules"),
                "no precompiled NVIDIA modules exist for Debian 12: use 'open' or 'dkms'",
            )
        )
    sw = spec.software
    for part in ("cudnn", "nccl"):
        if getattr(sw, part) and not sw.cuda:
            problems.append(
                (
                    ("software", part),
                    f"{part} is built per CUDA major version: pin software.cuda too",
                )
            )
    if sw.cudnn and sw.cudnn.split(".")[0] not in ("8", "9"):
        problems.append(
            (("software", "cudnn"), f"cuDNN {sw.cudnn}: major versions 8 and 9 are supported")
        )
    for i, pool in enumerate(spec.pools):
        prof = profiles.get(pool.profile)
        if pool.mig is None or prof is None:  # an unknown profile is reported by check_pools
            continue
        gpu = prof.gpu
        where: Loc = ("pools", i, "mig")
        if gpu is None or not gpu.mig_profiles:
            problems.append(
                (where, f"profile '{pool.profile}' has no MIG-capable GPU: remove 'mig'")
            )
            continue
        unknown = [m for m in pool.mig if m not in gpu.mig_profiles]
        if unknown:
            problems.append(
                (
                    where,
                    f"{', '.join(unknown)} not offered by {gpu.model}: "
                    f"choose from {', '.join(gpu.mig_profiles)}",
                )
            )
            continue
        slices = [_mig_slices(m, gpu.memory_gib) for m in pool.mig]
        compute, memory = sum(c for c, _ in slices), sum(m for _, m in slices)
        if compute > 7 or memory > 8:
            problems.append(
                (
                    where,
                    f"the layout needs {compute} of 7 compute slices and "
                    f"{memory} of 8 memory slices of one {gpu.model}: use fewer "
                    "or smaller instances",
                )
            )
    return problems


# NVIDIA's driver documentation: Grace Hopper and Blackwell run only the open kernel modules;
# Blackwell needs the R570 driver or later
_GRACE_HOPPER = re.compile(r"^GH\d{3}\b", re.IGNORECASE)
_BLACKWELL = re.compile(r"^G?B\d{3}\b|blackwell", re.IGNORECASE)
BLACKWELL_DRIVER = 570


def _proprietary_modules(spec: Spec) -> bool:
    """Whether the nodes get NVIDIA's proprietary kernel modules: the dkms flavour, and the
    precompiled streams of Rocky (Ubuntu's precompiled ones are the open modules)."""
    modules = spec.nvidia.driver_modules
    return modules == "dkms" or (modules == "precompiled" and spec.os.startswith("rocky"))


def check_gpu_generation(spec: Spec) -> list[Problem]:
    """What a GPU generation needs of the driver, refused where the spec cannot give it."""
    problems: list[Problem] = []
    profiles = load_profiles(spec.profiles)
    driver = spec.software.nvidia_driver
    for i, pool in enumerate(spec.pools):
        prof = profiles.get(pool.profile)
        if prof is None or prof.gpu is None:
            continue
        model = prof.gpu.model
        blackwell = _BLACKWELL.search(model) is not None
        if (blackwell or _GRACE_HOPPER.search(model)) and _proprietary_modules(spec):
            problems.append(
                (
                    ("nvidia", "driver_modules"),
                    f"pool '{pool.name}' has {model} GPUs, which run only NVIDIA's open kernel "
                    f"modules: set driver_modules: open",
                )
            )
        if not blackwell:
            continue
        if driver is not None and int(str(driver).split(".")[0]) < BLACKWELL_DRIVER:
            problems.append(
                (
                    ("software", "nvidia_driver"),
                    f"pool '{pool.name}' has Blackwell GPUs ({model}), which need driver "
                    f"{BLACKWELL_DRIVER} or later, not {driver}",
                )
            )
        if prof.gpu.nvswitch:
            problems.append(
                (
                    ("pools", i, "profile"),
                    f"{model} with NVSwitch is not supported yet: Blackwell's NVLink fabric "
                    "needs NVIDIA's NVLink subnet manager (NVLSM) beside the fabric manager, "
                    "which no role installs yet",
                )
            )
    return problems


def gpu_pools(spec: Spec) -> list[str]:
    profiles = load_profiles(spec.profiles)
    return [
        p.name
        for p in spec.pools
        if p.profile in profiles and profiles[p.profile].gpu is not None and p.role == "compute"
    ]


def _check_enroot(spec: Spec, gpus: bool) -> list[Problem]:
    """Containers in jobs: Slurm's Pyxis, Enroot on GPU nodes with NVIDIA's hooks, and nothing
    installed unverified."""
    nvidia = spec.nvidia
    if not nvidia.enroot:
        return []
    at: Loc = ("nvidia", "enroot")
    if spec.scheduler != "slurm":
        return [(at, "Enroot and Pyxis run jobs in containers through Slurm: scheduler slurm")]
    if not gpus:
        return [(at, "no pool has GPUs: Enroot goes on the GPU nodes")]
    problems: list[Problem] = []
    if not nvidia.container_toolkit:
        problems.append(
            (
                ("nvidia", "container_toolkit"),
                "Enroot's NVIDIA hook (the GPUs inside a container) needs the NVIDIA Container "
                "Toolkit: leave container_toolkit on with enroot",
            )
        )
    for key, what in (
        ("enroot_sha256", "the enroot package"),
        ("enroot_caps_sha256", "the enroot+caps package"),
        ("pyxis_sha256", "the Pyxis source archive"),
    ):
        if getattr(nvidia, key) is None:
            problems.append(
                (
                    ("nvidia", key),
                    f"give the SHA-256 of {what} (sha256sum of the release file): nothing is "
                    "installed unverified",
                )
            )
    return problems

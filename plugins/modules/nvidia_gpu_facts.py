#!/usr/bin/python
"""Ansible module: what NVIDIA hardware a node has, and whether it is a container.

The NVIDIA roles call it first and decide from it alone (no facts of other roles): a node with
no NVIDIA GPU, or a container, gets the userspace parts only, never kernel modules, services
that need a GPU, or a reboot.
"""

from __future__ import annotations

import os
import re

DOCUMENTATION = r"""
module: nvidia_gpu_facts
short_description: Count NVIDIA GPUs and NVSwitches (PCI vendor 10de) and detect containers
description:
  - Reads the PCI devices from sysfs, the loaded driver from /proc/driver/nvidia/version and the
    container markers systemd, podman and docker leave. Changes nothing.
options:
  root:
    description: File system root to read from (tests point it at a fake tree).
    type: path
    default: /
author: provision
"""

NVIDIA_VENDOR = "0x10de"
# PCI classes: 0x0300 VGA, 0x0302 3D controller (data-centre GPUs); 0x0680 bridge (NVSwitch)
GPU_CLASSES = ("0x0300", "0x0302")
NVSWITCH_CLASS = "0x0680"
_MODULE_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+)+)")


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def in_container(root: str = "/") -> bool:
    markers = ("run/.containerenv", ".dockerenv")
    if any(os.path.exists(os.path.join(root, m)) for m in markers):
        return True
    if _read(os.path.join(root, "run/systemd/container")):
        return True
    environ = _read(os.path.join(root, "proc/1/environ"))
    return "container=" in environ.replace("\0", "\n")


def detect(root: str = "/") -> dict[str, object]:
    gpus = nvswitches = 0
    devices = os.path.join(root, "sys/bus/pci/devices")
    for name in sorted(os.listdir(devices)) if os.path.isdir(devices) else []:
        base = os.path.join(devices, name)
        if _read(os.path.join(base, "vendor")) != NVIDIA_VENDOR:
            continue
        pci_class = _read(os.path.join(base, "class"))[:6]
        if pci_class in GPU_CLASSES:
            gpus += 1
        elif pci_class == NVSWITCH_CLASS:
            nvswitches += 1
    match = _MODULE_VERSION.search(_read(os.path.join(root, "proc/driver/nvidia/version")))
    container = in_container(root)
    hardware = gpus > 0 and not container
    if hardware:
        summary = f"{gpus} NVIDIA GPU(s), {nvswitches} NVSwitch(es)"
    else:
        why = "container" if container else "no NVIDIA GPU (PCI vendor 10de)"
        summary = f"{why}: userspace only; kernel modules, GPU services and reboots skipped"
    return {
        "nvidia_gpu_count": gpus,
        "nvidia_nvswitch_count": nvswitches,
        "nvidia_in_container": container,
        "nvidia_hardware": hardware,
        "nvidia_loaded_driver": match.group(1) if match else "",
        "nvidia_summary": summary,
    }


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={"root": {"type": "path", "default": "/"}}, supports_check_mode=True
    )
    facts = detect(module.params["root"])
    module.exit_json(changed=False, ansible_facts=facts, msg=facts["nvidia_summary"])


if __name__ == "__main__":
    main()

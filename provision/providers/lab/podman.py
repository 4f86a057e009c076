"""The podman command line, with the project's containers.conf, and clear errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from provision.errors import OperationError

CONTAINERS_CONF = Path(__file__).with_name("containers.conf")
INSTALL_HINT = "install it with `make setup` (apt-get install podman runc debootstrap)"


def env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def require(tool: str = "podman") -> str:
    path = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
    if path is None:
        raise OperationError(f"{tool} is not installed: {INSTALL_HINT}")
    return path


def podman(
    *args: str, check: bool = True, stdin: bytes | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[bytes]:
    cmd = [require("podman"), *args]
    result = subprocess.run(
        cmd, input=stdin, capture_output=True, env=env(), timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        err = " ".join(result.stderr.decode(errors="replace").split())[-400:]
        raise OperationError(f"podman {args[0]} {args[1] if len(args) > 1 else ''} failed: {err}")
    return result


def text(*args: str, check: bool = True) -> str:
    return podman(*args, check=check).stdout.decode(errors="replace").strip()


def image_exists(name: str) -> bool:
    return podman("image", "exists", name, check=False).returncode == 0


def image_label(image: str, key: str) -> str | None:
    """A label of `image`; None where the image or the label is missing."""
    if not image_exists(image):
        return None
    out = text("image", "inspect", image, "--format", "{{json .Labels}}")
    labels = json.loads(out or "null") or {}
    value = labels.get(key)
    return value if isinstance(value, str) else None


def network_exists(name: str) -> bool:
    return podman("network", "exists", name, check=False).returncode == 0

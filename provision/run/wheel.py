"""This project as a wheel, made from the package that is running: the burst role puts it on
the head nodes, which then need no package index (the burst programs use the standard library
only, and a wheel of pure Python imports straight from its zip file).

The wheel is built from the installed or checked-out package files, byte for byte the same for
the same files (fixed timestamps and order), so a re-apply copies nothing.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path

import provision

NAME = "gpu_provision"
# a zip file cannot hold times before 1980; every entry gets this one
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest},{len(data)}"


# what an installed wheel carries beside the code for the workstation (the Ansible collection,
# the renderer's templates: provision/assets.py); the nodes run neither, and a checkout has
# them outside the package, so the heads' wheel is the same from either
_WORKSTATION_ONLY = ("ansible_collections", "render/templates")


def package_files(root: Path | None = None) -> list[tuple[str, bytes]]:
    """(path in the wheel, content) of every file of the provision package the nodes may run,
    sorted."""
    package = root or Path(provision.__file__).resolve().parent
    files = []
    for path in sorted(package.rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        if path.relative_to(package).as_posix().startswith(_WORKSTATION_ONLY):
            continue
        arcname = "provision/" + path.relative_to(package).as_posix()
        files.append((arcname, path.read_bytes()))
    return files


def build_wheel(out_dir: Path, root: Path | None = None) -> Path:
    """Write the wheel into out_dir (unless the same bytes are there) and return its path."""
    version = provision.__version__
    dist_info = f"{NAME}-{version}.dist-info"
    files = package_files(root)
    files.append(
        (
            f"{dist_info}/METADATA",
            f"Metadata-Version: 2.1\nName: gpu-provision\nVersion: {version}\n".encode(),
        )
    )
    files.append(
        (
            f"{dist_info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: provision\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
    )
    files.append(
        (
            f"{dist_info}/entry_points.txt",
            b"[console_scripts]\nprovision = provision.cli:main\n",
        )
    )
    record = "".join(f"{name},{_record_hash(data)}\n" for name, data in files)
    record += f"{dist_info}/RECORD,,\n"
    files.append((f"{dist_info}/RECORD", record.encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            wheel.writestr(info, data)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{NAME}-{version}-py3-none-any.whl"
    data = buf.getvalue()
    if not target.exists() or target.read_bytes() != data:
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(target)
    return target

#!/usr/bin/python3
"""Write a one-program OCI image archive for `ctr image import`: there is no registry to pull
from here, so the image is made from the node's own /usr/bin/echo and the libraries it loads.

    oci_image.py OUT.tar NAME:TAG
"""

import hashlib
import io
import json
import os
import platform
import subprocess
import sys
import tarfile

PROGRAM = "/usr/bin/echo"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]


def layer() -> bytes:
    libs = subprocess.run(["ldd", PROGRAM], capture_output=True, text=True, check=True).stdout
    paths = [PROGRAM] + [w for w in libs.split() if w.startswith("/")]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in paths:
            # the file itself at the name the loader looks for (/lib64/ld-linux-x86-64.so.2 is a
            # link to a path the image would not have)
            tar.add(os.path.realpath(path), arcname=path.lstrip("/"), recursive=False)
    return buf.getvalue()


def main() -> None:
    out, ref = sys.argv[1], sys.argv[2]
    blobs = {}

    def blob(data: bytes, media: str) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media, "digest": digest, "size": len(data)}

    rootfs = layer()
    lay = blob(rootfs, "application/vnd.oci.image.layer.v1.tar")
    config = {
        "architecture": ARCH,
        "os": "linux",
        "config": {"Cmd": [PROGRAM, "hello from containerd"]},
        "rootfs": {"type": "layers", "diff_ids": [lay["digest"]]},
    }
    cfg = blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": cfg,
        "layers": [lay],
    }
    man = blob(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    man["annotations"] = {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref}
    index = {"schemaVersion": 2, "manifests": [man]}
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index).encode(),
    }
    files.update({f"blobs/sha256/{d.split(':')[1]}": data for d, data in blobs.items()})
    with tarfile.open(out, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


main()

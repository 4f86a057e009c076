"""A GPU pool's node image (examples/gpu-diskless.yaml: L40S servers booted diskless, Debian's
own NVIDIA driver): what apply's images phase makes for it, timed. The pool's packages and the
driver installed by Ansible in a builder container (playbooks/image.yml), the driver's kernel
module built by DKMS for the image's kernel (not this machine's), then the squashfs. Prints the
time of each part, the squashfs' size, and what DKMS built, for which kernel.

Run as root with podman (make bench): it needs the Debian mirror's non-free component. It makes
no cluster and boots nothing (the example's servers are real ones); it removes the pool's
image and the squashfs it made, unless `--keep`. About 6 minutes on two cores.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path

from provision import boot
from provision.cluster import Cluster
from provision.providers.lab import netboot, podman
from provision.render import render
from provision.render.output import write_render
from provision.spec import load_spec
from provision.sshkeys import ensure_ssh_key
from provision.state import State

ROOT = Path(__file__).resolve().parent.parent
MODULE = (
    "dkms status; for f in $(find /lib/modules -name 'nvidia*.ko*' | sort); do "
    'echo "$(basename "$f") $(du -k "$f" | cut -f1) KiB, vermagic $(modinfo -F vermagic "$f")"; '
    "done"
)


def main() -> int:
    keep = "--keep" in sys.argv
    spec = load_spec(ROOT / "examples" / "gpu-diskless.yaml")
    cluster = Cluster(spec)
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        print(f"  {line}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        state = State(Path(tmp), spec.name)
        state.build.mkdir(parents=True)
        ensure_ssh_key(state)
        write_render(render(cluster), state.build)
        started = time.monotonic()
        made: dict[str, str] = {}
        try:
            made = boot.images(cluster, state, say)
            wall = time.monotonic() - started
            found = [re.search(r"packages installed in (\d+) s", s) for s in said]
            packages = next((m[1] for m in found if m), "?")
            print(f"the gpu pool's image, from the kernel's layer: {wall:.0f} s")
            print(f"  the packages and the driver (Ansible in the builder): {packages} s")
            image = Path(made["gpu"])
            for name in netboot.FILES:
                print(f"  {name}: {(image / name).stat().st_size / 2**20:.0f} MB")
            built = podman.text(
                "run", "--rm", netboot.pool_image(spec.name, "gpu"), "sh", "-c", MODULE
            )
            print("  what DKMS built:\n    " + "\n    ".join(built.strip().splitlines()))
        finally:
            if not keep:  # the pool's podman image and its squashfs
                boot.remove_images(cluster, state)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

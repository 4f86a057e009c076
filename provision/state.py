"""The per-cluster state directory: everything a cluster's life needs, in one place.

<root>/<cluster>/
    build/        the current render
    applied/      the render of the last successful apply (what `plan` diffs against)
    keys/         generated SSH keys (0700 directory, 0600 files)
    secrets/      generated secrets such as the munge key (0700 / 0600)
    known_hosts   host keys seen by Ansible and verify (accept-new)
    facts/        Ansible fact cache
    logs/         one directory per run (ansible-runner artifacts)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path(".provision")
ENV_ROOT = "PROVISION_STATE_DIR"


def default_root() -> Path:
    return Path(os.environ.get(ENV_ROOT, str(DEFAULT_ROOT)))


@dataclass(frozen=True)
class State:
    root: Path
    cluster: str

    @property
    def dir(self) -> Path:
        return self.root / self.cluster

    @property
    def build(self) -> Path:
        return self.dir / "build"

    @property
    def applied(self) -> Path:
        return self.dir / "applied"

    @property
    def keys(self) -> Path:
        return self.dir / "keys"

    @property
    def secrets(self) -> Path:
        return self.dir / "secrets"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def facts(self) -> Path:
        return self.dir / "facts"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    def ensure(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for private in (self.keys, self.secrets):
            private.mkdir(mode=0o700, exist_ok=True)
            os.chmod(private, 0o700)
        self.logs.mkdir(exist_ok=True)
        self.facts.mkdir(exist_ok=True)

    def record_applied(self) -> None:
        """Copy the build to applied/ in one rename, so a crash never leaves half of it."""
        tmp = Path(tempfile.mkdtemp(dir=self.dir, prefix=".applied-"))
        try:
            shutil.copytree(self.build, tmp / "applied")
            old = self.dir / ".applied-old"
            if self.applied.exists():
                shutil.rmtree(old, ignore_errors=True)
                self.applied.rename(old)
            (tmp / "applied").rename(self.applied)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.root.exists() and not any(self.root.iterdir()):
            self.root.rmdir()

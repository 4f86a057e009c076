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

import fcntl
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from provision.assets import package_dir
from provision.errors import OperationError, UsageError

DEFAULT_ROOT = Path(".provision")
ENV_ROOT = "PROVISION_STATE_DIR"
LOCK = "lock"


def private_dir(path: Path) -> Path:
    """A directory only this user reaches: made 0700, corrected if looser; refused if it is a
    link or another user's (its files would be theirs to read or replace)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{path} is not a directory but a link or a file: remove it")
    if info.st_uid != os.geteuid():
        raise UsageError(
            f"{path} belongs to user {info.st_uid}, not to you ({os.geteuid()}): run as its "
            "owner, or use another --state-dir"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        path.chmod(0o700)
    return path


def user_root() -> Path:
    """The user's own state directory for provision: $XDG_STATE_HOME/provision, by default
    ~/.local/state/provision."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "provision"


def default_root(spec_path: Path) -> Path:
    """Where the state of the cluster a spec describes is when --state-dir is not given, the
    same from any working directory: $PROVISION_STATE_DIR; else `.provision` beside the spec;
    for a spec this package carries (the embedded default, the examples), which may lie in an
    installation nobody may write to, the user's own state directory (user_root)."""
    if os.environ.get(ENV_ROOT):
        return Path(os.environ[ENV_ROOT])
    spec = spec_path.resolve()
    if spec.is_relative_to(package_dir().resolve()):
        return user_root()
    return spec.parent / DEFAULT_ROOT


def refuse_lost_state(root: Path, cluster: str) -> None:
    """A cluster whose state is not under `root` but under the working directory, where
    earlier versions kept it by default, is refused with how to move it: a run without it would
    make new keys and secrets and push them to the running cluster."""
    legacy = Path.cwd() / DEFAULT_ROOT / cluster
    here = root / cluster
    if here.exists() or not (legacy / "secrets").is_dir():
        return
    if legacy.resolve() == here.resolve():
        return
    raise UsageError(
        f"cluster '{cluster}': its state is in {legacy} (under the working directory, where "
        f"earlier versions kept it), not in {here}, where provision looks for it from any "
        f"directory now: move it there (mkdir -p {root} && mv {legacy} {root}/), or pass "
        f"--state-dir {legacy.parent}"
    )


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
        for private in (self.dir, self.keys, self.secrets):
            private_dir(private)
        self.logs.mkdir(exist_ok=True)
        self.facts.mkdir(exist_ok=True)

    @contextmanager
    def locked(self, command: str) -> Iterator[None]:
        """Hold the cluster's lock while `command` changes its state; a second command on the
        same cluster fails at once, naming the one that holds it."""
        self.ensure()
        path = self.dir / LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OperationError(
                    f"cluster '{self.cluster}' is busy: {_holder(path)} holds {path}; "
                    "wait for it to finish, then run again"
                ) from None
            os.ftruncate(fd, 0)
            since = time.strftime("%Y-%m-%d %H:%M:%S")
            os.write(
                fd, json.dumps({"pid": os.getpid(), "command": command, "since": since}).encode()
            )
            yield
        finally:
            os.close(fd)

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


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        return f"`provision {info['command']}` (pid {info['pid']}, since {info['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another provision command"


def command_line() -> str:
    """What the lock file says is running: the verb and its arguments, one line."""
    return " ".join(sys.argv[1:])[:200].replace("\n", " ")

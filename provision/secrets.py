"""Secrets a cluster generates once and keeps in its state dir: mode 0600, never printed.

Ansible gets the directory's path, never a secret's value; the tasks that read them are no_log.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provision.errors import UsageError
from provision.state import State, private_dir

MUNGE_KEY = "munge.key"
SLURMDBD_PASSWORD = "slurmdbd.password"
GRAFANA_PASSWORD = "grafana-admin.password"
# the directory's (identity): its bind password, and the CA the nodes trust for it
DIRECTORY_BIND_PASSWORD = "directory-bind.password"
DIRECTORY_CA = "directory-ca.pem"
# the BMCs' account (`provision bmc-credentials`; the metal lab makes one where it has none)
CREDENTIALS = "bmc.json"


def smtp_password(receiver: str) -> str:
    """The secrets directory's copy of a mail receiver's relay password."""
    return f"smtp-{receiver}.password"


def check_secret_file(path: Path, sizes: tuple[int, int]) -> Path:
    """An existing secret is used only if it is this user's regular file, 0600 or stricter,
    and of a size such a secret has; anything else is refused with how to fix it."""
    info = path.lstat()
    remake = "or remove it and run again to make a new one"
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{path} is not a regular file (a link?): remove it and run again")
    if info.st_uid != os.geteuid():
        raise UsageError(
            f"{path} belongs to user {info.st_uid}, not to you: `chown {os.geteuid()} {path}` "
            f"if it is yours, {remake}"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise UsageError(
            f"{path} is mode {mode:04o}, readable by others: `chmod 600 {path}` if nobody "
            f"else read it, {remake}"
        )
    low, high = sizes
    if not low <= info.st_size <= high:
        raise UsageError(
            f"{path} is {info.st_size} bytes, not {low}-{high} as this secret is: remove it and "
            "run again to make a new one"
        )
    return path


def create_once(
    path: Path, make: Callable[[], bytes], sizes: tuple[int, int] = (16, 64 * 1024)
) -> Path:
    if os.path.lexists(path):
        return check_secret_file(path, sizes)
    # O_EXCL: two runs racing never both write; 0600 from the first byte on
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(make())
    return path


def write_private(path: Path, data: bytes) -> Path:
    """Replace `path` with `data` at once, 0600 from the first byte: a reader never sees half
    of it, and nobody else ever can."""
    tmp = path.with_name(f".{path.name}.new")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
    return path


def make_secrets(directory: Path, scheduler: str) -> Path:
    """Create, once, the secrets a cluster with this scheduler needs in `directory` (0700)."""
    private_dir(directory)
    if scheduler == "slurm":
        # munge takes keys of 32 bytes to 1 MiB
        create_once(directory / MUNGE_KEY, lambda: secrets.token_bytes(1024), (32, 1024 * 1024))
        create_once(directory / SLURMDBD_PASSWORD, lambda: secrets.token_urlsafe(32).encode())
    return directory


def ensure_cluster_secrets(state: State, scheduler: str) -> Path:
    """The secrets of a cluster, in its state dir; returns the directory that holds them."""
    state.ensure()
    return make_secrets(state.secrets, scheduler)


def monitoring_secrets(directory: Path, grafana: bool, relays: list[tuple[str, str, str]]) -> None:
    """Grafana's admin password (made once), and a copy of each mail relay's password from the
    file the spec names: (receiver, file, the spec key that names it). A file is checked like a
    secret of our own (this user's, 0600, one line), so one others can read stops the run before
    anything is done."""
    private_dir(directory)
    if grafana:
        create_once(directory / GRAFANA_PASSWORD, lambda: secrets.token_urlsafe(24).encode())
    for receiver, path, where in relays:
        copy_password(directory, path, where, smtp_password(receiver))


def copy_password(directory: Path, path: str, where: str, name: str) -> None:
    """A copy of the one-line password in `path` (a file the spec names at `where`) as `name`
    in the secrets directory. The file is checked like a secret of our own (this user's, 0600,
    one line), so one others can read stops the run before anything is done."""
    source = Path(path)  # absolute: the spec resolved it (spec/paths.py)
    if not source.exists():
        raise UsageError(f"{where}: {source} does not exist")
    try:
        check_secret_file(source, (1, 1024))
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None
    password = source.read_bytes().rstrip(b"\n")
    if not password or b"\n" in password or b"\r" in password:
        raise UsageError(f"{where}: {source} must hold the password on one line")
    target = directory / name
    if not target.exists() or target.read_bytes() != password:
        write_private(target, password)


def directory_secrets(directory: Path, password_file: str | None, ca: bytes | None) -> None:
    """The directory's bind password (from the file the spec names) and CA (checked by the
    caller), copied where the sssd role reads them; with no CA (no directory in the spec), or
    no password file (an anonymous read), what an earlier run copied is removed."""
    bind = directory / DIRECTORY_BIND_PASSWORD
    copy = directory / DIRECTORY_CA
    if ca is None:
        bind.unlink(missing_ok=True)
        copy.unlink(missing_ok=True)
        return
    private_dir(directory)
    if password_file is None:
        bind.unlink(missing_ok=True)
    else:
        copy_password(directory, password_file, "identity.bind_password_file", bind.name)
    if not copy.exists() or copy.read_bytes() != ca:
        write_private(copy, ca)


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str

    def __repr__(self) -> str:  # never print the password, even by accident
        return f"Credentials(user={self.user!r}, password=<hidden>)"


def save_credentials(state: State, creds: Credentials) -> Path:
    state.ensure()
    data = json.dumps({"user": creds.user, "password": creds.password}).encode()
    return write_private(state.secrets / CREDENTIALS, data)


def load_credentials(state: State) -> Credentials:
    path = state.secrets / CREDENTIALS
    if not path.exists():
        raise UsageError(
            f"no BMC credentials for cluster '{state.cluster}': "
            "run `provision bmc-credentials SPEC --user NAME` first"
        )
    check_secret_file(path, (2, 64 * 1024))
    try:
        data = json.loads(path.read_text())
        return Credentials(str(data["user"]), str(data["password"]))
    except (ValueError, KeyError, TypeError):
        raise UsageError(
            f"{path} is damaged: run `provision bmc-credentials SPEC --user NAME` again"
        ) from None

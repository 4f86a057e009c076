"""Files on the workstation that a spec names: where a spec may point, and how a path is read.

A spec is not trusted (docs/security.md): a path in it must never make provision read,
copy or send a file of the user's that the spec's author chose (~/.vault-token as an SMTP
password, another cluster's munge key). So each such path is resolved against the spec's own
directory (`~` is the user's home), links and `..` followed, and must end up inside one of:

- the spec's directory, or one below it;
- a secrets directory the user declared: $PROVISION_SECRETS_DIR (one or more directories,
  separated by ':'), by default ${XDG_CONFIG_HOME:-~/.config}/provision;
- for an SSH private key, ~/.ssh too (the key only signs the login; it is never sent);
- for a CA bundle (public certificates), the system's certificate directories too.

Anything else is refused at its key, naming the file and line, before anything is read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

ENV_SECRETS = "PROVISION_SECRETS_DIR"
FileKind = Literal["secret", "ssh key", "ca bundle"]
CERTIFICATE_DIRS = (
    "/etc/ssl",
    "/etc/pki",
    "/usr/share/ca-certificates",
    "/usr/local/share/ca-certificates",
)


def secrets_dirs() -> list[Path]:
    """The secrets directories the user declared, or the default one."""
    given = os.environ.get(ENV_SECRETS, "")
    if given.strip():
        return [Path(p).expanduser() for p in given.split(os.pathsep) if p.strip()]
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return [Path(config) / "provision"]


def allowed_dirs(kind: FileKind, spec_dir: Path) -> list[Path]:
    dirs = [spec_dir, *secrets_dirs()]
    if kind == "ssh key":
        dirs.append(Path.home() / ".ssh")
    elif kind == "ca bundle":
        dirs += [Path(d) for d in CERTIFICATE_DIRS]
    return dirs


def workstation_file(value: str, kind: FileKind, spec_dir: Path) -> str:
    """The absolute path a spec's `value` names, if it lies where a spec may point; else
    ValueError saying where it may."""
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = spec_dir / path
    real = Path(os.path.realpath(path))
    dirs = allowed_dirs(kind, spec_dir)
    if any(real.is_relative_to(os.path.realpath(d)) for d in dirs):
        return str(path)
    shown = ", ".join(_home_relative(d) for d in dirs)
    linked = f" (a link to {real})" if real != Path(os.path.abspath(path)) else ""
    raise ValueError(
        f"{value}{linked} is outside the directories a spec may name files in ({shown}): a spec "
        f"is not trusted to read the workstation's files; move the file beside the spec, or "
        f"add its directory to ${ENV_SECRETS}"
    )


def _home_relative(path: Path) -> str:
    home = Path.home()
    return (
        f"~/{path.relative_to(home)}" if path.is_relative_to(home) and path != home else str(path)
    )

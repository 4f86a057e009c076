"""The ports and daemon directories a cluster uses, read once from the spec's merged settings.

The firewall, the cloud rules, slurm.conf and verify all take their ports from here, so a spec
that moves SSH or slurmctld moves every one of them; the slurm role reads the same values back
from the rendered slurm.conf. The checks refuse settings the roles could not follow.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from provision.spec.models import Spec

SLURMCTLD_PORT = "6817"
SLURMD_PORT = "6818"
SLURMDBD_PORT = "6819"
MARIADB_PORT = "3306"
NFS_PORT = "2049"

# The health checks: where the role installs the program, and the slurm.conf keys health sets
HEALTH_PROGRAM = "/usr/local/sbin/provision-health"
HEALTH_PROLOG = "/usr/local/sbin/provision-health-prolog"  # Slurm's Prolog takes no arguments
HEALTH_KEYS = ("HealthCheckProgram", "HealthCheckInterval", "HealthCheckNodeState")

# slurm.conf keys that hold a directory the slurm role creates and gives to the slurm user
# (the log files' directories), with the directory Slurm uses when the spec says nothing.
SLURM_DIRECTORIES: dict[str, str] = {
    "StateSaveLocation": "/var/spool/slurmctld",
    "SlurmdSpoolDir": "/var/spool/slurmd",
    "SlurmctldLogFile": "/var/log/slurm/slurmctld.log",
    "SlurmdLogFile": "/var/log/slurm/slurmd.log",
}
_LOG_FILES = ("SlurmctldLogFile", "SlurmdLogFile")
# Directories no daemon may own: the system's own, and everything below these trees.
_SYSTEM_DIRS = frozenset(
    {
        "/var/log", "/var/spool", "/var/lib", "/var/run", "/var/tmp", "/var/cache", "/var/mail",
        "/var/opt", "/var/local", "/var/backups", "/run/user", "/home", "/srv", "/opt", "/mnt",
        "/media", "/tmp", "/run",
    }
)  # fmt: skip
_SYSTEM_TREES = ("/etc", "/usr", "/boot", "/proc", "/sys", "/dev", "/bin", "/sbin", "/lib",
                 "/lib64", "/root")  # fmt: skip


@dataclass(frozen=True)
class Ports:
    ssh: str
    slurmctld: str  # a port or a range (SlurmctldPort=6817-6820 runs several)
    slurmd: str
    slurmdbd: str = SLURMDBD_PORT
    mariadb: str = MARIADB_PORT
    nfs: str = NFS_PORT

    @property
    def slurmctld_first(self) -> str:
        return self.slurmctld.split("-")[0]


def service_ports(spec: Spec) -> Ports:
    config = spec.slurm.config
    return Ports(
        ssh=str(spec.ssh.port),
        slurmctld=str(config.get("SlurmctldPort", SLURMCTLD_PORT)),
        slurmd=str(config.get("SlurmdPort", SLURMD_PORT)),
    )


def daemon_directory(key: str, value: str) -> str:
    """The directory the slurm role creates for a slurm.conf path key."""
    return posixpath.dirname(value) if key in _LOG_FILES else value


def system_directory(path: str) -> bool:
    """A directory that belongs to the system (or to everyone), not to one daemon."""
    path = posixpath.normpath(path)
    if path.count("/") < 2 or path in _SYSTEM_DIRS:
        return True
    return any(path == tree or path.startswith(tree + "/") for tree in _SYSTEM_TREES)

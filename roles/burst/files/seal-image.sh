#!/bin/sh
# The seal of an elastic cloud pool's image, the builder's last step before it is stopped and
# captured: nothing of this builder's own or of the cluster's secrets stays in the image.
set -eu
# the package's own random key (Debian makes one at install) and the Slurm files: every node
# reads the cluster's key at boot and fetches slurm.conf from slurmctld
rm -f /etc/munge/munge.key /etc/default/slurmd /etc/sysconfig/slurmd
rm -f /etc/slurm/slurm.conf /etc/slurm/gres.conf /etc/slurm/cgroup.conf
# cloud-init runs every module again on the first boot of each instance
cloud-init clean --logs
# Azure's agent: its instance state out, as Azure's guide to generalizing a Linux VM has it
# (the user stays: each VM's cloud-init gives it the key again)
if command -v waagent >/dev/null; then waagent -force -deprovision >/dev/null; fi
# a machine ID of its own for every instance (systemd makes one at boot)
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id
# caches, logs and the builder's temporary files
if command -v apt-get >/dev/null; then apt-get clean; fi
if command -v dnf >/dev/null; then dnf clean all; fi
journalctl --rotate >/dev/null 2>&1 || true
journalctl --vacuum-time=1s >/dev/null 2>&1 || true
find /var/log -type f \( -name '*.gz' -o -name '*.[0-9]' \) -delete
find /var/log -type f -exec truncate -s 0 {} +
rm -rf /tmp/* /var/tmp/* /root/.bash_history /home/*/.bash_history
# each instance makes its own host keys (cloud-init); sshd takes no new connection after this
rm -f /etc/ssh/ssh_host_*
sync

#!/usr/bin/env bash
# The main job on the embedded default: a 3-node Slurm lab of podman containers on this
# machine, provisioned and verified. Needs root (or sudo) for podman networks and systemd nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
spec="${1:-examples/lab.yaml}"
P=.venv/bin/provision
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo --preserve-env=CONTAINERS_CONF,PATH"; fi
$P validate "$spec"
$P plan "$spec"
$SUDO $P apply "$spec"
cat <<TXT

The lab is up. Next:
  $P verify $spec      # the checks again
  $P ssh -f $spec head001 -- sinfo   # the cluster's key and known hosts, from its state
  $P destroy $spec     # containers, network, keys and state: all gone
Monitoring: Prometheus and Alertmanager answer head001's loopback alone; reach them through
SSH (Debian's Prometheus has its classic web pages only):
  $P ssh -f $spec --forward 9090 --forward 9093 head001   # until Ctrl-C, then:
  http://localhost:9090/classic/targets   Prometheus: every node's exporter, named by its node
  http://localhost:9090/classic/alerts    the alert rules, and which fire
  http://localhost:9093                   Alertmanager
Health: slurmd runs provision-health on the compute nodes every minute; a failing check drains
the node, naming it (sinfo -R). Run the checks by hand:
  $P ssh -f $spec compute001 -- provision-health --report-only
TXT

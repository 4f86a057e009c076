#!/bin/bash
# The kubelet's stand-in in Molecule's kubernetes scenario: its release, as the package installed
# it (prepare.yml writes it; no package moves it here, the package role being skipped).
set -euo pipefail
[ "$*" = --version ] || { echo "kubelet stand-in: not expected: $*" >&2; exit 2; }
echo "Kubernetes v$(cat /var/lib/kubelet-stand-in/release)"

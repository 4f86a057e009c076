#!/bin/bash
# kubectl's stand-in in Molecule's kubernetes scenario: the API answers ready once admin.conf
# exists; kubeadm-config holds the release the kubeadm stand-in recorded; drain and uncordon are
# recorded; diff compares a manifest with the one last applied (0 the same, 1 differs) and apply
# keeps it, recording the call; kustomize prints a stand-in of what it would build.
set -euo pipefail
rec=/var/lib/kubectl-stand-in
mkdir -p "$rec/applied"
if [ "$1" = kustomize ]; then
  command -v git > /dev/null || { echo "kubectl stand-in: kustomize needs git" >&2; exit 1; }
  echo "# the manifests built from $2 stand in here"
  exit 0
fi
config=""
if [ "$1" = --kubeconfig ]; then config=$2; shift 2; fi
[ -f "$config" ] || { echo "kubectl stand-in: no kubeconfig $config" >&2; exit 1; }
file=${*: -1}
case "$*" in
  "-n kube-system get configmap kubeadm-config "*)
    echo "kubernetesVersion: v$(cat /var/lib/kubeadm-stand-in/release)"
    exit 0 ;;
esac
case "$1" in
  get) [ "$*" = "get --raw /readyz" ] && echo ok ;;
  diff)
    cmp -s "$file" "$rec/applied/$(basename "$file")" && exit 0
    diff -u "$rec/applied/$(basename "$file")" "$file" 2>/dev/null || true
    exit 1 ;;
  drain|uncordon)
    echo "$(date +%s.%N) $*" >> "$rec/nodes" ;;
  apply)
    cp "$file" "$rec/applied/"
    echo "$(date +%s.%N) $*" >> "$rec/calls"
    echo "$(basename "$file") applied" ;;
  *) echo "kubectl stand-in: not expected: $*" >&2; exit 2 ;;
esac

#!/bin/bash
# kubeadm's stand-in in Molecule's kubernetes scenario (no kubeadm can be installed here): it does
# what the kubernetes_control_plane and kubernetes_node roles depend on (tokens and keys in
# kubeadm's forms; on init and join, the files kubeadm writes: the cluster CA, admin.conf,
# kubelet.conf; on init and upgrade apply, the cluster's release, which the kubectl stand-in
# gives back) and records each call and the configuration it was given, for verify to check.
# Certificate keys are masked in the call log.
set -euo pipefail
rec=/var/lib/kubeadm-stand-in
mkdir -p "$rec"
echo "$(date +%s.%N) $*" | sed -E 's/[0-9a-f]{64}/<key>/g' >> "$rec/calls"
token() {
  printf '%s.%s\n' "$(tr -dc a-z0-9 </dev/urandom | head -c6)" \
    "$(tr -dc a-z0-9 </dev/urandom | head -c16)"
}
private() {  # kubeadm's configuration holds secrets: refuse one others can read
  [ "$(stat -c %a "$1")" = 600 ] || { echo "$1 is not 0600" >&2; exit 1; }
}
case "$1 ${2:-}" in
  "token generate") token ;;
  "token create") t=$(token); echo "$t" >> "$rec/tokens"; echo "$t" ;;
  "certs certificate-key") openssl rand -hex 32 ;;
  "init phase") echo "${*: -1}" >> "$rec/uploaded-keys" ;;
  "init --config")
    private "$3"
    cp "$3" "$rec/init.yaml"
    sed -nE 's/^kubernetesVersion: v//p' "$3" > "$rec/release"
    mkdir -p /etc/kubernetes/pki
    openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=kubernetes \
      -keyout /etc/kubernetes/pki/ca.key -out /etc/kubernetes/pki/ca.crt 2>/dev/null
    install -m 0600 /dev/null /etc/kubernetes/admin.conf
    install -m 0600 /dev/null /etc/kubernetes/kubelet.conf
    # what kubeadm prints: a join command with a token (the role must not log it)
    echo "kubeadm join 10.89.18.10:8443 --token $(token)" ;;
  "join --config")
    private "$3"
    cp "$3" "$rec/join.yaml"
    mkdir -p /etc/kubernetes
    if grep -q certificateKey "$3"; then install -m 0600 /dev/null /etc/kubernetes/admin.conf; fi
    install -m 0600 /dev/null /etc/kubernetes/kubelet.conf ;;
  "upgrade apply") echo "${3#v}" > "$rec/release" ;;
  "upgrade node") ;;
  *) echo "kubeadm stand-in: not expected: $*" >&2; exit 2 ;;
esac

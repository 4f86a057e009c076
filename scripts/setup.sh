#!/usr/bin/env bash
# Install what provision and its tests need, idempotently: system packages (apt, only those
# missing), then a virtual environment in .venv with the project and its dev tools.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(podman runc debootstrap nftables openssh-client uidmap slirp4netns fuse-overlayfs
          tar git make ipmitool qemu-system-x86 qemu-utils squashfs-tools dnsmasq-base)
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ! python3 -m venv --help >/dev/null 2>&1; then missing+=(python3-venv); fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
  echo "setup: installing the project into .venv (versions from constraints.txt)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c constraints.txt -e '.[dev]'
  touch "$stamp"
fi

# promtool (the alert rules' unit tests, the rendered Prometheus files) and amtool (the rendered
# Alertmanager files): Debian's prometheus and prometheus-alertmanager packages carry them. Only
# the binaries are unpacked into .venv/bin; the packages are not installed, so nothing starts.
unpack_tool() {  # unpack_tool PACKAGE BINARY
  [ -x ".venv/bin/$2" ] && return 0
  echo "setup: unpacking $2 from Debian's $1 package into .venv/bin"
  local tmp
  tmp=$(mktemp -d)
  if ! (cd "$tmp" && apt-get download -q "$1" >/dev/null 2>&1); then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    (cd "$tmp" && apt-get download -q "$1" >/dev/null)
  fi
  dpkg-deb --fsys-tarfile "$tmp/$1"_*.deb | tar -x -C "$tmp" "./usr/bin/$2"
  install -m 0755 "$tmp/usr/bin/$2" ".venv/bin/$2"
  rm -rf "$tmp"
}
unpack_tool prometheus promtool
unpack_tool prometheus-alertmanager amtool

#!/usr/bin/env bash
# Install what provision and its tests need, idempotently: system packages (apt, only those
# missing), then a virtual environment in .venv with the project and its dev tools.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(podman runc debootstrap nftables openssh-client uidmap slirp4netns fuse-overlayfs
          tar git make ipmitool)
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

# promtool (the alert rules' unit tests): Debian's prometheus package carries it. Only the
# binary is unpacked into .venv/bin; the package is not installed, so no Prometheus starts here.
if [ ! -x .venv/bin/promtool ]; then
  echo "setup: unpacking promtool from Debian's prometheus package into .venv/bin"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if ! (cd "$tmp" && apt-get download -q prometheus >/dev/null 2>&1); then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    (cd "$tmp" && apt-get download -q prometheus >/dev/null)
  fi
  dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -x -C "$tmp" ./usr/bin/promtool
  install -m 0755 "$tmp/usr/bin/promtool" .venv/bin/promtool
fi

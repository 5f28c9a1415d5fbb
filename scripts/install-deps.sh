#!/usr/bin/env bash
# Installs tern's build and test dependencies from Debian 12's packages (nothing else is
# downloaded, at build or at run time). Safe to re-run: it only installs what is missing.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  googletest libgtest-dev libgmock-dev
  nlohmann-json3-dev libcli11-dev libcpp-httplib-dev
  python3 python3-numpy python3-jinja2  # numpy: the oracles; jinja2: the chat-template reference
  python3-torch libopenblas0-pthread    # the training oracle and speed peer (OpenBLAS: torch's fast BLAS)
  chromium  # headless browser for the chat page's test (tests/server/js)
  libopenmpi-dev openmpi-bin  # Open MPI: --tp / --pp over mpirun (src/dist, docs/distributed.md)
)
# --aarch64: also the ARM64 cross build's (scripts/test-aarch64.sh): Debian's cross compiler,
# qemu-user to run its tests, and the arm64 builds of the libraries tern links (multiarch).
aarch64=0
case "$#:${1:-}" in
  0:) ;;
  1:--aarch64) aarch64=1 ;;
  *) echo "usage: bash scripts/install-deps.sh [--aarch64]" >&2; exit 2 ;;
esac
missing=()
# Node.js + npm run the server's contract tests (the official `openai` client) and the peer.
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
if [ "$aarch64" = 1 ]; then
  for p in g++-aarch64-linux-gnu qemu-user libc6:arm64 libgtest-dev:arm64 libcpp-httplib-dev:arm64; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
  fi
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

#!/usr/bin/env bash
# Installs every Debian package duet needs to build, test and run, skipping what is already there.
# Run as root on Debian 12. Safe to run again.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git ccache
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev googletest
  libpcre2-dev
  libboost-dev libyaml-cpp-dev
  libhiredis-dev redis-server logrotate
  libssl-dev openssl
  libopenmpi-dev openmpi-bin
  python3 python3-numpy python3-torch python3-jinja2 python3-prometheus-client python3-yaml
  curl
  prometheus chromium
  g++-aarch64-linux-gnu qemu-user
  clang libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node.js and npm run the server tests' official `openai` client; the machine's own Node.js is
# used when there is one, Debian's otherwise.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages: ${missing[*]}" >&2
    echo "install-deps: run as root (or install them yourself) to continue" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm packages of the tests, exactly as package-lock.json pins them.
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ ! -d "$root/tests/server/node_modules/openai" ] || [ ! -d "$root/tests/server/node_modules/ajv" ] ||
   [ ! -d "$root/tests/server/node_modules/ajv-formats" ] || [ ! -d "$root/tests/server/node_modules/@anthropic-ai/sdk" ]; then
  echo "install-deps: installing the server tests' npm packages"
  (cd "$root/tests/server" && npm ci --no-audit --no-fund --loglevel=error)
fi
# playwright-core drives Debian's Chromium in the web console's browser test (no browser download).
if [ ! -d "$root/tests/console/node_modules/playwright-core" ]; then
  echo "install-deps: installing the console test's npm packages"
  (cd "$root/tests/console" && npm ci --no-audit --no-fund --loglevel=error)
fi

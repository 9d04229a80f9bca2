#!/usr/bin/env bash
# Installs the Debian packages keel needs to build and test, when they are missing.
# Build: gcc, cmake, make, pkg-config, cJSON, PCRE2, utf8proc, xxHash. Tests: cmocka; clang and its
# runtime libraries (libFuzzer, sanitizers) for the fuzz targets. Benchmarks only: OpenBLAS (loaded at run time).
set -euo pipefail
need=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in gcc make cmake pkg-config libcmocka-dev libcjson-dev libpcre2-dev libutf8proc-dev libxxhash-dev clang libclang-rt-14-dev "$@"; do
  have "$p" || need+=("$p")
done
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${need[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO=sudo; else
    echo "setup: need root (or sudo) to install: ${need[*]}" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

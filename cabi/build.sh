#!/usr/bin/env bash
# The one command that builds libkvcrouter.so (cgo c-shared); the Makefile
# and setup.py both call it.
#   cabi/build.sh OUT            the release library (host C compiler)
#   cabi/build.sh OUT kvrdebug   the test library (adds kvr_debug_panic)
# The linker version script keeps every symbol but kvr_* local: without it
# ~45 _cgo_* symbols leak. cgo's generated header is removed: cabi/kvcrouter.h
# is the real one. GO overrides the go binary.
#
# Portable mode: KVC_ROUTER_TARGET=x86_64 or aarch64 builds a library for
# that architecture that needs nothing newer than glibc 2.17 (manylinux_2_17,
# i.e. manylinux2014), from any Linux host and without a system toolchain:
# cgo's C compiler is Zig (`zig cc -target <arch>-linux-gnu.2.17`, which
# links against glibc 2.17's symbol versions). ZIG is the command that runs
# zig (default: `python3 -m ziglang` when the ziglang package is importable,
# else `zig` on PATH); `make wheel` installs the pinned ziglang wheel.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: [KVC_ROUTER_TARGET=x86_64|aarch64] $0 OUT [TAGS]" >&2
  exit 2
fi
out=$1
tags=${2:-}
cabi=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
cd "$cabi/.."
extld="-Wl,--version-script=$cabi/kvcrouter.map"
target=${KVC_ROUTER_TARGET:-}
if [ -n "$target" ]; then
  case "$target" in
    x86_64 | amd64) goarch=amd64 zigarch=x86_64 ;;
    aarch64 | arm64) goarch=arm64 zigarch=aarch64 ;;
    *)
      echo "$0: KVC_ROUTER_TARGET=$target (allowed: x86_64, aarch64)" >&2
      exit 2
      ;;
  esac
  zig=${ZIG:-}
  if [ -z "$zig" ]; then
    if python3 -c 'import ziglang' 2>/dev/null; then
      zig="$(command -v python3) -m ziglang"
    elif command -v zig >/dev/null; then
      zig=$(command -v zig)
    else
      echo "$0: portable build needs Zig: pip install ziglang (or set ZIG)" >&2
      exit 2
    fi
  fi
  # cgo splits CC on spaces; a wrapper keeps paths with spaces working.
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  printf '#!/bin/sh\nexec %s cc -target %s-linux-gnu.2.17 "$@"\n' "$zig" "$zigarch" >"$tmp/cc"
  chmod +x "$tmp/cc"
  export CC="$tmp/cc" GOOS=linux GOARCH=$goarch
  # Zig's linker keeps the C parts' debug info unless told to strip.
  extld="$extld -Wl,--strip-all"
fi
# The build version kvr_version reports: the package version, plus the
# commit when built from a git checkout (".dirty" with local changes).
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' python/kvc_router/__init__.py)
if commit=$(git rev-parse --short=12 HEAD 2>/dev/null); then
  version="$version+g$commit"
  git diff --quiet HEAD -- 2>/dev/null || version="$version.dirty"
fi
CGO_ENABLED=1 "${GO:-go}" build -buildmode=c-shared -trimpath -buildvcs=false -tags "$tags" \
  -ldflags "-s -w -X main.buildVersion=${version:-dev} '-extldflags=$extld'" -o "$out" ./cabi
rm -f "${out%.so}.h"

#!/usr/bin/env bash
# The one command that builds libkvcrouter.so (cgo c-shared); the Makefile
# and setup.py both call it.
#   cabi/build.sh OUT            the release library
#   cabi/build.sh OUT kvrdebug   the test library (adds kvr_debug_panic)
# The linker version script keeps every symbol but kvr_* local: without it
# ~45 _cgo_* symbols leak. cgo's generated header is removed: cabi/kvcrouter.h
# is the real one. GO overrides the go binary.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 OUT [TAGS]" >&2
  exit 2
fi
out=$1
tags=${2:-}
cabi=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
cd "$cabi/.."
# The build version kvr_version reports: the package version, plus the
# commit when built from a git checkout (".dirty" with local changes).
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' python/kvc_router/__init__.py)
if commit=$(git rev-parse --short=12 HEAD 2>/dev/null); then
  version="$version+g$commit"
  git diff --quiet HEAD -- 2>/dev/null || version="$version.dirty"
fi
CGO_ENABLED=1 "${GO:-go}" build -buildmode=c-shared -trimpath -buildvcs=false -tags "$tags" \
  -ldflags "-s -w -X main.buildVersion=${version:-dev} -extldflags=-Wl,--version-script=$cabi/kvcrouter.map" -o "$out" ./cabi
rm -f "${out%.so}.h"

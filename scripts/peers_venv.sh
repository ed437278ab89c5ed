#!/usr/bin/env bash
# Builds the peer-router venv (default .venv-peers) for the arena: the two
# real KV-cache-aware routers the arena compares against, pinned, as their
# prebuilt PyPI wheels (Rust binaries inside; no GPU, no model download).
#   sglang-router  -> python -m sglang_router.launch_router
#   vllm-router    -> the `vllm-router` console script
# Only packages are downloaded; nothing else is fetched at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV_PEERS:-.venv-peers}"
SGLANG_ROUTER_VERSION="${SGLANG_ROUTER_VERSION:-0.3.2}"
VLLM_ROUTER_VERSION="${VLLM_ROUTER_VERSION:-0.1.17}"
start=$(date +%s)

if [ -f "$VENV/.stamp" ] && [ "$(cat "$VENV/.stamp")" = "$SGLANG_ROUTER_VERSION $VLLM_ROUTER_VERSION" ]; then
  touch "$VENV/.stamp"
  echo "peers venv up to date ($VENV)"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
"$VENV/bin/python" -m pip install -q \
  "sglang-router==${SGLANG_ROUTER_VERSION}" "vllm-router==${VLLM_ROUTER_VERSION}"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import sglang_router.launch_router  # noqa: F401  (the entry point the arena runs)
print("sglang-router", md.version("sglang-router"), "vllm-router", md.version("vllm-router"))
PY
test -x "$VENV/bin/vllm-router" || { echo "vllm-router console script missing in $VENV/bin" >&2; exit 1; }
echo "$SGLANG_ROUTER_VERSION $VLLM_ROUTER_VERSION" > "$VENV/.stamp"
echo "peers venv ready in $(( $(date +%s) - start ))s; size $(du -sh "$VENV" | cut -f1)"

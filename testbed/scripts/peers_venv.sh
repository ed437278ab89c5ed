#!/usr/bin/env bash
# Builds the peer-router venv (default .venv-peers) for the arena: the two
# real KV-cache-aware routers the arena compares against, pinned, as their
# prebuilt PyPI wheels (Rust binaries inside; no GPU, no model download).
#   sglang-router  -> python -m sglang_router.launch_router
#   vllm-router    -> the `vllm-router` console script
#   ai-dynamo-runtime -> NVIDIA Dynamo's KV router (dynamo._core), used
#                     in-process by testbed/kvc_harness/dynamo_route.py
#   smg            -> python -m smg.launch_router (Shepherd Model Gateway,
#                     sglang-router's successor)
# Only packages are downloaded; nothing else is fetched at run time.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV_PEERS:-.venv-peers}"
SGLANG_ROUTER_VERSION="${SGLANG_ROUTER_VERSION:-0.3.2}"
VLLM_ROUTER_VERSION="${VLLM_ROUTER_VERSION:-0.1.17}"
DYNAMO_VERSION="${DYNAMO_VERSION:-1.6.1}"
SMG_VERSION="${SMG_VERSION:-1.13.0}"
STAMP="$SGLANG_ROUTER_VERSION $VLLM_ROUTER_VERSION $DYNAMO_VERSION $SMG_VERSION"
start=$(date +%s)

if [ -f "$VENV/.stamp" ] && [ "$(cat "$VENV/.stamp")" = "$STAMP" ]; then
  touch "$VENV/.stamp"
  echo "peers venv up to date ($VENV)"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
"$VENV/bin/python" -m pip install -q \
  "sglang-router==${SGLANG_ROUTER_VERSION}" "vllm-router==${VLLM_ROUTER_VERSION}" \
  "ai-dynamo-runtime==${DYNAMO_VERSION}" "smg==${SMG_VERSION}" pyzmq msgpack
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import sglang_router.launch_router  # noqa: F401  (the entry point the arena runs)
import smg.launch_router  # noqa: F401  (SMG's entry point)
from dynamo._core import KvRouter  # noqa: F401  (the real Dynamo router, in-process)
print("sglang-router", md.version("sglang-router"), "vllm-router", md.version("vllm-router"),
      "ai-dynamo-runtime", md.version("ai-dynamo-runtime"), "smg", md.version("smg"))
PY
test -x "$VENV/bin/vllm-router" || { echo "vllm-router console script missing in $VENV/bin" >&2; exit 1; }
test -x "$VENV/bin/smg" || { echo "smg console script missing in $VENV/bin" >&2; exit 1; }
echo "$STAMP" > "$VENV/.stamp"
echo "peers venv ready in $(( $(date +%s) - start ))s; size $(du -sh "$VENV" | cut -f1)"

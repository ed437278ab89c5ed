#!/usr/bin/env bash
# Builds the verl integration venv (default .venv-verl): the published verl
# wheel, the packages `import verl.workers.rollout.llm_server` needs, CPU use
# only, plus this project installed as a real (non-editable) wheel so that its
# kvc_router_verl.pth post-import hook is exercised exactly as users get it.
#
# torch: PyPI's only Linux x86_64 torch wheel is CUDA-linked; libtorch.so
# needs the CUDA runtime libraries at load time even with no GPU present, so
# `pip install --no-deps torch` does not import. We install torch with its
# declared dependencies (the nvidia-* / cuda-* wheels); nothing here uses a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV_VERL:-.venv-verl}"
VERL_VERSION="${VERL_VERSION:-0.9.1}"
TORCH_VERSION="${TORCH_VERSION:-2.11.0}"
start=$(date +%s)

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
PIP=("$VENV/bin/python" -m pip install -q)
# What verl's import chain needs (static trace of llm_server.py and the
# modules it pulls in), pinned where verl pins, nothing more.
"${PIP[@]}" \
  "torch==${TORCH_VERSION}" \
  "tensordict>=0.8.0,<=0.10.0,!=0.9.0" \
  "transformers>=5.5.3,<5.11,!=5.6.0" \
  "ray>=2.41" "numpy>=2.0.0" omegaconf hydra-core cachetools pydantic fastapi uvicorn \
  pyyaml orjson codetiming "packaging>=20.0" \
  pytest pyzmq msgpack "setuptools>=70.1" wheel
"${PIP[@]}" --no-deps "verl==${VERL_VERSION}"
# This project as a wheel (the Go library is built by make's $(PYLIB) rule).
KVC_ROUTER_SKIP_GO_BUILD=1 "${PIP[@]}" --no-deps --no-build-isolation --force-reinstall .
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import verl.workers.rollout.llm_server  # noqa: F401  (the import the integration needs)
print("verl", md.version("verl"), "torch", md.version("torch"), "kvc-router", md.version("kvc-router"))
PY
touch "$VENV/.stamp"
echo "verl venv ready in $(( $(date +%s) - start ))s; size $(du -sh "$VENV" | cut -f1)"

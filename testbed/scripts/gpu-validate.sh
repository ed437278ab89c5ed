#!/usr/bin/env bash
# Real-GPU validation of kvc-router: starts two or more real vLLM servers
# (prefix caching, /metrics with stats logging on, KV events over ZMQ on a
# unique port pair per server), then runs the `make demo` workload against them
# through the same Ray balancer actor, once with verl's default balancer and
# once with kvc_aware, and prints the comparison from the servers' own counters.
#
#   testbed/scripts/gpu-validate.sh                       # vLLM, one server per visible GPU (at least 2)
#   testbed/scripts/gpu-validate.sh --servers 2 --servers-per-gpu 2   # two servers sharing one GPU
#   testbed/scripts/gpu-validate.sh --backend sim --quick # the same path with bin/vllm-sim (tested in CI)
#   testbed/scripts/gpu-validate.sh --dry-run             # print every command, run nothing
#
# Options:
#   --backend vllm|vllm-cpu|sim  server implementation (default vllm). vllm-cpu: the CPU build
#                           of vLLM (testbed/scripts/vllm_venv.sh, as `make test-vllm` uses it),
#                           block size 32, --kv-cache-memory-bytes, a tiny random-weight model
#                           made locally (token-id prompts, --skip-tokenizer-init)
#   --model NAME            model to serve (default Qwen/Qwen2.5-0.5B-Instruct; vocab >= 32000)
#   --servers N             servers (default: number of GPUs x --servers-per-gpu, at least 2)
#   --servers-per-gpu K     servers sharing one GPU (default 1; memory utilisation split)
#   --kv-bytes B            vllm-cpu: KV cache bytes per server (default 67108864 = 64 MiB)
#   --gpu-blocks N          cap each server's KV cache (--num-gpu-blocks-override), so that
#                           cache affinity matters as in the demo (default: vLLM's own size;
#                           sim: 3072)
#   --max-model-len L       vLLM --max-model-len (default 16384)
#   --base-port P           first HTTP port (default 18000); KV events use P+1000+2i, replay +1
#   --venv DIR              vLLM virtualenv (default .venv-gpu; the sim backend uses .venv)
#   --out DIR               logs and results (default build/gpu-validate)
#   --quick                 the short workload (as the tests run it)
#   --skip-install          use the venv as it is
#   --dry-run               print the commands and exit
#   --                      the rest goes to testbed/scripts/demo.py (e.g. --prompts 16 --samples 16)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BACKEND=vllm
MODEL="Qwen/Qwen2.5-0.5B-Instruct"
SERVERS=""
PER_GPU=1
GPU_BLOCKS=""
MAX_LEN=16384
BASE_PORT=18000
VENV=""
OUT="$REPO/build/gpu-validate"
QUICK=""
SKIP_INSTALL=""
DRY=""
HEALTH_TIMEOUT=""
DEMO_ARGS=()
KV_BYTES=67108864

die() { echo "gpu-validate: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --backend) BACKEND="${2:?}"; shift 2 ;;
    --model) MODEL="${2:?}"; shift 2 ;;
    --servers) SERVERS="${2:?}"; shift 2 ;;
    --servers-per-gpu) PER_GPU="${2:?}"; shift 2 ;;
    --gpu-blocks) GPU_BLOCKS="${2:?}"; shift 2 ;;
    --max-model-len) MAX_LEN="${2:?}"; shift 2 ;;
    --kv-bytes) KV_BYTES="${2:?}"; shift 2 ;;
    --base-port) BASE_PORT="${2:?}"; shift 2 ;;
    --venv) VENV="${2:?}"; shift 2 ;;
    --out) OUT="${2:?}"; shift 2 ;;
    --health-timeout) HEALTH_TIMEOUT="${2:?}"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --skip-install) SKIP_INSTALL=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; DEMO_ARGS=("$@"); break ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ "$BACKEND" == vllm || "$BACKEND" == vllm-cpu || "$BACKEND" == sim ]] || die "--backend must be vllm, vllm-cpu or sim"
[[ "$PER_GPU" =~ ^[1-9][0-9]*$ ]] || die "--servers-per-gpu must be a positive integer"

# Number of GPUs (vLLM backend): CUDA_VISIBLE_DEVICES, else nvidia-smi.
GPUS=()
if [[ "$BACKEND" == vllm ]]; then
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    IFS=, read -r -a GPUS <<<"$CUDA_VISIBLE_DEVICES"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    mapfile -t GPUS < <(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true)
  fi
  if [[ ${#GPUS[@]} -eq 0 ]]; then
    [[ -n "$DRY" ]] || die "no GPU found (nvidia-smi / CUDA_VISIBLE_DEVICES); use --backend sim, or --dry-run"
    GPUS=(0 1)  # a dry run shows the command lines of a 2-GPU machine
  fi
  [[ -n "$SERVERS" ]] || SERVERS=$(( ${#GPUS[@]} * PER_GPU ))
  VENV="${VENV:-$REPO/.venv-gpu}"
  HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-900}"
elif [[ "$BACKEND" == vllm-cpu ]]; then
  [[ -n "$SERVERS" ]] || SERVERS=2  # ~2 GiB RAM and one core each
  VENV="${VENV:-$REPO/.venv-vllm}"
  [[ "$MODEL" != "Qwen/Qwen2.5-0.5B-Instruct" ]] || MODEL="$REPO/build/tiny-models/llama"
  [[ "$MAX_LEN" != 16384 ]] || MAX_LEN=4096  # the tiny model's max_position_embeddings
  HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-900}"
else
  [[ -n "$SERVERS" ]] || SERVERS=2
  VENV="${VENV:-$REPO/.venv}"
  GPU_BLOCKS="${GPU_BLOCKS:-3072}"
  HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-60}"
fi
[[ "$SERVERS" =~ ^[0-9]+$ && "$SERVERS" -ge 2 ]] || die "need at least 2 servers (got ${SERVERS})"
PY="$VENV/bin/python"

# run CMD...: print it; execute it unless --dry-run.
run() {
  printf '+'; printf ' %q' "$@"; printf '\n'
  [[ -n "$DRY" ]] || "$@"
}

# ---- 1. environment -------------------------------------------------------
if [[ -z "$SKIP_INSTALL" ]]; then
  if [[ "$BACKEND" == vllm ]]; then
    [[ -x "$PY" ]] || run python3 -m venv "$VENV"
    run "$PY" -m pip install -q --upgrade pip
    # vLLM brings torch; ray, pyzmq and msgpack are what the balancer actor needs.
    run "$PY" -m pip install -q vllm "ray>=2.41" pyzmq msgpack numpy matplotlib pyyaml
    run make -C "$REPO" build python/kvc_router/libkvcrouter.so
    run "$PY" -m pip install -q --no-deps -e "$REPO"
  elif [[ "$BACKEND" == vllm-cpu ]]; then
    run env VENV_VLLM="$VENV" bash "$REPO/testbed/scripts/vllm_venv.sh"
    run "$PY" "$REPO/testbed/scripts/make_tiny_models.py" --out "$REPO/build/tiny-models" --kinds llama
    run make -C "$REPO" build python/kvc_router/libkvcrouter.so
  else
    run make -C "$REPO" venv build python/kvc_router/libkvcrouter.so
  fi
fi

# ---- 2. servers -------------------------------------------------------------
[[ -n "$DRY" ]] || mkdir -p "$OUT"
SERVERS_FILE="$OUT/servers.jsonl"
PIDS=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ ${#PIDS[@]} -gt 0 ]]; then
    echo "gpu-validate: stopping ${#PIDS[@]} servers" >&2
    for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 1 100); do
      local alive=0
      for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
      [[ $alive -eq 0 ]] && break
      sleep 0.1
    done
    for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start_server I CMD...: runs CMD in its own session (so the whole process tree,
# vLLM's engine-core children included, is stopped with one signal).
start_server() {
  local i=$1; shift
  printf '+'; printf ' %q' "$@"; printf ' >%q 2>&1 &\n' "$OUT/server-$i.log"
  [[ -n "$DRY" ]] && return 0
  setsid "$@" >"$OUT/server-$i.log" 2>&1 </dev/null &
  PIDS+=("$!")
}

[[ -n "$DRY" ]] || : >"$SERVERS_FILE"
for ((i = 0; i < SERVERS; i++)); do
  port=$((BASE_PORT + i))
  ev=$((BASE_PORT + 1000 + 2 * i))
  replay=$((ev + 1))
  if [[ "$BACKEND" == vllm ]]; then
    gpu="${GPUS[$(( (i / PER_GPU) % ${#GPUS[@]} ))]}"
    util=$(awk -v k="$PER_GPU" 'BEGIN { printf "%.2f", 0.85 / k }')
    kv_cfg=$(printf '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:%d", "replay_endpoint": "tcp://*:%d", "topic": "kv-events"}' "$ev" "$replay")
    cmd=(env CUDA_VISIBLE_DEVICES="$gpu" VLLM_SERVER_DEV_MODE=1 PYTHONHASHSEED=0
         "$PY" -m vllm.entrypoints.openai.api_server
         --model "$MODEL" --host 127.0.0.1 --port "$port"
         --enable-prefix-caching --block-size 16
         --gpu-memory-utilization "$util" --max-model-len "$MAX_LEN"
         --kv-events-config "$kv_cfg")
    [[ -z "$GPU_BLOCKS" ]] || cmd+=(--num-gpu-blocks-override "$GPU_BLOCKS")
  elif [[ "$BACKEND" == vllm-cpu ]]; then
    # vLLM's CPU backend: block size 32 (16 is refused), KV cache by bytes,
    # eager mode (torch.compile builds C++ kernels for minutes), one OpenMP
    # thread per server, unbound, so the servers share the cores.
    kv_cfg=$(printf '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:%d", "replay_endpoint": "tcp://*:%d", "topic": "kv-events"}' "$ev" "$replay")
    cmd=(env VLLM_SERVER_DEV_MODE=1 PYTHONHASHSEED=0 VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1
         "$PY" -m vllm.entrypoints.openai.api_server
         --model "$MODEL" --served-model-name tiny --host 127.0.0.1 --port "$port"
         --enable-prefix-caching --block-size 32 --kv-cache-memory-bytes "$KV_BYTES"
         --max-model-len "$MAX_LEN" --skip-tokenizer-init --enforce-eager --enable-prompt-tokens-details
         --kv-events-config "$kv_cfg")
  else
    [[ -n "$DRY" || -x "$REPO/bin/vllm-sim" ]] || die "bin/vllm-sim missing (make build)"
    cmd=("$REPO/bin/vllm-sim" --host 127.0.0.1 --port "$port"
         --kv-events-endpoint "tcp://127.0.0.1:$ev" --kv-events-replay-endpoint "tcp://127.0.0.1:$replay"
         --kv-events-topic kv-events --num-gpu-blocks "$GPU_BLOCKS"
         --speed 4 --seed "$i" --log-level warn)
  fi
  start_server "$i" "${cmd[@]}"
  line=$(printf '{"index": %d, "url": "http://127.0.0.1:%d", "kv_events_endpoints": ["tcp://127.0.0.1:%d"], "kv_events_replay_endpoints": ["tcp://127.0.0.1:%d"], "topic": "kv-events"}' "$i" "$port" "$ev" "$replay")
  if [[ -n "$DRY" ]]; then echo "  servers.jsonl: $line"; else echo "$line" >>"$SERVERS_FILE"; fi
done

# ---- 3. wait until every server answers /health -----------------------------
if [[ -z "$DRY" ]]; then
  echo "gpu-validate: waiting for $SERVERS $BACKEND servers (up to ${HEALTH_TIMEOUT}s) ..."
  deadline=$((SECONDS + HEALTH_TIMEOUT))
  for ((i = 0; i < SERVERS; i++)); do
    port=$((BASE_PORT + i))
    until "$PY" - "$port" <<'EOF' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).read()
EOF
    do
      kill -0 "${PIDS[$i]}" 2>/dev/null || { tail -n 30 "$OUT/server-$i.log" >&2; die "server $i exited"; }
      (( SECONDS < deadline )) || { tail -n 30 "$OUT/server-$i.log" >&2; die "server $i not healthy"; }
      sleep 1
    done
  done
fi

# ---- 4. the demo workload through the Ray balancer actor ---------------------
if [[ "$BACKEND" == vllm ]]; then title="gpu-validate (vLLM, $MODEL)"
elif [[ "$BACKEND" == vllm-cpu ]]; then title="gpu-validate (vLLM CPU build, tiny random-weight model)"; else title="gpu-validate (vllm-sim at 4x speed)"; fi
# demo.py imports the harness package testbed/kvc_harness.
pp="$REPO/testbed"
[[ "$BACKEND" != vllm-cpu ]] || pp="$pp:$REPO/python"  # .venv-vllm has no kvc_router installed
drv=(env "PYTHONPATH=$pp" "$PY" "$REPO/testbed/scripts/demo.py" --servers-file "$SERVERS_FILE" --out "$OUT" --title "$title")
[[ -z "$QUICK" ]] || drv+=(--quick)
drv+=("${DEMO_ARGS[@]}")
run "${drv[@]}"

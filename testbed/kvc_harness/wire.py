"""vLLM's wire formats as the tests and benchmarks feed them to the router:
Prometheus /metrics text and msgpack KV-event batches (positional layout, as
vLLM <= 0.23 sends), and a stand-in /metrics server whose failure mode a test
switches at will."""

from __future__ import annotations

import http.server
import threading
import time
from typing import Any, Callable, List, Optional, Sequence

from kvc_harness import HOST
from kvc_harness.procs import Reaper

MODEL = "Qwen/Qwen3-0.6B"


def metrics_text(
    running: float = 0,
    waiting: float = 0,
    kv_usage: float = 0.0,
    block_size: int = 16,
    num_gpu_blocks: int = 4096,
    engine: str = "0",
) -> str:
    """One vLLM V1 /metrics scrape in the classic text format."""
    lab = f'engine="{engine}",model_name="{MODEL}"'
    return "\n".join(
        [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{lab}}} {float(running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{lab}}} {float(waiting)}",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{lab}}} {float(kv_usage)}",
            "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{{{lab}}} 48210.0",
            "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
            "# TYPE vllm:prefix_cache_hits_total counter",
            f"vllm:prefix_cache_hits_total{{{lab}}} 30720.0",
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{block_size}",cache_dtype="auto",enable_prefix_caching="True",'
            f'engine="{engine}",gpu_memory_utilization="0.9",num_cpu_blocks="None",'
            f'num_gpu_blocks="{num_gpu_blocks}",prefix_caching_hash_algo="sha256",sliding_window="None"}} 1.0',
            "",
        ]
    )


def block_stored(
    tokens: Sequence[int],
    block_size: int = 16,
    first_hash: int = 1000,
    parent: Optional[int] = None,
    medium: str = "GPU",
) -> List[Any]:
    """A BlockStored event for the full blocks of ``tokens``."""
    n = len(tokens) // block_size
    hashes = [first_hash + i for i in range(n)]
    return ["BlockStored", hashes, parent, list(tokens[: n * block_size]), block_size, None, medium]


def event_batch(*events: List[Any], dp_rank: int = 0) -> bytes:
    """A KVEventBatch payload: [ts, [events...], data_parallel_rank]."""
    import msgpack

    return msgpack.packb([time.time(), list(events), dp_rank], use_bin_type=True)


class MetricsStub:
    """A stand-in /metrics server whose behaviour a test switches at will:
    ``ok`` (vLLM text from ``body_fn``), ``500``, ``garbage``, ``slow``
    (``delay`` seconds, then ok), ``huge`` (``huge_bytes`` of valid-looking
    comment lines), ``hang`` (never answers within a scrape timeout),
    ``held`` (sets ``holding``, then answers ok once the test sets
    ``release``; after ``delay`` seconds at most)."""

    def __init__(self, reaper: Reaper, body_fn: Callable[[], str]) -> None:
        self.mode = "ok"
        self.delay = 0.0
        self.huge_bytes = 0
        self.body_fn = body_fn
        self.hits = 0
        self.holding = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                with stub._lock:
                    stub.hits += 1
                mode = stub.mode
                if mode == "500":
                    self._send(500, b"boom\n")
                elif mode == "garbage":
                    self._send(200, b"\x00\xff{{{ not prometheus }}}\nvllm:num_requests_running{ 1\n")
                elif mode == "huge":
                    line = b"# " + b"x" * 1000 + b"\n"
                    body = line * (stub.huge_bytes // len(line) + 1)
                    self._send(200, body + stub.body_fn().encode())
                else:
                    if mode in ("slow", "hang"):
                        time.sleep(stub.delay)
                    elif mode == "held":
                        stub.holding.set()
                        stub.release.wait(stub.delay)
                    self._send(200, stub.body_fn().encode())

            def _send(self, code: int, body: bytes) -> None:
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the scraper gave up (timeout): expected

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        reaper.add(self.close)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

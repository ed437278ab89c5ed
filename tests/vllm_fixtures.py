"""Builders for vLLM wire formats used by the tests: Prometheus /metrics text
and msgpack KV-event batches (positional layout, as vLLM <= 0.23 sends)."""

from __future__ import annotations

import time

import msgpack

MODEL = "Qwen/Qwen3-0.6B"


def metrics_text(running=0, waiting=0, kv_usage=0.0, block_size=16, num_gpu_blocks=4096, engine="0"):
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


def block_stored(tokens, block_size=16, first_hash=1000, parent=None, medium="GPU"):
    """A BlockStored event for the full blocks of ``tokens``."""
    n = len(tokens) // block_size
    hashes = [first_hash + i for i in range(n)]
    return ["BlockStored", hashes, parent, list(tokens[: n * block_size]), block_size, None, medium]


def event_batch(*events, dp_rank=0):
    """A KVEventBatch payload: [ts, [events...], data_parallel_rank]."""
    return msgpack.packb([time.time(), list(events), dp_rank], use_bin_type=True)

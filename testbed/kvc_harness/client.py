"""HTTP to vLLM-compatible servers (vLLM and bin/vllm-sim alike), standard
library only so Ray workers need nothing beyond the venv: completions (plain
and streaming with client-side TTFT), /health, /v1/models,
/reset_prefix_cache, and the servers' own /metrics counters."""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple


def split_url(url: str) -> Tuple[str, int]:
    """(host, port) of a URL."""
    u = urllib.parse.urlsplit(url)
    return u.hostname or "127.0.0.1", u.port or 80


def http_request(
    url: str, method: str = "GET", body: Optional[dict] = None, timeout: float = 10.0,
    headers: Optional[Dict[str, str]] = None, on_sent: Optional[Callable[[], None]] = None,
) -> Tuple[int, bytes]:
    """One request on a fresh connection; returns (status, body). Raises
    OSError / http.client.HTTPException when the server is not there.
    ``on_sent`` runs once the request is written, before the answer."""
    host, port = split_url(url)
    u = urllib.parse.urlsplit(url)
    target = (u.path or "/") + (f"?{u.query}" if u.query else "")
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        conn.request(method, target, body=data, headers=hdrs)
        if on_sent is not None:
            on_sent()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def request_json(url: str, method: str = "GET", body: Optional[dict] = None, timeout: float = 10.0) -> Any:
    """A request whose 200 answer is JSON; any other status raises RuntimeError."""
    status, data = http_request(url, method, body, timeout)
    if status != 200:
        raise RuntimeError(f"{method} {url}: HTTP {status}: {data[:200]!r}")
    return json.loads(data) if data else None


def healthy(url: str, timeout: float = 1.0) -> bool:
    """GET /health answered 200 (False when nothing answers)."""
    try:
        return http_request(url.rstrip("/") + "/health", timeout=timeout)[0] == 200
    except (OSError, http.client.HTTPException):
        return False


def complete(url: str, prompt: List[int], max_tokens: int = 1, timeout: float = 10.0) -> Dict[str, Any]:
    """POST /v1/completions with token ids, not streamed; the JSON answer."""
    return request_json(
        url.rstrip("/") + "/v1/completions", "POST", {"prompt": prompt, "max_tokens": max_tokens}, timeout
    )


def stream_events(
    base_url: str, body: dict, timeout: float = 600.0, headers: Optional[Dict[str, str]] = None,
    on_sent: Optional[Callable[[], None]] = None,
) -> Iterator[Tuple[float, dict]]:
    """POST /v1/completions with ``stream`` on; yields (seconds since the
    request was sent, message) for every server-sent data message until
    ``[DONE]``. An HTTP error or an error message raises RuntimeError."""
    host, port = split_url(base_url)
    data_out = json.dumps(body).encode()
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request("POST", "/v1/completions", body=data_out, headers=hdrs)
        if on_sent is not None:
            on_sent()
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            msg = json.loads(data)
            if msg.get("object") == "error" or "error" in msg:
                raise RuntimeError(f"stream error: {str(msg)[:200]}")
            yield time.perf_counter() - t0, msg
    finally:
        conn.close()


def cached_tokens(usage: dict) -> int:
    """Prompt tokens the server served from its prefix cache."""
    return ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0


def stream_completion(
    base_url: str, model: str, prompt: List[int], max_tokens: int, seed: int, timeout: float = 600.0
) -> dict:
    """Streamed completion of a token-id prompt; returns TTFT (first data
    chunk), e2e, generated token ids and usage (cached prompt tokens)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 1.0,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    t0 = time.perf_counter()
    ttft = None
    tokens: List[int] = []
    usage: dict = {}
    for t, msg in stream_events(base_url, body, timeout):
        if ttft is None:
            ttft = t
        for ch in msg.get("choices") or ():
            ids = ch.get("token_ids")
            if ids:
                tokens.extend(ids)
        if msg.get("usage"):
            usage = msg["usage"]
    e2e = time.perf_counter() - t0
    return {
        "ttft": ttft if ttft is not None else e2e,
        "e2e": e2e,
        "tokens": tokens,
        "cached": cached_tokens(usage),
        "prompt_tokens": usage.get("prompt_tokens", len(prompt)),
    }


COUNTERS = {
    "queries": ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"),
    "hits": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
    "ttft_sum": ("vllm:time_to_first_token_seconds_sum",),
    "ttft_count": ("vllm:time_to_first_token_seconds_count",),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prompt_tokens": ("vllm:prompt_tokens_total", "vllm:prompt_tokens"),
}


def parse_counters(text: str) -> Dict[str, float]:
    """Sums the counters above over all label sets (engines)."""
    names = {n: key for key, ns in COUNTERS.items() for n in ns}
    seen: Dict[str, Dict[str, float]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.rfind(" ")
        name = line[:brace] if 0 <= brace < space else line[:space]
        key = names.get(name.strip())
        if key is None:
            continue
        try:
            val = float(line[space + 1 :])
        except ValueError:
            continue
        seen.setdefault(key, {}).setdefault(name, 0.0)
        seen[key][name] += val
    # A counter exposed under both spellings is counted once.
    return {k: max(seen.get(k, {"": 0.0}).values()) for k in COUNTERS}


def scrape(url: str) -> Dict[str, float]:
    """The COUNTERS of one server's /metrics (`url` is the server's base URL)."""
    status, body = http_request(url.rstrip("/") + "/metrics")
    if status != 200:
        raise RuntimeError(f"GET {url}/metrics: HTTP {status}")
    return parse_counters(body.decode("utf-8", "replace"))


def scrape_all(urls: Dict[str, str]) -> Dict[str, Dict[str, float]]:
    return {sid: scrape(u) for sid, u in urls.items()}


def reset_prefix_caches(urls: Dict[str, str], tries: int = 50) -> None:
    """The weight update: POST /reset_prefix_cache on every server (vLLM needs
    VLLM_SERVER_DEV_MODE=1 for this endpoint). Retries while requests drain."""
    for sid, u in urls.items():
        for i in range(tries):  # bounded: a server that never accepts fails the run
            status, body = http_request(u.rstrip("/") + "/reset_prefix_cache", "POST")
            if status == 200:
                break
            if i == tries - 1:
                raise RuntimeError(f"{sid}: POST /reset_prefix_cache failed: HTTP {status} {body[:200]!r}")
            time.sleep(0.1)


def served_model(url: str) -> str:
    """The first model id /v1/models lists."""
    status, body = http_request(url.rstrip("/") + "/v1/models")
    if status != 200:
        raise RuntimeError(f"GET {url}/v1/models: HTTP {status}")
    return json.loads(body)["data"][0]["id"]


def wait_healthy(urls: Dict[str, str], timeout: float = 60.0) -> None:
    """Waits until every server answers /health; RuntimeError names the rest."""
    deadline = time.time() + timeout
    pending = dict(urls)
    while pending:
        for sid, u in list(pending.items()):
            if healthy(u, timeout=2.0):
                del pending[sid]
        if pending:
            if time.time() > deadline:
                raise RuntimeError(f"servers not healthy after {timeout:.0f}s: {sorted(pending)}")
            time.sleep(0.2)

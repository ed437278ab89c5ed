"""The real NVIDIA Dynamo KV router (``ai-dynamo-runtime``, ``dynamo._core``)
used in-process, as the arena uses kvc-router's balancer: the client asks it
for a worker with the request's token ids, sends the request to that server,
and tells it when the first token came back and when the request finished.

Dynamo's router needs its workers registered with its runtime. Each vllm-sim
server is represented the way Dynamo's own vLLM worker represents a vLLM
engine, with Dynamo's own APIs and nothing re-implemented:

* a ``DistributedRuntime`` per server serving the worker endpoint (its handler
  is never called: the client sends HTTP straight to the server);
* ``register_model`` with the engine's runtime facts (KV blocks, max_num_seqs,
  max_num_batched_tokens), as the vLLM worker publishes them: ``best_worker``
  answers "no endpoints available to route work" for instances that never
  published a model card (checked with ai-dynamo-runtime 1.6.1);
* a ``KvEventPublisher`` relaying the server's real vLLM ZMQ KV-event stream
  into Dynamo's event plane (Dynamo's ingress for vLLM engines).

The arena runs the router in a process of its own (:class:`DynamoRouterProcess`,
``python -m kvc_harness.dynamo_route --serve`` under .venv-peers' Python), as
Dynamo's frontend is: in the clients' process its asyncio loop waited for the
GIL behind hundreds of streaming client threads (84 ms a decision on
agent_scale, 0.4 ms on grpo_sat), which delayed each request by a cost no
deployment pays. The client speaks line-delimited JSON to it over a Unix
socket, one connection per concurrent caller. With ``proxy_urls`` the process
is also the request path, as Dynamo's frontend is (an HTTP proxy: the client
sends the completion to it, it routes, forwards, tells the router the first
token and frees the request): a Python client then makes no per-request router
calls, whose wait for the client's GIL (18 ms a decision on agent_task) and,
with requests sent in order, serialised sending a step.

Discovery is Dynamo's ``file`` backend in a private directory: its ``mem``
backend is per runtime, so a router never sees workers of another runtime.
Every socket binds to 127.0.0.1 (DYN_*_HOST). The router runs at Dynamo's
defaults: ``KvRouterConfig()`` and no session affinity.

``dynamo`` lives in ``.venv-peers`` (testbed/scripts/peers_venv.sh pins
ai-dynamo-runtime); its site-packages directory is appended to ``sys.path``
(after this venv's own), so the arena's process imports it without
installing it twice."""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

LOOPBACK_ENV = {
    "DYN_TCP_RPC_HOST": "127.0.0.1",
    "DYN_EVENT_PLANE_HOST": "127.0.0.1",
    "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
    "DYN_SYSTEM_HOST": "127.0.0.1",
    # Dynamo logs its own shutdown (watchers closing) at error level; real errors still show.
    "DYN_LOG": "error,dynamo_runtime::storage=off,dynamo_runtime::transports=off",
}
NAMESPACE = "kvcarena"
ENDPOINT = f"{NAMESPACE}.worker.generate"


def peers_site_packages(peers_python: str) -> Optional[str]:
    root = os.path.dirname(os.path.dirname(peers_python))
    hits = sorted(glob.glob(os.path.join(root, "lib", "python3*", "site-packages")))
    return hits[0] if hits else None


def import_dynamo(peers_python: str) -> Any:
    """dynamo._core from this environment or, failing that, from .venv-peers."""
    try:
        import dynamo._core as core  # noqa: PLC0415

        return core
    except ImportError:
        pass
    sp = peers_site_packages(peers_python)
    if not sp or not os.path.isdir(os.path.join(sp, "dynamo")):
        raise RuntimeError(
            f"ai-dynamo-runtime is not installed in {peers_python}'s venv (run testbed/scripts/peers_venv.sh)"
        )
    if sp not in sys.path:
        sys.path.append(sp)
    import dynamo._core as core  # noqa: PLC0415

    return core


async def _never_called(request: Any) -> Any:  # pragma: no cover - the client talks HTTP to the server
    raise RuntimeError("the arena sends requests to vllm-sim directly")
    yield request  # an async generator, as serve_endpoint requires


class DynamoKvRouter:
    """Dynamo's KvRouter over the given servers, driven from client threads.

    ``servers``: ``(sid, zmq_endpoint, topic)`` per vllm-sim server. Engine
    facts come from the fleet's configuration (the vLLM worker reads them from
    its engine)."""

    def __init__(self, peers_python: str, servers: Sequence[Tuple[str, str, str]], block_size: int,
                 total_kv_blocks: int, max_num_seqs: int, max_num_batched_tokens: int,
                 model: str, timeout: float = 30.0, router_config: Optional[Dict[str, float]] = None) -> None:
        for k, v in LOOPBACK_ENV.items():
            os.environ.setdefault(k, v)
        self._disc_dir = tempfile.mkdtemp(prefix="kvc-dynamo-")
        os.environ["DYN_FILE_KV"] = self._disc_dir
        self.core = import_dynamo(peers_python)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dynamo-loop", daemon=True)
        self._thread.start()
        self.block_size = block_size
        # KvRouterConfig keyword arguments; {} = Dynamo's defaults (the arena's
        # launcher-default row), set only for its tuned row.
        self.router_config = dict(router_config or {})
        self.sid_of: Dict[int, str] = {}
        self._runtimes: List[Any] = []
        self._publishers: List[Any] = []
        self._router: Any = None
        self._call(self._start(servers, total_kv_blocks, max_num_seqs, max_num_batched_tokens, model),
                   timeout)
        self._wait_workers(len(servers), timeout)

    # -- lifecycle ------------------------------------------------------------

    def _call(self, coro: Any, timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _rpc(self, method: str, *args: Any, timeout: float = 60.0, **kwargs: Any) -> Any:
        """Calls a router method on the loop thread (its awaitables need a
        running loop when they are created)."""

        async def call() -> Any:
            return await getattr(self._router, method)(*args, **kwargs)

        return self._call(call(), timeout)

    async def _start(self, servers: Sequence[Tuple[str, str, str]], total_kv_blocks: int, max_num_seqs: int,
                     max_num_batched_tokens: int, model: str) -> None:
        c = self.core
        loop = asyncio.get_running_loop()
        for sid, zmq_endpoint, topic in servers:
            rt = c.DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
            self._runtimes.append(rt)
            ep = rt.endpoint(ENDPOINT)
            asyncio.ensure_future(ep.serve_endpoint(_never_called))
            rc = c.ModelRuntimeConfig()
            rc.total_kv_blocks = total_kv_blocks
            rc.max_num_seqs = max_num_seqs
            rc.max_num_batched_tokens = max_num_batched_tokens
            await c.register_model(c.ModelInput.Tokens, c.ModelType.Completions, ep, model, model,
                                   worker_type=c.WorkerType.Aggregated, kv_cache_block_size=self.block_size,
                                   runtime_config=rc, skip_model_assets=True)
            self._publishers.append(c.KvEventPublisher(ep, kv_block_size=self.block_size,
                                                       zmq_endpoint=zmq_endpoint, zmq_topic=topic or ""))
            self.sid_of[ep.connection_id()] = sid
        rrt = c.DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
        self._runtimes.append(rrt)
        self._router = c.KvRouter(rrt.endpoint(ENDPOINT), self.block_size, c.KvRouterConfig(**self.router_config))

    def _wait_workers(self, n: int, timeout: float) -> None:
        deadline = time.time() + timeout
        last: Any = None
        while time.time() < deadline:
            try:
                loads = self._rpc("get_potential_loads", [1] * self.block_size, timeout=10.0)
                if len({d["worker_id"] for d in loads}) >= n:
                    return
                last = loads
            except Exception as e:  # noqa: BLE001 - discovery is asynchronous; retried until the deadline
                last = e
            time.sleep(0.1)
        raise RuntimeError(f"dynamo router did not discover {n} workers within {timeout:.0f}s: {last!r}")

    def close(self) -> None:
        try:
            for p in self._publishers:
                p.shutdown()
            for rt in self._runtimes:
                rt.shutdown()
        finally:
            self._router = None
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10.0)
            shutil.rmtree(self._disc_dir, ignore_errors=True)

    # -- routing ----------------------------------------------------------------

    def best_worker(self, token_ids: List[int], request_id: Optional[str]) -> Tuple[str, int]:
        """(server id, overlap blocks). With a request_id the router tracks the
        request (active blocks and prefill tokens) until :meth:`free`."""
        # Long timeout: with router_queue_threshold the router holds the call
        # until a worker has room.
        wid, _dp, overlap = self._rpc("best_worker", list(token_ids), request_id=request_id, timeout=3600.0)
        return self.sid_of[wid], overlap

    def new_request_id(self) -> str:
        return uuid.uuid4().hex

    def mark_prefill_complete(self, request_id: str) -> None:
        self._rpc("mark_prefill_complete", request_id)

    def free(self, request_id: str) -> None:
        self._rpc("free", request_id)

    def overlap_scores(self, token_ids: List[int]) -> Dict[str, int]:
        """Device-tier overlap blocks per server (Dynamo's indexer view)."""
        res = self._rpc("get_overlap_scores", list(token_ids))
        out: Dict[str, int] = {}
        for w in res.get("workers") or []:
            sid = self.sid_of.get(w.get("worker_id"))
            if sid is not None:
                out[sid] = int(w.get("device_blocks") or 0)
        return out

    def potential_loads(self, token_ids: List[int]) -> Dict[str, Dict[str, int]]:
        res = self._rpc("get_potential_loads", list(token_ids))
        return {self.sid_of[d["worker_id"]]: d for d in res if d["worker_id"] in self.sid_of}


# -- the router in its own process ------------------------------------------------

# What a client may call on the served router (DynamoKvRouter's routing API).
SERVED = ("best_worker", "mark_prefill_complete", "free", "overlap_scores", "potential_loads", "proxy_stats")


async def _serve_conn(router: DynamoKvRouter, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      stats: Optional[ProxyStats] = None) -> None:
    """One client connection: a JSON line [method, args] in, a JSON line
    {"ok": result} or {"error": text} out, in order."""
    r = router._router
    while True:
        line = await reader.readline()
        if not line:
            break
        try:
            method, args = json.loads(line)
            if method == "best_worker":
                wid, _dp, overlap = await r.best_worker(list(args[0]), request_id=args[1])
                out: Any = [router.sid_of[wid], overlap]
            elif method in ("mark_prefill_complete", "free"):
                await getattr(r, method)(args[0])
                out = None
            elif method == "overlap_scores":
                res = await r.get_overlap_scores(list(args[0]))
                out = {router.sid_of[w["worker_id"]]: int(w.get("device_blocks") or 0)
                       for w in res.get("workers") or [] if w.get("worker_id") in router.sid_of}
            elif method == "potential_loads":
                res = await r.get_potential_loads(list(args[0]))
                out = {router.sid_of[d["worker_id"]]: d for d in res if d["worker_id"] in router.sid_of}
            elif method == "proxy_stats" and stats is not None:
                out = stats.snapshot()
            else:
                raise ValueError(f"unknown method {method!r}; served: {', '.join(SERVED)}")
            reply = {"ok": out}
        except Exception as e:  # noqa: BLE001 - the error goes back to the caller, the server keeps serving
            reply = {"error": f"{type(e).__name__}: {e}"}
        writer.write(json.dumps(reply).encode() + b"\n")
        await writer.drain()
    writer.close()


# -- the router as an HTTP proxy (Dynamo's frontend's place in the request path) --

# The largest request head and body the proxy reads (a prompt's token ids as JSON).
PROXY_MAX_HEAD = 64 << 10
PROXY_MAX_BODY = 64 << 20


class ProxyStats:
    """What the proxy did, for the run's details (``proxy_stats``)."""

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.first_token_marks = 0
        self.overlap_blocks = 0
        self.tokenized = 0
        self.decision_s: List[float] = []

    def snapshot(self) -> Dict[str, Any]:
        d = sorted(self.decision_s)
        return {"requests": self.requests, "errors": self.errors, "first_token_marks": self.first_token_marks,
                "overlap_blocks": self.overlap_blocks, "tokenized": self.tokenized,
                "decision_p50_ms": d[len(d) // 2] * 1000.0 if d else 0.0,
                "decision_p99_ms": d[min(len(d) - 1, int(len(d) * 0.99))] * 1000.0 if d else 0.0}


def _split(url: str) -> Tuple[str, int]:
    hostport = url.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    return host, int(port)


async def _read_head(reader: asyncio.StreamReader) -> Tuple[str, Dict[str, str]]:
    """The request or status line and the headers (lower-case names)."""
    raw = await reader.readuntil(b"\r\n\r\n")
    if len(raw) > PROXY_MAX_HEAD:
        raise ValueError(f"head of {len(raw)} bytes (limit {PROXY_MAX_HEAD})")
    lines = raw.decode("latin-1").split("\r\n")
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    return lines[0], headers


def _reply(writer: asyncio.StreamWriter, status: int, body: Dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 502: "Bad Gateway", 503: "Service Unavailable"}
    writer.write(f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)


async def _tokenize(url: str, prompt: str, model: str) -> List[int]:
    """The engine's /tokenize (Dynamo's frontend tokenizes with the model's
    tokenizer; vllm-sim's is served there)."""
    host, port = _split(url)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        body = json.dumps({"model": model, "prompt": prompt}).encode()
        writer.write(f"POST /tokenize HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        status, headers = await _read_head(reader)
        n = int(headers.get("content-length", "-1"))
        data = await (reader.readexactly(n) if n >= 0 else reader.read(PROXY_MAX_BODY))
        if " 200 " not in status + " ":
            raise RuntimeError(f"/tokenize: {status}: {data[:200]!r}")
        return list(json.loads(data)["tokens"])
    finally:
        writer.close()


def sse_to_completion(raw: bytes) -> Tuple[int, Dict[str, Any]]:
    """A streamed completion's server-sent events (as an engine sends them,
    ``data: {...}`` lines ending with ``data: [DONE]``) as the one JSON
    completion a non-streamed request gets: the choices' texts and token ids
    joined, the last finish reason, the usage chunk. An error event is
    (503, its message); events that are not JSON are (502, why)."""
    text: List[str] = []
    ids: List[int] = []
    finish = None
    usage: Dict[str, Any] = {}
    head: Dict[str, Any] = {}
    for line in raw.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            continue
        try:
            msg = json.loads(payload)
        except ValueError as e:
            return 502, {"error": f"dynamo proxy: an event that is not JSON: {e}"}
        if not isinstance(msg, dict):
            return 502, {"error": "dynamo proxy: an event that is not a JSON object"}
        if msg.get("object") == "error":
            return 503, {"error": str(msg.get("message", "engine error"))}
        for k in ("id", "object", "created", "model"):
            if k in msg and k not in head:
                head[k] = msg[k]
        for ch in msg.get("choices") or ():
            text.append(ch.get("text") or "")
            ids.extend(ch.get("token_ids") or ())
            finish = ch.get("finish_reason") or finish
        if msg.get("usage"):
            usage = msg["usage"]
    out = dict(head, choices=[{"index": 0, "text": "".join(text), "token_ids": ids, "finish_reason": finish}])
    if usage:
        out["usage"] = usage
    return 200, out


async def _proxy_conn(router: DynamoKvRouter, urls: Dict[str, str], model: str, stats: ProxyStats,
                      reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One client request (the connection closes after it): route it with
    Dynamo's KvRouter, forward it to the chosen engine, relay the response
    bytes as they come, tell the router the first token when the first body
    bytes arrive (a streamed response's first chunk) and free the request
    when the engine closes the response. The client then sees Dynamo as it
    sees sglang-router or vllm-router: one HTTP hop, no per-request calls of
    its own (in the client's process those waited for its GIL).

    The engine is always asked to stream (the first token must be the real
    one); a client that asked for a non-streamed completion gets one, built
    here from the events (sse_to_completion), so its work per request is what
    it is behind any other router. (Relaying the stream to a non-streaming
    client made the arena's Python client parse every token's event for
    Dynamo alone: its turns came back later and the engines ran emptier.)"""
    r = router._router
    rid = ""
    tracked = False
    try:
        try:
            line, headers = await _read_head(reader)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            _reply(writer, 400, {"error": f"bad request head: {e}"})
            return
        method, _, rest = line.partition(" ")
        path = rest.split(" ", 1)[0]
        if method == "GET" and path in ("/health", "/v1/models"):
            _reply(writer, 200, {"status": "ok", "workers": sorted(urls)})
            return
        if method != "POST" or path != "/v1/completions":
            _reply(writer, 404, {"error": f"{method} {path}: the proxy serves POST /v1/completions"})
            return
        n = int(headers.get("content-length", "-1"))
        if not 0 <= n <= PROXY_MAX_BODY:
            _reply(writer, 400, {"error": f"content-length {n} outside [0, {PROXY_MAX_BODY}]"})
            return
        try:
            body = json.loads(await reader.readexactly(n))
            if not isinstance(body, dict):
                raise ValueError(f"a JSON object expected, got {type(body).__name__}")
        except ValueError as e:
            stats.errors += 1
            _reply(writer, 400, {"error": f"dynamo proxy: request body: {e}"})
            return
        stats.requests += 1
        # The client may send the prompt's token ids it already holds (as
        # verl does); otherwise the prompt is tokenised by an engine.
        ids = body.pop("prompt_token_ids", None)
        if ids is None:
            prompt = body.get("prompt")
            ids = list(prompt) if isinstance(prompt, list) else await _tokenize(
                next(iter(urls.values())), str(prompt), body.get("model") or model)
            stats.tokenized += 1
        buffered = not body.get("stream")
        if buffered:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        rid = uuid.uuid4().hex
        t0 = time.perf_counter()
        wid, _dp, overlap = await r.best_worker(list(ids), request_id=rid)
        stats.decision_s.append(time.perf_counter() - t0)
        tracked = True
        stats.overlap_blocks += int(overlap)
        sid = router.sid_of[wid]
        host, port = _split(urls[sid])
        data = json.dumps(body).encode()
        up_r, up_w = await asyncio.open_connection(host, port)
        try:
            extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()
                            if k.startswith("x-") or k == "authorization")
            # HTTP/1.0 upstream when buffering: the engine then sends the
            # events unchunked until it closes, so they parse as they are.
            version = "1.0" if buffered else "1.1"
            up_w.write(f"POST /v1/completions HTTP/{version}\r\nHost: {host}:{port}\r\n"
                       f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}"
                       f"x-dynamo-worker: {sid}\r\nConnection: close\r\n\r\n".encode() + data)
            await up_w.drain()
            head = await up_r.readuntil(b"\r\n\r\n")
            ok = head.split(b" ", 2)[1:2] == [b"200"]
            if not buffered or not ok:
                writer.write(head)
            marked = False
            got = bytearray()
            while True:
                chunk = await up_r.read(1 << 16)
                if not chunk:
                    break
                if not marked:
                    marked = True
                    await r.mark_prefill_complete(rid)
                    stats.first_token_marks += 1
                if buffered and ok:
                    got += chunk
                    if len(got) > PROXY_MAX_BODY:
                        raise ValueError(f"a response over {PROXY_MAX_BODY} bytes")
                    continue
                writer.write(chunk)
                await writer.drain()
            if buffered and ok:
                status, out = sse_to_completion(bytes(got))
                if status != 200:
                    stats.errors += 1
                _reply(writer, status, out)
        finally:
            up_w.close()
    except Exception as e:  # noqa: BLE001 - the error goes to this request's client; the proxy keeps serving
        stats.errors += 1
        try:
            _reply(writer, 502, {"error": f"dynamo proxy: {type(e).__name__}: {e}"})
        except Exception:  # noqa: BLE001 - the client is gone
            pass
    finally:
        if tracked:
            try:
                await r.free(rid)
            except Exception:  # noqa: BLE001 - counted; the request is over either way
                stats.errors += 1
        try:
            await writer.drain()
        except Exception:  # noqa: BLE001 - the client is gone
            pass
        writer.close()


def serve(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the router process: starts DynamoKvRouter, listens on
    --socket, prints "READY <proxy port>" (0 without a proxy) once its workers
    are discovered and its sockets are bound, and serves until
    stdin closes (the parent exited or closed it)."""
    ap = argparse.ArgumentParser(description="Dynamo's KvRouter served over a Unix socket (arena tooling)")
    ap.add_argument("--serve", action="store_true", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--spec", required=True, help="JSON: servers, block_size, total_kv_blocks, max_num_seqs, "
                    "max_num_batched_tokens, model, router_config")
    a = ap.parse_args(argv)
    spec = json.loads(a.spec)
    stats = ProxyStats()
    router = DynamoKvRouter(sys.executable, [tuple(x) for x in spec["servers"]], spec["block_size"],
                            spec["total_kv_blocks"], spec["max_num_seqs"], spec["max_num_batched_tokens"],
                            spec["model"], router_config=spec.get("router_config"))
    try:
        async def start() -> Any:
            return await asyncio.start_unix_server(lambda rd, wr: _serve_conn(router, rd, wr, stats), path=a.socket,
                                                   limit=1 << 26)

        server = router._call(start())
        proxy = None
        if spec.get("proxy"):
            urls = dict(spec["proxy"]["urls"])

            async def start_proxy() -> Any:
                # Port 0: the kernel picks a free port while this socket holds
                # it (a port picked by the parent and bound here later can be
                # taken by another process in between).
                return await asyncio.start_server(
                    lambda rd, wr: _proxy_conn(router, urls, spec["model"], stats, rd, wr),
                    host="127.0.0.1", port=0, limit=PROXY_MAX_HEAD, backlog=4096)

            proxy = router._call(start_proxy())
        port = proxy.sockets[0].getsockname()[1] if proxy is not None else 0
        print(f"READY {port}", flush=True)
        sys.stdin.read()  # EOF: the parent is gone or closed the pipe
        router._loop.call_soon_threadsafe(server.close)
        if proxy is not None:
            router._loop.call_soon_threadsafe(proxy.close)
    finally:
        router.close()
    return 0


class DynamoRouterProcess:
    """DynamoKvRouter's routing API, served by a child process (see the module
    docstring for why). Thread-safe: each concurrent caller takes its own
    connection from a pool."""

    def __init__(self, peers_python: str, servers: Sequence[Tuple[str, str, str]], block_size: int,
                 total_kv_blocks: int, max_num_seqs: int, max_num_batched_tokens: int,
                 model: str, timeout: float = 60.0, router_config: Optional[Dict[str, float]] = None,
                 proxy_urls: Optional[Dict[str, str]] = None) -> None:
        self.block_size = block_size
        self.router_config = dict(router_config or {})
        self._dir = tempfile.mkdtemp(prefix="kvc-dynamo-proc-")
        self._sock = os.path.join(self._dir, "router.sock")
        spec: Dict[str, Any] = {
            "servers": [list(s) for s in servers], "block_size": block_size, "total_kv_blocks": total_kv_blocks,
            "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens, "model": model,
            "router_config": self.router_config}
        # proxy_urls {server id: base URL}: the process also serves an HTTP
        # proxy (POST /v1/completions) routing to those servers, at proxy_url.
        self.proxy_url = ""  # set from the child's READY line (the port it bound)
        if proxy_urls:
            spec["proxy"] = {"urls": dict(proxy_urls)}
        env = dict(os.environ)
        for k, v in LOOPBACK_ENV.items():
            env.setdefault(k, v)
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
        self._log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [peers_python, "-m", "kvc_harness.dynamo_route", "--serve", "--socket", self._sock,
             "--spec", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env, text=True)
        self._pool: queue.SimpleQueue[socket.socket] = queue.SimpleQueue()
        self._conns: List[socket.socket] = []
        self._lock = threading.Lock()
        ready: List[str] = []

        def wait_ready() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                word, _, port = line.strip().partition(" ")
                if word == "READY":
                    ready.append(port)
                    return

        reader = threading.Thread(target=wait_ready, daemon=True)
        reader.start()
        reader.join(timeout)
        if not ready:
            self._stop_process()
            self._log.seek(0)
            log = self._log.read()[-3000:]
            self.close()
            raise RuntimeError(f"the Dynamo router process did not start within {timeout:.0f}s "
                               f"(exit {self.proc.returncode}): {log}")
        if proxy_urls:
            self.proxy_url = f"http://127.0.0.1:{int(ready[0])}"

    def _call(self, method: str, *args: Any) -> Any:
        try:
            conn = self._pool.get_nowait()
        except queue.Empty:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(self._sock)
            with self._lock:
                self._conns.append(conn)
        f = conn.makefile("rwb")
        f.write(json.dumps([method, list(args)]).encode() + b"\n")
        f.flush()
        line = f.readline()
        f.close()
        if not line:
            raise RuntimeError(f"the Dynamo router process closed the connection during {method} "
                               f"(exit {self.proc.poll()})")
        self._pool.put(conn)
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"dynamo router {method}: {reply['error']}")
        return reply["ok"]

    def best_worker(self, token_ids: List[int], request_id: Optional[str]) -> Tuple[str, int]:
        sid, overlap = self._call("best_worker", list(token_ids), request_id)
        return sid, overlap

    def new_request_id(self) -> str:
        return uuid.uuid4().hex

    def mark_prefill_complete(self, request_id: str) -> None:
        self._call("mark_prefill_complete", request_id)

    def free(self, request_id: str) -> None:
        self._call("free", request_id)

    def overlap_scores(self, token_ids: List[int]) -> Dict[str, int]:
        return self._call("overlap_scores", list(token_ids))

    def potential_loads(self, token_ids: List[int]) -> Dict[str, Dict[str, int]]:
        return self._call("potential_loads", list(token_ids))

    def proxy_stats(self) -> Dict[str, Any]:
        """The proxy's counters (ProxyStats.snapshot)."""
        return self._call("proxy_stats")

    def _stop_process(self) -> None:
        """Closes the connections and the process's stdin (its signal to
        exit); kills it if it has not exited within 20 s."""
        with self._lock:
            for c in self._conns:
                c.close()
            self._conns.clear()
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def close(self) -> None:
        self._stop_process()
        shutil.rmtree(self._dir, ignore_errors=True)
        self._log.close()


if __name__ == "__main__":
    sys.exit(serve())

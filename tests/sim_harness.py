"""Process and network helpers for the fault, hostile-input and soak tests:
real ``vllm-sim`` processes on loopback, a controllable stand-in /metrics
server, RSS readings and latency percentiles.

Everything started here is registered with a :class:`Reaper` (a pytest
fixture finalizer or a script's ``finally``) so it is stopped on failure too.
Only 127.0.0.1 is ever bound or dialled.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from typing import Any, Callable, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST = "127.0.0.1"


def free_ports(n: int) -> List[int]:
    """n distinct free TCP ports on loopback (bound together, then released)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((HOST, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def sim_binary() -> str:
    """The vllm-sim binary: $KVR_VLLM_SIM, bin/vllm-sim, else built into bin/."""
    env = os.environ.get("KVR_VLLM_SIM")
    if env:
        return env
    path = os.path.join(REPO, "bin", "vllm-sim")
    if not os.path.isfile(path):
        go = shutil.which("go")
        if go is None:
            raise RuntimeError("bin/vllm-sim is missing and no Go toolchain to build it")
        subprocess.run([go, "build", "-o", path, "./cmd/vllm-sim"], cwd=REPO, check=True, timeout=600)
    return path


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.01) -> Any:
    """Polls pred until it returns a truthy value; fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)


class Reaper:
    """Stops everything registered with it, newest first; safe to call twice."""

    def __init__(self) -> None:
        self._stops: List[Callable[[], None]] = []

    def add(self, stop: Callable[[], None]) -> None:
        self._stops.append(stop)

    def close(self) -> None:
        while self._stops:
            stop = self._stops.pop()
            try:
                stop()
            except Exception:  # noqa: BLE001 - cleanup must go on
                pass


class Sim:
    """One vllm-sim process with fixed HTTP, KV-event and replay ports, so a
    restart comes back at the same addresses."""

    def __init__(self, reaper: Reaper, extra: Optional[List[str]] = None, speed: float = 0.0) -> None:
        self.port, self.pub_port, self.replay_port = free_ports(3)
        self.extra = list(extra or [])
        self.speed = speed
        self.proc: Optional[subprocess.Popen] = None
        self.info: Dict[str, Any] = {}
        self.restarts = 0
        reaper.add(self.stop)

    @property
    def id(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.id}"

    @property
    def endpoint(self) -> str:
        return f"tcp://{HOST}:{self.pub_port}"

    @property
    def replay(self) -> str:
        return f"tcp://{HOST}:{self.replay_port}"

    def start(self, timeout: float = 30.0) -> Sim:
        cmd = [
            sim_binary(),
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--kv-events-endpoint",
            self.endpoint,
            "--kv-events-replay-endpoint",
            self.replay,
            "--speed",
            str(self.speed),
            "--log-level",
            "warn",
            *self.extra,
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
        )
        line = self.proc.stdout.readline()  # one JSON line once listening
        if not line:
            self.stop()
            raise RuntimeError(f"vllm-sim exited at start: {cmd}")
        self.info = json.loads(line)
        wait_for(self.healthy, timeout, f"{self.id} /health")
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no goodbye, as a crashed engine."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def restart(self, timeout: float = 30.0) -> Sim:
        self.kill()
        self.restarts += 1
        deadline = time.monotonic() + timeout
        while True:  # the ports may linger for a moment after the kill
            try:
                return self.start(timeout)
            except (RuntimeError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()

    def complete(self, prompt: List[int], max_tokens: int = 1, timeout: float = 10.0) -> Dict[str, Any]:
        body = json.dumps({"prompt": prompt, "max_tokens": max_tokens}).encode()
        req = urllib.request.Request(
            self.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def drop_events(self, n: int) -> None:
        req = urllib.request.Request(f"{self.url}/sim/drop_kv_events?next={n}", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()

    def cached_blocks(self) -> Any:
        with urllib.request.urlopen(self.url + "/sim/cached_blocks", timeout=5) as r:
            return json.loads(r.read())

    def endpoints_config(self, replay: bool = True) -> List[Dict[str, str]]:
        ep = {"endpoint": self.endpoint}
        if replay:
            ep["replay"] = self.replay
        return [ep]


class MetricsStub:
    """A stand-in /metrics server whose behaviour a test switches at will:
    ``ok`` (vLLM text from ``body_fn``), ``500``, ``garbage``, ``slow``
    (``delay`` seconds, then ok), ``huge`` (``huge_bytes`` of valid-looking
    comment lines), ``hang`` (never answers within a scrape timeout)."""

    def __init__(self, reaper: Reaper, body_fn: Callable[[], str]) -> None:
        self.mode = "ok"
        self.delay = 0.0
        self.huge_bytes = 0
        self.body_fn = body_fn
        self.hits = 0
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


def rss_bytes(pid: Optional[int] = None) -> int:
    """Resident set size of a process (default: this one) from /proc."""
    with open(f"/proc/{pid or 'self'}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def percentiles(samples: List[float], *ps: float) -> List[float]:
    s = sorted(samples)
    if not s:
        return [float("nan")] * len(ps)
    return [s[min(len(s) - 1, int(p / 100.0 * len(s)))] for p in ps]


def kvc_config(
    endpoints: Optional[Dict[str, List[Dict[str, str]]]] = None,
    urls: Optional[Dict[str, str]] = None,
    interval_ms: int = 50,
    timeout_ms: int = 200,
    collectors: tuple = ("vllm_metrics", "vllm_zmq"),
    log_level: str = "info",
    **extra: Any,
) -> Dict[str, Any]:
    """A kvc_aware balancer config with live collectors tuned for tests."""
    collector: Dict[str, Any] = {
        "interval_ms": interval_ms,
        "timeout_ms": timeout_ms,
        "backoff_max_ms": 4 * interval_ms,
        "idle_redial_ms": 300,
        "retry_ms": 100,
        "replay_timeout_ms": 1000,
        "use_handle_endpoints": False,
    }
    if endpoints:
        collector["endpoints"] = endpoints
    if urls:
        collector["urls"] = urls
    collector.update(extra.pop("collector", {}))
    cfg: Dict[str, Any] = {
        "strategies": [{"_target_": "kvc_router.config.KVCAwareStrategyConfig", "collector_names": list(collectors)}],
        "log_level": log_level,
        "model": "sim/llama-8b",
        "collector": collector,
    }
    cfg.update(extra)
    return {"type": "kvc_aware", "config": cfg}


def server_status(status: Dict[str, Any], sid: str) -> Dict[str, Any]:
    for s in status["router"]["servers"]:
        if s["id"] == sid:
            return s
    raise KeyError(sid)


def publisher_status(status: Dict[str, Any], sid: str) -> Dict[str, Any]:
    for p in status["router"]["collectors"]["collectors"].get("vllm_zmq") or []:
        if p["server"] == sid:
            return p
    return {}


def index_server(status: Dict[str, Any], sid: str) -> Dict[str, Any]:
    for s in status["router"]["index"]["servers"] or []:
        if s["name"] == sid:
            return s
    return {}


def poller_target(status: Dict[str, Any], sid: str) -> Dict[str, Any]:
    for t in status["router"]["collectors"]["collectors"].get("vllm_metrics") or []:
        if t["server"] == sid:
            return t
    return {}

"""The rollout workload shared by ``scripts/demo.py`` (simulated fleet) and
``scripts/gpu-validate.sh`` (real vLLM servers): seeded GRPO and multi-turn
agent workloads, the Ray rollout-worker actor that acquires a server through the
balancer actor and calls it over real HTTP, the servers' own ``/metrics``
counters, and the comparison table and plot.

Everything here talks to servers through vLLM's public HTTP API only
(``/v1/completions`` with token-id prompts and streaming, ``/metrics``,
``/reset_prefix_cache``, ``/v1/models``), so it runs unchanged against vLLM
and against ``bin/vllm-sim``.
"""

from __future__ import annotations

import atexit
import http.client
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

# Token ids stay inside every common vocabulary (Llama-2's is 32000) and above
# the low special-token range.
TOKEN_LO, TOKEN_HI = 100, 30000


# ---------------------------------------------------------------------------
# Workload


@dataclass
class WorkloadSpec:
    """Sizes of the two workloads; every draw comes from ``seed``."""

    seed: int = 0
    # GRPO: `prompts` prompts x `samples` samples per rollout step, `steps`
    # steps with a weight update (prefix-cache reset) between them.
    steps: int = 3
    prompts: int = 8
    samples: int = 8
    prompt_tokens: Sequence[int] = (1024, 3072)  # uniform range
    response_median: int = 96  # log-normal, long-tailed
    response_sigma: float = 0.8
    response_max: int = 512
    # Agent: `tasks` tasks x `agent_samples` trajectories, `turns` turns each,
    # run as one more rollout step after the GRPO steps.
    tasks: int = 4
    agent_samples: int = 4
    turns: int = 4
    system_tokens: int = 1024  # tool descriptions shared by every trajectory
    task_tokens: Sequence[int] = (256, 768)
    turn_response_median: int = 48
    turn_response_max: int = 192
    tool_tokens: Sequence[int] = (64, 384)

    def describe(self) -> str:
        lo, hi = self.prompt_tokens
        return (
            f"grpo: {self.steps} steps x {self.prompts} prompts x {self.samples} samples "
            f"(prompt {lo}-{hi} tok, response median {self.response_median} max {self.response_max}); "
            f"agent: {self.tasks} tasks x {self.agent_samples} trajectories x {self.turns} turns "
            f"(shared {self.system_tokens}-tok system prompt, tool outputs "
            f"{self.tool_tokens[0]}-{self.tool_tokens[1]} tok)"
        )


def _tokens(rng: random.Random, n: int) -> List[int]:
    return [rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(n)]


def _lognormal(rng: random.Random, median: int, sigma: float, cap: int) -> int:
    return max(1, min(cap, int(round(median * math.exp(rng.gauss(0.0, sigma))))))


def grpo_step(spec: WorkloadSpec, step: int) -> List[dict]:
    """One GRPO rollout step: every sample is its own request (own request_id);
    the samples of a prompt share the whole prompt."""
    rng = random.Random(f"grpo/{spec.seed}/{step}")
    reqs = []
    for p in range(spec.prompts):
        prompt = _tokens(rng, rng.randint(*spec.prompt_tokens))
        for k in range(spec.samples):
            reqs.append(
                {
                    "rid": f"grpo-s{step}-p{p}-k{k}",
                    "prompt": prompt,
                    "max_tokens": _lognormal(rng, spec.response_median, spec.response_sigma, spec.response_max),
                    "seed": rng.randrange(1 << 31),
                }
            )
    # Submission order interleaves prompts, as a shuffled dataloader batch does.
    rng.shuffle(reqs)
    return reqs


def agent_step(spec: WorkloadSpec, step: int) -> List[dict]:
    """Multi-turn trajectories: one request_id per trajectory; turn t+1's prompt is
    turn t's prompt + its response tokens + a tool output."""
    rng = random.Random(f"agent/{spec.seed}/{step}")
    system = _tokens(rng, spec.system_tokens)
    trajs = []
    for t in range(spec.tasks):
        task = _tokens(rng, rng.randint(*spec.task_tokens))
        for k in range(spec.agent_samples):
            turns = [
                {
                    "max_tokens": _lognormal(rng, spec.turn_response_median, 0.6, spec.turn_response_max),
                    "seed": rng.randrange(1 << 31),
                    "tool": _tokens(rng, rng.randint(*spec.tool_tokens)),
                }
                for _ in range(spec.turns)
            ]
            trajs.append({"rid": f"agent-s{step}-t{t}-k{k}", "prompt": system + task, "turns": turns})
    rng.shuffle(trajs)
    return trajs


# ---------------------------------------------------------------------------
# HTTP (stdlib only, so that Ray workers need nothing beyond the venv)


def _split(url: str):
    u = urllib.parse.urlsplit(url)
    return u.hostname or "127.0.0.1", u.port or 80


def http_request(url: str, method: str = "GET", body: Optional[dict] = None, timeout: float = 10.0):
    host, port = _split(url)
    path = urllib.parse.urlsplit(url).path or "/"
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(
            method,
            path + (("?" + urllib.parse.urlsplit(url).query) if urllib.parse.urlsplit(url).query else ""),
            body=data,
            headers=headers,
        )
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def stream_completion(
    base_url: str, model: str, prompt: List[int], max_tokens: int, seed: int, timeout: float = 600.0
) -> dict:
    """POST /v1/completions (stream=True); returns TTFT (first data chunk), e2e,
    generated token ids and usage (cached prompt tokens)."""
    host, port = _split(base_url)
    body = json.dumps(
        {
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
    ).encode()
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    ttft = None
    tokens: List[int] = []
    usage: dict = {}
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if ttft is None:
                ttft = time.perf_counter() - t0
            if data == b"[DONE]":
                break
            msg = json.loads(data)
            if msg.get("object") == "error":
                raise RuntimeError(f"stream error: {msg.get('message')}")
            for ch in msg.get("choices") or ():
                ids = ch.get("token_ids")
                if ids:
                    tokens.extend(ids)
            if msg.get("usage"):
                usage = msg["usage"]
    finally:
        conn.close()
    e2e = time.perf_counter() - t0
    cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
    return {
        "ttft": ttft if ttft is not None else e2e,
        "e2e": e2e,
        "tokens": tokens,
        "cached": cached,
        "prompt_tokens": usage.get("prompt_tokens", len(prompt)),
    }


# ---------------------------------------------------------------------------
# Ray rollout worker


class RolloutWorker:
    """What verl's agent-loop workers do, reduced to the routing part: acquire a
    server through the balancer actor, call it over HTTP, release it.

    Created with ``ray.remote(num_cpus=0)(RolloutWorker).remote(...)``."""

    def __init__(self, balancer: Any, urls: Dict[str, str], model: str, threads: int = 64):
        self.lb = balancer
        self.urls = dict(urls)
        self.model = model
        self.pool = ThreadPoolExecutor(max_workers=threads)

    def ready(self) -> bool:
        return True

    def _call(self, rid: str, prompt: List[int], max_tokens: int, seed: int) -> dict:
        import ray

        t0 = time.perf_counter()
        sid, _handle = ray.get(self.lb.acquire_server.remote(request_id=rid, prompt_ids=prompt))
        acquire_s = time.perf_counter() - t0
        out = {
            "rid": rid,
            "server": sid,
            "acquire_s": acquire_s,
            "prompt_len": len(prompt),
            "error": None,
            "tokens": [],
        }
        try:
            r = stream_completion(self.urls[sid], self.model, prompt, max_tokens, seed)
            out.update(r)
        except Exception as e:  # noqa: BLE001 - reported, never silently dropped
            out["error"] = f"{type(e).__name__}: {e}"
        finally:
            self.lb.release_server.remote(server_id=sid)
        return out

    def grpo(self, reqs: List[dict]) -> List[dict]:
        futs = [self.pool.submit(self._call, r["rid"], r["prompt"], r["max_tokens"], r["seed"]) for r in reqs]
        res = [f.result() for f in futs]
        for r in res:
            r.pop("tokens", None)
        return res

    def _trajectory(self, traj: dict) -> List[dict]:
        prompt = list(traj["prompt"])
        rng = random.Random(traj["rid"])
        out = []
        for i, turn in enumerate(traj["turns"]):
            r = self._call(traj["rid"], prompt, turn["max_tokens"], turn["seed"])
            r["turn"] = i
            toks = r.pop("tokens", None) or []
            out.append(r)
            if r["error"]:
                break
            if len(toks) != turn["max_tokens"]:  # server without return_token_ids
                toks = _tokens(rng, turn["max_tokens"])
            prompt = prompt + toks + turn["tool"]
        return out

    def agent(self, trajs: List[dict]) -> List[dict]:
        futs = [self.pool.submit(self._trajectory, t) for t in trajs]
        return [r for f in futs for r in f.result()]


# ---------------------------------------------------------------------------
# Servers' own counters


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
        for i in range(tries):
            status, body = http_request(u.rstrip("/") + "/reset_prefix_cache", "POST")
            if status == 200:
                break
            if i == tries - 1:
                raise RuntimeError(f"{sid}: POST /reset_prefix_cache failed: HTTP {status} {body[:200]!r}")
            time.sleep(0.1)


def served_model(url: str) -> str:
    status, body = http_request(url.rstrip("/") + "/v1/models")
    if status != 200:
        raise RuntimeError(f"GET {url}/v1/models: HTTP {status}")
    return json.loads(body)["data"][0]["id"]


def wait_healthy(urls: Dict[str, str], timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    pending = dict(urls)
    while pending:
        for sid, u in list(pending.items()):
            try:
                if http_request(u.rstrip("/") + "/health", timeout=2.0)[0] == 200:
                    del pending[sid]
            except OSError:
                pass
        if pending:
            if time.time() > deadline:
                raise RuntimeError(f"servers not healthy after {timeout:.0f}s: {sorted(pending)}")
            time.sleep(0.2)


# ---------------------------------------------------------------------------
# Server descriptions (the JSON lines vllm-sim prints; gpu-validate.sh writes
# the same shape for vLLM servers)


@dataclass
class Server:
    sid: str  # host:port, as verl names servers
    url: str
    events: List[str] = field(default_factory=list)
    replay: List[str] = field(default_factory=list)
    topic: str = ""

    @staticmethod
    def from_json(d: dict) -> Server:
        host, port = _split(d["url"])
        return Server(
            sid=f"{host}:{port}",
            url=d["url"].rstrip("/"),
            events=list(d.get("kv_events_endpoints") or []),
            replay=list(d.get("kv_events_replay_endpoints") or []),
            topic=d.get("topic") or "",
        )


def read_servers_file(path: str) -> List[Server]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(Server.from_json(json.loads(line)))
    if not out:
        raise SystemExit(f"{path}: no servers")
    return out


def router_config(policy: str, servers: List[Server], interval_ms: int = 100, max_num_seqs: int = 0) -> Any:
    """None is verl's behaviour; kvc_aware gets the metrics poller and, where the
    servers publish them, the KV-event subscriber."""
    if policy == "default":
        return None
    collectors = ["vllm_metrics"]
    endpoints = {}
    for s in servers:
        if s.events:
            endpoints[s.sid] = [
                {"endpoint": e, **({"replay": s.replay[i]} if i < len(s.replay) else {}), "topic": s.topic}
                for i, e in enumerate(s.events)
            ]
    if endpoints:
        collectors.append("vllm_zmq")
    cfg: Dict[str, Any] = {
        "type": "kvc_aware",
        "config": {
            "strategies": [{"_target_": "kvc_router.config.KVCAwareStrategyConfig", "collector_names": collectors}],
            "sticky_max_size": 10000,
            "collector": {"interval_ms": interval_ms, "timeout_ms": 1000, "endpoints": endpoints},
        },
    }
    if max_num_seqs:
        # The servers' running-set capacity (vLLM's --max-num-seqs; /metrics does not report it).
        cfg["config"]["load"] = {"max_num_seqs": max_num_seqs}
    return cfg


# ---------------------------------------------------------------------------
# One policy run


def _pct(xs: Sequence[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo = int(math.floor(k))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def run_policy(
    ray: Any,
    policy: str,
    servers: List[Server],
    spec: WorkloadSpec,
    model: str,
    workers: int = 4,
    log=print,
    max_num_seqs: int = 0,
) -> dict:
    """Creates the balancer exactly as verl does, drives the workload from
    `workers` Ray actors, and returns per-request results plus the servers'
    counter deltas."""
    from kvc_router import KVCAwareBalancer

    urls = {s.sid: s.url for s in servers}
    before = scrape_all(urls)
    lb = ray.remote(KVCAwareBalancer).remote(
        servers={s.sid: None for s in servers},
        max_cache_size=10000,
        router_config=router_config(policy, servers, max_num_seqs=max_num_seqs),
    )
    worker_cls = ray.remote(num_cpus=0)(RolloutWorker)
    ws = [worker_cls.remote(lb, urls, model) for _ in range(workers)]
    ray.get([w.ready.remote() for w in ws] + [lb.get_status.remote()])
    if policy != "default":
        _wait_collectors(ray, lb, servers)
    results: List[dict] = []
    steps: List[dict] = []
    try:
        plan = [("grpo", s) for s in range(spec.steps)] + [("agent", 0)]
        for kind, s in plan:
            items = grpo_step(spec, s) if kind == "grpo" else agent_step(spec, s)
            if not items:
                continue
            shards = [items[i::workers] for i in range(workers)]
            t0 = time.perf_counter()
            refs = [getattr(w, kind).remote(sh) for w, sh in zip(ws, shards) if sh]
            out = [r for part in ray.get(refs) for r in part]
            makespan = time.perf_counter() - t0
            name = f"{kind}-{s + 1}"
            for r in out:
                r["step"] = name
            results.extend(out)
            by_server = {sid: sum(1 for r in out if r["server"] == sid) for sid in urls}
            steps.append(
                {"step": name, "makespan_s": makespan, "requests": len(out), "by_server": list(by_server.values())}
            )
            log(
                f"  [{policy}] {name}: {len(out)} requests, makespan {makespan:.2f}s wall, "
                f"requests per server {list(by_server.values())}"
            )
            # Weight update between rollout steps.
            reset_prefix_caches(urls)
            ray.get(lb.reset_prefix_index.remote())
        status = ray.get(lb.get_status.remote())
    finally:
        for a in ws + [lb]:
            ray.kill(a)
    after = scrape_all(urls)
    delta = {sid: {k: after[sid][k] - before[sid][k] for k in COUNTERS} for sid in urls}
    return {"policy": policy, "results": results, "steps": steps, "counters": delta, "router": _router_summary(status)}


def _wait_collectors(ray: Any, lb: Any, servers: List[Server], timeout: float = 15.0) -> None:
    """Waits until every server has been scraped once (and its event
    subscription is up), so the first step is not routed blind."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = ray.get(lb.get_status.remote())["router"]
        if all(s["load"]["has_metrics"] for s in st["servers"]):
            return
        time.sleep(0.1)


def _router_summary(status: dict) -> dict:
    r = status.get("router") or {}
    cols = (r.get("collectors") or {}).get("collectors") or {}
    subs = cols.get("vllm_zmq") or []
    stored = sum((s.get("events") or {}).get("stored_blocks", 0) for s in subs)
    return {
        "mode": r.get("mode"),
        "counters": r.get("counters"),
        "event_stored_blocks": stored,
        "event_subscriptions": len(subs),
        "scrapes": sum(t.get("scrapes", 0) for t in cols.get("vllm_metrics") or []),
    }


# ---------------------------------------------------------------------------
# Summary, table, plot


def summarize(run: dict, time_scale: float = 1.0) -> dict:
    """time_scale converts wall seconds into the servers' clock (vllm-sim --speed)."""
    res = run["results"]
    ok = [r for r in res if not r["error"]]
    c = run["counters"]
    tot_q = sum(v["queries"] for v in c.values())
    tot_h = sum(v["hits"] for v in c.values())
    ttft = [r["ttft"] * time_scale for r in ok]
    acq = [r["acquire_s"] for r in ok]
    e2e = [r["e2e"] for r in ok]
    srv_ttft_n = sum(v["ttft_count"] for v in c.values())
    return {
        "policy": run["policy"],
        "requests": len(res),
        "errors": len(res) - len(ok),
        "hit_rate": tot_h / tot_q if tot_q else 0.0,
        "hit_rate_by_server": {sid: (v["hits"] / v["queries"] if v["queries"] else 0.0) for sid, v in c.items()},
        "queries_by_server": {sid: v["queries"] for sid, v in c.items()},
        "requests_by_server": {sid: sum(1 for r in res if r["server"] == sid) for sid in c},
        "client_cached_tokens": sum(r.get("cached", 0) for r in ok),
        "prompt_tokens": sum(r["prompt_len"] for r in ok),
        "ttft_p50_s": _pct(ttft, 0.5),
        "ttft_p99_s": _pct(ttft, 0.99),
        "ttft_mean_s": sum(ttft) / len(ttft) if ttft else float("nan"),
        "server_ttft_mean_s": (sum(v["ttft_sum"] for v in c.values()) / srv_ttft_n) if srv_ttft_n else float("nan"),
        "preemptions": sum(v["preemptions"] for v in c.values()),
        "makespan_s": {s["step"]: s["makespan_s"] * time_scale for s in run["steps"]},
        "total_makespan_s": sum(s["makespan_s"] for s in run["steps"]) * time_scale,
        "acquire_p50_us": _pct(acq, 0.5) * 1e6,
        "acquire_p99_us": _pct(acq, 0.99) * 1e6,
        "acquire_share": (sum(acq) / sum(e2e + acq)) if ok else float("nan"),
        "router": run["router"],
        "ttft_samples_s": sorted(ttft),
        "first_error": next((r["error"] for r in res if r["error"]), None),
    }


def _chg(a: float, b: float, unit: str = "%") -> str:
    if unit == "pt":
        return f"{(b - a) * 100:+.1f} pt"
    if not a or a != a or b != b:
        return ""
    return f"{(b - a) / a * 100:+.0f}%"


def format_table(sums: List[dict], title: str, time_unit: str) -> str:
    base, new = sums[0], sums[-1]
    names = [s["policy"] for s in sums]
    w0 = 34
    cols = "".join(f"{n:>14}" for n in names)
    lines = [title, "", f"{'':<{w0}}{cols}{'change':>12}", "-" * (w0 + 14 * len(sums) + 12)]

    def row(label, vals, fmt, change=""):
        lines.append(f"{label:<{w0}}" + "".join(f"{fmt(v):>14}" for v in vals) + f"{change:>12}")

    pct = lambda v: f"{v * 100:.1f}%"  # noqa: E731
    row(
        "prefix-cache hit rate (servers)",
        [s["hit_rate"] for s in sums],
        pct,
        _chg(base["hit_rate"], new["hit_rate"], "pt"),
    )
    for i in range(len(base["hit_rate_by_server"])):
        cells = []
        for s in sums:
            hr, nreq = list(s["hit_rate_by_server"].values()), list(s["requests_by_server"].values())
            cells.append(f"{hr[i] * 100:.1f}% /{nreq[i]:>3}" if i < len(hr) else "")
        row(f"  server {i}", cells, str)
    sec = lambda v: f"{v:.3f}s"  # noqa: E731
    row(
        f"TTFT p50 (client, {time_unit})",
        [s["ttft_p50_s"] for s in sums],
        sec,
        _chg(base["ttft_p50_s"], new["ttft_p50_s"]),
    )
    row(
        f"TTFT p99 (client, {time_unit})",
        [s["ttft_p99_s"] for s in sums],
        sec,
        _chg(base["ttft_p99_s"], new["ttft_p99_s"]),
    )
    row(
        "TTFT mean (servers' histogram)",
        [s["server_ttft_mean_s"] for s in sums],
        sec,
        _chg(base["server_ttft_mean_s"], new["server_ttft_mean_s"]),
    )
    for step in base["makespan_s"]:
        row(
            f"makespan {step} ({time_unit})",
            [s["makespan_s"].get(step, float("nan")) for s in sums],
            lambda v: f"{v:.2f}s",
            _chg(base["makespan_s"][step], new["makespan_s"].get(step, float("nan"))),
        )
    row(
        f"makespan total ({time_unit})",
        [s["total_makespan_s"] for s in sums],
        lambda v: f"{v:.2f}s",
        _chg(base["total_makespan_s"], new["total_makespan_s"]),
    )
    row("preemptions (servers)", [s["preemptions"] for s in sums], lambda v: f"{v:.0f}")
    row(
        "acquire p50 / p99 (Ray RTT, ms)",
        [f"{s['acquire_p50_us'] / 1e3:.1f} / {s['acquire_p99_us'] / 1e3:.1f}" for s in sums],
        str,
    )
    row("acquire share of request time", [s["acquire_share"] for s in sums], lambda v: f"{v * 100:.2f}%")
    row("requests / errors", [f"{s['requests']} / {s['errors']}" for s in sums], str)
    row("KV-event blocks applied", [s["router"]["event_stored_blocks"] for s in sums], lambda v: f"{v:.0f}")
    lines.append("-" * (w0 + 14 * len(sums) + 12))
    lines.append("per-server rows: hit rate / requests routed there")
    return "\n".join(lines)


def plot(sums: List[dict], path: str, title: str, time_unit: str) -> Optional[str]:
    """hit rate by policy (total and per server), TTFT CDF, makespan per step."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); no plot written"
    colors = {"default": "#8c8c8c", "kvc_aware": "#1f77b4"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    fig.suptitle(title, fontsize=11)
    ax = axes[0]
    names = [s["policy"] for s in sums]
    xs = range(len(sums))
    ax.bar(xs, [s["hit_rate"] * 100 for s in sums], color=[colors.get(n, "C2") for n in names], width=0.6)
    for i, s in enumerate(sums):
        per = list(s["hit_rate_by_server"].values())
        ax.scatter(
            [i] * len(per),
            [v * 100 for v in per],
            color="black",
            s=14,
            zorder=3,
            label="per server" if i == 0 else None,
        )
        top = max([s["hit_rate"]] + per) * 100
        ax.text(i, top + 2.5, f"{s['hit_rate'] * 100:.1f}%", ha="center", fontsize=10, fontweight="bold")
    ax.set_xticks(list(xs), names)
    ax.set_ylim(0, 105)
    ax.set_ylabel("prefix-cache hit rate (%)")
    ax.set_title("hit rate (servers' /metrics)")
    ax.legend(loc="lower right", fontsize=8)
    ax = axes[1]
    for s in sums:
        v = s["ttft_samples_s"]
        if v:
            ax.step(
                v,
                [(i + 1) / len(v) for i in range(len(v))],
                where="post",
                color=colors.get(s["policy"], "C2"),
                label=f"{s['policy']} (p50 {s['ttft_p50_s']:.3f}s, p99 {s['ttft_p99_s']:.3f}s)",
            )
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"TTFT, client side ({time_unit}, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax = axes[2]
    steps = list(sums[0]["makespan_s"])
    width = 0.8 / len(sums)
    for j, s in enumerate(sums):
        ax.bar(
            [i + (j - (len(sums) - 1) / 2) * width for i in range(len(steps))],
            [s["makespan_s"].get(st, 0) for st in steps],
            width=width,
            color=colors.get(s["policy"], "C2"),
            label=s["policy"],
        )
    ax.set_xticks(range(len(steps)), steps)
    ax.set_ylabel(f"makespan ({time_unit})")
    ax.set_title("rollout-step makespan")
    ax.set_ylim(0, max(v for s in sums for v in s["makespan_s"].values()) * 1.22)
    ax.legend(fontsize=8, loc="upper left", ncol=len(sums))
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_json(path: str, payload: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))


# ---------------------------------------------------------------------------
# Processes: everything started is stopped, also on Ctrl-C / SIGTERM


class Cleanup:
    """Stops registered child processes (process groups) and calls registered
    functions, once, from ``finally``, ``atexit`` or a signal."""

    def __init__(self) -> None:
        self._procs: List[subprocess.Popen] = []
        self._funcs: List[Any] = []
        self._done = False
        self._lock = threading.Lock()
        atexit.register(self.run)

    def add_process(self, p: subprocess.Popen) -> None:
        self._procs.append(p)

    def add(self, fn) -> None:
        self._funcs.append(fn)

    def install_signal_handlers(self) -> None:
        def handler(signum, frame):
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGHUP, handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def stop_process(self, p: subprocess.Popen, grace: float = 5.0) -> None:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                p.terminate()
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    p.kill()
                p.wait(5)
        if p in self._procs:
            self._procs.remove(p)

    def run(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        if threading.current_thread() is threading.main_thread():
            for s in old:
                signal.signal(s, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        try:
            for p in list(self._procs):
                try:
                    self.stop_process(p)
                except Exception as e:  # noqa: BLE001
                    print(f"cleanup: pid {p.pid}: {e}", file=sys.stderr)
            for fn in reversed(self._funcs):
                try:
                    fn()
                except Exception as e:  # noqa: BLE001
                    print(f"cleanup: {e}", file=sys.stderr)
        finally:
            if threading.current_thread() is threading.main_thread():
                for s, h in old.items():
                    signal.signal(s, h)


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM if this process dies, even by SIGKILL
    (Linux prctl PR_SET_PDEATHSIG). Only used before any thread is started."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except Exception:  # noqa: BLE001 - best effort
        pass


def ports_free(ports: Sequence[int]) -> bool:
    for p in ports:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p))
        except OSError:
            return False
        finally:
            s.close()
    return True


def start_sim_fleet(
    binary: str, n: int, cleanup: Cleanup, extra: Sequence[str], log_path: str, tries: int = 20, timeout: float = 30.0
) -> tuple:
    """Starts ``vllm-sim --fleet n`` on free loopback ports; returns (Popen, servers)."""
    rng = random.Random(os.getpid() ^ int(time.time() * 1000))
    last = ""
    for _ in range(tries):
        base = rng.randrange(20000, 40000)
        ev = base + 100
        if not ports_free(list(range(base, base + n)) + list(range(ev, ev + 2 * n))):
            continue
        cmd = [
            binary,
            "--fleet",
            str(n),
            "--base-port",
            str(base),
            "--base-event-port",
            str(ev),
            "--log-level",
            "warn",
            *extra,
        ]
        log = open(log_path, "ab")
        try:
            p = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        finally:
            log.close()
        cleanup.add_process(p)
        servers, err = _read_fleet_lines(p, n, timeout)
        if servers is not None:
            return p, servers, cmd
        cleanup.stop_process(p)
        last = err
    raise RuntimeError(f"could not start the vllm-sim fleet: {last}")


def _read_fleet_lines(p: subprocess.Popen, n: int, timeout: float):
    lines: List[dict] = []
    box: Dict[str, Any] = {}

    def reader():
        try:
            for raw in p.stdout:
                lines.append(json.loads(raw))
                if len(lines) == n:
                    return
        except Exception as e:  # noqa: BLE001
            box["err"] = str(e)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    if len(lines) == n:
        return [Server.from_json(d) for d in lines], ""
    return None, box.get("err") or f"fleet exited with {p.poll()} after {len(lines)} of {n} servers"

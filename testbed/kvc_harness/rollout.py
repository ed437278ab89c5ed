"""A rollout through the balancer actor, as verl's agent-loop workers do it:
:class:`RolloutWorker` actors acquire a server, call it over HTTP (streaming,
client-side TTFT) and release it; :func:`run_policy` creates the balancer
exactly as verl does and drives a workload's steps, with a weight update
(prefix-cache reset) between them."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Sequence

from kvc_harness.balancer import router_config, router_summary, wait_collectors
from kvc_harness.client import COUNTERS, reset_prefix_caches, scrape_all, stream_completion
from kvc_harness.fleet import Server
from kvc_harness.workloads import WorkloadSpec, agent_step, grpo_step, random_tokens


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
                toks = random_tokens(rng, turn["max_tokens"])
            prompt = prompt + toks + turn["tool"]
        return out

    def agent(self, trajs: List[dict]) -> List[dict]:
        futs = [self.pool.submit(self._trajectory, t) for t in trajs]
        return [r for f in futs for r in f.result()]


def run_policy(
    ray: Any,
    policy: str,
    servers: Sequence[Server],
    spec: WorkloadSpec,
    model: str,
    workers: int = 4,
    log: Callable[[str], Any] = print,
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
        wait_collectors(ray, lb)
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
    return {"policy": policy, "results": results, "steps": steps, "counters": delta, "router": router_summary(status)}

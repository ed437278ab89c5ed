"""Benchmarks (not collected by pytest): run `python tests/bench_balancer.py`.

1. Python-level KVCAwareBalancer.acquire_server + release_server on an
   8k-token prompt, in process (target <= 100 us per acquire).
2. Ray actor round-trip throughput with 8k-token prompts: KVCAwareBalancer
   (kvc_aware) vs a plain-Python least-in-flight balancer actor, same run
   (target ratio >= 0.8).
"""

from __future__ import annotations

import argparse
import array
import random
import time
from collections import OrderedDict

PROMPT_TOKENS = 8192


class PlainLeastInflight:
    """A minimal pure-Python least-in-flight balancer with a sticky LRU."""

    def __init__(self, servers, max_cache_size=10000):
        self.handles = dict(servers)
        self.inflight = {s: 0 for s in servers}
        self.cache = OrderedDict()
        self.max = max_cache_size

    def acquire_server(self, request_id, prompt_ids=None):
        sid = self.cache.get(request_id)
        if sid is not None and sid in self.inflight:
            self.cache.move_to_end(request_id)
        else:
            sid = min(self.inflight, key=self.inflight.get)
            self.cache[request_id] = sid
            if len(self.cache) > self.max:
                self.cache.popitem(last=False)
        self.inflight[sid] += 1
        return sid, self.handles[sid]

    def release_server(self, server_id, **kwargs):
        if self.inflight.get(server_id, 0) > 0:
            self.inflight[server_id] -= 1


def prompts(n, rng):
    base = [rng.randrange(1, 150_000) for _ in range(PROMPT_TOKENS)]
    out = []
    for _ in range(n):  # GRPO-like: groups share a long prefix
        p = list(base)
        p[-512:] = [rng.randrange(1, 150_000) for _ in range(512)]
        out.append(p)
    return out


def bench_inprocess(iters):
    from kvc_router import KVCAwareBalancer

    rng = random.Random(0)
    servers = {f"10.0.0.{i}:8000": None for i in range(8)}
    ps = prompts(64, rng)
    rows = []
    for mode in (None, "kvc_aware"):
        lb = KVCAwareBalancer(
            servers,
            router_config=mode
            if mode is None
            else {"type": "kvc_aware", "config": {"strategies": [{"name": "kvc_aware"}]}},
        )
        for label, conv in (("list[int]", lambda p: p), ("array('i')", lambda p: array.array("i", p))):
            data = [conv(p) for p in ps]
            for i in range(200):  # warm up
                sid, _ = lb.acquire_server(f"w{i}", data[i % len(data)])
                lb.release_server(sid)
            t0 = time.perf_counter()
            for i in range(iters):
                lb.acquire_server(f"r{i}", data[i % len(data)])
            t1 = time.perf_counter()
            for _ in range(iters):
                lb.release_server("10.0.0.0:8000")
            rows.append((f"acquire_server, 8k tokens, {mode or 'default'}, {label}", (t1 - t0) / iters * 1e6, "us/op"))
            lb.clear_sticky_cache()
        lb.close()
    return rows


def bench_ray(seconds, clients, window):
    import ray
    from kvc_router import KVCAwareBalancer

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    servers = {f"10.0.0.{i}:8000": None for i in range(8)}
    rng = random.Random(1)
    ps = prompts(16, rng)

    @ray.remote(num_cpus=0)
    class Client:
        def __init__(self, lb, ps):
            self.lb, self.ps = lb, ps

        def run(self, seconds, window, tag):
            import ray as r

            n, pending, deadline = 0, [], time.time() + seconds
            while time.time() < deadline:
                while len(pending) < window:
                    p = self.ps[n % len(self.ps)]
                    pending.append(self.lb.acquire_server.remote(request_id=f"{tag}-{n}", prompt_ids=p))
                    n += 1
                done, pending = r.wait(pending, num_returns=1)
                for sid, _ in r.get(done):
                    self.lb.release_server.remote(server_id=sid)
            r.get(pending)
            return n

    results = {}
    for name, cls, kwargs in (
        ("plain-Python least-inflight", PlainLeastInflight, {}),
        (
            "KVCAwareBalancer kvc_aware",
            KVCAwareBalancer,
            {"router_config": {"type": "kvc_aware", "config": {"strategies": [{"name": "kvc_aware"}]}}},
        ),
        ("KVCAwareBalancer default", KVCAwareBalancer, {}),
    ):
        lb = ray.remote(cls).remote(servers=servers, max_cache_size=10000, **kwargs)
        ray.get(lb.acquire_server.remote(request_id="warm", prompt_ids=ps[0]))
        cs = [Client.remote(lb, ps) for _ in range(clients)]
        ray.get([c.run.remote(1.0, window, "w") for c in cs])  # warm-up
        t0 = time.time()
        n = sum(ray.get([c.run.remote(seconds, window, f"c{k}") for k, c in enumerate(cs)]))
        results[name] = n / (time.time() - t0)
        for a in cs + [lb]:
            ray.kill(a)
    ray.shutdown()
    base = results["plain-Python least-inflight"]
    return [(f"Ray round trips, 8k tokens: {k}", v, f"ops/s (x{v / base:.2f})") for k, v in results.items()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--window", type=int, default=8, help="outstanding acquires per client")
    ap.add_argument("--no-ray", action="store_true")
    a = ap.parse_args()
    rows = bench_inprocess(a.iters)
    if not a.no_ray:
        rows += bench_ray(a.seconds, a.clients, a.window)
    w = max(len(r[0]) for r in rows)
    print(f"{'benchmark':<{w}}  {'value':>10}  unit")
    for name, v, unit in rows:
        print(f"{name:<{w}}  {v:>10.1f}  {unit}")


if __name__ == "__main__":
    main()
